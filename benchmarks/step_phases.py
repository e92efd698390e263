"""Where a training step's time goes on each rank: the executor's Trainer run phase by
phase (forward and backward of the schedule, gradient reduction, optimizer step), with
the CPU time the rank used beside its wall time (issue 17: the unexplained part of a
2-rank debug-tiny step).

    torchrun --standalone --nnodes=1 --nproc-per-node=2 benchmarks/step_phases.py \\
        --plan PLAN.yaml [--steps 60] [--warmup 5]

Rank 0 prints, per rank, the median milliseconds of each phase over the steps after the
warm-up: `run` (StageRunner: every forward and backward, pipeline transfers and in-line
collectives), `reduce` (tied-embedding and data-parallel gradient reduction: waits for the
slowest rank too), `step` (optimizer), `total`, `cpu` (this process's CPU time in the
step: wall minus cpu is time spent waiting), and `hand_off` (inside `run`: taking each
backward's gradients into the buffer, `add_grads`, with sequence parallelism's norm
gradients all-reduced there).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

PHASES = ("run", "reduce", "step", "total", "cpu", "hand_off")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    trainer, rank = start_trainer(args.plan, args.steps)
    samples: dict[str, list[float]] = {k: [] for k in PHASES}
    hand_off = [0.0]

    def timed(add: Callable[..., None]) -> Callable[..., None]:
        def add_grads(**kw: bool) -> None:
            t = time.perf_counter()
            add(**kw)
            hand_off[0] += time.perf_counter() - t
        return add_grads

    for s in trainer.states:
        s.add_grads = timed(s.add_grads)  # timing only
    for step in range(args.steps):
        hand_off[0] = 0.0
        c0, t0 = time.process_time(), time.perf_counter()
        trainer.runner.run(step)
        t1 = time.perf_counter()
        if trainer.tied_group is not None:
            for s in trainer.states:
                for grad in s.tied_grads():
                    dist.all_reduce(grad, group=trainer.tied_group)
        for s in trainer.states:
            s.reduce_grads()
        t2 = time.perf_counter()
        for s in trainer.states:
            s.step()
        t3, c3 = time.perf_counter(), time.process_time()
        for k, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t3 - t0, c3 - c0, hand_off[0]),
                        strict=True):
            samples[k].append(v)
    mine = {k: statistics.median(v[args.warmup:]) * 1e3 for k, v in samples.items()}
    everyone: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        json.dump({"plan": args.plan, "steps": args.steps, "warmup": args.warmup,
                   "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
                   "ms_per_rank": everyone}, sys.stdout, indent=1)
        print()
    gc.collect()  # before destroy: avoids gloo's exit-time abort
    dist.destroy_process_group()


def start_trainer(plan_path: str, steps: int) -> tuple[Any, int]:
    """This torchrun rank's executor Trainer for the plan at `plan_path` (its process
    group started, a watchdog and a scratch run folder), and the rank."""
    import torch.distributed as dist

    from executor.groups import create_groups
    from executor.runtime import RunSettings, Trainer, _device
    from executor.topology import Topology
    from executor.watchdog import Watchdog
    from planner.specs.plan import load_plan

    plan = load_plan(plan_path)
    topo, rank = Topology.of(plan), int(os.environ["RANK"])
    device, backend = _device(plan, topo, rank)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group(backend, timeout=timeout)
    run_dir = tempfile.mkdtemp()
    watchdog = Watchdog(rank=rank, names=[r.describe() for r in topo.roles], run_dir=run_dir,
                        hang_timeout_s=120)
    trainer = Trainer(plan, topo, rank, device, create_groups(plan, topo, rank, timeout=timeout),
                      watchdog, RunSettings(steps=steps, run_dir=run_dir))
    return trainer, rank


if __name__ == "__main__":
    main()
