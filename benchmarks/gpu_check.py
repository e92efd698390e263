"""The Python half of benchmarks/gpu_check.sh: what the shell cannot say in one line.

    python benchmarks/gpu_check.py preflight --device cuda --out WORK/device.json
    python benchmarks/gpu_check.py summarize --work WORK --out RESULT.json [--dry-run]

`preflight` fails fast, in one line on stderr (exit 3), where the check cannot run: no
torch, no PyYAML, or (--device cuda) no GPU torch can use, or a GPU the device catalog
does not know (name it with GPU_CHECK_GPU_TYPE). Otherwise it writes the device's
metadata (GPU, count, compute capability, torch / CUDA / cuDNN / NCCL / driver versions,
host, date, the repo's commit) and prints `gpu_type=...` and `num_gpus=...` for the shell.

`summarize` reads the work folder the shell filled (steps.tsv, profiles/ops-*.csv, the
predictions predict-*.json and the runs' runs/*/report.json) and writes one JSON of
predicted vs measured: per profiled dtype, each GEMM, attention and optimizer row beside
the analytic device model's time for it; per plan, the event simulation with the profile
(and without it: the analytic model alone) beside the measured iteration and memory.
"""

import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFUSED = 3  # the shell's code for "cannot run here"
DETAIL_KINDS = ("gemm", "attention", "optimizer")  # rows listed one by one


def _refuse(why: str) -> int:
    print(f"gpu_check: {why}", file=sys.stderr)
    return REFUSED


def _git() -> dict:
    """The commit the check ran at, if this copy of the repo has its .git."""
    def git(*args):
        out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                             check=False, timeout=30)
        return out.stdout.strip() if out.returncode == 0 else None

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(dirty) if commit else None}


def _cpu_model() -> str:
    from profiler.measure import device_description

    return device_description("cpu")


def _device_meta(device: str, torch) -> dict:
    from profiler.host import local_device, runtime

    where = "cuda:0" if device == "cuda" else "cpu"
    local = local_device(where, device_name=os.environ.get("GPU_CHECK_GPU_TYPE") or None)
    rt = runtime(where)
    meta = {"kind": device, "catalog_type": local.spec.name, "name": local.detail,
            "num_gpus": 0, "torch": rt.torch_version, "cuda": rt.cuda_version,
            "driver": rt.driver, "cudnn": None, "nccl": None,
            "python": platform.python_version(), "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(), "host": platform.node() or "unknown",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **_git()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
        meta.update(num_gpus=torch.cuda.device_count(),
                    compute_capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 1024**3, 1),
                    multiprocessors=props.multi_processor_count,
                    l2_cache_bytes=getattr(props, "L2_cache_size", None),
                    cudnn=torch.backends.cudnn.version(),
                    nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl)
    return meta


def preflight(device: str, out: str) -> int:
    try:
        import torch
    except ImportError:
        return _refuse(f"torch is not installed for {sys.executable} (the GPU machine's "
                       "python3 brings it; else set GPU_CHECK_PYTHON)")
    try:
        import yaml  # noqa: F401  # the planner reads its data files with it
    except ImportError:
        return _refuse(f"PyYAML is not installed for {sys.executable}")
    if device == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return _refuse(f"torch {torch.__version__} ({build}) sees no CUDA GPU here; run it "
                       "on a GPU machine, or with --dry-run")
    from profiler.schema import SpecError

    try:
        meta = _device_meta(device, torch)
    except SpecError as err:
        return _refuse(f"{err} (set GPU_CHECK_GPU_TYPE to its catalog name, `plan gpus`)")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1)
    print(f"gpu_type={meta['catalog_type']}")
    print(f"num_gpus={meta['num_gpus']}")
    return 0


# ---- summary ---------------------------------------------------------------------------

def _steps(work: str) -> list[dict]:
    steps = []
    with open(os.path.join(work, "steps.tsv"), encoding="utf-8") as fh:
        for line in fh:
            name, status, seconds, code, note = line.rstrip("\n").split("\t")
            steps.append({"step": name, "status": status, "seconds": float(seconds),
                          "exit_code": int(code) if code.lstrip("-").isdigit() else None,
                          "note": note or None})
    return steps


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return round(predicted / measured - 1, 4)


def _skips(work: str, dtype: str) -> list[str]:
    path = os.path.join(work, f"profile-{dtype}.err")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as fh:
        return sorted({ln.strip() for ln in fh if ln.startswith("skipped ")})


def _profile_summary(path: str, work: str) -> dict:
    """Each GEMM / attention / optimizer row beside the analytic model's time, and the
    median |analytic / measured - 1| per op kind."""
    from planner.costs.compute import ComputeCosts
    from planner.costs.workload import Op
    from planner.profiling.cases import op_dtype
    from profiler.devices import device
    from profiler.store import load_profile

    profile = load_profile(path)
    meta = profile.meta
    rows, errors = [], {}
    for r in profile.op_rows:
        dtype = op_dtype(meta.dtype, r.name)  # fp8 profiles: FP8 GEMMs, bf16 elsewhere
        op = Op(name=r.name, kind=r.kind, flops=r.flops, bytes=r.bytes, shape=r.shape,
                kernels=r.kernels, variant=r.variant)
        analytic = ComputeCosts(device(meta.device), dtype).time_s(op)
        errors.setdefault(r.kind, []).append(abs(analytic / r.time_s - 1))
        if r.kind in DETAIL_KINDS:
            rows.append({"kind": r.kind, "name": r.name, "variant": r.variant,
                         "shape": "x".join(map(str, r.shape)), "dtype": dtype,
                         "measured_s": r.time_s, "p10_s": r.p10_s, "p90_s": r.p90_s,
                         "achieved_tflops": round(r.flops / r.time_s / 1e12, 2)
                         if r.flops else None,
                         "analytic_s": analytic, "analytic_error": _error(analytic, r.time_s)})
    return {"file": os.path.relpath(path, work), "dtype": meta.dtype,
            "precision": meta.precision, "device": meta.device,
            "device_detail": meta.device_detail, "torch": meta.torch_version,
            "cuda": meta.cuda_version, "rows": len(profile.rows),
            "skipped": _skips(work, meta.dtype),
            "median_abs_analytic_error": {k: round(statistics.median(v), 4)
                                          for k, v in sorted(errors.items())},
            "ops": rows}


def _load(path: str) -> dict | None:
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError:
            return None


def _prediction(sim: dict | None) -> dict | None:
    if sim is None:
        return None
    return {"iteration_s": sim["iteration_time_s"], "tokens_per_s": sim["tokens_per_s"],
            "mfu": sim.get("mfu"), "peak_memory_bytes": [s["memory"]["total_bytes"]
                                                         for s in sim.get("stages", ())
                                                         if s.get("pipeline", 0) == 0],
            "breakdown": sim.get("breakdown"), "kernels": sim.get("kernels"),
            "sources": sim.get("sources")}


def _plan_summary(work: str, name: str) -> dict:
    sim = _prediction(_load(os.path.join(work, f"predict-{name}.json")))
    analytic = _prediction(_load(os.path.join(work, f"predict-{name}-analytic.json")))
    run = _load(os.path.join(work, "runs", name, "report.json"))
    measured = None
    if run is not None:
        measured = {"iteration_s": run["measured_iteration_s"],
                    "iteration_range_s": run["measured_iteration_range_s"],
                    "tokens_per_s": run["measured_tokens_per_s"], "steps": run["steps_run"],
                    "warmup_steps": run["warmup_steps"], "losses": run["losses"],
                    "memory_kind": run["memory_kind"],
                    "peak_memory_bytes": [r["peak_bytes"] for r in run["ranks"]],
                    "predicted_peak_memory_bytes": [r["predicted_peak_bytes"]
                                                    for r in run["ranks"]],
                    # `plan run --trace`: each rank's time by kind of op beside the cost
                    # model's (kernels' time on GPUs)
                    "traces": run.get("traces", [])}
    measured_s = measured["iteration_s"] if measured else None
    return {"plan": name, "file": f"plans/{name}.yaml",
            "layout": run["layout"] if run else None,
            "predicted": sim, "predicted_analytic": analytic, "measured": measured,
            "error": _error(sim["iteration_s"] if sim else None, measured_s),
            "error_analytic": _error(analytic["iteration_s"] if analytic else None,
                                     measured_s)}


def summarize(work: str, out: str, *, dry_run: bool) -> int:
    with open(os.path.join(work, "device.json"), encoding="utf-8") as fh:
        device = json.load(fh)
    with open(os.path.join(work, "settings.json"), encoding="utf-8") as fh:
        settings = json.load(fh)
    steps = _steps(work)
    profiles = {}
    for path in sorted(glob.glob(os.path.join(work, "profiles", "ops-*.csv"))):
        summary = _profile_summary(path, work)
        profiles[summary["dtype"]] = summary
    plans = [_plan_summary(work, name) for name in settings["plans"]]
    result = {"check": "benchmarks/gpu_check.sh", "format": 1, "dry_run": dry_run,
              "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "device": device, "settings": settings, "steps": steps,
              "complete": all(s["status"] in ("ok", "refused") for s in steps),
              "elapsed_s": round(sum(s["seconds"] for s in steps), 1),
              "profiles": profiles, "plans": plans}
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(_table(result))
    return 0


def _table(result: dict) -> str:
    """What the shell prints at the end: steps, profiles, plans."""
    lines = [f"gpu check on {result['device']['name']} ({result['device']['catalog_type']}), "
             f"torch {result['device']['torch']}"
             + (" [dry run]" if result["dry_run"] else "")]
    for s in result["steps"]:
        note = f"  {s['note']}" if s["note"] and s["status"] != "ok" else ""
        lines.append(f"  {s['step']:<24} {s['status']:<8} {s['seconds']:7.1f} s{note}")
    for dtype, p in result["profiles"].items():
        errs = ", ".join(f"{k} {v:.0%}" for k, v in p["median_abs_analytic_error"].items())
        lines.append(f"  profile {dtype}: {p['rows']} rows; analytic model off by (median) "
                     f"{errs}")
    for plan in result["plans"]:
        pred, meas = plan["predicted"], plan["measured"]
        text = (f"predicted {pred['iteration_s'] * 1e3:.1f} ms" if pred else "no prediction")
        text += (f", measured {meas['iteration_s'] * 1e3:.1f} ms" if meas else ", not run")
        if plan["error"] is not None:
            text += f" ({plan['error']:+.1%}; analytic alone {plan['error_analytic']:+.1%})"
        lines.append(f"  plan {plan['plan']}: {text}")
        traces = (meas or {}).get("traces") or []
        if traces:
            kinds = ", ".join(
                f"{k['kind']} {k['measured_s'] * 1e3:.2f}"
                + (f" ({k['predicted_s'] * 1e3:.2f})" if k["predicted_s"] is not None else "")
                for k in traces[0]["kinds"])
            lines.append(f"    rank 0 by kind of op, ms a step measured (predicted): {kinds}")
    lines.append(f"  {'complete' if result['complete'] else 'INCOMPLETE'} in "
                 f"{result['elapsed_s']:.0f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    sys.path.insert(0, ROOT)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preflight")
    pre.add_argument("--device", choices=("cuda", "cpu"), required=True)
    pre.add_argument("--out", required=True)
    summ = sub.add_parser("summarize")
    summ.add_argument("--work", required=True)
    summ.add_argument("--out", required=True)
    summ.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.command == "preflight":
        return preflight(args.device, args.out)
    return summarize(args.work, args.out, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
