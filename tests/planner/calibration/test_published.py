"""Simulator accuracy against published measurements (bounds from the simulator issue).

If one of these fails after a change, the change made the predictions worse: fix the
model or recalibrate (python -m planner.calibration.fit, docs/calibration.md), never the bound.
"""

import os
import re
import subprocess
import sys

import pytest

from planner.calibration.published import (
    VALIDATION_DIR,
    korthikanti_layer_cases,
    layer_errors,
    published_cases,
    summarize,
    vtrain_cases,
    vtrain_groups,
    vtrain_rows,
)
from planner.simulator import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCORER = os.path.join(ROOT, "benchmarks", "score_published.py")


def test_published_rows():
    s = summarize(published_cases(), simulate)
    assert not s.failed
    assert s.mape <= 0.05, f"MAPE {s.mape:.3f}"
    assert s.max_abs <= 0.15, max(s.errors.items(), key=lambda kv: abs(kv[1]))


def test_vtrain_single_node_a100():
    """vTrain's 1,440 single-node runs (vTrain itself reports 8.4% with profiled kernels)."""
    s = summarize(vtrain_cases(), simulate)
    assert s.count == 1440 and not s.failed
    assert s.mape <= 0.07, f"MAPE {s.mape:.3f}"


@pytest.mark.slow
def test_the_shared_scorer_agrees():
    """The project's own scorer, run against `plan` exactly as users run it."""
    out = subprocess.run(
        [sys.executable, SCORER, os.path.join(VALIDATION_DIR, "published_visible.csv"),
         "--plan", f"{sys.executable} -m planner.cli"],
        capture_output=True, text=True, check=True, timeout=600).stdout
    mape = float(re.search(r"^MAPE ([\d.]+)% \((\d+) of (\d+) rows\)", out, re.M).group(1))
    worst = float(re.search(r"max \|err\| ([\d.]+)%", out).group(1))
    assert "FAILED" not in out
    assert mape <= 5.0 and worst <= 15.0, out[-400:]


def test_layer_times_match_korthikanti_table_4():
    """One layer of the 22B model at tp 8, micro-batch 4 (Korthikanti et al. 2022 Table 4):
    forward and backward per recompute / sequence-parallel setting within 10%."""
    errors = layer_errors(korthikanti_layer_cases())
    assert len(errors) == 10
    assert max(abs(e) for e in errors.values()) <= 0.10, errors


def test_vtrain_groups_split_the_error_by_what_rows_share():
    """The breakdown `python -m planner.calibration.published` prints: counts per tp
    degree (vTrain's design: 640 / 480 / 240 / 80 rows at tp 1 / 2 / 4 / 8), each group's
    own mean, and shares that add up to the set's MAPE."""
    rows = vtrain_rows()
    errors = {f"vtrain-{i:04d}": (-0.2 if r["tp"] == 8 else 0.1) for i, (r, _) in enumerate(rows)}
    groups = {g.key: g for g in vtrain_groups(errors, ("tp",))}
    assert {k: g.count for k, g in groups.items()} == {(1,): 640, (2,): 480, (4,): 240, (8,): 80}
    assert groups[(8,)].mean == pytest.approx(-0.2) and groups[(8,)].mape == pytest.approx(0.2)
    assert groups[(1,)].mean == pytest.approx(0.1)
    total = sum(abs(e) for e in errors.values()) / len(errors)
    assert sum(g.share for g in groups.values()) == pytest.approx(total)
    with pytest.raises(ValueError, match="unknown vTrain field"):
        vtrain_groups(errors, ("batch",))


@pytest.mark.parametrize("argv, said", [
    (["--by", "tp,model"], "--by: unknown field 'model' in 'tp,model'; choose from gpus"),
    (["--dgxc-by", "gpu", "rack"], "--dgxc-by: unknown field 'rack' in 'rack'"),
])
def test_an_unknown_grouping_field_is_a_usage_error_before_scoring(argv, said, capsys):
    from planner.calibration.published import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert said in capsys.readouterr().err
