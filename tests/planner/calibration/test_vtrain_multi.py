"""The held-out multi-node vTrain rows (planner/data/validation/vtrain_multi_node_a100.csv:
vTrain's data/ground_truth_multi.csv, Bang et al., MICRO 2024; GPT 3.6B-175B on 64-512
A100s; source in the folder's README).

Nothing in the cost model was fitted to these rows. The bounds are regression guards for a
held-out set: the MAPE measured when the file was added (7.05%, docs/calibration.md
"vTrain multi-node (held out)") rounded up to the next whole percent, and the 175B rows
(deep pipelines, pp 8-32 over 512 GPUs, the regime of the issue's "very large Megatron-style
runs") within 5% each (measured: -2.2 .. +2.8%; -1.1 .. +4.7% since the rows are priced
with DeepSpeed's blocking pipeline sends, `VTRAIN_COMM`). A change that breaks them made the held-out
predictions worse: find the mechanism, never widen a bound to pass.
"""

import dataclasses

import pytest

from planner.calibration.published import (
    VTRAIN_COMM,
    summarize,
    vtrain_multi_cases,
    vtrain_multi_cluster,
    vtrain_multi_groups,
    vtrain_multi_rows,
)
from planner.costs.stages import plan_costs
from planner.simulator import simulate
from planner.specs.choices import PipelineP2P


@pytest.fixture(scope="module")
def summary():
    return summarize(vtrain_multi_cases(), simulate, require_fit=False)


def test_every_row_is_a_whole_layout():
    """109 rows, each a complete 3D layout of its GPU count with whole micro-batches."""
    rows = vtrain_multi_rows()
    assert len(rows) == 109
    for r, measured_s in rows:
        assert r["tp"] * r["dp"] * r["pp"] == r["gpus"], r
        assert r["gbs"] % (r["dp"] * r["mbs"]) == 0, r
        assert r["layers"] % r["pp"] == 0, r
        assert 3 < measured_s < 70, r
    cases = vtrain_multi_cases()
    assert all(len(c.plans) == 1 for c in cases), [c.id for c in cases if len(c.plans) != 1]


def test_the_cluster_and_communication_are_the_configs():
    """vTrain's validation configs (config/validation/multi/*.json): node_size 8,
    inter_node_bandwidth 800 (Gb/s in total per node, src/config.py), use_gradient_bucket
    false; its simulator reduces 16-bit gradients after the last backward. The runs are
    Megatron-DeepSpeed's (vTrain data/README.md), whose pipelines are DeepSpeed's
    PipelineEngine (Megatron-DeepSpeed training.py `train_step`: `model[0].train_batch`
    while `ds_pipeline_enabled`): blocking dist.send / dist.recv (deepspeed/runtime/pipe/
    p2p.py asserts async_op == False), gradients all-reduced once after the schedule in
    buckets of MEMORY_OPT_ALLREDUCE_SIZE = 5e8 elements (runtime/pipe/engine.py
    `_exec_reduce_grads`)."""
    cluster = vtrain_multi_cluster(512)
    (group,) = cluster.node_groups
    assert group.num_nodes == 64 and group.gpus_per_node == 8
    assert group.nics_per_node * group.nic_bandwidth_gbit_per_s == pytest.approx(800)
    assert group.nic == "infiniband"
    assert not VTRAIN_COMM.overlap_grad_reduce
    assert VTRAIN_COMM.grad_reduce_dtype == "fp16"
    assert VTRAIN_COMM.pipeline_p2p is PipelineP2P.BLOCKING
    assert VTRAIN_COMM.grad_bucket_params == 5e8
    plan = vtrain_multi_cases()[0].plans[0]
    assert plan.training.comm == VTRAIN_COMM


def test_pipeline_sends_hold_the_compute():
    """DeepSpeed's blocking sends are priced as such: the same pp 16 row (39.1B, tp 1,
    dp 32, micro-batch 3) is slower with them than with Megatron's batched sends beside the
    compute, and each of its stages is marked blocking."""
    rows = vtrain_multi_rows()
    cases = vtrain_multi_cases()
    i = next(i for i, (r, _) in enumerate(rows)
             if (r["hidden"], r["tp"], r["pp"]) == (8192, 1, 16))
    plan = cases[i].plans[0]
    batched = dataclasses.replace(
        plan, training=dataclasses.replace(
            plan.training, comm=dataclasses.replace(VTRAIN_COMM,
                                                    pipeline_p2p=PipelineP2P.BATCHED)))
    assert all(c.p2p_blocking for c in plan_costs(plan).costs[0])
    assert simulate(plan).iteration_time_s > simulate(batched).iteration_time_s


def test_held_out_error(summary):
    assert summary.count == 109 and not summary.failed
    assert summary.mape <= 0.08, f"MAPE {summary.mape:.4f}"


def test_the_175b_runs_each_within_5_percent(summary):
    rows = vtrain_multi_rows()
    big = {f"vtrain-multi-{i:03d}": summary.errors[f"vtrain-multi-{i:03d}"]
           for i, (r, _) in enumerate(rows) if r["hidden"] == 12288}
    assert len(big) == 21
    assert all(abs(e) <= 0.05 for e in big.values()), big


def test_groups_cover_the_set(summary):
    groups = vtrain_multi_groups(summary.errors, ("gpus",))
    assert {g.key: g.count for g in groups} == {(64,): 26, (256,): 15, (512,): 68}
    assert sum(g.share for g in groups) == pytest.approx(summary.mape)
    with pytest.raises(ValueError, match="unknown vTrain field"):
        vtrain_multi_groups(summary.errors, ("batch",))
