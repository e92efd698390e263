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
