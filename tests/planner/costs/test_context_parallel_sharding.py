"""Model states under context parallelism: context-parallel ranks hold the same weights
and reduce the same gradients, so the gradient reduction and ZeRO's shards run over the
data- x context-parallel group (Megatron-Core: the distributed optimizer takes
`parallel_state.get_data_parallel_group(with_context_parallel=True)`,
megatron/core/optimizer/__init__.py; its default bucket is
max(4e7, 1e6 x |dp x cp group|), megatron/training/training.py)."""

import dataclasses

import pytest

from planner.costs.stages import dp_sync, plan_costs
from planner.export.formats import export_plan
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan, sharding_preset
from planner.specs.model import preset
from planner.specs.plan import Communication, Sharding
from profiler.schema import SpecError

MODEL = dataclasses.replace(preset("llama3-8b"), num_layers=4)
CLUSTER = parse_gpus_arg("H100-80GB-SXM:8")


def _plan(*, dp: int, cp: int, sharding: str):
    cfg = ParallelConfig(tp=8 // (dp * cp), dp=dp, cp=cp, mbs=1, gbs=dp * 2, seq_len=16384,
                         sequence_parallel=dp * cp < 8,
                         sharding=sharding_preset(sharding, dp * cp))
    return homogeneous_plan(dataclasses.replace(MODEL, seq_len=16384), CLUSTER, cfg)


def test_distributed_optimizer_shards_over_the_context_parallel_ranks():
    """dp 1 x cp 8 (the ModelZoo 128k layout's shape): ZeRO-1 puts 1/8 of the fp32
    master weights and Adam moments (12 bytes per parameter) on each rank; before, a
    sharding counted replicas only and dp 1 could not shard at all."""
    none, zero1 = (plan_costs(_plan(dp=1, cp=8, sharding=s)).costs[0][0]
                   for s in ("none", "zero1"))
    assert zero1.num_params == none.num_params
    assert none.memory.optimizer_bytes == pytest.approx(12 * none.num_params)
    assert zero1.memory.optimizer_bytes == pytest.approx(12 * none.num_params / 8)
    assert zero1.memory.grads_bytes == none.memory.grads_bytes  # ZeRO-1 keeps gradients


def test_gradients_reduce_over_the_context_parallel_ranks():
    """Without sharding the 8 cp ranks all-reduce their gradients (before: no traffic at
    dp 1); the distributed optimizer reduce-scatters them instead and gathers the updated
    parameters, one bucket per max(4e7, 1e6 x 8) parameters."""
    none, zero1 = (plan_costs(_plan(dp=1, cp=8, sharding=s)).costs[0][0]
                   for s in ("none", "zero1"))
    assert none.dp.grad_iteration_s > 0 and none.dp.param_iteration_s == 0
    assert "all_reduce" in none.dp.about("grad_iteration")
    assert "reduce_scatter" in zero1.dp.about("grad_iteration")
    assert zero1.dp.param_iteration_s > 0
    assert zero1.dp.buckets == -(-zero1.num_params // 40e6)
    # the group is the 8 cp ranks (tp 1: GPUs 0-7), sharded over all of them
    alone = dp_sync(CLUSTER, tuple(range(8)), zero1.num_params, 8, Sharding(optim=8), "bf16",
                    comm=Communication())
    assert zero1.dp.grad_iteration_s == pytest.approx(alone.grad_iteration_s)
    assert zero1.dp.param_iteration_s == pytest.approx(alone.param_iteration_s)
    # cp 1: the same stage shape without context ranks has nothing to reduce
    single = plan_costs(_plan(dp=1, cp=1, sharding="none")).costs[0][0]
    assert single.dp.grad_iteration_s == 0


def test_sharding_sizes_count_dp_x_cp_ranks():
    """dp 2 x cp 4: ZeRO-1 is optim = 8, which the check accepts (it divides dp x cp) and
    Megatron's export writes as the whole distributed optimizer; a size dividing neither
    is refused."""
    plan = _plan(dp=2, cp=4, sharding="zero1")
    assert plan.sharding.optim == 8 and plan.dp_cp == 8
    args = export_plan(plan, "megatron").text
    assert "--use-distributed-optimizer" in args
    assert "--num-distributed-optimizer-instances" not in args
    cost = plan_costs(plan).costs[0][0]
    assert cost.memory.optimizer_bytes == pytest.approx(12 * cost.num_params / 8)
    bad = ParallelConfig(tp=1, dp=2, cp=4, mbs=1, gbs=4, seq_len=16384,
                         sharding=dataclasses.replace(sharding_preset("zero1", 8), optim=3))
    with pytest.raises(SpecError, match="dp x cp"):
        check_parallel(bad, MODEL, CLUSTER)
