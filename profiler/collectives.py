"""Measure collectives across N local processes over torch.distributed.

gloo on the CPU (one thread per rank: other load makes more threads slower, see
shared/notes/torch-distributed-on-cpu.md), NCCL on GPUs (rank r on cuda:r). Sizes are
NCCL's "size": the full per-rank buffer (the all-gather output, the reduce-scatter
input); send/recv is one way between rank pairs (0,1), (2,3), ..., timed as half a round
trip. A sample is the slowest rank's time of back-to-back calls after a barrier; a row's
time is the samples' median on GPUs and their mean on the CPU, where gloo's calls are
skewed far to the right (a transport thread now and then waits a scheduler slice for a
core) and a step pays every call (profiler.store.summary_row).

Sizes are measured in interleaved rounds (one sample of every size, then the next
round), so a burst of load on the machine hits all sizes alike instead of skewing one.
Each rank imports torch only inside the spawned worker.

On the CPU with N > 2 processes, all-reduce, all-gather and reduce-scatter are also timed
in groups of every g dividing N (2 <= g < N), the N / g groups of consecutive ranks at
once: variant `crowd<N>`, ranks g. That is how a plan's data-parallel groups reduce after
the backward, every rank of the host at once, and gloo's collectives on oversubscribed
cores are not the alone measurement slowed by a share: a rank waiting for its peer waits
for the peer's CPU work, itself queued behind the other groups' (on the 2-core VMs two
2-rank reduce-scatters of 3.3 MB at once took 6.8 ms where one alone took 2.7, 2026-12-05).
"""

from __future__ import annotations

import math
import os
import queue
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from profiler.store import ProfileRow, crowd_variant, summary_row

__all__ = ["COLLECTIVES", "CROWDED", "CollectiveSettings", "crowd_sizes", "measure_collectives",
           "size_grid"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")
# timed in groups smaller than the world too, every group at once (`crowd_variant`)
CROWDED = ("all_reduce", "all_gather", "reduce_scatter")
_ELEM_BYTES = 4  # fp32 buffers


def crowd_sizes(nprocs: int) -> tuple[int, ...]:
    """The group sizes timed at once in a run of `nprocs` CPU processes: every divisor
    from 2 to below `nprocs`."""
    return tuple(g for g in range(2, nprocs) if nprocs % g == 0)


@dataclass(frozen=True, kw_only=True)
class CollectiveSettings:
    nprocs: int = 2
    device: str = "cpu"  # cpu | cuda
    kinds: tuple[str, ...] = COLLECTIVES
    sizes_bytes: tuple[int, ...] = ()
    warmup: int = 3
    repeats: int = 15
    min_sample_s: float = 2e-3
    budget_s_per_size: float = 2.0  # fewer samples for the largest sizes
    # also the host costs of profiler/hostcost.py (tiny collectives, FSDP2's and DTensor's
    # per-layer costs, for a tiny model of this preset's family); CPU only
    host_costs_model: str | None = None
    # with it, DTensor's rows also on these (ModelSpec, micro-batch, sequence): the tp
    # collectives inside a block at the activation sizes a plan of that model runs
    host_costs_blocks: tuple[tuple[Any, int, int], ...] = ()


def size_grid(min_bytes: int, max_bytes: int) -> tuple[int, ...]:
    """Powers of two from `min_bytes` to `max_bytes` (both included when powers of two)."""
    lo = math.ceil(math.log2(max(min_bytes, _ELEM_BYTES)))
    hi = math.floor(math.log2(max_bytes))
    return tuple(2**e for e in range(lo, hi + 1))


def _ops(kind: str, size: int, rank: int, world: int, device: str,
         group: object = None) -> Callable[[], None]:
    """One call of collective `kind` with a per-rank buffer of `size` bytes, over the
    default group (`world` ranks) or over `group` of `world` ranks."""
    import torch
    import torch.distributed as dist

    from profiler.torch_compat import all_gather_single, reduce_scatter_single

    numel = max(size // _ELEM_BYTES, world)
    numel -= numel % world  # shards must be equal
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // world, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":
        return lambda: all_gather_single(full, shard, group=group)
    if kind == "reduce_scatter":
        return lambda: reduce_scatter_single(shard, full, group=group)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if kind == "send_recv":
        peer = rank ^ 1
        if peer >= world:
            return lambda: None  # an odd rank out sits the exchange out

        def ping_pong() -> None:
            if rank % 2 == 0:
                dist.send(full, peer)
                dist.recv(full, peer)
            else:
                dist.recv(full, peer)
                dist.send(full, peer)

        return ping_pong
    raise ValueError(f"unknown collective {kind!r}")


def _sample_s(fn: Callable[[], None], calls: int, device: str) -> tuple[float, float]:
    """The slowest rank's seconds per call over `calls` back-to-back calls, and the CPU
    seconds per call of a rank's process (all its threads; the mean over the ranks)."""
    import time

    import torch
    import torch.distributed as dist

    dist.barrier()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
    busy = torch.tensor([(time.process_time() - cpu) / calls], dtype=torch.float64)
    if device.startswith("cuda"):
        elapsed, busy = elapsed.to(device), busy.to(device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    dist.all_reduce(busy)
    return float(elapsed.item()), float(busy.item()) / dist.get_world_size()


def _kind_rows(kind: str, rank: int, world: int, device: str, s: CollectiveSettings,
               crowds: dict[int, object] | None = None) -> list[ProfileRow]:
    """All sizes of one collective, sampled in interleaved rounds; with `crowds` (group
    size -> this rank's group of that size) also in those groups, all at once."""
    rows = _timed_rows(kind, rank, world, device, s, None)
    if crowds and kind in CROWDED:
        for g, group in crowds.items():
            rows += _timed_rows(kind, rank, g, device, s, group)
    return rows


def _timed_rows(kind: str, rank: int, world: int, device: str, s: CollectiveSettings,
                group: object) -> list[ProfileRow]:
    """`_kind_rows` over the whole world (`group` None) or over `group` of `world` ranks,
    every rank of the world in its own group at once (variant `crowd_variant`; no CPU-time
    row: the shares are the alone measurement's)."""
    import torch.distributed as dist

    variant = None if group is None else crowd_variant(dist.get_world_size())
    fns = [_ops(kind, size, rank, world, device, group) for size in s.sizes_bytes]
    calls, rounds = [], []
    for fn in fns:  # warm up; agree on calls per sample and on the number of rounds
        first = min(_sample_s(fn, 1, device)[0] for _ in range(max(s.warmup, 1)))
        calls.append(max(1, math.ceil(s.min_sample_s / max(first, 1e-9))))
        rounds.append(max(5, min(s.repeats, math.floor(s.budget_s_per_size / max(first, 1e-9)))))
    times: list[list[float]] = [[] for _ in fns]
    busy: list[list[float]] = [[] for _ in fns]
    for r in range(max(rounds)):
        for i, fn in enumerate(fns):
            if r < rounds[i]:
                wall, cpu = _sample_s(fn, calls[i], device)
                times[i].append(wall)
                busy[i].append(cpu)
    factor = 0.5 if kind == "send_recv" else 1.0  # a ping-pong is two one-way sends
    # gloo's calls are skewed far right on a busy host and a step pays each: their mean
    # (`summary_row`), wall and CPU time alike (their ratio is the CPU share of a call)
    gloo = device == "cpu"
    rows = []
    for size, ts, cs, n in zip(s.sizes_bytes, times, busy, calls, strict=True):
        rows.append(summary_row("collective", kind, [t * factor for t in ts],
                                variant=variant, ranks=world, size_bytes=size, calls=n,
                                mean=gloo))
        if gloo and group is None:  # gloo runs it on the ranks' own cores
            rows.append(summary_row("host", f"cpu.{kind}", [max(c * factor, 1e-9) for c in cs],
                                    variant="gloo", ranks=world, size_bytes=size, calls=n,
                                    mean=True))
    return rows


def _worker(rank: int, s: CollectiveSettings, init_file: str, results: object) -> None:
    """One rank: join the group, measure every collective, send rows (rank 0) home."""
    import gc
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    cuda = s.device.startswith("cuda")
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=s.nprocs)
    # every rank makes every group, in the same order (torch.distributed.new_group)
    crowds = {g: [dist.new_group(list(range(lo, lo + g))) for lo in range(0, s.nprocs, g)
                  ][rank // g] for g in (() if cuda else crowd_sizes(s.nprocs))}
    try:
        for kind in s.kinds:
            rows = _kind_rows(kind, rank, s.nprocs, device, s, crowds)
            if rank == 0:
                results.put(rows)  # type: ignore[attr-defined]  # a multiprocessing queue
        if s.host_costs_model is not None:
            from profiler.hostcost import framework_rows

            rows = framework_rows(rank, s.nprocs, backend="gloo",
                                  family_model=s.host_costs_model, repeats=s.repeats,
                                  blocks=s.host_costs_blocks)
            if rank == 0:
                results.put(rows)  # type: ignore[attr-defined]  # a multiprocessing queue
    finally:
        gc.collect()  # before destroy: avoids gloo's exit-time abort (see shared/notes)
        dist.destroy_process_group()


def measure_collectives(s: CollectiveSettings,
                        progress: Callable[[int, str], None] | None = None
                        ) -> tuple[tuple[ProfileRow, ...], bool]:
    """Rows for every (collective, size) over `s.nprocs` spawned processes, and whether
    Ctrl-C cut it short (the collectives finished by then are kept)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    rows: list[ProfileRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_worker, args=(r, s, init_file, results), daemon=True)
                 for r in range(s.nprocs)]
        for p in procs:
            p.start()
        try:
            for i, kind in enumerate(s.kinds):
                if progress is not None:
                    progress(i, kind)
                rows.extend(_next_rows(results, procs))
            if s.host_costs_model is not None:
                if progress is not None:
                    progress(len(s.kinds), "host costs")
                rows.extend(_next_rows(results, procs))
        except KeyboardInterrupt:
            _stop(procs)
            return tuple(rows), True
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError("a measuring process failed ("
                               + _exits([p.exitcode for p in procs]) + ")")
    if progress is not None:
        progress(len(s.kinds), "done")
    return tuple(rows), False


def _next_rows(results: object, procs: Sequence[object]) -> list[ProfileRow]:
    """Wait for rank 0's next batch of rows; fail if a rank died meanwhile."""
    while True:
        try:
            return results.get(timeout=1.0)  # type: ignore[attr-defined]  # a multiprocessing queue
        except queue.Empty:
            dead = [p.exitcode for p in procs if not p.is_alive()]  # type: ignore[attr-defined]  # multiprocessing processes
            if dead:
                _stop(procs)
                raise RuntimeError(f"a measuring process exited early ({_exits(dead)}); its "
                                   "error, if it printed one, is above") from None


def _exits(codes: Sequence[int | None]) -> str:
    """Processes' exit codes as a person reads them: a negative code is the signal that
    killed the process (SIGABRT: a C++ abort, as gloo's threads do now and then when a
    process ends; SIGKILL: most often the kernel's out-of-memory killer)."""
    def one(code: int | None) -> str:
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        return f"exit code {code}"
    return ", ".join(one(c) for c in codes)


def _stop(procs: Sequence[object]) -> None:
    for p in procs:
        if p.is_alive():  # type: ignore[attr-defined]  # multiprocessing processes
            p.terminate()  # type: ignore[attr-defined]  # multiprocessing processes
    for p in procs:
        p.join()  # type: ignore[attr-defined]  # multiprocessing processes
