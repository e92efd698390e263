"""The run report's measured iteration time (executor/report.py)."""

from __future__ import annotations

import statistics

import pytest

from executor.report import measured_iteration_s

COMPUTE_S, OPTIMIZER_S, DELAY_S = 0.008, 0.002, 0.005


def _coupled_ranks(steps: int, late: set[int]) -> list[list[float]]:
    """Two data-parallel ranks as the executor times them: each step computes, waits for
    the other at the gradient reduction, then steps its optimizer on its own; rank 0's
    optimizer step is DELAY_S late in the steps of `late` (a preemption). Each rank's step
    is timed from its own start (executor/runtime.py `_train`)."""
    ends = [0.0, 0.0]
    times: list[list[float]] = [[], []]
    for k in range(steps):
        sync = max(end + COMPUTE_S for end in ends)
        new = [sync + OPTIMIZER_S + (DELAY_S if r == 0 and k in late else 0.0) for r in (0, 1)]
        for r in (0, 1):
            times[r].append(new[r] - ends[r])
        ends = new
    return times


def test_a_late_rank_counts_once_not_twice():
    """Rank 0 is late in 2 of every 5 steps; rank 1 then waits for it in the step after.
    Each rank's median is the undisturbed step (10 ms); the slowest rank of each step is
    disturbed in 3 of 5 steps, so the median of the per-step slowest says 15 ms, counting
    every delay twice."""
    late = {k for k in range(40) if k % 5 in (0, 1)}
    per_rank = _coupled_ranks(40, late)
    slowest = [max(pair) for pair in zip(*per_rank, strict=True)]
    assert statistics.median(slowest[2:]) == pytest.approx(COMPUTE_S + OPTIMIZER_S + DELAY_S)
    metrics = {"step_times_s": slowest, "rank_step_times_s": per_rank}
    assert measured_iteration_s(metrics, 2) == pytest.approx(COMPUTE_S + OPTIMIZER_S)


def test_the_slowest_ranks_median_is_the_iteration():
    """Ranks whose typical steps differ (a rank that is always slower): the slower one's."""
    metrics = {"step_times_s": [0.012] * 6,
               "rank_step_times_s": [[0.010] * 6, [0.012, 0.011, 0.012, 0.013, 0.012, 0.012]]}
    assert measured_iteration_s(metrics, 1) == pytest.approx(0.012)


def test_older_metrics_without_per_rank_times_keep_the_median_of_the_slowest():
    metrics = {"step_times_s": [0.1, 0.02, 0.03, 0.01]}
    assert measured_iteration_s(metrics, 1) == pytest.approx(0.02)


def test_a_diverged_run_says_so():
    """An fp16 run at --lr 10 reported losses 5.54, nan, nan, ... with exit 0 and no word
    (audit of 2026-12-06): the report and stderr now say from which step."""
    from types import SimpleNamespace

    from executor.report import diverged

    assert diverged(SimpleNamespace(losses=[5.5, 5.4, 5.3], first_step=0)) is None
    why = diverged(SimpleNamespace(losses=[5.5, float("nan"), float("inf")], first_step=3))
    assert why is not None and why.startswith("the loss is not finite from step 5")
