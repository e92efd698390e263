"""Op times from a profile first, the analytic model for the rest, and which answered."""

import math

import pytest

from planner.costs.compute import ANALYTIC_SOURCE, ComputeCosts, compute_source
from planner.costs.stages import clear_cost_caches, cost_sources, layer_parts, plan_costs
from planner.costs.workload import Op, WorkloadShape, layer_work
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from profiler.devices import device
from profiler.store import load_profile, load_profiles
from tests.planner.profile_helpers import op_row, write_profile

MODEL = preset("debug-small")
SHAPE = WorkloadShape(micro_batch_size=8, seq_len=64, dtype="fp32", attention="flash")


def _ops():
    work = layer_work(MODEL, SHAPE)
    return [op for op in (*work.forward, *work.backward) if isinstance(op, Op)]


def _gemm_profile(tmp_path, factor=3.0):
    """Every GEMM of the layer measured at `factor` x its analytic time."""
    analytic = ComputeCosts(device("CPU"), "fp32")
    rows = [op_row(op, factor * analytic.time_s(op)) for op in _ops() if op.kind == "gemm"]
    return write_profile(tmp_path / "cpu.csv", rows)


def test_profile_answers_what_it_has_and_analytic_the_rest(tmp_path):
    profile = load_profile(_gemm_profile(tmp_path))
    analytic = ComputeCosts(device("CPU"), "fp32")
    measured = ComputeCosts(device("CPU"), "fp32", profile)
    for op in _ops():
        factor = 3.0 if op.kind == "gemm" else 1.0
        assert measured.time_s(op) == analytic.time_s(op) * factor
    source = compute_source((profile, op) for op in _ops())
    assert source.startswith(f"measured profile {profile.path} (gemm)")
    assert f"{ANALYTIC_SOURCE} for the rest (" in source and "attn.norm" in source
    assert compute_source((None, op) for op in _ops()) == ANALYTIC_SOURCE


def _fc1(mbs):
    work = layer_work(MODEL, WorkloadShape(micro_batch_size=mbs, seq_len=64, dtype="fp32"))
    return next(op for op in work.forward if getattr(op, "name", "") == "mlp.fc1")


def test_other_sizes_scale_the_analytic_model_by_the_nearest_measurement(tmp_path):
    """Outside the measured sizes the profile's measured / analytic ratio at its nearest
    measurement carries over: continuous at the edge, monotone, never the raw analytic
    model (which priced a CPU 3x fast from 2x the profiled micro-batch on: a plan of mbs
    17 came out faster than one of mbs 16, and tp 2 halves ran as slow as the whole GEMM,
    sweep of 2026-12-03)."""
    profile = load_profile(_gemm_profile(tmp_path))
    measured = ComputeCosts(device("CPU"), "fp32", profile)
    analytic = ComputeCosts(device("CPU"), "fp32")
    for mbs in (1, 2, 4, 12, 16, 17, 64):  # measured at 8 only: every size is outside
        assert measured.time_s(_fc1(mbs)) == pytest.approx(3.0 * analytic.time_s(_fc1(mbs)))
    times = [measured.time_s(_fc1(mbs)) for mbs in range(1, 40)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    source = compute_source((profile, _fc1(mbs)) for mbs in (8, 16))
    assert source == (f"measured profile {profile.path} (gemm); outside the sizes "
                      f"{profile.path} measured: the analytic model scaled by its nearest "
                      "measurement (mlp.fc1)")


def test_sizes_between_measurements_interpolate_along_the_ops_series(tmp_path):
    analytic = ComputeCosts(device("CPU"), "fp32")
    rows = [op_row(_fc1(mbs), t) for mbs, t in ((4, 1e-3), (16, 3e-3))]
    profile = load_profile(write_profile(tmp_path / "p.csv", rows))
    measured = ComputeCosts(device("CPU"), "fp32", profile)
    assert measured.time_s(_fc1(8)) == pytest.approx(math.sqrt(1e-3 * 3e-3))  # log-log
    assert measured.time_s(_fc1(2)) == pytest.approx(
        1e-3 * analytic.time_s(_fc1(2)) / analytic.time_s(_fc1(4)))  # the smaller end's
    assert measured.time_s(_fc1(32)) == pytest.approx(
        3e-3 * analytic.time_s(_fc1(32)) / analytic.time_s(_fc1(16)))  # the larger end's


def test_cost_caches_keep_profiled_and_analytic_apart(tmp_path):
    profiles = load_profiles([_gemm_profile(tmp_path)], devices=["CPU"], dtype="fp32")
    tiers = (("tp", ()), ("cp", ()))
    clear_cost_caches()
    plain = layer_parts(MODEL, SHAPE, device("CPU"), tiers, "none")
    profiled = layer_parts(MODEL, SHAPE, device("CPU"), tiers, "none", profiles)
    assert profiled[0].compute_s > plain[0].compute_s * 1.5
    assert layer_parts(MODEL, SHAPE, device("CPU"), tiers, "none") == plain  # no mixing
    other = load_profiles([_gemm_profile(tmp_path / "..", factor=2.0)], devices=["CPU"],
                          dtype="fp32")
    assert layer_parts(MODEL, SHAPE, device("CPU"), tiers, "none", other) != profiled


def test_plan_costs_and_sources_use_the_profile(tmp_path):
    cfg = ParallelConfig(mbs=8, gbs=8, seq_len=64, dtype="fp32")
    plan = homogeneous_plan(MODEL, parse_gpus_arg("CPU:1"), cfg)
    profiles = load_profiles([_gemm_profile(tmp_path)], devices=["CPU"], dtype="fp32")
    plain, profiled = plan_costs(plan).costs[0][0], plan_costs(plan, profiles).costs[0][0]
    assert profiled.forward.compute_s > plain.forward.compute_s
    sources = cost_sources(plan, profiles)
    assert "measured profile" in sources["compute"] and "gemm" in sources["compute"]
    assert cost_sources(plan, None)["compute"] == ANALYTIC_SOURCE


def test_calibration_source_says_what_each_gpu_types_numbers_rest_on():
    """`sources: calibration` (planner/costs/compute.py `calibration_source`): a fitted
    architecture names its data (docs/calibration.md), a catalog type with its own fit names
    Zorse, an architecture without measurements says so, and a catalog file's own values are
    named as the file's."""
    import dataclasses

    from planner.costs.compute import calibration_source
    from profiler.devices import device

    text = calibration_source([device("A100-80GB-SXM"), device("GB200-186GB"), device("L4-24GB"),
                               device("MI300X-192GB")])
    a100, gb200, l4, mi300x = text.split("; ")
    assert "vTrain" in a100 and "ampere" in a100
    assert gb200.startswith("GB200-186GB") and "DGX Cloud GB200" in gb200
    assert "Megatron-Bridge" in gb200 and "NOT calibrated" not in gb200
    assert "Zorse" in l4
    assert mi300x.startswith("MI300X-192GB") and "NOT calibrated" in mi300x
    custom = dataclasses.replace(device("L4-24GB"), memory_gib=20)  # a user's variant
    assert "from the catalog file" in calibration_source([custom])
    assert calibration_source([device("CPU")]) == ""


def test_a_measurement_carried_to_other_sizes_never_passes_the_gpus_peak(tmp_path):
    """A profile measured near the peak, carried to a GEMM the analytic model runs closer
    to the peak (its tiles fill the GPU better), was priced past it: a synthetic H100
    profile extrapolated a GEMM 100x its largest measured to 102% of the bf16 peak
    (profile sweep, 2026-12-04). No kernel outruns its precision's datasheet peak
    (`peak_time_s`); sizes inside the measured range are as measured."""
    h100 = device("H100-80GB-SXM")
    shape = WorkloadShape(micro_batch_size=1, seq_len=512, dtype="bf16", attention="flash")
    small = next(op for op in layer_work(preset("llama3-8b"), shape).forward
                 if getattr(op, "name", "") == "mlp.fc1")
    peak = h100.peak_tflops["bf16"] * 1e12
    at = small.flops / (0.98 * peak)  # measured at 98% of the peak
    profile = load_profile(write_profile(tmp_path / "h100.csv", [op_row(small, at)],
                                         device="H100-80GB-SXM", dtype="bf16"))
    costs = ComputeCosts(h100, "bf16", profile)
    assert costs.time_s(small) == at
    for mbs in (16, 64):
        big = next(op for op in layer_work(preset("llama3-8b"), WorkloadShape(
            micro_batch_size=mbs, seq_len=512, dtype="bf16", attention="flash")).forward
            if getattr(op, "name", "") == "mlp.fc1")
        uncapped = at / ComputeCosts(h100, "bf16").time_s(small) \
            * ComputeCosts(h100, "bf16").time_s(big)
        assert big.flops / uncapped > peak  # what the scaling alone would price
        assert costs.time_s(big) == pytest.approx(big.flops / peak)


def test_a_users_numbers_are_credited_to_the_users_file(tmp_path):
    """A --catalog override (A100-80GB-SXM: {memory_gib: 40}) kept the datasheet as its
    source, and the sources line credited its numbers to it (CLI audit, 2026-12-06)."""
    from planner.costs.compute import calibration_source
    from profiler.devices import load_catalog

    path = tmp_path / "cat.yaml"
    path.write_text("A100-80GB-SXM: {memory_gib: 40}\n")
    a100 = load_catalog(str(path))["A100-80GB-SXM"]
    assert a100.memory_gib == 40
    assert a100.source.startswith(f"{path}: memory_gib overridden; otherwise NVIDIA A100")
    assert f"(its numbers from the user's file: {path}: memory_gib overridden" in (
        calibration_source([a100]))
    path.write_text("A100-80GB-SXM: {memory_gib: 40, source: our 40 GB parts}\n")
    assert load_catalog(str(path))["A100-80GB-SXM"].source == "our 40 GB parts"
