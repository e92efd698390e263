"""The AMSP sharding space and its choice (Chen et al. 2023): the integer program (pulp
and scipy) and the search loop's scan agree."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.sharding import (
    ShardingOption,
    choose,
    pareto_options,
    sharding_levels,
    sharding_options,
    solve_ilp,
)
from planner.specs.plan import Sharding


def test_levels_are_node_multiples_and_the_whole_group():
    assert sharding_levels(64, 8) == (1, 8, 16, 32, 64)
    assert sharding_levels(6, 4) == (1, 2, 6)  # a node's 4 replicas do not divide 6
    assert sharding_levels(12, 2) == (1, 2, 4, 12)


def test_options_nest_and_contain_zero_stages_and_mics():
    opts = sharding_options(sharding_levels(32, 8))
    assert all(o.grads % o.params == 0 and o.optim % o.grads == 0 for o in opts)
    for zero in (Sharding(), Sharding(optim=32), Sharding(grads=32, optim=32),
                 Sharding(params=32, grads=32, optim=32), Sharding(params=8, grads=8, optim=8)):
        assert zero in opts


def test_pareto_drops_only_dominated():
    a = ShardingOption(Sharding(), (10.0,), (1.0, 0.0))
    b = ShardingOption(Sharding(optim=2), (8.0,), (1.0, 0.5))
    c = ShardingOption(Sharding(grads=2, optim=2), (9.0,), (1.5, 0.6))  # beaten by b
    assert pareto_options([a, b, c]) == [a, b]


problems = st.integers(min_value=1, max_value=12).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n),
    st.lists(st.lists(st.floats(1.0, 100.0), min_size=2, max_size=2), min_size=n, max_size=n),
    st.lists(st.floats(20.0, 90.0), min_size=2, max_size=2)))


@settings(max_examples=40, deadline=None)
@given(problems)
def test_ilp_and_scan_choose_the_same_optimum(problem):
    times, memory, caps = problem
    scan = choose(times, memory, caps)
    for solver in ("pulp", "scipy"):
        ilp = solve_ilp(times, memory, caps, solver=solver)
        if scan is None:
            assert ilp is None
        else:
            assert ilp is not None and times[ilp] == pytest.approx(times[scan])
            assert all(m <= c * (1 + 1e-9) for m, c in zip(memory[ilp], caps, strict=True))
