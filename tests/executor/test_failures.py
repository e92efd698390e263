"""A rank that dies, hangs or raises stops every other rank within 60 s, and each says
which rank it was (executor/watchdog.py)."""

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from planner.specs.model import preset
from planner.specs.plan import save_plan
from tests.executor.distributed import homogeneous, run_forked

LIMIT_S = 60
TINY = preset("debug-tiny")


def _fault_time(run_dir):
    with open(os.path.join(run_dir, "fault.txt"), encoding="utf-8") as fh:
        return float(fh.read().split()[0])


def _notes(run_dir):
    out = {}
    for name in os.listdir(run_dir):
        if name.startswith("stop-rank") and name.endswith(".json"):
            with open(os.path.join(run_dir, name), encoding="utf-8") as fh:
                note = json.load(fh)
            out[note["rank"]] = note
    return out


@pytest.mark.multiprocess
def test_killed_rank_under_plan_run(tmp_path):
    """The real launch: torchrun, then the survivors' watchdogs, then plan run's line."""
    plan = homogeneous(TINY, world=2, pp=2, mbs=1, gbs=4)
    save_plan(plan, str(tmp_path / "plan.yaml"))
    report = tmp_path / "run"
    cmd = [sys.executable, "-m", "planner.cli", "run", "--plan", str(tmp_path / "plan.yaml"),
           "--steps", "50", "--report", str(report), "--inject-fault", "1:3:kill"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    ended = time.time()
    assert out.returncode == 1
    assert ended - _fault_time(report) < LIMIT_S
    culprit = "rank 1 (pipeline 0, stage 1, tp rank 0, GPU 1 on node 0) exited"
    assert f"rank 0 (pipeline 0, stage 0, tp rank 0, GPU 0 on node 0): stopping: {culprit}" \
        in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"plan run: failed: {culprit}"), last


@pytest.mark.multiprocess
@pytest.mark.parametrize(("fault", "blamed", "reason"), [
    ("2:3:hang", 2, "made no progress"),
    ("1:2:error", 1, "failed: RuntimeError: injected fault at step 2"),
    ("3:2:kill", 3, "exited"),
])
def test_every_other_rank_names_the_one_that_failed(tmp_path, fault, blamed, reason):
    # dp 2 x pp 2: the ranks that stop are not all neighbours of the one that failed
    plan = homogeneous(TINY, world=4, dp=2, pp=2, mbs=1, gbs=4)
    codes, metrics = run_forked(plan, tmp_path, steps=50, hang_timeout_s=5, fault=fault)
    ended = time.time()
    assert metrics is None and all(c != 0 for c in codes)
    assert ended - _fault_time(tmp_path) < LIMIT_S
    notes = _notes(tmp_path)
    survivors = [r for r in range(4) if r != blamed]
    assert set(survivors) <= set(notes), notes
    for r in survivors:
        assert f"rank {blamed} (pipeline" in notes[r]["cause"] and reason in notes[r]["cause"]


def test_a_note_cut_short_is_not_the_launchers_failure(tmp_path):
    """A rank killed while writing its note left an empty file, and plan run died on it
    with a JSONDecodeError instead of naming the rank (CI, stop 35)."""
    from executor.launch import first_failure

    (tmp_path / "stop-rank0.json").write_text("", encoding="utf-8")
    (tmp_path / "stop-rank1.json").write_text(
        json.dumps({"time": 2.0, "rank": 1, "cause": "rank 1 exited"}), encoding="utf-8")
    assert first_failure(str(tmp_path)) == "rank 1 exited (1 rank(s) reported it)"


def test_a_rank_writes_its_note_whole_or_not_at_all(tmp_path, monkeypatch):
    """The note is written aside and renamed: a reader never sees a partial one."""
    from executor import watchdog

    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append(sorted(os.listdir(tmp_path)))
        real_replace(src, dst)

    monkeypatch.setattr(watchdog.os, "replace", replace)
    dog = watchdog.Watchdog.__new__(watchdog.Watchdog)
    dog.run_dir, dog.rank = str(tmp_path), 0
    dog._report("rank 0: stopping", cause="rank 1 exited")
    assert seen == [["stop-rank0.json.part"]]
    assert sorted(os.listdir(tmp_path)) == ["stop-rank0.json"]
    note = json.loads((tmp_path / "stop-rank0.json").read_text(encoding="utf-8"))
    assert note["cause"] == "rank 1 exited" and note["rank"] == 0
