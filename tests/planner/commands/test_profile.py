"""`plan profile show --plot` and `-o`: the picture's path checked before the profile is
read, written whole."""

import os
import pathlib
import shutil

import pytest

from tests.planner.cli_helpers import run_cli

PROFILE = pathlib.Path(__file__).resolve().parents[3] / "profiles" / "cpu-debug-tiny.csv"


@pytest.mark.parametrize("plot, needle", [
    ("missing/p.png", "--plot: 'missing/p.png' is not allowed (folder 'missing' does not exist)"),
    ("p.txt", "--plot: 'p.txt' is not allowed (a .png, .svg, .pdf file)"),
    ("folder.png", "--plot: 'folder.png' is not allowed (a file, not a folder)"),
])
def test_bad_plot_paths(tmp_path, monkeypatch, capsys, plot, needle):
    monkeypatch.chdir(tmp_path)
    shutil.copy(PROFILE, "p.csv")
    os.mkdir("folder.png")
    code, out, err = run_cli(["profile", "show", "p.csv", "--plot", plot], capsys)
    assert code == 2 and out == "" and needle in err and err.count("\n") == 1, err


def test_plot_written_whole(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(PROFILE, "p.csv")
    code, _, err = run_cli(["profile", "show", "p.csv", "--plot", "p.svg"], capsys)
    assert code == 0, err
    assert sorted(os.listdir()) == ["p.csv", "p.svg"]


def test_measure_output_checked_before_measuring(tmp_path, capsys):
    code, _, err = run_cli(["profile", "--model", "debug-tiny", "-o",
                            str(tmp_path / "missing" / "p.csv")], capsys)
    assert code == 2 and "(folder" in err and "does not exist)" in err, err


def test_measure_help_says_what_host_costs_measure(capsys):
    """`--host-costs` with `--collectives` also measures the shared-core slowdown
    (`gemm_shared` rows) the event simulation prices: the help says so."""
    code, out, _ = run_cli(["profile", "measure", "--help"], capsys)
    text = " ".join(out.split())  # argparse wraps lines
    assert code == 0 and "FSDP2's and DTensor's per-layer costs" in text
    assert "while n of the --nprocs ranks compute at once (gemm_shared" in text
