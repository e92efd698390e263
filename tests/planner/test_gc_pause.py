"""The cyclic garbage collector is paused while a search or a simulation builds its
objects (planner/gc_pause.py: it walked a large task graph again and again while it grew,
35-40% of the time), and its state is given back after."""

import gc

import pytest

from planner.gc_pause import gc_paused
from planner.search import SearchRequest, search
from planner.search.search import prepare
from planner.simulator import simulate
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset


def _collections() -> int:
    return sum(generation["collections"] for generation in gc.get_stats())


# the one collection the collector runs when it resumes, over what the work allocated
# (17 during this simulation and 8 during this search, unpaused)
ON_RESUMING = 1


@pytest.fixture
def collector_on():
    enabled = gc.isenabled()
    gc.enable()
    yield
    if not enabled:
        gc.disable()


def test_the_collectors_state_is_given_back(collector_on):
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an inner pause does not end the outer one
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("fails inside")
    assert gc.isenabled()
    gc.disable()  # a caller that turned it off keeps it off
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_a_simulation_runs_no_collection_until_it_ends(collector_on):
    """GPT-3 175B in 8 stages of 64 micro-batches: thousands of tasks, each with its
    metadata, enough to set off the collector many times under its default thresholds."""
    plan = homogeneous_plan(preset("gpt3-175b"), parse_gpus_arg("A100-80GB-SXM:512"),
                            ParallelConfig(tp=8, pp=8, dp=8, mbs=1, gbs=512, seq_len=2048))
    before = _collections()
    result = simulate(plan)
    assert _collections() - before <= ON_RESUMING
    assert result.iteration_time_s > 0 and gc.isenabled()


def test_a_search_runs_no_collection_until_it_ends(collector_on):
    request = SearchRequest(model=preset("gpt3-1.3b"), cluster=parse_gpus_arg("A100-80GB-SXM:8"),
                            gbs=16, seq_len=2048)
    before = _collections()
    found = search(request)
    assert _collections() - before <= ON_RESUMING
    assert found.ranked and gc.isenabled()


def test_a_what_if_reports_searches_together_run_no_collection(collector_on):
    requests = [SearchRequest(model=preset("gpt3-1.3b"), cluster=parse_gpus_arg(gpus), gbs=32,
                              seq_len=2048) for gpus in ("A100-80GB-SXM:8", "H100-80GB-SXM:16")]
    before = _collections()
    prepare(requests, title="searching every scenario")
    assert _collections() - before <= ON_RESUMING and gc.isenabled()
