"""`plan profile` as users meet it: one-line errors; measure, show, fit, use."""

import json

import pytest

from tests.planner.cli_helpers import run_cli as _run
from tests.planner.profile_helpers import QUICK_PROFILE


@pytest.mark.parametrize("argv, needle", [
    (["-o", "p.csv"], "--model: missing is not allowed (give a model to measure its ops, or "
                      "--collectives)"),
    (["--model", "debug-tiny", "--device", "tpu", "-o", "p.csv"],
     "--device: 'tpu' is not allowed (cpu, cuda or cuda:N)"),
    (["--model", "debug-tiny", "--tp", "3", "-o", "p.csv"],
     "--tp: 3 is not allowed (must divide num_heads 4)"),
    (["--model", "debug-tiny", "-o", "p.txt"],
     "-o: 'p.txt' is not allowed (a .csv, .parquet file)"),
    (["--model", "debug-tiny", "--optimizer", "adam", "-o", "p.csv"],
     "--optimizer: 'adam' is not allowed (allowed: fused, foreach, for_loop)"),
    (["--collectives", "--max-bytes", "12XB", "-o", "p.csv"],
     "argument --max-bytes: '12XB' is not a size (e.g. 1KB, 16MB, 1GB)"),
    (["--collectives", "--min-bytes", "2MB", "--max-bytes", "1MB", "-o", "p.csv"],
     "--min-bytes: 2097152 is not allowed (must be ≤ --max-bytes 1048576)"),
    (["--model", "debug-tiny", "--repeats", "0", "-o", "p.csv"],
     "argument --repeats: 0 is not allowed (must be ≥ 1)"),
    (["--model", "debug-tiny", "--attention", "memory_efficient", "-o", "p.csv"],
     "--attention: 'memory_efficient' is not allowed (CPU supports flash, math)"),
    (["--model", "debug-tiny", "--device", "cuda", "-o", "p.csv"],
     "--device: 'cuda' is not allowed (torch sees no CUDA device here)"),
    (["--model", "debug-tiny", "--dtype", "tf32", "-o", "p.csv"],
     "--dtype: 'tf32' is not allowed (TF32 tensor cores are on NVIDIA GPUs of compute "
     "capability 8.0 or newer; profile fp32 on the CPU)"),
    (["--model", "debug-tiny", "--dtype", "fp8", "-o", "p.csv"],
     "--dtype: 'fp8' is not allowed (FP8 tensor cores are on NVIDIA GPUs of compute "
     "capability 8.9 or newer; profile bf16 on the CPU)"),
    # the CPU's times, filed as an H100's, priced every H100 of a plan 5x slow
    (["--model", "debug-tiny", "--device-name", "H100-80GB-SXM", "-o", "p.csv"],
     "--device-name: 'H100-80GB-SXM' is not allowed (a CPU catalog entry: --device cpu "
     "measures"),
    # one process has no peer: its send_recv rows timed nothing
    (["--collectives", "--nprocs", "1", "-o", "p.csv"],
     "argument --nprocs: 1 is not allowed (must be ≥ 2)"),
    # the unknown name was blamed on a field "gpu" (CLI sweep 2026-12-04)
    (["--model", "debug-tiny", "--device-name", "FOO", "-o", "p.csv"],
     "--device-name: 'FOO' is not a known GPU type"),
    # CLI sweep 2026-12-04: a learned-position model past its table raised IndexError
    # in the embedding op; a sequence whose attention scores hold 89,407 GiB ran for
    # minutes in one op, deaf to Ctrl-C and SIGTERM
    (["--model", "debug-tiny", "--seq", "100000", "-o", "p.csv"],
     "--seq: 100000 is not allowed (at most debug-tiny's 64 learned positions"),
    (["--model", "debug-tiny-llama", "--seq", "1000000", "-o", "p.csv"],
     "--seq/--mbs: '--seq 1000000 --mbs 1' is not allowed (ops whose tensors fit in this "
     "host's"),
    (["--model", "debug-tiny", "--turn-seconds", "-1", "-o", "p.csv"],
     "argument --turn-seconds: -1.0 is not allowed (must be ≥ 0)"),
    # the optimizer step outgrew the host: the message blamed --seq/--mbs and --attention
    (["--model", "gpt3-175b", "--seq", "16", "--mbs", "1", "-o", "p.csv"],
     "--model: 'gpt3-175b' is not allowed (a model whose optimizer step fits in this host's"),
])
def test_bad_flags(argv, needle, capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["profile", *argv], capsys)
    assert code == 2 and out == "" and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "p.csv").exists()


def test_a_step_shape_whose_ops_together_outgrow_the_host_is_refused(capsys, tmp_path,
                                                                     monkeypatch):
    """The CPU times a step shape's ops in turn, each keeping its tensors: debug-tiny's at
    8 x 64 move 8 MiB at most one by one, 49 MiB together; a 16 MiB host is refused."""
    pytest.importorskip("torch")
    import planner.commands.profile as profile

    monkeypatch.setattr(profile, "_memory_bytes", lambda req, dev: (16 * 2**20, "this host's"))
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["profile", "--model", "debug-tiny", "--mbs", "8", "--seq", "64",
                           "-o", "p.csv"], capsys)
    assert code == 2 and out == "" and not (tmp_path / "p.csv").exists()
    assert err.startswith("plan profile: error: --seq/--mbs: '--seq 64 --mbs 8' is not "
                          "allowed (a step shape whose ops fit in this host's 0.0156 GiB "
                          "together (the CPU times them in turn, each keeping its tensors); "
                          "the largest holds 0.0482 GiB: lower them)"), err
    assert err.count("\n") == 1


def test_show_and_fit_errors(tmp_path, capsys):
    code, _, err = _run(["profile", "show", str(tmp_path / "none.csv")], capsys)
    assert code == 2 and "none.csv: cannot read (No such file or directory)" in err


@pytest.mark.parametrize("output, needle", [
    ("nofolder/cat.yaml", "folder '{d}/nofolder' does not exist"),
    ("", "a .yaml, .yml file"),  # the folder itself
    ("cat.json", "a .yaml, .yml file"),  # --catalog then read it as JSON
    ("cpu.csv", "a .yaml, .yml file"),  # it overwrote the measured profile
])
def test_fit_checks_its_output_before_fitting(tmp_path, capsys, output, needle):
    """Each of these fitted first, then died with a traceback (or wrote YAML into the
    profile itself, or into a .json that --catalog then could not read)."""
    from planner.costs.workload import Op
    from tests.planner.profile_helpers import op_row, write_profile

    path = write_profile(tmp_path / "cpu.csv", [op_row(Op("mlp.fc1", "gemm", 2e6, 1e4,
                                                           (1, 64, 64, 256)), 1e-4)])
    before = (tmp_path / "cpu.csv").read_text()
    code, out, err = _run(["profile", "fit", path, "--iterations", "5",
                           "-o", str(tmp_path / output) if output else str(tmp_path)], capsys)
    assert code == 2 and out == "" and needle.format(d=tmp_path) in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "cpu.csv").read_text() == before


def test_measure_show_fit_and_use(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("TRAINPLAN_PROGRESS", "always")  # short work: show the bar anyway
    path = str(tmp_path / "cpu.csv")
    code, out, err = _run(["profile", "--model", "debug-tiny", *QUICK_PROFILE, "-o", path], capsys)
    assert code == 0, err
    # (progress on stderr is quiet off a terminal for work this short: profiler/progress.py)
    assert out.startswith("wrote ") and f"to {path}" in out
    code, out, _ = _run(["profile", "show", path, "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 0 and "mlp.fc1" in out and "best FLOP/s" in out
    assert (tmp_path / "p.png").stat().st_size > 10_000
    code, out, _ = _run(["profile", "show", path, "--json"], capsys)
    shown = json.loads(out)
    assert shown["meta"]["device"] == "CPU" and shown["meta"]["num_threads"] == 1
    assert {s["name"] for s in shown["series"]} >= {"attn.qkv", "optimizer.adamw"}
    code, out, _ = _run(["profile", "fit", path, "--iterations", "40"], capsys)
    assert code == 0 and "cpu.gemm_efficiency" in out
    code, out, err = _run(["simulate", "--model", "debug-tiny", "--gpus", "CPU:1", "--tp", "1",
                           "--pp", "1", "--dp", "1", "--mbs", "2", "--gbs", "2", "--seq", "32",
                           "--dtype", "fp32", "--profile", path, "--json"], capsys)
    assert code == 0, err
    sources = json.loads(out)["sources"]["compute"]
    assert sources == f"measured profile {path} (attention, elementwise, gemm, optimizer)"


def test_ctrl_c_keeps_what_was_measured(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import profiler.measure

    real = profiler.measure.sampler
    calls = []

    def interrupted_on_the_third(device):
        sample = real(device)

        def timed(fn, n):  # the CPU times its cases in turn: the third case's first call
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return sample(fn, n)
        return timed

    monkeypatch.setattr(profiler.measure, "sampler", interrupted_on_the_third)
    path = tmp_path / "cpu.csv"
    code, out, err = _run(["profile", "--model", "debug-tiny", "--mbs", "2", "--seq", "16",
                           "--warmup", "1", "--repeats", "2", "-o", str(path)], capsys)
    assert code == 130 and out == ""
    assert "interrupted; kept the 2 rows measured" in err and str(path) in err
    from profiler.store import load_profile

    assert len(load_profile(str(path)).rows) == 2
    # not the whole measurement: plan run reuses a profile whose command is its own
    assert load_profile(str(path)).meta.command.endswith("  # interrupted: 2 rows")


def test_the_profile_says_how_its_dtype_ran():
    from planner.commands.profile import _precision

    assert _precision("cpu", "fp32") is None and _precision("cuda", "bf16") is None
    assert "no TF32" in _precision("cuda:0", "fp32")
    assert "TF32 tensor cores" in _precision("cuda", "tf32")
    assert "('high')" in _precision("cuda", "tf32")
    fp8 = _precision("cuda", "fp8")
    assert "attn.qkv, attn.proj, mlp.fc1, mlp.fc2" in fp8 and "bf16" in fp8


def test_the_profiler_measures_only_the_kernels_pytorch_runs():
    """FlashAttention's Triton port is priced by the planner from FlashAttention-2's rows;
    the profiler times PyTorch's SDPA backends alone, by default and when asked."""
    import dataclasses

    from planner.commands.profile import MeasureRequest, _attentions
    from profiler.devices import device
    from profiler.schema import SpecError

    a100 = device("A100-80GB-SXM")
    assert "flash_triton" in a100.attention_kernels
    req = MeasureRequest(model=None, output="p.csv", command="plan profile measure")
    assert _attentions(req, a100) == ("flash", "memory_efficient", "math")
    asked = dataclasses.replace(req, attention=("flash_triton",))
    with pytest.raises(SpecError, match="A100-80GB-SXM supports flash, memory_efficient, math"):
        _attentions(asked, a100)


def test_an_moe_model_is_measured_where_torch_runs_its_ops(tmp_path, capsys):
    """The shipped debug-tiny-moe raised ValueError ('no torch implementation for workload
    op moe.router') with a traceback; now its router, attention and dense ops are measured
    and the note names what the analytic model prices."""
    pytest.importorskip("torch")
    path = str(tmp_path / "moe.csv")
    code, out, err = _run(["profile", "--model", "debug-tiny-moe", *QUICK_PROFILE, "-o",
                           path], capsys)
    assert code == 0 and f"to {path}" in out, err
    assert ("not measured: moe.topk, moe.permute, moe.expert.fc1, moe.expert.fc2, "
            "moe.unpermute and their gradients") in err
    code, out, _ = _run(["profile", "show", path, "--json"], capsys)
    assert {"moe.router", "moe.expert.swiglu", "attn.core"} <= {
        s["name"] for s in json.loads(out)["series"]}
