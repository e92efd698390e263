"""`plan run`: flags checked before anything starts; no folder left behind; nothing
written outside the report folder."""

import tempfile

import pytest

from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Kernels, save_plan
from tests.planner.cli_helpers import run_cli


@pytest.fixture
def plan_file(tmp_path):
    cpu = ClusterSpec(name="cpu", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=2, gpus_per_node=1,
        intra_node_link="loopback"),)).resolved()
    plan = homogeneous_plan(preset("debug-tiny"), cpu, ParallelConfig(
        pp=2, mbs=1, gbs=4, seq_len=32, dtype="fp32"),
        kernels=Kernels(attention="math", optimizer="foreach"))
    path = tmp_path / "plan.yaml"
    save_plan(plan, str(path))
    return str(path)


@pytest.mark.parametrize("flags, needle", [
    (["--hang-timeout", "nan"], "argument --hang-timeout: 'nan' is not allowed (a finite number)"),
    (["--hang-timeout", "0"], "argument --hang-timeout: 0.0 is not allowed (must be > 0)"),
    (["--lr", "inf"], "argument --lr: 'inf' is not allowed"),
    (["--seed", "-1"], "argument --seed: -1 is not allowed (must be ≥ 0)"),
    (["--name", "../../x"], "--name: '../../x' is not allowed (a folder name under reports/"),
    (["--name", "/tmp/x"], "--name: '/tmp/x' is not allowed"),
    (["--name", ".."], "--name: '..' is not allowed"),
    (["--report", "plan.yaml"], "--report: 'plan.yaml' is not allowed (a folder, not a file)"),
    (["--checkpoint-dir", "plan.yaml"], "--checkpoint-dir: 'plan.yaml' is not allowed"),
])
def test_bad_flags_before_anything_starts(tmp_path, monkeypatch, capsys, plan_file, flags,
                                          needle):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", "--plan", "plan.yaml", *flags], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("steps", ["1", "2", "5"])
def test_a_short_run_takes_less_warm_up_without_being_told(capsys, plan_file, steps):
    """The default warm-up (5 steps) shrinks to leave one measured step: `--steps 2` was
    refused over a --warmup the user never gave."""
    pytest.importorskip("torch")
    code, out, err = run_cli(["run", "--plan", plan_file, "--steps", steps, "--dry-run"],
                             capsys)
    assert code == 0 and f"--steps {steps}" in out, err


def test_no_temporary_folder_is_left(tmp_path, monkeypatch, capsys, plan_file):
    """Every `plan run --plan` left an empty trainplan-run-* folder in /tmp."""
    pytest.importorskip("torch")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    code, out, err = run_cli(["run", "--plan", plan_file, "--dry-run"], capsys)
    assert code == 0 and "torchrun" in out, err
    assert list(scratch.iterdir()) == []


def _saved(root, *steps):
    """Checkpoint folders as a finished save leaves them (the marker is enough here)."""
    from executor.checkpoint_dirs import COMPLETE

    for step in steps:
        folder = root / f"step-{step:08d}"
        folder.mkdir(parents=True)
        (folder / COMPLETE).write_text("{}")


def test_checkpoints_of_an_earlier_run_are_checked_before_launching(tmp_path, monkeypatch,
                                                                    capsys, plan_file):
    """--resume with --steps at or below the checkpoint's step ran no step and ended in a
    StatisticsError traceback; a fresh run into a folder of an earlier run's checkpoints
    overwrote some steps and left the rest, so a later --resume took the earlier run's."""
    monkeypatch.chdir(tmp_path)
    _saved(tmp_path / "ck", 50, 100)
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "100", "--dry-run"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--steps: 100 is not allowed (more than the step of the checkpoint it resumes " \
           "from, 100" in err
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck",
                            "--checkpoint-every", "50", "--dry-run"], capsys)
    assert code == 2 and "it holds an earlier run's, up to step 100" in err, err
    code, out, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                              "--steps", "101", "--dry-run"], capsys)
    assert code == 0, err
    # an explicit warm-up longer than what is left to run was dropped without a word
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "101", "--warmup", "1", "--dry-run"], capsys)
    assert code == 2 and "--warmup: 1 is not allowed (fewer than the 1 steps run after " \
        "the checkpoint of step 100)" in err, err


def test_a_rerun_forgets_the_last_runs_report(tmp_path):
    """A failed rerun into the same report folder left the last run's report.md and
    report.json beside its own stop notes: it read as a finished run."""
    from planner.commands.run import _clean

    for name in ("report.md", "report.json", "metrics.json", "stop-rank0.json", "plan.yaml",
                 "notes.txt"):
        (tmp_path / name).write_text("x")
    _clean(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "plan.yaml"]
