"""Pure evaluation work spread over this machine's cores (fork; no threads in the planner).

Results come back in the order of the items, so a parallel search returns exactly what a
sequential one would. Progress is counted in units finer than items where the work says
how many it has (`units`, `tick`): a worker counts into a shared counter the parent
draws from.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from profiler.progress import ProgressBar

__all__ = ["cores", "parallel_map", "tick"]

T = TypeVar("T")

_counter: Any = None  # units done, shared with the workers of the running parallel_map
_bar: ProgressBar | None = None  # the bar, where the work runs in the drawing process


def cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def tick(n: int = 1) -> None:
    """Count `n` units of the running `parallel_map`'s work as done (from any of its
    processes; nothing outside one)."""
    if _counter is None:
        return
    with _counter.get_lock():
        _counter.value += n
    if _bar is not None:
        _bar(_counter.value)


def parallel_map(fn: Callable[[Any], T], items: Sequence[Any], *, title: str,
                 workers: int | None = None, units: Sequence[int] | None = None,
                 unit: str = "task") -> list[T]:
    """[fn(x) for x in items], over up to `workers` forked processes (all cores by
    default), with a progress bar: of items, or of `units[i]` units per item that `fn`
    reports with `tick`. `fn` must be a module-level function (or a partial of one)."""
    global _counter, _bar
    n = min(workers or cores(), len(items))
    counted = units is not None
    total = sum(units) if units is not None else len(items)
    bar = ProgressBar(total, title=title, unit=unit if counted else "task")
    forking = n > 1 and "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if forking else None)
    _counter = context.Value("q", 0)
    try:
        if not forking:
            _bar = bar if counted else None
            out = []
            for x in items:
                out.append(fn(x))
                if not counted:
                    tick()
                    bar(_counter.value)
            return out
        return _in_pool(fn, items, n, context, bar, counted)
    finally:
        _counter, _bar = None, None
        bar.close()


def _in_pool(fn: Callable[[Any], T], items: Sequence[Any], n: int, context: Any,
             bar: ProgressBar, counted: bool) -> list[T]:
    results: list[Any] = [None] * len(items)
    with ProcessPoolExecutor(max_workers=n, mp_context=context) as ex:
        futures = {ex.submit(fn, x): i for i, x in enumerate(items)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for fut in done:
                results[futures[fut]] = fut.result()
                if not counted:
                    tick()
            bar(_counter.value)
    return results
