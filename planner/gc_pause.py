"""CPython's cyclic garbage collector paused while a search or a simulation builds its
objects.

A search prices tens of thousands of candidates into memo tables, and a simulation builds
a task graph of up to hundreds of thousands of tasks: millions of small objects that live
until the work ends, so that no collection could free them. Under the default thresholds
(700, 10, 10) the collector walks them again and again while they pile up (its older
generations are rescanned each time enough younger collections have run), which took 35%
of a 391,200-task simulation (llama3-405b, pp 32, vp 3, 1,024 micro-batches: 3.1 s against
2.0 s paused) and 40% of `plan search --model llama3-405b --cluster
cluster_specs/mixed-nic.yaml --gbs 1024` on one core (36.6 s against 21.2 s; peak memory
the same), measured 2026-12-06 (docs/architecture.md, "Search and simulation speed: the
collector paused"). Paused, an object without cycles is still freed when its last
reference goes; cyclic garbage made meanwhile waits for the first collection after the
pause.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic collection inside (also a decorator); the collector's state
    before is restored after, so that nested pauses and a caller's own `gc.disable()`
    keep theirs."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
