"""Pure evaluation work spread over this machine's cores (fork; no threads in the planner).

Results come back in the order of the items, so a parallel search returns exactly what a
sequential one would. No worker outlives the search: Ctrl-C or SIGTERM in the parent (a
KeyboardInterrupt, planner/cli.py), or any error, kills the workers before it is raised
on, and a worker whose parent dies is killed by the kernel (Linux: PR_SET_PDEATHSIG).
A worker that dies is an error, never a wait.
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
    """`parallel_map` over `n` forked workers, each with a pipe of its own: the parent
    hands out one index at a time and gathers the results. No lock is shared between
    the parent and a worker (but the progress counter's), so a worker that dies, however
    it dies, cannot leave the parent waiting: multiprocessing.Pool's terminate waited on
    its task queue's lock, which an idle worker holds while it waits for a task, and a
    SIGTERM to the whole process group (`timeout`, Slurm, Kubernetes) hung `plan search`
    about one time in ten; a worker killed alone hung Pool's results for ever."""
    global _work
    workers: list[tuple[Any, Any]] = []  # (process, the parent's end of its pipe)
    _work = (fn, items)
    # SIGINT and SIGTERM are blocked while the workers are forked: a worker inherits the
    # parent's handlers (SIGTERM raises KeyboardInterrupt, planner/cli.py) and, until
    # `_worker_init` has replaced them, a signal in its start-up (a terminal's Ctrl-C to
    # the group) printed a KeyboardInterrupt traceback. The workers unblock them once
    # their own handlers are set; the parent, once all are started, takes any that
    # arrived meanwhile (and stops the workers, below).
    blocked = _blockable()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if blocked else None
    try:
        try:
            for _ in range(n):
                mine, theirs = context.Pipe()
                process = context.Process(target=_worker, args=(theirs, os.getpid()),
                                          daemon=True)
                process.start()
                theirs.close()
                workers.append((process, mine))
        finally:
            _work = None  # the workers have their copy from the fork
            if previous is not None:  # a signal that came meanwhile is raised here
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        results = _gather(workers, len(items), bar, counted)
    except BaseException:
        for process, _ in workers:  # SIGKILL: no handler, nothing left half-done to wait on
            if process.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGKILL)
        raise
    finally:
        for process, conn in workers:
            with contextlib.suppress(OSError):
                conn.send(None)  # done: the worker exits (a killed one is past caring)
            conn.close()
            process.join()
    return results


def _gather(workers: list[tuple[Any, Any]], total: int, bar: ProgressBar,
            counted: bool) -> list[Any]:
    """Hand the indices 0..total-1 to the workers, one at a time each, and collect what
    they send back, in the items' order; a worker's error is raised here."""
    from multiprocessing.connection import wait

    results: list[Any] = [None] * total
    todo = iter(range(total))
    busy = {}  # the parent's end of a worker's pipe -> the worker
    for process, conn in workers:
        if (index := next(todo, None)) is not None:
            conn.send(index)
            busy[conn] = process
    for _ in range(total):
        ready: list[Any] = []
        while not ready:  # redraw the bar while the workers count
            ready = wait(list(busy), timeout=0.25)
            bar(_counter.value)
        conn = ready[0]
        try:
            index, ok, value = conn.recv()
        except EOFError:
            process = busy[conn]
            process.join(timeout=1)
            raise RuntimeError(f"a worker of the search (pid {process.pid}) died (exit code "
                               f"{process.exitcode})") from None
        if not ok:
            raise value
        results[index] = value
        if not counted:
            tick()
        bar(_counter.value)
        if (index := next(todo, None)) is not None:
            conn.send(index)
        else:
            del busy[conn]
    return results


def _worker(conn: Any, parent: int) -> None:
    """Run the items whose indices the parent sends until it sends None; send back
    (index, True, result), or (index, False, the exception) and stop."""
    _worker_init(parent)
    assert _work is not None, "a worker of parallel_map has its work"
    fn, items = _work
    while (index := conn.recv()) is not None:
        try:
            conn.send((index, True, fn(items[index])))
        except Exception as err:  # the parent raises it
            try:
                conn.send((index, False, err))
            except Exception:  # the exception would not pickle
                conn.send((index, False, RuntimeError(f"{type(err).__name__}: {err}")))
            return


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
    group), stops on SIGTERM (a fork inherits the parent's handler, which would raise
    instead) and dies with its parent."""
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
