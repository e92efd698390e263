"""A task graph and its list scheduler.

Tasks live in flat lists (tens of thousands per iteration must schedule in well under a
second); `to_networkx` gives the same graph as a networkx DiGraph for inspection.

Scheduling (vTrain's algorithm, extended with overlap): a task is ready when all its
predecessors have finished; each stream runs one task at a time, in
order of readiness (ties by creation order). Compute streams get their program order as
edges, so they run exactly the schedule's sequence; communication streams are FIFO, so
contention between transfers on one link shows up as waiting.

Ranks that share a host's cores (CPU ranks) also slow each other while they compute at
once: `schedule(graph, shared=...)` then runs the same list scheduling as a fluid
processor-sharing simulation (Kleinrock 1967): a task's CPU work progresses at
1 / slowdown(load), where load is how many ranks of its host compute at that moment, so a
rank computes at full speed while the others wait (pipeline bubbles) and slower while
they compute too. A collective on such a host (gloo) is CPU work too, for the share of
its time its ranks' processes were busy when the profile measured it with its group
alone (`ref_load`): it loads the host by that share and is slowed only by load beyond
what it was measured at. Without shared hosts the fixed-duration scheduler runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Schedule", "SharedCores", "TaskGraph", "schedule"]


@dataclass
class TaskGraph:
    names: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    streams: list[int] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    meta: list[Any] = field(default_factory=list)
    succs: list[list[int]] = field(default_factory=list)
    num_preds: list[int] = field(default_factory=list)
    stream_names: list[str] = field(default_factory=list)
    _stream_ids: dict[str, int] = field(default_factory=dict)

    def stream(self, name: str) -> int:
        """The id of stream `name`, created on first use."""
        sid = self._stream_ids.get(name)
        if sid is None:
            sid = self._stream_ids[name] = len(self.stream_names)
            self.stream_names.append(name)
        return sid

    def add(self, name: str, kind: str, stream: int, duration_s: float, meta: Any = None,
            after: tuple[int, ...] = ()) -> int:
        tid = len(self.names)
        self.names.append(name)
        self.kinds.append(kind)
        self.streams.append(stream)
        self.durations.append(duration_s)
        self.meta.append(meta)
        self.succs.append([])
        self.num_preds.append(len(after))
        succs = self.succs
        for p in after:
            succs[p].append(tid)
        return tid

    def edge(self, before: int, after: int) -> None:
        self.succs[before].append(after)
        self.num_preds[after] += 1

    def __len__(self) -> int:
        return len(self.names)

    def to_networkx(self) -> Any:
        import networkx as nx

        g = nx.DiGraph()
        for i, name in enumerate(self.names):
            g.add_node(i, name=name, kind=self.kinds[i], stream=self.stream_names[self.streams[i]],
                       duration_s=self.durations[i])
        g.add_edges_from((i, j) for i, succ in enumerate(self.succs) for j in succ)
        return g


@dataclass
class Schedule:
    start: list[float]
    end: list[float]
    binding: list[int]  # the task whose end let this one start (-1: none)

    @property
    def makespan_s(self) -> float:
        return max(self.end, default=0.0)


@dataclass(frozen=True)
class SharedCores:
    """Compute streams whose ranks share one host's cores. `streams`: stream id -> the
    ranks of this host it stands for (a simulated stage stands for its tp ranks and its
    identical replicas); `slowdown(load)`: how much longer a rank's CPU work takes while
    `load` ranks of the host compute at once (1 for a load of 1 or less)."""

    streams: Mapping[int, float]
    slowdown: Callable[[float], float]


def schedule(graph: TaskGraph, *, shared: Sequence[SharedCores] = (),
             cpu_share: Sequence[float] = (), ref_load: Sequence[float] = (),
             in_situ: Sequence[tuple[float, float]] = (),
             own_slowdown: Sequence[Callable[[float], float] | None] = (),
             peer_ranks: Sequence[float] = ()) -> Schedule:
    """List-schedule `graph`; raises if it has a cycle. With `shared` hosts, tasks on their
    streams are slowed by the host's load (`_schedule_shared`); `cpu_share`: per task, the
    fraction of its duration that is CPU work (the rest, e.g. waiting for a peer, is
    neither slowed nor counted in the load); `ref_load`: per task, 0 for work measured by
    one process alone (a pass: its stream's ranks compute in lockstep), else the host load
    its duration was measured at (a collective measured with its group: its ranks times
    its CPU share); `in_situ`: per task, the fraction of its duration (within its CPU
    share) that a profile measured with L0 of the host's ranks computing at once, and L0
    (DTensor's rows, timed on every tp rank together): that work is slowed by
    k(L) / k(L0), not k(L), its ranks' own sharing being in the measurement already;
    `own_slowdown`: per task, a slowdown measured on that task's own kind of work (None:
    the host's), e.g. the optimizer step, which streams its states through the memory
    that the ranks stepping at once share; `peer_ranks`: per task, the host's ranks at the
    other end of a point-to-point transfer on a sender's stream, whose processes take it in
    on their own cores (gloo's receive copies it as its send does), so it loads the host
    for them too."""
    if shared:
        return _schedule_shared(graph, shared, cpu_share, ref_load, in_situ, own_slowdown,
                                peer_ranks)
    n = len(graph)
    succs, streams, durations = graph.succs, graph.streams, graph.durations
    remaining = list(graph.num_preds)
    ready = [0.0] * n
    binding = [-1] * n
    start = [0.0] * n
    end = [0.0] * n
    stream_free = [0.0] * len(graph.stream_names)
    stream_last = [-1] * len(graph.stream_names)
    heap = [(0.0, i) for i in range(n) if remaining[i] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
        t, i = heapq.heappop(heap)
        s = streams[i]
        if stream_free[s] > t:
            t = stream_free[s]
            binding[i] = stream_last[s]
        start[i] = t
        finish = t + durations[i]
        end[i] = finish
        stream_free[s] = finish
        stream_last[s] = i
        done += 1
        for j in succs[i]:
            if finish >= ready[j]:
                ready[j] = finish
                binding[j] = i
            remaining[j] -= 1
            if remaining[j] == 0:
                heapq.heappush(heap, (ready[j], j))
    if done != n:
        raise ValueError("task graph has a cycle")
    return Schedule(start, end, binding)


@dataclass
class _Host:
    """One shared host during the fluid simulation."""

    cores: SharedCores
    running: dict[int, float] = field(default_factory=dict)  # task -> work left (alone s)
    speed: dict[int, float] = field(default_factory=dict)  # task -> alone s per s
    since: float = 0.0  # when `running` last advanced


def _schedule_shared(graph: TaskGraph, shared: Sequence[SharedCores],
                     cpu_share: Sequence[float], ref_load: Sequence[float] = (),
                     in_situ: Sequence[tuple[float, float]] = (),
                     own_slowdown: Sequence[Callable[[float], float] | None] = (),
                     peer_ranks: Sequence[float] = ()) -> Schedule:
    """`schedule` as a discrete-event simulation in which tasks on shared hosts' streams
    progress at a rate set by the host's load: a task with CPU fraction w on a stream
    standing for c ranks adds c * w to the load the host's other streams see, and runs at
    1 / (1 + w (k(L) / k(L0) - 1)) alone-seconds per second (its CPU work slowed by k
    relative to the load L0 it was measured at, the rest not). A pass (`ref_load` 0) was
    measured alone (L0 = 1) and sees L = c + the other running tasks' c * w: the c ranks
    of its own stream run the same ops in lockstep, so while it computes they all do (a
    pass that blocks in collectives for part of its time still computes 4 ranks at once
    on 4 lockstep ranks). A collective (`ref_load` L0 > 0) sees L = every running task's
    c * w, its own included. Each stream still runs one task at a time in order of
    readiness (ties by creation order), so with k = 1 it gives `schedule`'s times
    exactly."""
    n = len(graph)
    succs, streams, durations = graph.succs, graph.streams, graph.durations
    host_of: dict[int, tuple[_Host, float]] = {}
    for cores in shared:
        h = _Host(cores)
        host_of.update((sid, (h, ranks)) for sid, ranks in cores.streams.items())
    remaining = list(graph.num_preds)
    ready, start, end = [0.0] * n, [0.0] * n, [0.0] * n
    binding = [-1] * n
    version = [0] * n
    busy = [-1] * len(graph.stream_names)  # the task each stream runs (-1: free)
    last = [-1] * len(graph.stream_names)
    waiting: list[list[tuple[float, int]]] = [[] for _ in graph.stream_names]
    # events: (time, 0 = a task ends / 1 = a task is ready, task, version)
    events = [(0.0, 1, i, 0) for i in range(n) if remaining[i] == 0]
    heapq.heapify(events)

    def advance(h: _Host, now: float) -> None:
        """Progress `h`'s running tasks to `now` at the speeds they had."""
        for t, left in h.running.items():
            h.running[t] = max(0.0, left - (now - h.since) * h.speed[t])
        h.since = now

    def respeed(h: _Host, now: float) -> None:
        """Set `h`'s running tasks' speeds for its load now, and the times they end. A
        task's CPU work runs beside its own stream's other ranks' CPU work (they are one
        stage's tp ranks or identical replicas, running the same ops at the same time, so
        their CPU phases coincide whatever the task's share) and beside the other
        streams' ranks in proportion to those tasks' CPU shares (independent phases)."""
        spread = {t: (host_of[streams[t]][1] + (peer_ranks[t] if peer_ranks else 0.0))
                  * cpu_share[t] for t in h.running}
        total = sum(spread.values())
        for t, left in h.running.items():
            ref = ref_load[t] if ref_load else 0.0
            slowdown = (own_slowdown[t] if own_slowdown else None) or h.cores.slowdown
            if ref > 0.0:  # a collective, measured with its group at load `ref`
                k = slowdown(total) / slowdown(ref)
            else:
                k = slowdown(total - spread[t] + host_of[streams[t]][1])
            measured, at = in_situ[t] if in_situ else (0.0, 1.0)
            alone = cpu_share[t] - measured  # measured by one process alone
            k_situ = k / h.cores.slowdown(at) if measured else 1.0
            h.speed[t] = 1.0 / (1.0 + alone * (max(k, 1.0) - 1.0)
                                + measured * (max(k_situ, 1.0) - 1.0))
            version[t] += 1
            heapq.heappush(events, (now + left / h.speed[t], 0, t, version[t]))

    def begin(i: int, now: float) -> None:
        s = streams[i]
        busy[s], start[i] = i, now
        shared_host = host_of.get(s)
        if shared_host is None or not durations[i] or not cpu_share[i]:
            heapq.heappush(events, (now + durations[i], 0, i, version[i]))
            return
        h = shared_host[0]
        advance(h, now)
        h.running[i] = durations[i]
        respeed(h, now)

    done = 0
    while events:
        now, kind, i, v = heapq.heappop(events)
        if kind == 1:  # ready: start now, or wait for its stream
            s = streams[i]
            if busy[s] < 0:
                begin(i, now)
            else:
                heapq.heappush(waiting[s], (now, i))
            continue
        if v != version[i]:
            continue  # its host's load changed since this end was foreseen
        s = streams[i]
        end[i], busy[s], last[s] = now, -1, i
        done += 1
        shared_host = host_of.get(s)
        if shared_host is not None and i in shared_host[0].running:
            h = shared_host[0]
            del h.running[i], h.speed[i]
            advance(h, now)
            respeed(h, now)
        for j in succs[i]:
            if now >= ready[j]:
                ready[j], binding[j] = now, i
            remaining[j] -= 1
            if remaining[j] == 0:
                heapq.heappush(events, (ready[j], 1, j, 0))
        if waiting[s]:
            r, j = heapq.heappop(waiting[s])
            if now > r:
                binding[j] = i
            begin(j, now)
    if done != n:
        raise ValueError("task graph has a cycle")
    return Schedule(start, end, binding)
