"""The benchmark's guard against a machine whose speed moves without visible load
(benchmarks/run_vs_prediction.py: `speed_probe_s`, `speed_against`, `disturbance`)."""

import argparse
import os
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import run_vs_prediction as bench

ARGS = argparse.Namespace(max_foreign=0.1, max_drift=0.1)


def test_the_speed_of_a_trial_is_its_probe_furthest_from_the_profiles():
    assert bench.speed_against(2.0, (2.0, 2.5)) == pytest.approx(0.8)
    assert bench.speed_against(2.0, (1.6, 2.1)) == pytest.approx(1.25)
    assert bench.speed_against(2.0, (2.0,)) == 1.0


def test_a_trial_is_disturbed_by_load_or_by_a_slower_machine_alone():
    assert bench.disturbance(0.0, 1.0, ARGS) == 0.0
    assert bench.disturbance(0.05, 0.95, ARGS) <= 1.0
    # 2026-12-02: a profile's GEMMs ran 1.4x slower at 0.00 foreign cores
    assert bench.disturbance(0.0, 1 / 1.4, ARGS) > 1.0
    assert bench.disturbance(0.3, 1.0, ARGS) > 1.0
    assert bench.disturbance(0.0, 1.0, argparse.Namespace(max_foreign=0.0, max_drift=0.1)) == 0.0


def test_the_probe_times_its_gemm():
    m, n, k = bench.PROBE_SHAPE
    t = bench.speed_probe_s()
    assert 0 < t < 1.0
    assert 2 * m * n * k / t > 1e8  # over 0.1 GFLOP/s: it ran the GEMM, not a no-op


def test_a_row_over_rounds_is_its_median_round():
    rounds = [{"measured_ms": m, "error": e} for m, e in ((120.0, -0.2), (100.0, 0.0),
                                                          (140.0, -0.3))]
    row = bench.median_of_rounds(rounds)
    assert row["measured_ms"] == 120.0 and row["error"] == -0.2
    assert row["rounds_ms"] == [120.0, 100.0, 140.0]
    assert bench.median_of_rounds(rounds[:2])["measured_ms"] == 100.0  # the lower of two
    assert bench.median_of_rounds(rounds[:1])["rounds_ms"] == [120.0]
