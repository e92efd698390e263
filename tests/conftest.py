"""Test-wide settings."""

import sys

import pytest


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts several processes needs the cores to itself, as one that times
    what it runs does: `make test` runs the `serial` ones one at a time, after the rest
    ran on every core (pytest-xdist)."""
    for item in items:
        if item.get_closest_marker("multiprocess") is not None:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """torch tests run one thread per process, as one CPU rank is one core: on a machine
    with any other load, two threads are much slower than one
    (shared/notes/torch-distributed-on-cpu.md). Only where a test has imported torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    yield
