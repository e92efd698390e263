"""Ranks, roles and groups of a plan (pure Python: no processes)."""

from executor.topology import Topology, chunk_layers, sample_ranges
from planner.specs.model import preset
from tests.executor.distributed import explicit, homogeneous

SMALL = preset("debug-small")


def test_megatron_layout_roles_and_groups():
    plan = homogeneous(SMALL, world=8, tp=2, pp=2, dp=2, mbs=1, gbs=4)
    topo = Topology.of(plan)
    # Megatron order: tp fastest, then dp, then pp
    assert [(r.pipeline, r.stage, r.tp_rank) for r in topo.roles[:4]] == [
        (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    assert topo.tp_groups(plan)[:2] == [(0, 1), (4, 5)]
    assert topo.dp_groups(plan) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert topo.forward_targets(plan, 1) == (5,) and topo.forward_source(plan, 5) == 1
    assert topo.backward_targets(plan, 5) == (1,) and topo.backward_source(plan, 1) == 5
    # debug-small ties its embeddings: first and last stage pair up per replica and tp rank
    assert sorted(topo.embedding_pairs(plan)) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_unequal_tp_between_stages_fans_out_and_in():
    plan = explicit(SMALL, world=3, pipelines=[(1, 2, [(0, 3, [0, 1], 2, "none"),
                                                       (3, 4, [2], 1, "none")])])
    topo = Topology.of(plan)
    assert topo.forward_targets(plan, 0) == (2,) and topo.forward_targets(plan, 1) == ()
    assert topo.forward_source(plan, 2) == 0
    assert topo.backward_targets(plan, 2) == (0, 1)
    assert topo.backward_source(plan, 0) == topo.backward_source(plan, 1) == 2


def test_ranks_are_the_gpus_the_plan_uses_in_order():
    plan = explicit(SMALL, world=6, pipelines=[(1, 2, [(0, 4, [5], 1, "none")]),
                                               (1, 2, [(0, 4, [2], 1, "none")])])
    topo = Topology.of(plan)
    assert topo.world_size == 2 and [r.device for r in topo.roles] == [2, 5]
    assert [r.pipeline for r in topo.roles] == [1, 0]
    assert sample_ranges(plan) == (0, 2)


def test_interleaved_chunks_take_layers_in_megatron_order():
    # two stages of 4 and 2 layers, two chunks each: model chunks s0c0, s1c0, s0c1, s1c1
    assert chunk_layers((4, 2), 2) == (((0, 2), (3, 5)), ((2, 3), (5, 6)))
    assert chunk_layers((3, 1), 1) == (((0, 3),), ((3, 4),))


def test_mixed_tp_positions_sum_over_all_their_ranks():
    """Stage position 0 mixes tp 1 and tp 2: its gradients are summed over all three of
    its ranks; position 1 (tp 1 in both replicas) keeps its rank-to-rank dp group."""
    from executor.groups import _collective_groups, shard_layout

    llama = preset("debug-tiny-llama")
    plan = explicit(llama, world=5, pipelines=[
        (1, 2, [(0, 1, [0], 1, "none"), (1, 2, [1], 1, "none")]),
        (1, 2, [(0, 1, [2, 3], 2, "none"), (1, 2, [4], 1, "none")])])
    topo = Topology.of(plan)
    assert [topo.mixed_tp(plan, s) for s in range(2)] == [True, False]
    assert topo.position_group(plan, 0) == (0, 2, 3)
    assert shard_layout(plan, topo, 3).members == (3,)
    assert shard_layout(plan, topo, 4).members == (1, 4)
    assert _collective_groups(plan, topo) == [(0, 2, 3), (1, 4), (2, 3)]
    # tied embeddings with mixed tp: each replica's twins pair up by tp rank
    tied = explicit(preset("debug-tiny"), world=6, pipelines=[
        (1, 2, [(0, 1, [0], 1, "none"), (1, 2, [1], 1, "none")]),
        (1, 2, [(0, 1, [2, 3], 2, "none"), (1, 2, [4, 5], 2, "none")])])
    assert Topology.of(tied).embedding_pairs(tied) == [(0, 1), (2, 4), (3, 5)]


def test_the_planner_prices_the_ep_groups_the_executor_forms():
    """With ep > 1 the cost model's ep group of each stage (planner/costs/stages.py
    `StageSpec.ep_group`, whose links price the all-to-alls) is the executor's group of
    that rank, GPU for GPU, also where a mixed plan places replicas out of GPU order (the
    old rule, the first ep replicas in pipeline order, gave replica 0 of the mixed
    replicas plan GPUs (2, 0) instead of its group (2, 3))."""
    from planner.costs.stages import plan_costs
    from tests.executor.test_moe import MOE, _mixed_replicas_ep2, _mixed_stages_ep2

    plans = [_mixed_stages_ep2(), _mixed_replicas_ep2(),
             homogeneous(MOE, world=8, dp=8, ep=4, mbs=1, gbs=8)]
    for plan in plans:
        assert _priced_ep_groups(plan) == _executor_ep_groups(plan)
    assert plan_costs(plans[1]).specs[0][0].ep_group == (2, 3)


def _executor_ep_groups(plan):
    """Each rank's GPU -> the GPUs of its ep group as the executor forms it."""
    topo = Topology.of(plan)
    return {role.device: tuple(topo.roles[r].device for r in topo.ep_group(plan, rank))
            for rank, role in enumerate(topo.roles)}


def _priced_ep_groups(plan):
    """Each rank's GPU -> the GPUs of the ep group the cost model prices for it: its
    stage's `StageSpec.ep_group` (that of the stage's first GPU, tp rank 0) moved to its
    own tp rank (every member's GPU at the same offset in its own stage)."""
    from planner.costs.stages import plan_costs

    out = {}
    for pipe, specs in zip(plan.pipelines, plan_costs(plan).specs, strict=True):
        for stage, spec in zip(pipe.stages, specs, strict=True):
            for t, device in enumerate(stage.devices):
                out[device] = tuple(sorted(d + t for d in spec.ep_group))
    return out


def test_the_planner_prices_the_executors_ep_groups_with_tp():
    """With tp > 1 (experts whole on every tp rank, etp 1) the executor forms each ep group
    of one tp rank in ep data-parallel replicas (`Topology.ep_group`); a plan that says so
    (Training.ep_layout data_parallel) is priced on those GPUs, rank for rank. Megatron's
    folding (the default layout) would put a replica's tp ranks in one group instead: GPUs
    0 and 1 (tp ranks of replica 0), not 0 and 2 (tp rank 0 of replicas 0 and 1)."""
    import pytest

    from executor.preflight import check_runnable
    from planner.costs.stages import plan_costs
    from profiler.schema import SpecError
    from tests.executor.test_moe import MOE

    layouts = [dict(tp=2, dp=4, ep=2), dict(tp=2, dp=4, ep=4), dict(tp=2, pp=2, dp=2, ep=2),
               dict(tp=4, dp=2, ep=2)]
    for knobs in layouts:
        plan = homogeneous(MOE, world=8, etp=1, mbs=1, gbs=4, ep_layout="data_parallel",
                           **knobs)
        check_runnable(plan, cuda_devices=0)
        executor = _executor_ep_groups(plan)
        assert _priced_ep_groups(plan) == executor, knobs
        assert all(len(g) == knobs["ep"] for g in executor.values())
    assert _executor_ep_groups(plan)[0] == (0, 4)  # tp 4: GPU 0 and 4, tp rank 0 of both
    folded = homogeneous(MOE, world=8, tp=2, dp=4, etp=1, ep=2, mbs=1, gbs=4)
    assert plan_costs(folded).specs[0][0].ep_group == (0, 1)
    assert _executor_ep_groups(folded)[0] == (0, 2)
    with pytest.raises(SpecError, match="ep_layout"):  # the executor does not run it
        check_runnable(folded, cuda_devices=0)
