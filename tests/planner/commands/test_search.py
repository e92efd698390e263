"""`plan search`: outputs checked before the search; one-line errors for bad numbers."""

import os

import pytest

from tests.planner.cli_helpers import run_cli

SEARCH = ["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--gbs", "16"]


@pytest.mark.parametrize("flags, needle", [
    (["-o", "notes.txt"], "-o: 'notes.txt' is not allowed (a .yaml, .yml, .json file)"),
    (["-o", "missing/best.yaml"], "(folder 'missing' does not exist)"),
    (["--tokens", "nan"], "argument --tokens: 'nan' is not allowed (a finite number)"),
    (["--tokens", "1e3", "--max-budget", "inf"], "argument --max-budget: 'inf' is not allowed"),
    (["--top", "100000"], "argument --top: 100000 is not allowed (must be ≤ 1,000)"),
    (["--memory-headroom", "80"], "--memory-headroom: 80.0 is not allowed (less than the "
                                  "cluster's largest GPU memory, 80 GiB"),
])
def test_refused_before_searching(tmp_path, monkeypatch, capsys, flags, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes")
    code, out, err = run_cli([*SEARCH, *flags], capsys)
    assert code == 2 and out == "" and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "notes.txt").read_text() == "my notes"
    assert os.listdir(tmp_path) == ["notes.txt"]
