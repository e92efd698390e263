"""`plan export -o`: checked before reading the plan, written atomically."""

import os

import pytest

from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import save_plan
from tests.planner.cli_helpers import run_cli


@pytest.fixture
def plan_file(tmp_path):
    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(tp=2, pp=2, dp=2, mbs=4, gbs=64, seq_len=2048))
    save_plan(plan, str(tmp_path / "p.yaml"))
    return str(tmp_path / "p.yaml")


@pytest.mark.parametrize("output, needle", [
    ("missing/args.sh", "-o: 'missing/args.sh' is not allowed (folder 'missing' does not exist)"),
    ("folder", "-o: 'folder' is not allowed (a file, not a folder)"),
    ("p.yaml", "-o: 'p.yaml' is not allowed (the same file as PLAN)"),
])
def test_bad_outputs(tmp_path, monkeypatch, capsys, plan_file, output, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    before = (tmp_path / "p.yaml").read_text()
    code, out, err = run_cli(["export", "p.yaml", "--format", "megatron", "-o", output], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert (tmp_path / "p.yaml").read_text() == before


def test_written_whole(tmp_path, monkeypatch, capsys, plan_file):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["export", "p.yaml", "--format", "megatron", "-o", "args.sh"],
                           capsys)
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["args.sh", "p.yaml"]


def test_a_framework_beside_a_framework_format_is_bad_input(capsys, plan_file):
    """--format megatron names the framework; another --framework is refused like any
    bad flag: exit 2, one line naming the flag and the value."""
    code, _, err = run_cli(["export", plan_file, "--format", "megatron", "--framework",
                            "deepspeed"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--framework: 'deepspeed' is not allowed (only with --format slurm or kubernetes" in err
