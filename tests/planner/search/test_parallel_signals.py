"""planner/search/parallel.py: the pool's workers are forked with SIGINT and SIGTERM
blocked, so that a stop signal in a worker's start-up (before its initializer replaced
the parent's handlers) cannot print a KeyboardInterrupt traceback; each worker unblocks
them once its own handlers are set, and the parent's mask comes back as it was."""

import signal
import sys

import pytest

from planner.search.parallel import parallel_map

# serial: starts a worker pool and waits a bounded time for its workers
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="fork and pthread_sigmask"),
              pytest.mark.serial]
STOPS = {signal.SIGINT, signal.SIGTERM}


def _worker_state(_: int) -> tuple[set, object, object]:
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    return set(mask), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


def test_workers_start_shielded_and_end_with_their_own_handlers():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    states = parallel_map(_worker_state, range(4), title="mask", workers=2)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    for mask, on_int, on_term in states:
        assert not (mask & STOPS), mask  # unblocked again by the worker's initializer
        assert on_int == signal.SIG_IGN and on_term == signal.SIG_DFL


def _dies_on_the_first(i: int) -> int:
    import os
    import time

    if i == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    time.sleep(0.05)
    return i


def test_a_worker_that_dies_is_an_error_not_a_wait():
    """multiprocessing.Pool replaced a killed worker and waited for its result for ever
    (and its terminate waited on a lock an idle worker held, which hung `plan search`
    when SIGTERM reached the whole process group): a worker's death is raised."""
    import subprocess

    code = ("from tests.planner.search.test_parallel_signals import _dies_on_the_first;"
            "from planner.search.parallel import parallel_map;"
            "parallel_map(_dies_on_the_first, range(6), title='t', workers=2)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "RuntimeError: a worker of the search (pid " in proc.stderr, proc.stderr
    assert "died (exit code -9)" in proc.stderr


def _fails_on_the_third(i: int) -> int:
    if i == 2:
        raise ValueError(f"item {i} is bad")
    return i * i


def test_results_come_in_order_and_a_workers_error_is_raised_here():
    assert parallel_map(_fails_on_the_third, range(3, 12), title="t", workers=2) == [
        i * i for i in range(3, 12)]
    with pytest.raises(ValueError, match="item 2 is bad"):
        parallel_map(_fails_on_the_third, range(9), title="t", workers=2)
