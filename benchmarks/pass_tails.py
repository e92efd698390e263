"""The spread of pass times inside a run, and what it costs the step (issue 17).

A profile prices each op at the median of its samples (each a few milliseconds of calls),
and the simulation sums those prices along the schedule. In a run the passes vary: on a
shared host a pass is now and then held up (the OS's and the hypervisor's interruptions,
the transport threads of gloo, the other ranks), so pass times are skewed to the right and
their mean lies above their median. A step is a sum of passes, so it carries their means
(the expectation of a sum is the sum of the expectations); and where ranks wait for each
other, a late pass also delays the rank that waits for it, so the expected makespan of the
schedule exceeds the makespan of the passes' typical times (noise in synchronising
programs: Hoefler, Schneider and Lumsdaine, SC10, 2010). This tool measures the first and
propagates it through the simulated schedule to see the second.

Two parts. On the ranks, every forward (each model chunk's module) and backward (autograd)
of every step, on each rank:

    torchrun --standalone --nnodes=1 --nproc-per-node=N benchmarks/pass_tails.py \\
        --plan PLAN.yaml [--steps 60] [--warmup 5] > PASSES.json

Then, with the profile the plan is priced with (no torch needed):

    python benchmarks/pass_tails.py --analyse PASSES.json --plan PLAN.yaml --profile DIR

prints per rank, pass kind and chunk the median, mean and 90th percentile of the measured
passes, and the iteration three ways: simulated as priced; simulated with each pass task's
priced time times a ratio drawn from the measured passes (a pass over its own group's
median), the median over `--draws` draws (`planner.simulator.build.rescheduled`: the same
graph, order and host sharing); and measured (the median step).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

PASS_KINDS = ("F", "B", "W")  # the simulated tasks the measured spread applies to


def record(plan_path: str, steps: int, warmup: int) -> dict[str, Any] | None:
    """Run `steps` steps of the plan on this torchrun rank with every model forward and
    backward timed; rank 0 returns every rank's passes and step times after `warmup`
    (others None). Each pass: [kind "F" / "B", model chunk, start, end] in seconds of the
    host's monotonic clock (one clock for every rank of a host)."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from step_phases import start_trainer

    trainer, rank = start_trainer(plan_path, steps)
    runner = trainer.runner
    passes: list[list[Any]] = []
    current = [0]  # the chunk whose backward runs

    def forward_of(module: torch.nn.Module, index: int) -> None:
        inner = module.forward

        def timed(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            out = inner(*a, **k)
            passes.append(["F", index, start, time.perf_counter()])
            return out
        module.forward = timed  # type: ignore[method-assign]

    for chunk in runner.chunks:
        forward_of(chunk.module, chunk.index)
    backward_pass = runner._backward

    def backward_of_chunk(chunk: Any, j: int) -> None:
        current[0] = chunk.index
        backward_pass(chunk, j)

    runner._backward = backward_of_chunk
    autograd_backward = torch.autograd.backward

    def timed_backward(*a: Any, **k: Any) -> None:
        start = time.perf_counter()
        autograd_backward(*a, **k)
        passes.append(["B", current[0], start, time.perf_counter()])

    torch.autograd.backward = timed_backward  # type: ignore[assignment]
    mine: list[dict[str, Any]] = []
    for step in range(steps):
        passes.clear()
        dist.barrier()
        start = time.perf_counter()
        trainer.iteration(step)
        if step >= warmup:
            mine.append({"step_s": time.perf_counter() - start, "passes": list(passes)})
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    gc.collect()  # before destroy: avoids gloo's exit-time abort
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {"plan": plan_path, "steps": steps, "warmup": warmup,
            "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
            "ranks": everyone}


def groups(measured: dict[str, Any]) -> dict[tuple[int, str, int], list[float]]:
    """Pass seconds by (rank, kind, chunk), over every recorded step."""
    out: dict[tuple[int, str, int], list[float]] = defaultdict(list)
    for rank, steps in enumerate(measured["ranks"]):
        for step in steps:
            for kind, chunk, start, end in step["passes"]:
                out[(rank, kind, chunk)].append(end - start)
    return dict(out)


def ratios(by_group: dict[tuple[int, str, int], list[float]]) -> list[float]:
    """Every measured pass over the median of its group: the spread, without the
    differences between chunks and kinds."""
    return [t / statistics.median(ts) for ts in by_group.values() for t in ts]


def drawn_iterations(sim: Any, spread: Sequence[float], draws: int, seed: int = 0
                     ) -> list[float]:
    """The simulated iteration seconds with each pass task's time times a ratio drawn
    from `spread` (independently per task and draw), `draws` times."""
    from planner.simulator.build import rescheduled

    g, rng = sim.graph, random.Random(seed)
    passes = [t for t in range(len(g)) if g.kinds[t] in PASS_KINDS]
    out = []
    for _ in range(draws):
        durations = list(g.durations)
        for t in passes:
            durations[t] *= rng.choice(spread)
        out.append(max(rescheduled(sim, durations).end))
    return out


def analyse(measured: dict[str, Any], plan_path: str, profile: str, draws: int,
            say: Callable[[str], None] = print) -> dict[str, Any]:
    from planner.simulator.build import simulate_graph
    from planner.specs.plan import load_plan
    from profiler.store import load_profiles

    plan = load_plan(plan_path)
    devices = sorted({g.device.name for g in plan.cluster.node_groups})
    profiles = load_profiles([profile], devices=devices, dtype=plan.training.dtype)
    sim = simulate_graph(plan, profiles=profiles)
    by_group = groups(measured)
    spread = ratios(by_group)
    if not spread:
        raise SystemExit("pass_tails: no pass was recorded")
    say("rank kind chunk: passes, median / mean / p90 ms (mean over median)")
    for (rank, kind, chunk), ts in sorted(by_group.items()):
        ts = sorted(ts)
        med, mean = statistics.median(ts), statistics.fmean(ts)
        say(f"  {rank} {kind} {chunk}: {len(ts)}, {med * 1e3:.2f} / {mean * 1e3:.2f} / "
            f"{ts[int(0.9 * (len(ts) - 1))] * 1e3:.2f} ({mean / med:.3f})")
    priced = max(sim.schedule.end)
    drawn = drawn_iterations(sim, spread, draws)
    steps = [s["step_s"] for s in measured["ranks"][0]]
    out = {"priced_s": priced, "drawn_median_s": statistics.median(drawn),
           "drawn_p10_s": sorted(drawn)[len(drawn) // 10],
           "drawn_p90_s": sorted(drawn)[(9 * len(drawn)) // 10],
           "spread_mean": statistics.fmean(spread), "measured_median_s": statistics.median(steps),
           "draws": draws}
    say(f"passes' mean over median, all groups: {out['spread_mean']:.3f}")
    say(f"iteration: simulated as priced {priced * 1e3:.2f} ms; with the measured spread "
        f"{out['drawn_median_s'] * 1e3:.2f} ms (median of {draws} draws, p10 "
        f"{out['drawn_p10_s'] * 1e3:.2f}, p90 {out['drawn_p90_s'] * 1e3:.2f}); measured "
        f"{out['measured_median_s'] * 1e3:.2f} ms (median of {len(steps)} steps)")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--analyse", metavar="PASSES.json",
                    help="what the ranks recorded; with --profile, simulate it")
    ap.add_argument("--profile", help="the profile folder the plan is priced with")
    ap.add_argument("--draws", type=int, default=100)
    args = ap.parse_args(argv)
    if args.analyse:
        if not args.profile:
            ap.error("--analyse needs --profile")
        with open(args.analyse, encoding="utf-8") as fh:
            analyse(json.load(fh), args.plan, args.profile, args.draws)
        return
    out = record(args.plan, args.steps, args.warmup)
    if out is not None:
        json.dump(out, sys.stdout)
        print()


if __name__ == "__main__":
    main()
