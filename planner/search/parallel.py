"""Pure evaluation work spread over this machine's cores (fork; no threads in the planner).

Results come back in the order of the items, so a parallel search returns exactly what a
sequential one would. No worker outlives the search: Ctrl-C or SIGTERM in the parent (a
KeyboardInterrupt, planner/cli.py), or any error, terminates the pool before it is raised
on, and a worker whose parent dies is killed by the kernel (Linux: PR_SET_PDEATHSIG).
Progress is counted in units finer than items where the work says how many it has
(`units`, `tick`): a worker counts into a shared counter the parent draws from.
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

__all__ = ["cores", "parallel_map", "tick"]

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_counter: Any = None  # units done, shared with the workers of the running parallel_map
_bar: ProgressBar | None = None  # the bar, where the work runs in the drawing process
# The running parallel_map's function and items, which its forked workers inherit: a task
# sends only an index, so the workers use the parent's very objects (a cluster of
# thousands of GPUs is slow to pickle, and an equal copy slow to compare in every cache
# lookup keyed by it).
_work: tuple[Callable[[Any], Any], Sequence[Any]] | None = None


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
    reports with `tick`. The workers are forked with `fn` and `items` (nothing of them
    is pickled); their results come back pickled."""
    global _counter, _bar
    n = min(workers or cores(), len(items))
    counted = units is not None
    total = sum(units) if units is not None else len(items)
    bar = ProgressBar(total, title=title, unit=unit)
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
    global _work
    results: list[Any] = [None] * len(items)
    _work = (fn, items)
    # SIGINT and SIGTERM are blocked while the workers are forked: a worker inherits the
    # parent's handlers (SIGTERM raises KeyboardInterrupt, planner/cli.py) and, until its
    # initializer has replaced them, a signal in its start-up (the pool's terminate, or
    # a terminal's Ctrl-C to the group) printed a KeyboardInterrupt traceback. The
    # workers unblock them once their own handlers are set (`_worker_init`); the parent,
    # once the pool exists, takes any that arrived meanwhile.
    blocked = _blockable()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if blocked else None
    try:
        pool = context.Pool(n, initializer=_worker_init, initargs=(os.getpid(),))
    except BaseException:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        raise
    finally:
        _work = None  # the workers have their copy from the fork
    try:
        if previous is not None:  # a signal that came meanwhile is raised here
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        done = pool.imap_unordered(_call, range(len(items)))
        for _ in items:
            while True:  # redraw the bar while the workers count
                try:
                    i, value = done.next(timeout=0.25)
                    break
                except multiprocessing.TimeoutError:
                    bar(_counter.value)
            results[i] = value
            if not counted:
                tick()
            bar(_counter.value)
        pool.close()
    except BaseException:
        pool.terminate()  # SIGTERM to every worker, whatever it is doing
        raise
    finally:
        pool.join()
    return results


def _call(index: int) -> tuple[int, Any]:
    """Item `index` of the parallel_map the worker was forked from."""
    assert _work is not None, "a worker of parallel_map has its work"
    fn, items = _work
    return index, fn(items[index])


def _blockable() -> set[signal.Signals]:
    """The stop signals a fork is shielded from, where the platform can block them (and
    only from the main thread, where Python handles signals)."""
    import threading

    if not hasattr(signal, "pthread_sigmask") or \
            threading.current_thread() is not threading.main_thread():
        return set()
    return {signal.SIGINT, signal.SIGTERM}


def _worker_init(parent: int) -> None:
    """A worker leaves Ctrl-C to its parent (the terminal sends it to the whole process
    group), stops on SIGTERM (the pool's terminate; a fork inherits the parent's handler,
    which would raise instead) and dies with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    blocked = _blockable()
    if blocked:  # blocked by the parent across the fork (`_in_pool`)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took hold
        os._exit(1)
