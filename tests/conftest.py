"""Test-wide settings."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """torch tests run one thread per process, as one CPU rank is one core: on a machine
    with any other load, two threads are much slower than one
    (shared/notes/torch-distributed-on-cpu.md). Only where a test has imported torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    yield
