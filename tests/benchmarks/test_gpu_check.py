"""benchmarks/gpu_check.sh: it parses, its dry run exercises every step but the CUDA ones,
and where torch or CUDA is missing it stops at once in one line (issue 17)."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.sh")


def _run(args, tmp_path, **env):
    full = {**os.environ, "GPU_CHECK_PYTHON": sys.executable, "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=full,
                          check=False, timeout=900)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", SCRIPT], check=False).returncode == 0


def test_without_torch_it_stops_in_one_line(tmp_path):
    blocked = tmp_path / "no-torch"
    blocked.mkdir()
    (blocked / "torch.py").write_text("raise ImportError('not installed')\n")
    done = _run(["--results", str(tmp_path / "results")], tmp_path,
                PYTHONPATH=str(blocked))
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.startswith("gpu_check: torch is not installed for ")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "results").exists()


def test_without_cuda_it_stops_in_one_line(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = _run(["--results", str(tmp_path / "results")], tmp_path)
    assert done.returncode == 3 and done.stdout == ""
    assert re.fullmatch(r"gpu_check: torch \S+ \(.*\) sees no CUDA GPU here; run it on a GPU "
                        r"machine, or with --dry-run\n", done.stderr), done.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_the_dry_run_exercises_every_step_but_the_cuda_ones(tmp_path):
    """debug-tiny on the CPU: profiled in fp32 (tf32 and fp8 refused, as on a GPU without
    them), collectives over two processes, predicted and run on one and two CPU ranks,
    then summarized: 2 minutes on the shared 2-core machine (45 s of CPU time)."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    done = _run(["--dry-run", "--results", str(tmp_path / "results"), "--copy-to", str(out)],
                tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (result_file,) = (tmp_path / "results").glob("gpu-check-dry-run-*.json")
    result = json.loads(result_file.read_text())
    assert result["dry_run"] and result["complete"]
    steps = {s["step"]: s["status"] for s in result["steps"]}
    assert steps == {"profile-fp32": "ok", "profile-tf32": "refused", "profile-fp8": "refused",
                     "profile-collectives": "ok", "predict-single": "ok",
                     "predict-single-analytic": "ok", "run-single": "ok", "predict-dp2": "ok",
                     "predict-dp2-analytic": "ok", "run-dp2": "ok"}
    refusal = next(s["note"] for s in result["steps"] if s["step"] == "profile-fp8")
    assert "FP8 tensor cores are on NVIDIA GPUs of compute capability 8.9" in refusal
    assert result["device"]["torch"] and result["device"]["date"]
    assert result["device"]["catalog_type"] == "CPU"
    profile = result["profiles"]["fp32"]
    assert set(result["profiles"]) == {"fp32"} and profile["rows"] > 0
    assert {r["kind"] for r in profile["ops"]} == {"gemm", "attention", "optimizer"}
    assert all(r["measured_s"] > 0 and r["analytic_s"] > 0 for r in profile["ops"])
    for plan in result["plans"]:
        assert plan["predicted"]["iteration_s"] > 0 and plan["measured"]["iteration_s"] > 0
        assert "measured profile" in plan["predicted"]["sources"]["compute"]
        assert "analytic" in plan["predicted_analytic"]["sources"]["compute"]
        assert plan["error"] == pytest.approx(plan["predicted"]["iteration_s"]
                                              / plan["measured"]["iteration_s"] - 1, abs=1e-4)
        # each run's traced steps: every rank's GEMMs beside the cost model's
        traces = plan["measured"]["traces"]
        assert len(traces) == (1 if plan["plan"] == "single" else 2)
        gemm = next(k for k in traces[0]["kinds"] if k["kind"] == "gemm")
        assert gemm["measured_s"] > 0 and gemm["predicted_s"] > 0
    assert [p["plan"] for p in result["plans"]] == ["single", "dp2"]
    copied = sorted(p.name for p in out.iterdir())  # what the device tool brings back
    assert [re.sub(r"\d{8}T\d{6}Z", "T", name) for name in copied] == [
        "gpu-check-dry-run-T.json", "gpu-check-dry-run-T.log", "gpu-check-dry-run-T.tar.gz"]
    assert "complete in" in done.stdout
    assert "rank 0 by kind of op, ms a step measured (predicted): gemm" in done.stdout
