"""Host-side costs of a training step, from the "host" rows a profile measured on this
host (profiler/hostcost.py), else the analytic defaults:

* per-op dispatch: on a GPU the host issues each kernel (`launch_s`, the measured
  `dispatch_forward` or the catalog's `launch_overhead_us`) while the device runs ahead;
  on the CPU the op runs on the thread that dispatches it, so each op's measured time
  already holds its dispatch and nothing is added;
* FSDP2 (`fsdp_unit_s`, `fsdp_root_s`): each unit's hooks and copies beyond its
  all-gather and reduce-scatter, per forward and per backward (measured with the
  collectives in, those taken out at the profile's own price of them), at the unit's
  bytes; the root unit's (embedding, final norm, head) apart. Where they were measured, the unit's
  collectives are taken as blocking the compute thread (gloo has no streams; FSDP2 waits
  for each gather), so the simulator prices gathers one by one inside the pass instead of
  prefetched on a side stream;
* DTensor (`dtensor_layer_s`, `dtensor_root_s`): what a tensor-parallel block (and the
  embedding and head) adds to a pass, held on the compute stream: measured with its tp
  collectives in, at the activation sizes the profile timed blocks at (a tiny block's, and
  the plan model's at each micro-batch and sequence asked for), between those linearly;
  the collectives are taken out at the profile's own price for the size measured and
  priced again at the plan's, so at a measured size the measured block stands whole (a
  collective inside a block costs more than one timed back to back: on this CPU host a
  256 KB all-reduce took 1.4-2.0 ms a call in situ against 0.5-0.9 ms); the share of a
  block's time its rank is on the CPU (`dtensor_cpu_share`, from the rows' `cpu.` twins:
  a rank waiting for its peer in a tp collective leaves its core to others);
* shared cores (`shared_cores`): CPU ranks of one host share its cores, caches, memory
  bandwidth and whatever else runs there, so each computes slower than the single process
  that measured the op profile while other ranks compute too: the plan model's own
  forward + backward (`pass_shared`; else a GEMM's, `gemm_shared`) with n of the host's
  ranks computing at once against one alone, n = 1..N. The event simulation applies
  it only while that many ranks compute (planner/simulator/graph.py), so pipeline stages
  that compute in turn are not slowed;
* the optimizer step (`optimizer_shared`): AdamW and the gradients' zeroing stream the
  optimizer states through memory once a step, and every rank of a host steps at about
  the same moment (after the gradient reduction), so beyond the last-level cache they
  share the host's memory bandwidth: the step with n of the host's ranks stepping at once
  against one alone, at the model's parameter count and its 1/N shard (two fp32 AdamW
  steps of 25 M parameters at once took 25 ms each on this VM against 15 ms alone; 0.8 M
  parameters, in cache, no slower). The event simulation applies it to optimizer tasks
  in place of the pass's slowdown;
* ranks in step (`sync_skew`): a group that synchronises at every collective runs at
  the pace of its slowest rank (Hoefler et al. 2010); the measured lateness of the last
  rank per second of compute before a collective lengthens each synchronised rank's
  compute in the event simulation;
* collectives as CPU work (`collective_cpu_share`): gloo runs a collective on its ranks'
  own cores (copies, reductions, loopback TCP), so the share of its time a rank's process
  is busy loads the host like compute, slowing the ranks that compute meanwhile and
  being slowed by them.

Each is measured per host with the executor's framework and never fitted to a plan.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from profiler.analytic import launch_overhead_s
from profiler.devices import DeviceSpec
from profiler.store import Profile, ProfileRow, Profiles

__all__ = ["HOST_ANALYTIC_GPU_SOURCE", "HOST_ANALYTIC_SOURCE", "NO_BLOCK_COST",
           "BlockHostCost", "SharedCoreSlowdown", "backend", "collective_cpu_share",
           "dtensor_cpu_share", "dtensor_layer_s", "dtensor_root_s", "fsdp_root_s",
           "fsdp_unit_s", "host_families", "host_source", "launch_s", "runner_microbatch_s",
           "optimizer_shared", "p2p_host_s", "shared_cores", "sync_skew", "at_size"]

HOST_ANALYTIC_SOURCE = ("analytic defaults (per-op dispatch inside each op's time on the CPU, "
                        "the catalog's launch overhead on GPUs; FSDP gathers prefetched on "
                        "their own stream; no DTensor overhead; CPU ranks compute as fast "
                        "as one process alone)")
# the same defaults as they apply to a plan on GPUs only (the CPU ones are noise there)
HOST_ANALYTIC_GPU_SOURCE = ("analytic defaults (the catalog's per-kernel launch overhead, "
                            "profiler/data/efficiency.yaml; FSDP gathers prefetched on their "
                            "own stream; no DTensor overhead)")


def backend(dev: DeviceSpec) -> str:
    """The torch.distributed backend the executor uses on this device."""
    return "gloo" if dev.vendor == "cpu" else "nccl"


def launch_s(dev: DeviceSpec, profile: Profile | None) -> float:
    """Host seconds to issue one kernel on a device that runs ahead of its host (zero on
    the CPU: there, dispatch is part of each op's measured time)."""
    default = launch_overhead_s(dev)
    if default <= 0.0 or profile is None:
        return default
    measured = profile.host_s("dispatch_forward")
    return default if measured is None else measured


def runner_microbatch_s(dev: DeviceSpec, profile: Profile | None) -> float:
    """The executor's runner per micro-batch pass of a model chunk beyond the model's own
    forward and backward (drawing the samples, weighting the loss, keeping activations,
    reporting progress), as measured on this host (`runner_microbatch`); on the CPU only,
    where the runner holds the thread that computes; 0 without the row."""
    if dev.vendor != "cpu" or profile is None:
        return 0.0
    return profile.host_s("runner_microbatch") or 0.0


def p2p_host_s(dev: DeviceSpec, profile: Profile | None, size: float
               ) -> tuple[float, float]:
    """The compute thread's seconds to send one pipeline message of `size` bytes (the
    `isend` call, and the `wait` once it has gone) and to receive one (posting the
    `irecv` and the `wait` once it has arrived), as measured on this host (`p2p_send` /
    `p2p_recv` rows, `at_size`); on the CPU only, where the thread that issues them is
    the one that computes; (0, 0) without the rows."""
    if dev.vendor != "cpu" or profile is None:
        return 0.0, 0.0
    sent, taken = (profile.sized_host_rows(name, variant=backend(dev), ranks=2)
                   for name in ("p2p_send", "p2p_recv"))
    if not sent or not taken:
        return 0.0, 0.0
    return at_size(sent, size)[1], at_size(taken, size)[1]


@dataclass(frozen=True)
class BlockHostCost:
    """A framework's measured cost of one framed block (an FSDP2 unit, a tensor-parallel
    block under DTensor) per forward and per backward. `comm_bytes` > 0: measured with
    the block's own collectives in, at that size (FSDP2: a gather in the forward, a
    gather and a reduce-scatter in the backward; DTensor: two tp collectives a pass); the
    pricing takes them out at the profile's own price for that size, so that a noisy
    collective row prices them alike on both sides of the subtraction. 0: the times
    already leave them out (profiles before 2026-12-04)."""

    forward_s: float
    backward_s: float
    comm_bytes: float = 0.0


NO_BLOCK_COST = BlockHostCost(0.0, 0.0)


def _block_cost(profile: Profile, stem: str, variant: str, ranks: int,
                size: float | None = None) -> BlockHostCost | None:
    """The rows `<stem>_total_forward` / `_backward` (collectives in) where the profile
    has them, else `<stem>_forward` / `_backward` (collectives out), or None; at `size`
    (`at_size`: the rows measured at several sizes), else at the one size measured."""
    for whole in (True, False):
        found = _pair_at(profile, f"{stem}{'_total' if whole else ''}", variant, ranks, size)
        if found is not None:
            at, fwd_s, bwd_s = found
            return BlockHostCost(fwd_s, bwd_s, at if whole else 0.0)
    return None


def _pair_at(profile: Profile, stem: str, variant: str, ranks: int, size: float | None
             ) -> tuple[float, float, float] | None:
    """(bytes, forward seconds, backward seconds) of the rows `<stem>_forward` and
    `<stem>_backward` at `size` (`at_size`), or None where the profile lacks either."""
    fwd, bwd = (profile.sized_host_rows(f"{stem}_{p}", variant=variant, ranks=ranks)
                for p in ("forward", "backward"))
    if not fwd or not bwd:
        return None
    at, fwd_s = at_size(fwd, size)
    return at, fwd_s, at_size(bwd, size)[1]


def at_size(rows: Sequence[ProfileRow], size: float | None) -> tuple[float, float]:
    """(bytes, seconds) of rows measured at several sizes (smallest first), at `size`:
    linear between the two measured around it, the nearest end's beyond them (a block's
    cost at a size far from any measured is the end's, with its collectives repriced by
    the caller: `BlockHostCost`); the first row where `size` is None."""
    if size is None or len(rows) == 1 or size <= rows[0].bytes:
        return rows[0].bytes, rows[0].time_s
    if size >= rows[-1].bytes:
        return rows[-1].bytes, rows[-1].time_s
    hi = next(i for i, r in enumerate(rows) if r.bytes >= size)
    lo_row, hi_row = rows[hi - 1], rows[hi]
    share = (size - lo_row.bytes) / (hi_row.bytes - lo_row.bytes)
    return size, lo_row.time_s + share * (hi_row.time_s - lo_row.time_s)


def fsdp_unit_s(dev: DeviceSpec, profile: Profile | None, ranks: int,
                unit_bytes: float | None = None) -> BlockHostCost | None:
    """FSDP2's measured per-unit cost, or None; at `unit_bytes` where the profile measured
    units of several sizes (the tiny preset's block and the plan model's)."""
    return (None if profile is None
            else _block_cost(profile, "fsdp_unit", backend(dev), ranks, unit_bytes))


def fsdp_root_s(dev: DeviceSpec, profile: Profile | None, ranks: int,
                root_bytes: float | None = None) -> BlockHostCost | None:
    """FSDP2's measured cost of the root unit (embedding, final norm, head), measured
    with its one gather (forward) and one reduce-scatter (backward) in, at `root_bytes`
    as `fsdp_unit_s`; None where the profile lacks the rows (before 2026-12-05)."""
    return (None if profile is None
            else _block_cost(profile, "fsdp_root", backend(dev), ranks, root_bytes))


def _variant(dev: DeviceSpec, sequence_parallel: bool) -> str:
    return backend(dev) + ("+sp" if sequence_parallel else "")


def dtensor_layer_s(dev: DeviceSpec, profile: Profile | None, tp: int,
                    sequence_parallel: bool, act_bytes: float | None = None) -> BlockHostCost:
    """DTensor's per-block cost (with or beyond its tp collectives: `BlockHostCost`), at
    the activation size `act_bytes` where the profile measured blocks at several sizes."""
    if profile is None or tp <= 1:
        return NO_BLOCK_COST
    return (_block_cost(profile, "dtensor_layer", _variant(dev, sequence_parallel), tp,
                        act_bytes) or NO_BLOCK_COST)


def dtensor_cpu_share(dev: DeviceSpec, profile: Profile | None, tp: int,
                      sequence_parallel: bool, act_bytes: float | None = None) -> float | None:
    """The share of a tp block's DTensor time (its machinery and tp collectives together,
    forward and backward) that its rank's process is on the CPU: the `cpu.` twins of the
    `dtensor_layer_total_*` rows (CPU seconds, the ranks' mean) against the rows, at
    `act_bytes` as `dtensor_layer_s`, at most 1. A rank waiting in a tp collective for its
    peer (gloo blocks in a socket read) leaves its core to the host's other ranks. None
    where the profile lacks the rows (profiles before 2026-12-05), on GPUs and without tp."""
    if profile is None or tp <= 1 or dev.vendor != "cpu":
        return None
    variant = _variant(dev, sequence_parallel)
    wall = _pair_at(profile, "dtensor_layer_total", variant, tp, act_bytes)
    used = _pair_at(profile, "cpu.dtensor_layer_total", variant, tp, act_bytes)
    if wall is None or used is None or wall[1] + wall[2] <= 0.0:
        return None
    return max(0.0, min(1.0, (used[1] + used[2]) / (wall[1] + wall[2])))


def dtensor_root_s(dev: DeviceSpec, profile: Profile | None, tp: int,
                   sequence_parallel: bool, act_bytes: float | None = None) -> BlockHostCost:
    """DTensor's cost of the embedding, head and vocabulary-parallel loss together, their
    tp collectives in (measured at `comm_bytes` of activation), at `act_bytes` as
    `dtensor_layer_s`."""
    if profile is None or tp <= 1:
        return NO_BLOCK_COST
    found = _pair_at(profile, "dtensor_root", _variant(dev, sequence_parallel), tp, act_bytes)
    return NO_BLOCK_COST if found is None else BlockHostCost(found[1], found[2], found[0])


@dataclass(frozen=True)
class SharedCoreSlowdown:
    """How much slower each CPU rank of a host computes while n of its ranks compute at
    once than one alone: `measured[n - 1]` for n = 1..N (`gemm_shared` rows)."""

    measured: tuple[float, ...]

    def __call__(self, load: float) -> float:
        """The slowdown at `load` ranks computing (fractional: a rank that spends part of
        a task waiting in a collective counts for that part): linear between the measured
        counts, 1 up to one rank, and beyond the largest count N each rank's fair share of
        N ranks' throughput (k(N) * load / N, processor sharing)."""
        k, n = self.measured, len(self.measured)
        if load <= 1.0:
            return 1.0
        if load >= n:
            return k[-1] * load / n
        lo = int(load)
        return k[lo - 1] + (load - lo) * (k[lo] - k[lo - 1])


def shared_cores(dev: DeviceSpec, profile: Profile | None, act_bytes: float | None = None
                 ) -> SharedCoreSlowdown | None:
    """The measured slowdown of `dev`'s ranks sharing a host (None on GPUs, which do not
    share their compute, and where the profile has neither `pass_shared` nor
    `gemm_shared` rows). The plan model's own forward + backward (`pass_shared`) where
    the profile has it, at the measured activation size nearest `act_bytes` (the largest
    where None): a pass's memory-bound ops share the memory bandwidth and the last-level
    cache as a GEMM in cache does not (profiler/hostcost.py); else the 256^3 GEMM's.
    Never below 1 and never smaller for more ranks (a measurement's noise is not a
    speed-up).

    The ratio of the samples' 10th percentiles, not of their medians, and at each count
    the least of the measurements the profile holds (one per collective run of N
    processes): the host's own sharing (cores, caches, memory bandwidth) is in every
    sample, other processes' load only in some, and a plan's ranks are slowed by the
    former wherever they run; a machine kept busy by other work for a whole measurement
    still shows in it."""
    if dev.vendor != "cpu" or profile is None:
        return None
    passes = [r for r in profile.host_rows if r.name == "pass_shared" and not r.variant]
    if passes:
        sizes = {r.bytes for r in passes}
        size = (max(sizes) if act_bytes is None else
                min(sizes, key=lambda b: (abs(math.log(b / act_bytes)), -b)))
        found = _slowdown([r for r in passes if r.bytes == size])
        if found is not None:
            return found
    return _slowdown([r for r in profile.host_rows
                      if r.name == "gemm_shared" and not r.variant])


def optimizer_shared(dev: DeviceSpec, profile: Profile | None, params: float
                     ) -> SharedCoreSlowdown | None:
    """The measured slowdown of `dev`'s ranks' optimizer steps while n of the host's ranks
    step at once (`optimizer_shared` rows, profiler/hostcost.py), at the measured size
    nearest a step over `params` parameters (16 bytes each: weight, gradient and the two
    moments in fp32); None on GPUs and where the profile has no such rows (the pass's
    slowdown, `shared_cores`, then applies to the step as to any CPU work)."""
    if dev.vendor != "cpu" or profile is None:
        return None
    rows = [r for r in profile.host_rows if r.name == "optimizer_shared" and not r.variant]
    if not rows or params <= 0:
        return None
    size = min({r.bytes for r in rows},
               key=lambda b: (abs(math.log(max(b, 1.0) / (16.0 * params))), -b))
    return _slowdown([r for r in rows if r.bytes == size])


def _slowdown(rows: Sequence[ProfileRow]) -> SharedCoreSlowdown | None:
    """`shared_cores` from one probe's rows (every count, every measurement)."""
    times: dict[int, float] = {}
    for r in rows:
        times[r.ranks] = min(times.get(r.ranks, r.p10_s), r.p10_s)
    if 1 not in times or len(times) < 2:
        return None
    out, k = [], 1.0
    for n in range(1, max(times) + 1):
        if n not in times:
            break
        k = max(k, times[n] / times[1])
        out.append(k)
    return SharedCoreSlowdown(tuple(out)) if len(out) > 1 else None


def sync_skew(dev: DeviceSpec, profile: Profile | None, ranks: int) -> float | None:
    """How much longer a rank's compute takes, as a fraction of it, when `ranks` ranks of
    this host must keep in step: each collective waits for the last rank to arrive, and
    the ranks' speeds differ from moment to moment, so a group runs at the pace of its
    slowest (Hoefler et al. 2010, SC10). The slope of a least-squares line through the
    profile's `arrival_skew` against `arrival_segment` rows (the latest rank's lateness
    against the segment of compute before the collective) at the nearest group size
    measured; its intercept, the lateness after no compute, is left out: the collectives'
    and the framework rows' samples were taken at collectives too. None on GPUs and
    where the profile has no such rows; never below 0 (noise is not a speed-up)."""
    if dev.vendor != "cpu" or profile is None or ranks < 2:
        return None
    points: dict[int, dict[tuple, list[float]]] = {}
    for r in profile.host_rows:
        if r.name in ("arrival_skew", "arrival_segment"):
            pair = points.setdefault(r.ranks, {}).setdefault(r.shape, [0.0, 0.0])
            pair[r.name == "arrival_skew"] = r.time_s
    if not points:
        return None
    xs, ys = zip(*points[_nearest(points, ranks)].values(), strict=True)
    if len(xs) < 2 or max(xs) <= min(xs):
        return None
    return max(0.0, statistics.linear_regression(xs, ys).slope)


def _nearest(sizes: Iterable[int], ranks: int) -> int:
    """The measured group size nearest `ranks` (the smaller of two as near)."""
    return min(sizes, key=lambda g: (abs(g - ranks), g))


def collective_cpu_share(dev: DeviceSpec, profile: Profile | None, ranks: int
                         ) -> float | None:
    """The share of a collective's time that each of its ranks' processes is busy on the
    CPU (gloo: copies, reductions, loopback TCP), as the profile measured it with a group
    of `ranks` processes alone on the host (the nearest group size measured): the median,
    over every collective and size it timed, of the `cpu.<collective>` row's CPU seconds
    per call against the collective's seconds per call, at most 1. None on GPUs (NCCL
    runs on the GPU) and where the profile has no such rows (older profiles: collectives
    then load no core, as before)."""
    if dev.vendor != "cpu" or profile is None or not profile.collective_cpu_shares:
        return None
    measured = profile.collective_cpu_shares
    nearest = _nearest({g for _, g in measured}, ranks)
    return statistics.median(min(1.0, share) for (_, g), shares in measured.items()
                             if g == nearest for share in shares)


# What each family of host rows measures (profiler/hostcost.py), by its names' start.
_HOST_FAMILIES = (("dispatch_", "per-op dispatch"),
                  ("fsdp_unit_", "FSDP2 units beyond their collectives, which block the "
                                 "compute thread"),
                  ("dtensor_", "DTensor layers beyond their collectives"),
                  ("pass_shared", "CPU ranks sharing the host's cores while they compute at "
                                  "once, measured on the model's own pass"),
                  ("gemm_shared", "CPU ranks sharing the host's cores while they compute at "
                                  "once"),
                  ("optimizer_shared", "CPU ranks sharing the host's memory bandwidth "
                                       "while they step at once"),
                  ("arrival_", "ranks in step waiting for the slowest"),
                  ("p2p_", "the compute thread's part of pipeline sends and receives"),
                  ("cpu.", "the CPU time of gloo collectives"),
                  ("runner_", "the executor's runner per micro-batch"))


def host_families(*, gpus: bool, cpu_ranks: int, fsdp: bool, tp: bool,
                  cpu_pipeline: bool = False) -> frozenset[str]:
    """The families of host rows (`_HOST_FAMILIES`, by their names' start) that price a
    plan: per-op dispatch on GPUs (on the CPU each op's time holds it); FSDP2's units where
    the executor runs FSDP2; DTensor's where a stage has tp > 1; and where several CPU ranks
    share a host, their sharing, their keeping in step and their collectives' CPU time;
    the executor's runner wherever CPU ranks train, and its pipeline sends' calls where
    CPU ranks pipeline (`cpu_pipeline`)."""
    out = {"dispatch_"} if gpus else set()
    out |= {"runner_"} if cpu_ranks else set()
    out |= {"p2p_"} if cpu_pipeline else set()
    out |= {"fsdp_unit_"} if fsdp else set()
    out |= {"dtensor_"} if tp else set()
    out |= ({"pass_shared", "gemm_shared", "optimizer_shared", "arrival_", "cpu."}
            if cpu_ranks > 1 else set())
    return frozenset(out)


def host_source(profiles: Profiles | None, devices: set[str], *, on_cpu: bool = True,
                families: frozenset[str] | None = None) -> str:
    """What priced the host-side costs of a plan on `devices` (`on_cpu`: some of them are
    CPU ranks; without, only the GPU defaults are named): the profiles with host rows and
    the costs their rows measured, each named once; only the `families` that price the
    plan (`host_families`; None: all)."""
    found: dict[str, list[str]] = {}
    for name, p in profiles.by_device if profiles else ():
        if name not in devices:
            continue
        for start, what in _HOST_FAMILIES:
            if families is not None and start not in families:
                continue
            if start == "gemm_shared" and any(r.name == "pass_shared" for r in p.host_rows):
                continue  # the model's own pass prices the sharing (`shared_cores`)
            if any(r.name.startswith(start) for r in p.host_rows):
                found.setdefault(p.path, []).append(what)
    if not found:
        return HOST_ANALYTIC_SOURCE if on_cpu else HOST_ANALYTIC_GPU_SOURCE
    return "; ".join(f"measured host costs {path} ({'; '.join(whats)})"
                     for path, whats in sorted(found.items())) + \
        f"; {HOST_ANALYTIC_SOURCE} for the rest"
