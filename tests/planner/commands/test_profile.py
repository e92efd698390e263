"""`plan profile show --plot` and `-o`: the picture's path checked before the profile is
read, written whole."""

import dataclasses
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


def test_an_unknown_host_model_is_refused_in_one_line(tmp_path, capsys):
    code, out, err = run_cli(["profile", "--collectives", "--host-costs", "--host-model",
                              "gpt-nope", "-o", str(tmp_path / "p.csv")], capsys)
    assert code == 2 and out == "" and "--host-model: 'gpt-nope' is not a known preset" in err
    assert err.count("\n") == 1 and not os.path.exists(tmp_path / "p.csv"), err


def test_the_dtensor_rows_time_the_models_blocks_at_each_micro_batch_and_sequence():
    """With --host-model (or --model) and --host-costs on the CPU, the collectives run
    also times DTensor on that model's blocks at each --mbs x --seq (the activation sizes
    its plans run); without host costs, or on a GPU, nothing."""
    from planner.commands.profile import MeasureRequest, _host_blocks
    from planner.specs.model import preset

    small = preset("debug-small")
    req = MeasureRequest(model=None, output="p.csv", command="", collectives=True,
                         host_costs=True, host_model=small, mbs=(4, 8), seq=(32, 64))
    assert _host_blocks(req) == ((small, 4, 32), (small, 4, 64), (small, 8, 32), (small, 8, 64))
    assert _host_blocks(dataclasses.replace(req, seq=None)) == ((small, 4, 64), (small, 8, 64))
    assert _host_blocks(dataclasses.replace(req, host_costs=False)) == ()
    assert _host_blocks(dataclasses.replace(req, device="cuda")) == ()
    assert _host_blocks(dataclasses.replace(req, host_model=None)) == ()


def test_blocks_too_big_for_the_cpu_are_left_to_the_tiny_rows(capsys):
    """A model whose blocks the CPU cannot time in 5-block models (or whose attention
    scores at a shape are too big) keeps the tiny preset's rows, and says so."""
    from planner.commands.profile import MeasureRequest, _host_blocks
    from planner.specs.model import preset

    req = MeasureRequest(model=None, output="p.csv", command="", collectives=True,
                         host_costs=True, host_model=preset("llama3-8b"), mbs=(1,), seq=(64,))
    assert _host_blocks(req) == ()
    assert "DTensor rows on llama3-8b's own blocks skipped" in capsys.readouterr().err
    small = preset("debug-small")
    req = dataclasses.replace(req, host_model=small, mbs=(1, 64), seq=(64, 8192))
    assert _host_blocks(req) == ((small, 1, 64), (small, 64, 64))
    assert "(1, 8192), (64, 8192)" in capsys.readouterr().err


def test_a_model_too_big_for_a_whole_pass_keeps_the_gemms_shared_core_rows(capsys):
    """The shared-core rows time the model's whole forward + backward in every process:
    beyond MAX_PASS_PARAMS they are not taken (the GEMM's `gemm_shared` rows price its
    plans), and `plan profile` says so; its blocks' DTensor rows are still timed."""
    from planner.commands.profile import MeasureRequest, _host_blocks
    from planner.specs.model import preset
    from profiler.hostcost import MAX_PASS_PARAMS

    wide = dataclasses.replace(preset("debug-small"), vocab_size=1_000_000)
    assert wide.num_params() > MAX_PASS_PARAMS
    req = MeasureRequest(model=None, output="p.csv", command="", collectives=True,
                         host_costs=True, host_model=wide, mbs=(8,), seq=(64,))
    assert _host_blocks(req) == ((wide, 8, 64),)
    err = capsys.readouterr().err
    assert "shared-core rows on debug-small's whole pass skipped" in err
    assert "(gemm_shared)" in err
    small = preset("debug-small")
    assert _host_blocks(dataclasses.replace(req, host_model=small)) == ((small, 8, 64),)
    assert "whole pass" not in capsys.readouterr().err
