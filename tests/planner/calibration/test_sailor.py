"""The Sailor artifact's measured runs (planner/data/validation/sailor_measured.csv) as
Plans (planner/calibration/sailor.py)."""

import pytest

from planner.calibration.sailor import sailor_cases, score
from planner.costs.comm import group_tiers
from planner.predict.estimate import estimate
from planner.specs.choices import PipelineP2P
from planner.specs.plan import TRAIN_DTYPES

STAND_INS = {"GH-96": ("GH200-96GB",), "RTX-3090": ("RTX4090-24GB",),
             "RTX-2080": ("T4-16GB",), "Titan-RTX": ("A6000-48GB",)}


def test_every_row_is_a_plan_or_says_why_not():
    cases = sailor_cases()
    assert len(cases) == 36
    gh200 = [c for c in cases if c.group.startswith("GH200")]
    assert len(gh200) == 27 and all(c.plan is not None for c in gh200)
    mixed = [c for c in cases if c.group.startswith("mixed")]
    assert len(mixed) == 9
    for c in mixed:  # until the catalog has the RTX cards (issue 14)
        assert c.plan is not None or "not in the device catalog" in c.reason
    if "tf32" not in TRAIN_DTYPES:
        assert all(c.lower_bound and "fp32" in c.reason for c in gh200)


def test_gh200_layout_as_written():
    """Row 1: GPT-Neo-2.7B, 4 stages x 4 replicas, [GH-96, tp 4] each, stage entries
    6/9/9/8 with the embedding and the head among them: 5/9/9/7 layers."""
    case = next(c for c in sailor_cases() if c.id == "sailor-01")
    plan = case.plan
    assert plan.dp == 4 and [s.num_layers for s in plan.pipelines[0].stages] == [5, 9, 9, 7]
    assert all(s.tp == 4 for p in plan.pipelines for s in p.stages)
    assert plan.model.num_layers == 30 and plan.pipelines[0].num_microbatches == 64
    stage = plan.pipelines[1].stages[2]
    assert len({plan.cluster.slots[d].node for d in stage.devices}) == 1  # tp inside a node
    assert plan.training.comm.pipeline_p2p is PipelineP2P.BLOCKING  # DeepSpeed's engine
    assert plan.kernels.attention == "math"


def test_mixed_cluster_with_stand_in_gpus():
    """With stand-ins for the RTX cards the mixed rows build: the RTX-3090 node behind a
    1 Gb/s link, the others on 25 GbE, GeForce-style PCIe inside nodes."""
    cases = {c.id: c for c in sailor_cases(gpu_names=STAND_INS)}
    plan = cases["sailor-30"].plan  # RTX-3090 / RTX-2080 / Titan-RTX stages, tp 8 each
    assert plan is not None and [s.num_layers for s in plan.pipelines[0].stages] == [6, 9, 7]
    first, second = plan.pipelines[0].stages[0].devices[0], plan.pipelines[0].stages[1].devices[0]
    (islands,) = group_tiers(plan.cluster, (first, second))
    assert islands.name == "islands" and islands.bandwidth_bytes_per_s < 1e9 / 8
    assert plan.cluster.node_groups[0].intra_node_link == "pcie-host"
    s = score([c for c in cases.values() if c.group.startswith("mixed")], estimate)
    assert len(s.errors) == 9


def test_scores_by_group():
    s = score(sailor_cases(), estimate)
    groups = s.by_group()
    # the catalog has the RTX cards (issue 14): every row is scored
    assert set(groups) == {"GH200 pipelined", "GH200 data parallel", "mixed RTX pipelined",
                           "mixed RTX data parallel"}
    assert groups["GH200 pipelined"][2] == 20 and groups["GH200 data parallel"][2] == 7
    assert groups["mixed RTX pipelined"][2] == 6 and groups["mixed RTX data parallel"][2] == 3
    assert s.mape == pytest.approx(sum(abs(e) for e in s.errors.values()) / 36)
