"""Expert parallelism in mixed-GPU plans (issue 18.3, "on mixed clusters too"): mixed
templates of an MoE model split the routed experts over groups of ep replicas, within
what trainplan's executor runs (executor/preflight.py), and each ep group is priced as
the GPUs it is (tests/planner/costs/test_moe.py: its links, its slowest peer)."""

import math
from dataclasses import replace

import pytest

from executor.preflight import check_runnable
from planner.export.frameworks import CAPABILITIES, NO_SHARDING, unsupported
from planner.hetero.search import MixedSpace, hetero_candidates, lower_bound_s, mixed_templates
from planner.predict.estimate import estimate
from planner.search import SearchRequest, search
from planner.simulator import simulate
from planner.specs.choices import Recompute, Schedule
from planner.specs.cluster import ClusterSpec, NodeGroup, load_cluster
from planner.specs.model import ModelSpec, preset
from planner.specs.plan import Communication, Kernels, Sharding

TRAINPLAN = CAPABILITIES["trainplan"]
# Four MoE layers of 64 SwiGLU experts of 4096 x 4096: 3.2 B expert parameters a layer,
# 51 GB of fp16 states with fp32 masters and AdamW moments (16 bytes a parameter,
# planner/costs/memory.py) — more than a V100-32GB holds, a quarter of it less.
WIDE = ModelSpec(name="wide-moe", num_layers=4, hidden_size=4096, ffn_hidden_size=4096,
                 num_heads=32, num_kv_heads=8, vocab_size=32000, seq_len=1024,
                 activation="swiglu", norm="rmsnorm", position_embedding="rope",
                 num_experts=64, experts_per_token=2)
A100_V100 = ClusterSpec(name="a100+v100", node_groups=(
    NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=1, island="ib"),
    NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=1, island="ib"))).resolved()
KERNELS = Kernels(attention="math")


def test_the_mixed_space_of_an_moe_model_keeps_trainplans_ep_limits():
    space = MixedSpace.for_framework(TRAINPLAN, preset("mixtral-8x7b"))
    assert space.ep == (1, 2, 4, 8) and space.tp == (1,)
    assert space.recompute_for(2) == (Recompute.NONE, Recompute.SELECTIVE)
    assert space.recompute_for(1) == tuple(Recompute)
    assert space.schedule_allowed(Schedule.ZB_H1, 1)
    assert not space.schedule_allowed(Schedule.ZB_H1, 2)
    cheap, rest = space.shardings(16, 2, 4)  # degrees <= 4 or multiples of 4 only
    assert Sharding(optim=16) in cheap and all(
        n <= 4 or n % 4 == 0 for sh in cheap + rest for n in (sh.params, sh.grads, sh.optim))
    # a dense model, or a framework without ep: ep 1 only
    assert MixedSpace.for_framework(TRAINPLAN, preset("llama2-7b")).ep == (1,)
    # ep groups whole replicas, every replica the same micro-batches
    templates = mixed_templates(preset("mixtral-8x7b"),
                                load_cluster("cluster_specs/mixed-a100-v100.yaml"), 256, space)
    assert {t.ep for t in templates} == {1, 2, 4, 8}
    assert all(t.dp % t.ep == 0 for t in templates)


def _wide_candidates(space):
    """Priced as a trainplan search prices them (its executor's communication)."""
    templates = mixed_templates(WIDE, A100_V100, 16, space)
    found, _, _ = hetero_candidates(WIDE, A100_V100, templates, gbs=16, seq_len=1024,
                                    dtype="fp16", kernels=KERNELS,
                                    comm=Communication.preset(TRAINPLAN.comm, dtype="fp16"),
                                    score=lambda p: p.iteration_s, keep=50,
                                    bound_score=lambda t, bound: bound, space=space)
    return templates, found


def test_a_mixed_plan_that_must_split_its_experts_does():
    """With model states replicated (a V100 cannot hold a layer's experts whole), no mixed
    template fits at ep 1 or 2; at ep >= 4 they do: the best mixed plan splits its
    experts, passes trainplan's preflight, and is priced as its Plan (search = estimate),
    and every template's lower bound stays below its candidates."""
    space = replace(MixedSpace.for_framework(TRAINPLAN, WIDE), sharding=(NO_SHARDING,))
    templates, found = _wide_candidates(space)
    assert any(t.ep == 1 for t in templates)
    assert found and min(p.template.ep for p in found) >= 4
    best = found[0]
    assert {g for rep in best.template.replicas for g, _ in rep} == {"A100-80GB-SXM",
                                                                   "V100-32GB-SXM2"}
    for p in found:
        plan = p.plan(WIDE, A100_V100, seq_len=1024, dtype="fp16", kernels=KERNELS)
        assert plan.training.ep == p.template.ep > 1
        assert plan.training.comm == Communication.preset("trainplan", dtype="fp16")
        check_runnable(plan, cuda_devices=8, host=False)
        assert unsupported(plan, TRAINPLAN) == []
        assert math.isclose(p.iteration_s, estimate(plan).iteration_time_s, rel_tol=1e-9)
        bound = lower_bound_s(WIDE, A100_V100, p.template, gbs=16, seq_len=1024,
                              dtype="fp16", kernels=KERNELS)
        assert bound <= p.iteration_s * (1 + 1e-9)
    # ep groups across GPU types (one-stage replicas of both types, ep 16) wait for the
    # V100s: every replica, A100 or V100, finishes at the V100s' pace
    mixed_group = [p for p in found if p.template.family == "mixed-replicas"
                   and p.template.pp == 1 and p.template.ep == 16]
    assert mixed_group
    plan = mixed_group[0].plan(WIDE, A100_V100, seq_len=1024, dtype="fp16", kernels=KERNELS)
    stages = estimate(plan).stages
    for pass_s in ("forward_s", "backward_s"):
        by_type = {s.device: getattr(s, pass_s) for s in stages}
        assert len(by_type) == 2 and by_type["A100-80GB-SXM"] == pytest.approx(
            by_type["V100-32GB-SXM2"], rel=1e-9)


def test_mixtral_on_the_mixed_cluster_splits_its_experts(tmp_path):
    """Mixtral 8x7B on the shipped A100 + V100 cluster: the best plan mixes the types with
    ep > 1 (its V100 stages hold more layers once the experts are split, without ZeRO-3's
    gathers) and beats every plan without expert parallelism; trainplan runs it, and
    `plan simulate` of it gives the search's time."""
    cluster = load_cluster("cluster_specs/mixed-a100-v100.yaml")
    found = search(SearchRequest(model=preset("mixtral-8x7b"), cluster=cluster, gbs=256,
                                 seq_len=4096, dtype="fp16", top=16))
    # (16: with the executor's reduction after the backward, Communication.preset
    # "trainplan", the best plan without ep ranks 15th, at 3.73 s to the best's 2.98 s)
    best = found.ranked[0]
    assert best.plan.training.ep > 1
    # the mixed search prices and writes the executor's communication
    assert best.plan.training.comm == Communication.preset("trainplan", dtype="fp16")
    assert len({g.gpu for g in cluster.node_groups}) == len(best.plan.gpu_types)
    without = [r for r in found.ranked if r.plan.training.ep == 1]
    assert without and best.result.iteration_time_s < min(
        r.result.iteration_time_s for r in without)
    check_runnable(best.plan, cuda_devices=8, host=False)
    assert math.isclose(best.estimate_s, estimate(best.plan).iteration_time_s, rel_tol=1e-9)
    assert math.isclose(best.result.iteration_time_s,
                        simulate(best.plan).iteration_time_s, rel_tol=1e-9)
