"""A task graph and its list scheduler.

Tasks live in flat lists (tens of thousands per iteration must schedule in well under a
second); `to_networkx` gives the same graph as a networkx DiGraph for inspection.

Scheduling (vTrain's algorithm, extended with overlap): a task is ready when all its
predecessors have finished; each stream runs one task at a time, in
order of readiness (ties by creation order). Compute streams get their program order as
edges, so they run exactly the schedule's sequence; communication streams are FIFO, so
contention between transfers on one link shows up as waiting.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Schedule", "TaskGraph"]


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
        self.num_preds.append(0)
        for p in after:
            self.edge(p, tid)
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


def schedule(graph: TaskGraph) -> Schedule:
    """List-schedule `graph`; raises if it has a cycle."""
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
