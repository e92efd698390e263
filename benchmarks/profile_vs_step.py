"""The profile-driven prediction of a one-process CPU training step against the step
measured in torch (issue 4's check; tests/executor/test_step_vs_prediction.py asserts 20%).

    python benchmarks/profile_vs_step.py [--model debug-tiny] [--mbs 8] [--trials 3]
    python benchmarks/profile_vs_step.py --collectives [--trials 5]

Each trial profiles the model afresh (`plan profile`, fp32, one thread), predicts the step
(`plan simulate --profile`, tp = pp = dp = 1) and times it (executor/train.py) with the
kernels the prediction chose. With --collectives: all-reduce at 1, 2, 3, 4 and 8 MB over
two processes in interleaved rounds; the profile without 3 MB predicts it.
"""

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import time

from executor.train import time_train_step
from planner.cli import main
from planner.specs.model import preset
from profiler.store import MonotoneCurve

MB = 1024**2


def _plan(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return out.getvalue()


def step_trial(model, mbs, seq, folder):
    path = os.path.join(folder, "cpu.csv")
    start = time.perf_counter()
    _plan(["profile", "--device", "cpu", "--model", model, "--mbs", str(mbs), "--seq",
           str(seq), "--dtype", "fp32", "--threads", "1", "-o", path])
    profiled_s = time.perf_counter() - start
    result = json.loads(_plan(["simulate", "--model", model, "--gpus", "CPU:1", "--tp", "1",
                               "--pp", "1", "--dp", "1", "--mbs", str(mbs), "--gbs", str(mbs),
                               "--seq", str(seq), "--dtype", "fp32", "--profile", path,
                               "--json"]))
    k = result["kernels"]
    step = time_train_step(preset(model), batch_size=mbs, seq_len=seq, dtype="fp32",
                           attention=k["attention"], optimizer=k["optimizer"], threads=1,
                           repeats=21)
    predicted, measured = result["iteration_time_s"], step.timing.median_s
    print(f"{model} mbs {mbs}: profiled in {profiled_s:.1f} s, kernels {k['attention']}/"
          f"{k['optimizer']}, predicted {predicted * 1e3:.2f} ms, measured "
          f"{measured * 1e3:.2f} ms (spread {step.timing.spread:.1%}), "
          f"error {predicted / measured - 1:+.1%}")
    return predicted / measured - 1


def collective_trial():
    from profiler.collectives import CollectiveSettings, measure_collectives

    sizes = (1 * MB, 2 * MB, 3 * MB, 4 * MB, 8 * MB)
    rows, _ = measure_collectives(CollectiveSettings(nprocs=2, kinds=("all_reduce",),
                                                     repeats=41, sizes_bytes=sizes))
    curve = MonotoneCurve([(r.bytes, r.time_s) for r in rows if r.bytes != 3 * MB])
    fresh = next(r.time_s for r in rows if r.bytes == 3 * MB)
    print("all-reduce ms at 1,2,3,4,8 MB:", [round(r.time_s * 1e3, 2) for r in rows],
          f"predicted 3 MB {curve(3 * MB) * 1e3:.2f} ms, error {curve(3 * MB) / fresh - 1:+.1%}")
    return curve(3 * MB) / fresh - 1


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="debug-tiny")
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--collectives", action="store_true")
    args = ap.parse_args()
    errors = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.trials):
            errors.append(collective_trial() if args.collectives else
                          step_trial(args.model, args.mbs, args.seq, folder))
    print(f"median |error| {statistics.median(abs(e) for e in errors):.1%}, "
          f"worst {max(abs(e) for e in errors):.1%} over {len(errors)} trials")


if __name__ == "__main__":
    main_()
