"""`plan run` against its prediction with the host-side costs measured on this machine
(issue 17): the two plan kinds the simulator missed most before them, ZeRO-3 on FSDP2
(-40%) and tp 2 with DTensor (-48%), on debug-small over 2 CPU ranks.

The bound here is 25%, not the benchmark's 10%: CI runs on a shared 2-core machine where
another process's load slows the two ranks unevenly (benchmarks/run_vs_prediction.py and
docs/executor.md hold the 10% table and the load it was measured under). What cannot be
blamed on load is also checked: the measured host costs move each prediction towards the
measurement. A profile and a run that lose to a burst of load are retried once.
"""

import json
import os
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import run_vs_prediction as bench

from planner.specs.model import preset
from planner.specs.plan import save_plan

MODEL, KINDS, BOUND, ATTEMPTS = "debug-small", ("dp2-zero3", "tp2"), 0.25, 2


def _errors(folder: str) -> dict[str, tuple[float, float]]:
    """Per kind: (error with host costs, error without) of one run."""
    bench.profile(folder, MODEL)
    out = {}
    for kind in KINDS:
        plan = bench.KINDS[kind](preset(MODEL))
        path = os.path.join(folder, f"{kind}.yaml")
        save_plan(plan, path)
        report, _ = bench.trial(path, folder, steps=10, warmup=3)
        measured = report["measured_iteration_s"]
        without = bench.predicted_without_host_s(plan, folder)
        assert "measured host costs" in report["prediction_source"]
        out[kind] = (report["iteration_error"], without / measured - 1)
    return out


@pytest.mark.slow
def test_host_costs_bring_fsdp2_and_dtensor_runs_within_the_bound(tmp_path):
    tries = []
    for attempt in range(ATTEMPTS):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        errors = _errors(str(folder))
        tries.append(errors)
        if all(abs(e) < BOUND and abs(e) < abs(before) for e, before in errors.values()):
            break
    last = tries[-1]
    report = json.dumps(tries)
    for kind, (error, before) in last.items():
        assert abs(error) < abs(before), f"{kind}: host costs moved it away: {report}"
        assert abs(error) < BOUND, f"{kind}: {error:+.1%} (errors per attempt {report})"
