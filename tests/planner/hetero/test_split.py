"""Layer and batch splits of heterogeneous pipelines (Zorse; Metis; HexiScale)."""

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from planner.hetero.split import (
    batch_split_analytic,
    batch_split_ilp,
    layer_split_dp,
    layer_split_fast,
    layer_split_ilp,
    layer_split_proportional,
    layer_split_uniform,
    pipeline_cost,
)

cases = st.integers(2, 6).flatmap(lambda s: st.tuples(
    st.integers(s, 40),
    st.lists(st.floats(0.0, 5.0), min_size=s, max_size=s),
    st.lists(st.floats(0.05, 3.0), min_size=s, max_size=s),
    st.lists(st.integers(1, 20), min_size=s, max_size=s)))


@settings(max_examples=50, deadline=None)
@given(cases, st.sampled_from([None, 1, 4, 32]))
# scipy's HiGHS stopped at its default 1e-4 relative gap: [3, 1, 1] (3.00006) for [2, 2, 1]
@example((5, [6.103515625e-05, 1.0, 0.0], [1.0, 1.0, 1.0], [3, 3, 1]), None)
def test_ilp_dynamic_program_and_search_agree(case, microbatches):
    """Same optimum (slowest stage, or the 1F1B time with m micro-batches) from the ILP
    (pulp and scipy), the dynamic program and the parametric search."""
    layers, fixed, per_layer, max_layers = case

    def cost(split):
        return pipeline_cost(split, fixed, per_layer, microbatches)

    dp = layer_split_dp(layers, fixed, per_layer, max_layers, microbatches=microbatches)
    splits = [layer_split_fast(layers, fixed, per_layer, max_layers, microbatches=microbatches)]
    splits += [layer_split_ilp(layers, fixed, per_layer, max_layers, solver=solver,
                               microbatches=microbatches) for solver in ("pulp", "scipy")]
    for split in splits:
        assert (dp is None) == (split is None)
        if dp is not None:
            assert sum(split) == layers
            assert all(1 <= n <= u for n, u in zip(split, max_layers, strict=True))
            assert cost(split) == pytest.approx(cost(dp), rel=1e-6, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(cases, st.sampled_from([None, 2, 8]))
def test_optimum_never_worse_than_the_heuristics(case, microbatches):
    layers, fixed, per_layer, _ = case
    unbounded = [layers] * len(fixed)
    opt = layer_split_fast(layers, fixed, per_layer, unbounded, microbatches=microbatches)
    best = pipeline_cost(opt, fixed, per_layer, microbatches)
    for split in (layer_split_uniform(layers, len(fixed)),
                  layer_split_proportional(layers, per_layer)):
        assert sum(split) == layers and min(split) >= 1
        assert best <= pipeline_cost(split, fixed, per_layer, microbatches) + 1e-12


def test_memory_caps_bind():
    # the fast stage would take most layers but can hold only 3
    split = layer_split_dp(10, [0, 0], [1.0, 3.0], [3, 10])
    assert split == [3, 7]


@settings(max_examples=40, deadline=None)
@given(st.integers(10, 400), st.floats(0, 2), st.floats(0, 2), st.floats(0.01, 1), st.floats(0.01, 1))
def test_two_replica_batch_split_is_the_analytic_optimum(total, f0, f1, s0, s1):
    m0 = batch_split_analytic(total, [f0, f1], [s0, s1])
    assume(1 <= m0 <= total - 1)
    for solver in ("pulp", "scipy"):
        m = batch_split_ilp(total, [f0, f1], [s0, s1], solver=solver)
        assert sum(m) == total
        finish = max(f0 + s0 * m[0], f1 + s1 * m[1])
        continuous = f0 + s0 * m0
        # integer optimum: within one micro-batch step of the continuous one, and it is
        # one of the two roundings of the analytic share
        assert continuous - 1e-9 <= finish <= continuous + max(s0, s1) + 1e-9
        assert m[0] in (int(m0), int(m0) + 1)


@given(total=st.integers(1, 5000), weights=st.lists(st.floats(0.01, 1000), min_size=1,
                                                    max_size=64))
@settings(max_examples=300, deadline=None)
def test_proportional_split_gives_everyone_at_least_one(total, weights):
    """The throughput-proportional baseline once gave the fastest replica a negative number
    of micro-batches (rounding many small shares up to one each)."""
    from planner.hetero.split import proportional_split

    if total < len(weights):
        return
    split = proportional_split(total, weights)
    assert sum(split) == total and min(split) >= 1
    for share, w in zip(split, weights, strict=True):  # within one of its exact share
        assert share <= max(1, total * w / sum(weights)) + 1
