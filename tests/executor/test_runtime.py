"""The executor's per-process set-up on CPU ranks."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")

# Allocate and free a 64 MiB tensor (far above glibc's 128 KiB mmap threshold) ten
# times, then count the minor page faults of ten more.
_FAULTS = """
import resource, sys, torch
from executor.runtime import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def churn():
    for _ in range(10):
        x = torch.ones(16 * 1024 * 1024)
        del x
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _faults(mode: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], float(out[1])


def test_freed_memory_stays_in_the_process_from_step_to_step():
    """With glibc's defaults a freed 64 MiB tensor goes back to the kernel and the next
    one faults in all of its 16,384 pages again; after `keep_freed_memory` the next one
    reuses it (PyTorch's performance tuning guide, "CPU specific optimizations")."""
    kept, faults = _faults("keep")
    if kept != "True":
        pytest.skip("not glibc: the allocator has no such settings")
    _, default = _faults("default")
    assert default > 16_000
    assert faults < 100
