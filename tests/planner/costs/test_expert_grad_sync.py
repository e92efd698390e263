"""The routed experts' data-parallel traffic runs over their own expert-data-parallel
group (issue 18.2): Megatron-Core reduces expert gradients over
`parallel_state.get_expert_data_parallel_group()`, of dp x cp x tp / (ep x etp) ranks, the
ranks holding the same experts (its DDP keeps expert parameters in their own buffers,
megatron/core/distributed/distributed_data_parallel.py `expert_parallel_buffers`), and
shards their optimizer states over it; trainplan's executor does the same over dp / ep
replicas (executor/topology.py `expert_dp_group`, executor/groups.py
`expert_shard_layout`). The dense parameters still sync over the dp x cp group."""

import dataclasses

import pytest

from planner.costs.memory import rank_expert_param_count
from planner.costs.stages import (
    EXPERT_TERM_PREFIX,
    dp_sync,
    expert_sharding,
    plan_costs,
)
from planner.specs.choices import EpLayout
from planner.specs.cluster import homogeneous_cluster
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Sharding

MOE = dataclasses.replace(preset("mixtral-8x7b"), num_layers=2)
CLUSTER = homogeneous_cluster("H100-80GB-SXM", 16)  # two nodes of 8


def _plan(*, tp: int, ep: int, sharding: Sharding, layout: EpLayout = EpLayout.FOLDED):
    dp = 16 // tp
    cfg = ParallelConfig(tp=tp, dp=dp, mbs=1, gbs=dp * 2, seq_len=4096, ep=ep,
                         sharding=sharding, ep_layout=layout)
    check_parallel(cfg, MOE, CLUSTER)
    return homogeneous_plan(MOE, CLUSTER, cfg)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """16 GPUs, tp 1, ep 4 (Megatron-Core folding: ep consecutive ranks, the expert-data-
    parallel group every ep-th rank, dp x cp x tp / (ep x etp) = 4 of them): the dense
    gradients are all-reduced over all 16 ranks (8 per node on both nodes), the experts'
    over GPUs 0, 4, 8, 12 (2 per node), each in its own buckets (the default bucket size
    follows the data-parallel size for both buffers, distributed_data_parallel.py)."""
    costs = plan_costs(_plan(tp=1, ep=4, sharding=Sharding()))
    spec, cost = costs.specs[0][0], costs.costs[0][0]
    assert spec.dp_cp_group == tuple(range(16))
    assert spec.ep_group == (0, 1, 2, 3)
    assert spec.expert_dp_group == (0, 4, 8, 12)
    assert costs.specs[5][0].expert_dp_group == (1, 5, 9, 13)
    experts = rank_expert_param_count(MOE, num_layers=MOE.num_layers, etp=1, ep=4)
    assert 0 < experts < cost.num_params
    dense = dp_sync(CLUSTER, tuple(range(16)), cost.num_params - experts, 1, Sharding(),
                    "bf16", comm=costs.runs[0].comm, units=MOE.num_layers + 2)
    expert = dp_sync(CLUSTER, (0, 4, 8, 12), experts, 1, Sharding(), "bf16",
                     comm=costs.runs[0].comm, units=MOE.num_layers + 2, bucket_dp=16)
    assert cost.dp.grad_iteration_s == pytest.approx(dense.grad_iteration_s
                                                     + expert.grad_iteration_s)
    assert cost.dp.buckets == dense.buckets + expert.buckets
    # not all parameters over the 16 ranks (as before): 2 GPUs per node carry the experts'
    # inter-node traffic, not 8
    whole = dp_sync(CLUSTER, tuple(range(16)), cost.num_params, 1, Sharding(), "bf16",
                    comm=costs.runs[0].comm)
    assert cost.dp.grad_iteration_s > 1.5 * whole.grad_iteration_s
    # a trace names the experts' reduction apart, with its own group
    about = cost.dp.about("grad_iteration")
    assert "16 ranks (8 per node/2 nodes)" in about
    assert f"{EXPERT_TERM_PREFIX}" in about and "4 ranks (2 per node/2 nodes)" in about


def test_expert_states_shard_over_their_group_as_the_memory_model_does():
    """ZeRO-1 over the 16 ranks: the experts' optimizer states are sharded over their 4
    expert-data-parallel peers (16 / ep), as `model_state_bytes` counts them, so the
    reduce-scatter and the parameter gather of the experts run over those 4 and the
    optimizer steps 1/4 of the experts' parameters beside 1/16 of the dense ones."""
    zero1 = plan_costs(_plan(tp=1, ep=4, sharding=Sharding(optim=16)))
    spec, cost = zero1.specs[0][0], zero1.costs[0][0]
    assert expert_sharding(Sharding(optim=16), spec.placed) == Sharding(optim=4)
    about = cost.dp.about("grad_iteration")
    dense, expert = about.split(f"; {EXPERT_TERM_PREFIX}")
    assert "reduce_scatter" in dense and "16 ranks" in dense
    assert "reduce_scatter" in expert and "4 ranks" in expert
    assert "4 ranks" in cost.dp.about("param_iteration")
    experts = rank_expert_param_count(MOE, num_layers=MOE.num_layers, etp=1, ep=4)
    plain = plan_costs(_plan(tp=1, ep=4, sharding=Sharding()))
    # optimizer time is linear in the parameters it steps (fused Adam, memory bound)
    ratio = (cost.optimizer_s / plain.costs[0][0].optimizer_s)
    expected = ((cost.num_params - experts) / 16 + experts / 4) / cost.num_params
    assert ratio == pytest.approx(expected, rel=0.05)
    assert ratio > 1.5 / 16  # not every parameter over 16 ranks


def test_data_parallel_layout_groups_replicas_holding_the_same_experts():
    """ep_layout data_parallel (trainplan's executor): tp 2, dp 8, ep 4. An ep group is
    tp rank 0 of 4 consecutive replicas (GPUs 0, 2, 4, 6); the replicas holding the same
    experts are every 4th (executor/topology.py `expert_dp_group`: GPUs 0 and 8, one per
    node), and ZeRO-1 over the 8 replicas shards the experts' states over those 2
    (executor/groups.py `expert_shard_layout`: optim / ep)."""
    costs = plan_costs(_plan(tp=2, ep=4, sharding=Sharding(optim=8),
                             layout=EpLayout.DATA_PARALLEL))
    spec, cost = costs.specs[0][0], costs.costs[0][0]
    assert spec.ep_group == (0, 2, 4, 6)
    assert spec.expert_dp_group == (0, 8)
    assert costs.specs[3][0].expert_dp_group == (6, 14)
    assert expert_sharding(Sharding(optim=8), spec.placed) == Sharding(optim=2)
    assert "2 ranks (2 nodes)" in cost.dp.about("grad_iteration")
    assert "8 ranks (4 per node/2 nodes)" in cost.dp.about("grad_iteration")
    # folded with the same shape puts ep over tp x dp ranks: every 4th of them, each
    # holding the experts whole per tp rank (etp = tp): the same replicas' GPUs here
    folded = plan_costs(_plan(tp=2, ep=4, sharding=Sharding(optim=8))).specs[0][0]
    assert folded.expert_dp_group == (0, 8)
