"""The program torchrun starts on every rank: `python -m executor.worker --plan FILE ...`.

`plan run` builds this command line (executor/launch.py); users of multi-node clusters
run the printed torchrun lines, which end in it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

__all__ = ["LEARNING_RATE", "main", "worker_args"]

LEARNING_RATE = 3e-4  # AdamW's, where a run names none (`plan run --lr`)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="executor.worker", description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--hang-timeout", type=float, default=30.0)
    p.add_argument("--fault", help=argparse.SUPPRESS)
    p.add_argument("--trace", type=int, default=0, help="steps run after the measured ones "
                   "under torch.profiler (their ops' time by kind in metrics.json)")
    return p


def worker_args(*, plan: str, steps: int, run_dir: str, seed: int = 0,
                learning_rate: float | None = None,
                checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                resume: bool = False, hang_timeout_s: float = 30.0,
                fault: str | None = None, trace_steps: int = 0) -> list[str]:
    """The worker's arguments for these settings (the inverse of its parser)."""
    args = ["--plan", plan, "--steps", str(steps), "--run-dir", run_dir, "--seed", str(seed),
            "--hang-timeout", f"{hang_timeout_s:g}"]
    if learning_rate is not None:
        args += ["--lr", f"{learning_rate!r}"]
    if checkpoint_dir:
        args += ["--checkpoint-dir", checkpoint_dir, "--checkpoint-every",
                 str(checkpoint_every)]
    if resume:
        args.append("--resume")
    if fault:
        args += ["--fault", fault]
    if trace_steps:
        args += ["--trace", str(trace_steps)]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C reaches the ranks as SIGINT forwarded by torchrun's agent: end at once, as
    # SIGTERM does, and leave the one line to `plan run` (a KeyboardInterrupt in the torch
    # imports or a backward pass printed a traceback from every rank). A save in progress
    # is not harmed: checkpoints are written aside and renamed whole.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    args = _parser().parse_args(argv)
    from executor.runtime import RunSettings, run_rank
    from planner.specs.plan import load_plan

    extra = {} if args.lr is None else {"learning_rate": args.lr}
    run_rank(load_plan(args.plan), RunSettings(
        steps=args.steps, run_dir=args.run_dir, seed=args.seed, **extra,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        resume=args.resume, hang_timeout_s=args.hang_timeout, fault=args.fault,
        trace_steps=args.trace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
