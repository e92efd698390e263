"""`plan what-if`: bad numbers and outputs refused in one line before any planning."""

import pathlib

import pytest

from tests.planner.cli_helpers import run_cli

DGX = pathlib.Path(__file__).resolve().parents[3] / "cluster_specs" / "dgx-h100.yaml"
WHATIF = ["what-if", "--model", "gpt3-1.3b", "--gbs", "64"]


@pytest.mark.parametrize("flags, needle", [
    (["--tokens", "nan", "-o", "r"], "argument --tokens: 'nan' is not allowed (a finite number)"),
    (["--tokens", "1e9", "--max-budget", "-3", "-o", "r"],
     "argument --max-budget: -3.0 is not allowed (must be > 0)"),  # search refused it; now both
    (["--tokens", "1e9", "-o", "notes.txt"], "-o: 'notes.txt' is not allowed (a folder, not a "
     "file)"),
    (["--tokens", "1e9", "-o", "notes.txt/sub"], "is a file, not a folder"),
    (["--tokens", "1e9", "--scenario", 'add "H100-80GB-SXM 8', "-o", "r"],
     "no closing quotation"),
    (["--tokens", "1e9", "--scenario", "add H100-80GB-SXM ²", "-o", "r"],
     "count: '²' is not allowed (a positive whole number)"),
    # the report names its rows by label: two 'a' rows (or a second 'baseline') were
    # accepted and its headlines could name either
    (["--tokens", "1e9", "--scenario", "a: add H100-80GB-SXM 8", "--scenario",
      "a: price H100-80GB-SXM 1", "-o", "r"], "its label 'a' is taken"),
    (["--tokens", "1e9", "--scenario", "baseline: add H100-80GB-SXM 8", "-o", "r"],
     "its label 'baseline' is taken"),
    (["--tokens", "1e9", "--memory-headroom", "900", "-o", "r"],
     "--memory-headroom: 900.0 is not allowed (less than the cluster's largest GPU memory"),
    # with GPUs of less memory than the default, the flag named was one never given
    (["--tokens", "1e9", "--catalog", "small.yaml", "-o", "r"],
     "--memory-headroom: 2.0 is not allowed (less than the cluster's largest GPU memory, "
     "1.5 GiB: the GiB a plan should leave free at its peak, 2 by default)"),
])
def test_refused_before_planning(tmp_path, monkeypatch, capsys, flags, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "small.yaml").write_text("H100-80GB-SXM: {memory_gib: 1.5}\n")
    code, out, err = run_cli([*WHATIF, "--cluster", str(DGX), *flags], capsys)
    assert code == 2 and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "notes.txt").read_text() == "my notes"
    assert not (tmp_path / "r").exists()


def test_a_refusal_every_scenario_shares_is_bad_input(tmp_path, monkeypatch, capsys):
    """--objective cost on a cluster without prices: no scenario can be planned, so it is
    one line and exit 2 (was: a report of rows without a plan, exit 0). Where a scenario
    adds the prices, it plans and the baseline's row says why it has none."""
    monkeypatch.chdir(tmp_path)
    argv = ["what-if", "--model", "gpt3-125m", "--gpus", "H100-80GB-SXM:8", "--gbs", "16",
            "--tokens", "1e9", "--objective", "cost", "-o", "r"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--objective: 'cost' is not allowed (needs prices" in err
    assert not (tmp_path / "r").exists()
    code, out, err = run_cli([*argv, "--scenario", "priced: price H100-80GB-SXM 2.5"], capsys)
    assert code == 0, err
    assert "baseline: no plan: --objective" in out and "priced: " in out
