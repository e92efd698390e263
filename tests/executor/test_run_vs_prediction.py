"""`plan run` against its prediction with the host-side costs measured on this machine
(issue 17): the two plan kinds the simulator missed most before them, ZeRO-3 on FSDP2
(-40%) and tp 2 with DTensor (-48%), on debug-small over 2 CPU ranks.

The bound here is 25%, not the benchmark's 10%, and it is asserted only for a run during
which other processes used at most 0.3 cores: CI runs on a shared 2-core machine where
another process's load slows the two ranks unevenly and by more than the profile saw
(docs/executor.md shows runs under a load average of 5-8 missing by 40-65%). A loaded
attempt is retried (after waiting up to a minute for a quiet machine); if every attempt
was loaded the test is skipped, saying so. On a quiet run it also asserts that the
measured host costs move each prediction towards the measurement. That is not asserted
under load either: the shared-core ratio prices the load of the moment the profile was
measured, and a run beside less load then lands on the other side (2026-12-01, foreign
load 0.87 cores: tp2 +63% with host costs against -62% without; the attempts before,
+8% and +24% against -68% and -74%; dp2-zero3 -20%, -13%, -19% against -67%, -66%, -68%).
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

MODEL, KINDS, BOUND, ATTEMPTS = "debug-small", ("dp2-zero3", "tp2"), 0.25, 3
QUIET_CORES = 0.3  # foreign load under which the bound is asserted


def _errors(folder: str) -> dict[str, tuple[float, float, float]]:
    """Per kind: (error with host costs, error without, foreign load) of one run."""
    bench.wait_quiet(QUIET_CORES, 60)
    bench.profile(folder, MODEL, nprocs=(2,))
    out = {}
    for kind in KINDS:
        plan = bench.KINDS[kind](preset(MODEL))
        path = os.path.join(folder, f"{kind}.yaml")
        save_plan(plan, path)
        report, foreign = bench.trial(path, folder, steps=10, warmup=3)
        measured = report["measured_iteration_s"]
        without = bench.predicted_without_host_s(plan, folder)
        assert "measured host costs" in report["prediction_source"]
        out[kind] = (report["iteration_error"], without / measured - 1, foreign)
    return out


@pytest.mark.slow
def test_host_costs_bring_fsdp2_and_dtensor_runs_within_the_bound(tmp_path):
    tries = []
    for attempt in range(ATTEMPTS):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        errors = _errors(str(folder))
        tries.append(errors)
        quiet = all(f <= QUIET_CORES for _, _, f in errors.values())
        if quiet:
            for kind, (error, before, _) in errors.items():
                assert abs(error) < abs(before), \
                    f"{kind}: host costs moved it away: {json.dumps(tries)}"
                assert abs(error) < BOUND, \
                    f"{kind}: {error:+.1%} (errors per attempt {json.dumps(tries)})"
            return
    pytest.skip(f"every attempt ran beside other load (> {QUIET_CORES} cores): "
                f"{json.dumps(tries)}")
