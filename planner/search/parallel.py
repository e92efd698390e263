"""Pure evaluation work spread over this machine's cores (fork; no threads in the planner).

Results come back in the order of the items, so a parallel search returns exactly what a
sequential one would.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from profiler.progress import ProgressBar

__all__ = ["cores", "parallel_map"]

T = TypeVar("T")


def cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parallel_map(fn: Callable[[Any], T], items: Sequence[Any], *, title: str,
                 workers: int | None = None) -> list[T]:
    """[fn(x) for x in items], over up to `workers` forked processes (all cores by
    default) with a progress bar per finished item. `fn` must be a module-level function
    (or a partial of one)."""
    n = min(workers or cores(), len(items))
    bar = ProgressBar(len(items), title=title)
    if n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for i, x in enumerate(items, 1):
            out.append(fn(x))
            bar(i, "")
        bar.close()
        return out
    results: list[Any] = [None] * len(items)
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork")) as ex:
        futures = {ex.submit(fn, x): i for i, x in enumerate(items)}
        for done, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            bar(done, "")
    bar.close()
    return results
