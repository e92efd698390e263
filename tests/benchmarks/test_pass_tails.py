"""benchmarks/pass_tails.py: the spread of measured pass times carried through the
simulated schedule (issue 17: where a pipeline's step goes beyond its priced passes)."""

import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import pass_tails
import run_vs_prediction as bench

from planner.specs.model import preset
from planner.specs.plan import save_plan

PROFILE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results",
                       "profiles-debug-small-2026-12-05T1511")


def _measured(times: dict[tuple[int, str, int], list[float]], steps: int) -> dict:
    """What the ranks record: per rank, per step, its passes [kind, chunk, start, end]."""
    ranks = 1 + max(r for r, _, _ in times)
    out: list[list[dict]] = [[{"step_s": 0.1, "passes": []} for _ in range(steps)]
                             for _ in range(ranks)]
    for (rank, kind, chunk), ts in times.items():
        for i, t in enumerate(ts):
            out[rank][i % steps]["passes"].append([kind, chunk, 1.0, 1.0 + t])
    return {"ranks": out}


def test_the_spread_is_each_pass_over_its_groups_median():
    measured = _measured({(0, "F", 0): [1.0, 1.0, 3.0], (1, "B", 1): [2.0, 4.0, 2.0]}, 3)
    groups = pass_tails.groups(measured)
    assert groups == {(0, "F", 0): [1.0, 1.0, 3.0], (1, "B", 1): [2.0, 4.0, 2.0]}
    assert sorted(pass_tails.ratios(groups)) == [1.0, 1.0, 1.0, 1.0, 2.0, 3.0]


@pytest.fixture
def interleaved(tmp_path):
    path = str(tmp_path / "plan.yaml")
    save_plan(bench.KINDS["pp2-interleaved"](preset("debug-small")), path)
    return path


def test_a_spread_of_ones_leaves_the_simulation_as_priced_and_a_tail_lengthens_it(interleaved):
    """Without spread every draw is the priced schedule; with passes now and then 50%
    longer (mean 1.05) the iteration grows, and by more than nothing (a late pass on one
    rank delays the other, which waits for it)."""
    from planner.simulator.build import simulate_graph
    from planner.specs.plan import load_plan
    from profiler.store import load_profiles

    profiles = load_profiles([PROFILE], devices=["CPU"], dtype="fp32")
    sim = simulate_graph(load_plan(interleaved), profiles=profiles)
    priced = max(sim.schedule.end)
    assert pass_tails.drawn_iterations(sim, [1.0], 3) == pytest.approx([priced] * 3)
    tail = [1.0] * 9 + [1.5]
    drawn = pass_tails.drawn_iterations(sim, tail, 40)
    assert statistics.median(drawn) > priced * 1.01
    assert max(sim.schedule.end) == priced  # the simulation itself is left as it was


def test_the_analysis_reports_priced_drawn_and_measured(interleaved):
    measured = _measured({(0, "F", 0): [3e-3, 3.1e-3, 3.3e-3], (0, "B", 0): [6e-3] * 3,
                          (1, "F", 1): [3.5e-3] * 3, (1, "B", 1): [7e-3, 7e-3, 9e-3]}, 3)
    lines: list[str] = []
    out = pass_tails.analyse(measured, interleaved, PROFILE, 20, say=lines.append)
    assert out["measured_median_s"] == pytest.approx(0.1)
    assert out["drawn_median_s"] >= out["priced_s"] * 0.99
    assert out["spread_mean"] > 1.0
    assert any(line.startswith("  1 B 1: 3,") for line in lines)
    assert "simulated as priced" in lines[-1]
