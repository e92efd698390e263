"""`plan run`: flags checked before anything starts; no folder left behind; nothing
written outside the report folder."""

import json
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


def _saved(root, plan_file, *steps, damaged=(), model=None, seed=0):
    """Checkpoint folders as a finished save leaves them: a marker naming the plan's model
    (or `model`) and its one file with its SHA-256; in the `damaged` steps that file
    changed since (same size)."""
    from executor.checkpoint_dirs import COMPLETE, FORMAT, METADATA, file_digest
    from planner.specs.plan import load_plan, plan_to_dict

    ours = plan_to_dict(load_plan(plan_file))["model"]
    for step in steps:
        folder = root / f"step-{step:08d}"
        folder.mkdir(parents=True)
        (folder / METADATA).write_bytes(b"dcp metadata")
        files = {METADATA: file_digest(str(folder / METADATA))}
        if step in damaged:
            (folder / METADATA).write_bytes(b"DCP METADATA")
        (folder / COMPLETE).write_text(json.dumps({
            "format": FORMAT, "step": step, "model": model or ours, "plan": "0" * 16,
            "layout": "pp 2", "files": files, "seed": seed, "learning_rate": 3e-4}))


def test_checkpoints_of_an_earlier_run_are_checked_before_launching(tmp_path, monkeypatch,
                                                                    capsys, plan_file):
    """--resume with --steps at or below the checkpoint's step ran no step and ended in a
    StatisticsError traceback; a fresh run into a folder of an earlier run's checkpoints
    overwrote some steps and left the rest, so a later --resume took the earlier run's."""
    monkeypatch.chdir(tmp_path)
    _saved(tmp_path / "ck", plan_file, 50, 100)
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


def test_the_checks_before_launching_take_the_checkpoint_the_ranks_take(tmp_path, monkeypatch,
                                                                        capsys, plan_file):
    """The ranks resume from the newest intact checkpoint; the checks before launching
    went by the newest folder with a marker: a damaged step 100 refused --steps 100, which
    resumes from step 50 and runs (audit of 2026-12-06)."""
    monkeypatch.chdir(tmp_path)
    _saved(tmp_path / "ck", plan_file, 50, 100, damaged=(100,))
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "100", "--dry-run"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "50", "--dry-run"], capsys)
    assert code == 2 and "resumes from, 50 (ck/step-00000050)" in err, err


def test_a_checkpoint_of_another_model_is_refused_before_launching(tmp_path, monkeypatch,
                                                                   capsys, plan_file):
    """Every rank started, failed on it, and the launcher cut its line mid-word (audit of
    2026-12-06): now one line before any process starts."""
    from planner.specs.model import preset as model_preset
    from profiler.schema import dump

    monkeypatch.chdir(tmp_path)
    _saved(tmp_path / "ck", plan_file, 50, model=dump(model_preset("debug-small")))
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "60", "--dry-run"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--checkpoint-dir: 'ck' is not allowed (ck/step-00000050 holds model " \
           "'debug-small', this plan trains 'debug-tiny'" in err


def test_resuming_with_another_seed_says_so(tmp_path, monkeypatch, capsys, plan_file):
    """A resume with another --seed or --lr than the checkpoint's run leaves the losses of
    an uninterrupted run without a word (audit of 2026-12-06): it runs, with a note."""
    monkeypatch.chdir(tmp_path)
    _saved(tmp_path / "ck", plan_file, 50)
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "60", "--seed", "7", "--lr", "3e-3", "--dry-run"],
                           capsys)
    assert code == 0
    assert "note: resuming step 50 with --seed 7 (it was 0) and --lr 0.003 (it was " \
           "0.0003)" in err, err
    code, _, err = run_cli(["run", "--plan", plan_file, "--checkpoint-dir", "ck", "--resume",
                            "--steps", "60", "--dry-run"], capsys)
    assert code == 0 and "note" not in err, err


def test_a_rerun_forgets_the_last_runs_report(tmp_path):
    """A failed rerun into the same report folder left the last run's report.md and
    report.json beside its own stop notes: it read as a finished run."""
    from planner.commands.run import _clean

    for name in ("report.md", "report.json", "metrics.json", "stop-rank0.json", "plan.yaml",
                 "notes.txt"):
        (tmp_path / name).write_text("x")
    _clean(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "plan.yaml"]
