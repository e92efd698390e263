"""Pure evaluation work spread over this machine's cores (fork; no threads in the planner).

Results come back in the order of the items, so a parallel search returns exactly what a
sequential one would. No worker outlives the search: Ctrl-C or SIGTERM in the parent (a
KeyboardInterrupt, planner/cli.py), or any error, terminates the pool before it is raised
on, and a worker whose parent dies is killed by the kernel (Linux: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from profiler.progress import ProgressBar

__all__ = ["cores", "parallel_map"]

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
    pool = multiprocessing.get_context("fork").Pool(n, initializer=_worker_init,
                                                    initargs=(os.getpid(),))
    try:
        tasks = ((fn, i, x) for i, x in enumerate(items))
        for done, (i, value) in enumerate(pool.imap_unordered(_call, tasks), 1):
            results[i] = value
            bar(done, "")
        pool.close()
    except BaseException:
        pool.terminate()  # SIGTERM to every worker, whatever it is doing
        raise
    finally:
        pool.join()
        bar.close()
    return results


def _call(task: tuple[Callable[[Any], Any], int, Any]) -> tuple[int, Any]:
    fn, index, item = task
    return index, fn(item)


def _worker_init(parent: int) -> None:
    """A worker leaves Ctrl-C to its parent (the terminal sends it to the whole process
    group), stops on SIGTERM (the pool's terminate; a fork inherits the parent's handler,
    which would raise instead) and dies with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took hold
        os._exit(1)
