"""The cost model's split of a step by kind of op (planner/predict/op_kinds.py): the same
op times the stage costs sum, over every pass of the step."""

from __future__ import annotations

import pytest

from planner.costs.stages import plan_costs
from planner.predict.op_kinds import COMPUTE_KINDS, stage_op_kinds
from planner.specs.choices import Recompute
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import model_presets
from planner.specs.plan import Kernels


def _plan(**knobs):
    cfg = ParallelConfig(**{"dtype": "bf16", "seq_len": 2048, **knobs})
    return homogeneous_plan(model_presets()["gpt3-1.3b"], parse_gpus_arg("A100-80GB-SXM:8"),
                            cfg, kernels=Kernels())


def _stage_compute_s(plan, pi: int, si: int) -> float:
    """A step's compute of the stage as its StageCost prices it: each micro-batch's
    layers forward and backward (with recomputation), the embedding and the head."""
    c = plan_costs(plan).costs[pi][si]
    m = plan.pipelines[pi].num_microbatches
    per_mb = (c.num_layers * (c.layer_forward.compute_s + c.layer_backward.compute_s)
              + c.embed_forward.compute_s + c.embed_backward.compute_s
              + c.head_forward.compute_s + c.head_backward.compute_s)
    return m * per_mb


@pytest.mark.parametrize("knobs", [
    {"tp": 1, "pp": 1, "dp": 8, "mbs": 2, "gbs": 64},
    {"tp": 2, "pp": 2, "dp": 2, "mbs": 1, "gbs": 32, "recompute": Recompute.FULL},
    {"tp": 2, "pp": 4, "dp": 1, "mbs": 2, "gbs": 16, "recompute": Recompute.SELECTIVE,
     "sequence_parallel": True},
])
def test_the_kinds_add_up_to_the_stage_costs(knobs):
    plan = _plan(**knobs)
    kinds = stage_op_kinds(plan)
    costs = plan_costs(plan).costs
    assert set(kinds) == {(pi, si) for pi, p in enumerate(plan.pipelines)
                          for si in range(len(p.stages))}
    for (pi, si), split in kinds.items():
        assert set(split) == set(COMPUTE_KINDS)
        compute = sum(v for k, v in split.items() if k != "optimizer")
        assert compute == pytest.approx(_stage_compute_s(plan, pi, si), rel=1e-9)
        assert split["optimizer"] == pytest.approx(costs[pi][si].optimizer_s)
        assert split["gemm"] > split["attention"] > 0 and split["elementwise"] > 0


def test_full_recomputation_runs_the_forward_again():
    """Full recomputation adds each layer's forward GEMMs once more: 3 GEMM passes of
    work (forward, backward's two) become 4, so the GEMM time grows by about a third."""
    plain = stage_op_kinds(_plan(tp=1, pp=1, dp=8, mbs=2, gbs=64))[(0, 0)]
    again = stage_op_kinds(_plan(tp=1, pp=1, dp=8, mbs=2, gbs=64,
                                 recompute=Recompute.FULL))[(0, 0)]
    assert 1.25 < again["gemm"] / plain["gemm"] < 1.34


def test_only_the_first_and_last_stages_hold_the_embedding_and_the_head():
    plan = _plan(tp=1, pp=4, dp=2, mbs=1, gbs=16)
    kinds = stage_op_kinds(plan)
    middle = kinds[(0, 1)]
    assert kinds[(0, 1)] == pytest.approx(kinds[(0, 2)])
    # the head's logits GEMM (vocab 50,257 x 2,048) on the last stage
    assert kinds[(0, 3)]["gemm"] > 1.3 * middle["gemm"]
