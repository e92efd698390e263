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
    """Row 1: GPT-Neo-2.7B, 4 stages x 4 replicas, [GH-96, tp 4] each. The artifact lists
    7/9/9/9 entries (plan_config_N16_D4.json: 0-6, 7-15, 16-24, 25-33), the embedding
    and the head among them; the CSV's 6/9/9/8 are the transformer layers, 32 in all
    (`test_stage_layers_are_deepspeeds_uniform_split`)."""
    case = next(c for c in sailor_cases() if c.id == "sailor-01")
    plan = case.plan
    assert plan.dp == 4 and [s.num_layers for s in plan.pipelines[0].stages] == [6, 9, 9, 8]
    assert all(s.tp == 4 for p in plan.pipelines for s in p.stages)
    assert plan.model.num_layers == 32 and plan.pipelines[0].num_microbatches == 64
    stage = plan.pipelines[1].stages[2]
    assert len({plan.cluster.slots[d].node for d in stage.devices}) == 1  # tp inside a node
    assert plan.training.comm.pipeline_p2p is PipelineP2P.BLOCKING  # DeepSpeed's engine
    assert plan.kernels.attention == "math"


def test_stage_layers_are_deepspeeds_uniform_split():
    """The runs built the whole model and let DeepSpeed split it: run_opt.slurm passes
    `--num-layers 24` to pretrain_gpt.py, whose model_provider builds OPTModelPipe /
    GPTNeoModelPipe without `layers_per_stage`, so PipelineModule takes
    `partition_method='uniform'` over its layer specs (deepspeed runtime/utils.py
    `partition_uniform`: equal chunks, the remainder one each to the first stages). The
    specs are two casts, the embedding, the transformer layers and one last module (OPT's
    head, GPT-Neo's final LayerNorm). That split gives every row's `stage_layers` as
    transformer layers per stage, all of the model's in total; the plans hold them so."""
    import csv
    import json

    from planner.calibration.sailor import SAILOR_CSV

    def partition_uniform(items: int, parts: int) -> list[int]:
        chunk, rest = divmod(items, parts)
        return [p * chunk + min(p, rest) for p in range(parts + 1)]

    cases = {c.id: c for c in sailor_cases(gpu_names=STAND_INS)}
    for r in csv.DictReader(open(SAILOR_CSV, encoding="utf-8")):
        layers, pp = int(r["layers"]), int(float(r["pp"]))
        specs = ["cast", "embedding", "cast", *["layer"] * layers, "last"]
        bounds = partition_uniform(len(specs), pp)
        split = [specs[bounds[k]:bounds[k + 1]].count("layer") for k in range(pp)]
        assert split == [int(x) for x in r["stage_layers"].split("/")], r["row_id"]
        plan = cases[f"sailor-{int(r['row_id']):02d}"].plan
        assert plan is not None and plan.model.num_layers == layers
        assert len(json.loads(r["stage_replicas"])) == pp
        assert [s.num_layers for s in plan.pipelines[0].stages] == split


def test_mixed_cluster_with_stand_in_gpus():
    """With stand-ins for the RTX cards the mixed rows build: the RTX-3090 node behind a
    1 Gb/s link, the others on 25 GbE, GeForce-style PCIe inside nodes."""
    cases = {c.id: c for c in sailor_cases(gpu_names=STAND_INS)}
    plan = cases["sailor-30"].plan  # RTX-3090 / RTX-2080 / Titan-RTX stages, tp 8 each
    assert plan is not None and [s.num_layers for s in plan.pipelines[0].stages] == [7, 9, 8]
    first, second = plan.pipelines[0].stages[0].devices[0], plan.pipelines[0].stages[1].devices[0]
    (islands,) = group_tiers(plan.cluster, (first, second))
    assert islands.name == "islands" and islands.bandwidth_bytes_per_s < 1e9 / 8
    assert plan.cluster.node_groups[0].intra_node_link == "pcie-host"
    s = score([c for c in cases.values() if c.group.startswith("mixed")], estimate)
    assert len(s.errors) == 8 and set(s.excluded) == {"sailor-30"}  # row 34's record


def test_scores_by_group():
    """Every row scores now that the catalog has the RTX cards."""
    s = score(sailor_cases(), estimate)
    groups = s.by_group()
    assert {g: n for g, (_, _, n) in groups.items()} == {
        "GH200 pipelined": 20, "GH200 data parallel": 6, "mixed RTX pipelined": 5,
        "mixed RTX data parallel": 3}
    # row 8: below its own profile (next test); row 30: row 34's record, copied
    assert set(s.excluded) == {"sailor-08", "sailor-30"}
    assert s.mape == pytest.approx(sum(abs(e) for e in s.errors.values()) / 34)


def test_row_8_is_below_the_artifacts_own_profile():
    """Sailor's measured profile of GPT-Neo-2.7B on one GH200 (eth-easl/sailor@142ddeb,
    profiles/GPT-Neo-2.7/GH-96/profile.json): one layer at micro-batch 4, tp 4 takes
    3.206 ms forward + 7.259 ms backward. Row 8 (dp 4 x tp 4, 32 layers in one stage,
    128 / (4 x 4) = 8 micro-batches) needs 8 x 32 x 10.465 ms = 2.68 s of layer compute
    alone; it was logged at 1.061 s. Every other GPT-Neo row takes 1.10-3.2x its bound."""
    import csv

    from planner.calibration.sailor import SAILOR_CSV, profile_bound_s

    rows = {r["row_id"]: r for r in csv.DictReader(open(SAILOR_CSV, encoding="utf-8"))}
    assert profile_bound_s(rows["8"]) == pytest.approx(8 * 32 * (3.206e-3 + 7.259e-3))
    ratios = {i: float(r["measured_iter_time_s"]) / b for i, r in rows.items()
              if (b := profile_bound_s(r)) is not None}
    assert len(ratios) == 12  # the GPT-Neo rows; OPT and the mixed rows have no profile
    assert ratios["8"] < 0.5 and min(v for i, v in ratios.items() if i != "8") > 1.1
    cases = {c.id: c for c in sailor_cases()}
    assert "Sailor's own profile" in cases["sailor-08"].inconsistent
    assert "copied" in cases["sailor-30"].inconsistent
    assert all(not c.inconsistent for c in cases.values()
               if c.id not in ("sailor-08", "sailor-30"))


def test_rows_run_in_the_dtype_the_run_used():
    """The artifact's image is nvcr.io/nvidia/pytorch:24.10-py3 (eth-easl/sailor
    Dockerfile), whose TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 runs fp32 matmuls in TF32 where
    the GPU has it (GH200, RTX 3090); Turing (Titan RTX, RTX 2080 Ti) has no TF32, so its
    GEMMs run on the CUDA cores."""
    from profiler.analytic import on_cuda_cores

    for c in sailor_cases():
        assert c.plan is not None and c.plan.training.dtype == "tf32"
        for g in c.plan.cluster.node_groups:
            assert on_cuda_cores(g.device, "tf32") == (g.device.arch == "turing"), g.gpu


def test_rows_apply_the_dropout_their_layers_apply():
    """Sailor's Megatron-DeepSpeed OPT applies no dropout at all, its GPT-Neo its two
    residual dropouts but not the attention's (sailor._DROPOUT); the plans had priced
    Megatron's default dropout everywhere, which Sailor's logged memory refutes
    (test_sailor_memory.py)."""
    for c in sailor_cases():
        assert c.plan is not None
        m = c.plan.model
        assert not m.drops_attention
        assert m.dropout == m.name.startswith("GPT-Neo"), m.name


# Measured mean |error| of the event simulation over the 34 scored rows and per group
# (14.1%; 12.8 / 16.2 / 10.0 / 25.5%, rounded up by under a point); Sailor's own simulator
# on them: 9.6% (9.1 / 10.4 / 4.1 / 19.9%). Row 8 (+234%) is printed but not scored: its
# logged time is 0.40x the compute its layout needs by Sailor's own profile; row 30's
# record is row 34's (docs/calibration.md, "Sailor").
# 2026-12-07: the bounds were 0.145 / 0.15 / 0.12 / 0.10 / 0.25 (14.3%; 14.9 / 11.3 / 9.4 /
# 24.7%) while the plans priced dropout the runs do not apply (OPT none, GPT-Neo no
# attention dropout; `test_rows_apply_the_dropout_their_layers_apply`). With the dropout
# the runs ran, GPT-Neo's rows got faster (GH200 pipelined 14.9 -> 14.6%) and OPT's, already
# too fast, faster still: those bounds rose with the inputs made true, not with the model.
# mixed RTX data parallel: 0.235 until its gradient rings were counted by their own ranks
# (rows 33 and 36: 6 ranks over two islands, 1 + 5 nodes, had been priced as 2 x 5 = 10);
# the logged reductions of rows 35 and 36 came within 4% (below), the rows' end-to-end
# error moved from 22.8% to 24.7%: the RTX runs' missing time is not in their collectives
# 2026-12-07 (later): 0.16 / 0.15 / 0.17 / 0.12 / 0.28 (15.6%; 14.6 / 16.6 / 11.3 / 27.2%)
# until the fp32 softmax's backward was priced as autograd runs it and the quad GH200 as
# the full NVLink mesh it is (docs/calibration.md, "Sailor: the fp32 softmax backward and
# the GH200 mesh"); each alone moves one group past its bound, together every group gains.
# Then mixed RTX 0.09 / 0.24 (8.5 / 23.3%) until Sailor's "RTX-2080" was priced as the
# RTX 2080 Ti it is (its layer profile fits like the Titan RTX's; "Sailor: the RTX-2080 is
# an RTX 2080 Ti"): those runs, already too fast, got faster; the bound rose with the
# input made true.
SAILOR_BOUND = {"all": 0.145, "GH200 pipelined": 0.135, "GH200 data parallel": 0.17,
                "mixed RTX pipelined": 0.105, "mixed RTX data parallel": 0.26}


def test_simulated_accuracy():
    from planner.simulator import simulate

    s = score(sailor_cases(), simulate)
    assert s.mape <= SAILOR_BOUND["all"], f"{s.mape:.3f}"
    for group, (ours, _, _) in s.by_group().items():
        assert ours <= SAILOR_BOUND[group], f"{group}: {ours:.3f}"


def test_tp_slices_share_the_slow_island_link():
    """Row 28: the RTX-3090 stage (tp 2) sends to the Titan-RTX stage (tp 2) over the
    1 Gb/s link. DeepSpeed's PipelineEngine partitions the activation over the tp ranks
    (`is_pipe_partitioned`), and both slices cross the one link at once: a transfer takes
    the whole activation's time on the link (2 x 2048 x 1024 x 4 B at 0.96 x 1 Gb/s,
    0.14 s), not half of it. The pipelined mixed rows' error falls from 31% to 9% with it."""
    from planner.costs.stages import plan_costs

    case = next(c for c in sailor_cases() if c.id == "sailor-28")
    assert case.plan is not None and case.plan.pipelines[0].stages[0].tp == 2
    activation = 2 * 2048 * 1024 * 4
    link = 1e9 / 8 * 0.96
    assert plan_costs(case.plan).costs[0][0].p2p_s == pytest.approx(activation / link, rel=0.02)


def test_gradient_reduction_as_the_artifact_logged_it():
    """The artifact logs each run's gradient reduction (`red_grads`, plan_config_N6_D2 /
    N6_D3 / N6_D6.json, saha18uiuc/sailor@13b79423 and @37ded108, whose `real` are rows
    34-36's): 5.46 / 8.89 / 22.64 s. Only stage 0 (the RTX-3090 node with RTX-2080
    replicas, tp 8) reduces over the 1 Gb/s link in rows 34 and 35; its 8 tp rings share
    it with no other stage's (row 36 has one stage). Counting every GPU of the replica
    (24 in row 34) gave about 15.7 s there; counting 2 x 5 ranks for row 36's 6 (one on
    the RTX-3090 island, five on the other) and 2 x 2 for row 35's 3 gave +12.5% and +16.9%,
    now within 6%."""
    from planner.costs.stages import plan_costs

    logged = {"sailor-34": 5.4637, "sailor-35": 8.89421, "sailor-36": 22.63707}
    cases = {c.id: c for c in sailor_cases()}
    for case_id, seconds in logged.items():
        plan = cases[case_id].plan
        assert plan is not None
        stage0 = plan_costs(plan).costs[0][0]
        assert stage0.dp.grad_iteration_s == pytest.approx(seconds, rel=0.06), case_id
