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


def test_dropout_seeding_draws_as_torch_manual_seed_without_queueing_cuda_calls(monkeypatch):
    """Each step seeds dropout (`Trainer.iteration`). `torch.manual_seed` also seeds CUDA,
    which on a rank without CUDA initialised queues the call with a formatted stack
    (torch.cuda._lazy_call, ~0.1 ms a step on the CPU); `seed_dropout` seeds the CPU's
    generator alike and queues nothing there."""
    import torch

    from executor.runtime import seed_dropout

    queued = []
    monkeypatch.setattr(torch.cuda.random, "_lazy_call", lambda *a, **k: queued.append(a))
    seed_dropout(1234, torch.device("cpu"))
    ours = torch.rand(8)
    assert queued == []
    torch.manual_seed(1234)
    assert torch.equal(ours, torch.rand(8))
    if not torch.cuda.is_initialized():
        assert queued, "torch.manual_seed queued no CUDA call: the saving is gone"


def test_a_gpus_measured_peak_counts_what_the_predicted_peak_counts(monkeypatch):
    """The predicted stage peak includes the runtime reserve (CUDA context, NCCL buffers,
    workspaces, fragmentation: 2 GiB in `costs.memory`); the measured one must too, not
    max_memory_allocated's tensors alone. Here: 10 GiB of segments at the peak, 8 GiB now,
    the device 11.5 GiB used, so 3.5 GiB outside the allocator -> 13.5 GiB."""
    import torch

    from executor.runtime import _peak_memory_bytes

    gib = 1024**3
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (int(68.5 * gib), 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 8 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 10 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 9 * gib)
    peak, kind = _peak_memory_bytes(cuda)
    assert peak == int(13.5 * gib)
    assert "max_memory_reserved" in kind and "outside" in kind
