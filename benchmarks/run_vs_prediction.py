"""Measured iteration time of `plan run` against the profile-driven prediction, on this
machine's CPU ranks (issue 7's check: within 15% on at least 5 plan kinds).

    python benchmarks/run_vs_prediction.py [--model debug-small] [--profile DIR]
                                           [--steps 30] [--trials 3] [--kinds dp2,...]

Without --profile the machine is profiled first (`plan profile`: the model's ops at the
plans' shapes, and collectives over 2 processes up to 4 MB). Each plan kind is saved as a
Plan on 2 CPU ranks and run with `plan run --plan ... --profile DIR --json`; its measured
time is the median step after warm-up, its prediction the event simulation with the
profile. The machine has 2 cores: another process's load doubles a 2-rank run's time, so
every trial measures the CPU time the rest of the machine used while it ran ("foreign
load", in cores); a trial above --max-foreign is repeated (up to --trials), and the table
reports the least disturbed one. Before each trial it waits (up to --patience seconds)
for the machine to be quiet.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from planner.specs.cluster import load_cluster
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import ModelSpec, preset
from planner.specs.plan import Kernels, Pipeline, Plan, Sharding, Stage, Training, save_plan

SEQ = 64
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = load_cluster(os.path.join(ROOT, "cluster_specs", "local-cpu.yaml"))
KERNELS = Kernels(attention="flash", optimizer="fused")


def _homogeneous(model: ModelSpec, **knobs) -> Plan:
    cfg = ParallelConfig(seq_len=SEQ, dtype="fp32", **knobs)
    cluster = CLUSTER if cfg.num_gpus == 2 else CLUSTER.take(cfg.num_gpus)
    return homogeneous_plan(model, cluster, cfg, kernels=KERNELS)


def _hetero(model: ModelSpec) -> Plan:
    """Two replicas with unequal micro-batch counts (3 and 1 micro-batches of 8)."""
    pipes = tuple(Pipeline(micro_batch_size=8, num_microbatches=m,
                           stages=(Stage(layers=(0, model.num_layers), devices=(d,)),))
                  for d, m in ((0, 3), (1, 1)))
    training = Training(global_batch_size=32, seq_len=SEQ, dtype="fp32")
    plan = Plan(model=model, cluster=CLUSTER, training=training, pipelines=pipes,
                kernels=KERNELS)
    plan.check("plan")
    return plan


def _uneven_pp(model: ModelSpec, schedule: str) -> Plan:
    """Two stages, the first with one layer more (the last computes the logits)."""
    cut = model.num_layers // 2 + 1
    stages = (Stage(layers=(0, cut), devices=(0,)), Stage(layers=(cut, model.num_layers),
                                                           devices=(1,)))
    training = Training(global_batch_size=32, seq_len=SEQ, dtype="fp32",
                        schedule=schedule)  # type: ignore[arg-type]
    plan = Plan(model=model, cluster=CLUSTER, training=training, kernels=KERNELS,
                pipelines=(Pipeline(micro_batch_size=8, num_microbatches=4, stages=stages),))
    plan.check("plan")
    return plan


KINDS = {
    "single": lambda m: _homogeneous(m, mbs=8, gbs=8),
    "dp2": lambda m: _homogeneous(m, dp=2, mbs=8, gbs=16),
    "dp2-zero1": lambda m: _homogeneous(m, dp=2, mbs=8, gbs=16, sharding=Sharding(optim=2)),
    "dp2-zero2": lambda m: _homogeneous(m, dp=2, mbs=8, gbs=32,
                                        sharding=Sharding(grads=2, optim=2)),
    "dp2-zero3": lambda m: _homogeneous(m, dp=2, mbs=8, gbs=16,
                                        sharding=Sharding(params=2, grads=2, optim=2)),
    "pp2-1f1b": lambda m: _uneven_pp(m, "1f1b"),
    "pp2-gpipe": lambda m: _uneven_pp(m, "gpipe"),
    "pp2-zb-h1": lambda m: _uneven_pp(m, "zb-h1"),
    "tp2": lambda m: _homogeneous(m, tp=2, mbs=8, gbs=8),
    "hetero-dp2": _hetero,
}


def _plan(argv: list[str], quiet: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=quiet,
                          text=True, check=False, cwd=ROOT)


def profile(folder: str, model: str) -> None:
    for argv in (["--model", model, "--tp", "1,2", "--mbs", "8", "--seq", str(SEQ),
                  "--dtype", "fp32", "-o", os.path.join(folder, "cpu-ops.csv")],
                 ["--collectives", "--nprocs", "2", "--max-bytes", "4MB",
                  "-o", os.path.join(folder, "cpu-collectives.csv")]):
        out = _plan(["profile", "--device", "cpu", *argv])
        assert out.returncode == 0, out.stderr
        print(out.stdout.strip(), file=sys.stderr)


def _busy_jiffies() -> int:
    with open("/proc/stat", encoding="utf-8") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal


def wait_quiet(max_cores: float, patience_s: float) -> float:
    """Wait until the machine's load (nothing of ours runs now) stays under `max_cores`
    for 3 s, or `patience_s` has passed; returns the last load seen."""
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + patience_s
    while True:
        busy0 = _busy_jiffies()
        time.sleep(3.0)
        load = (_busy_jiffies() - busy0) / hz / 3.0
        if load <= max_cores or time.monotonic() > deadline:
            return load
        print(f"  waiting for a quiet machine (load {load:.2f} cores)", file=sys.stderr,
              flush=True)
        time.sleep(10.0)


def trial(plan_path: str, profile_dir: str, steps: int, warmup: int) -> tuple[dict, float]:
    """One `plan run`: its JSON report and the foreign load (cores) while it ran."""
    hz = os.sysconf("SC_CLK_TCK")
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, t0 = _busy_jiffies(), time.monotonic()
    out = _plan(["run", "--plan", plan_path, "--steps", str(steps), "--warmup", str(warmup),
                 "--profile", profile_dir, "--json"])
    busy1, t1 = _busy_jiffies(), time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    ours = (after.ru_utime + after.ru_stime) - (before_children.ru_utime
                                                + before_children.ru_stime)
    foreign = max(0.0, (busy1 - busy0) / hz - ours) / (t1 - t0)
    return json.loads(out.stdout), foreign


def measure(kind: str, folder: str, args: argparse.Namespace) -> dict:
    path = os.path.join(folder, f"{kind}.yaml")
    save_plan(KINDS[kind](preset(args.model)), path)
    best = None
    for _ in range(args.trials):
        wait_quiet(args.max_foreign, args.patience)
        report, foreign = trial(path, args.profile, args.steps, args.warmup)
        if best is None or foreign < best[1]:
            best = (report, foreign)
        if foreign <= args.max_foreign:
            break
    report, foreign = best
    return {"kind": kind, "layout": report["layout"],
            "predicted_ms": report["predicted_iteration_s"] * 1e3,
            "measured_ms": report["measured_iteration_s"] * 1e3,
            "range_ms": [x * 1e3 for x in report["measured_iteration_range_s"]],
            "error": report["iteration_error"], "foreign_cores": foreign}


def _short(layout: str) -> str:
    """The layout without what every kind shares (batch, dtype, kernels)."""
    drop = ("gbs", "seq", "fp32", "recompute", "P/G/OS 1/1/1")
    parts = [p for p in layout.split(", ") if not p.startswith(drop)
             and not p.endswith(("attention", "AdamW"))]
    return ", ".join(parts)


def table(rows: list[dict]) -> str:
    lines = ["| plan kind | layout | predicted ms | measured ms (median; range) | error | "
             "foreign load (cores) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {_short(r['layout'])} | "
                     f"{r['predicted_ms']:.2f} | {r['measured_ms']:.2f} "
                     f"({r['range_ms'][0]:.2f}-{r['range_ms'][1]:.2f}) | "
                     f"{r['error']:+.1%} | {r['foreign_cores']:.2f} |")
    within = sum(abs(r["error"]) <= 0.15 for r in rows)
    lines.append(f"\n{within} of {len(rows)} plan kinds within 15%; median |error| "
                 f"{statistics.median(abs(r['error']) for r in rows):.1%}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="debug-small", help="a preset (default debug-small)")
    ap.add_argument("--profile", help="a folder of CPU profiles (default: measure afresh)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--max-foreign", type=float, default=0.1,
                    help="foreign load (cores) above which a trial is repeated")
    ap.add_argument("--patience", type=float, default=600,
                    help="seconds to wait for a quiet machine before each trial")
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.profile is None:
            args.profile = os.path.join(folder, "profiles")
            os.makedirs(args.profile)
            profile(args.profile, args.model)
        rows = []
        for kind in args.kinds.split(","):
            rows.append(measure(kind, folder, args))
            r = rows[-1]
            print(f"{kind}: predicted {r['predicted_ms']:.2f} ms, measured "
                  f"{r['measured_ms']:.2f} ms, error {r['error']:+.1%}, foreign load "
                  f"{r['foreign_cores']:.2f} cores", file=sys.stderr, flush=True)
        print(table(rows))


if __name__ == "__main__":
    main()
