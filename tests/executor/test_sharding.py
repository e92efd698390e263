"""AMSP shard arithmetic, checked by running its collectives on numpy arrays."""

import itertools

import numpy as np
import pytest

from executor.sharding import ShardLayout

CASES = [(dp, p, g, os_) for dp in (1, 2, 4, 8, 12)
         for p, g, os_ in itertools.product((1, 2, 3, 4, 6, 8, 12), repeat=3)
         if g % p == 0 and os_ % g == 0 and dp % os_ == 0]


def _chunks(x, n):
    return np.split(x, n)


@pytest.mark.parametrize(("dp", "p", "g", "os_"), CASES)
def test_collectives_sum_gradients_and_rebuild_parameters(dp, p, g, os_):
    members = tuple(range(10, 10 + 3 * dp, 3))  # any sorted ranks
    lay = {r: ShardLayout(members, r, p, g, os_) for r in members}
    n = 2 * os_ * 5
    rng = np.random.default_rng(dp * 1000 + p * 100 + g * 10 + os_)
    grads = {r: rng.normal(size=n) for r in members}
    total = sum(grads.values())
    # 1. reduce-scatter inside the g group: member k of the group keeps chunk k
    g_shard = {}
    for r in members:
        group = lay[r].grad_group
        assert len(group) == g and r in group
        summed = sum(grads[q] for q in group)
        g_shard[r] = _chunks(summed, g)[group.index(r)]
        assert group.index(r) == lay[r].g_chunk
    # 2. reduce-scatter over members holding the same G-chunk, 3. all-reduce over blocks
    os_shard = {}
    for r in members:
        group = lay[r].grad_reduce_group
        assert len(group) == os_ // g
        part = _chunks(sum(g_shard[q] for q in group), os_ // g)[group.index(r)]
        os_shard[r] = part
    for r in members:
        os_shard_sum = sum(os_shard[q] for q in lay[r].replica_group)
        np.testing.assert_allclose(os_shard_sum, _chunks(total, os_)[lay[r].os_chunk])
    # every chunk is owned once per block of os replicas
    for start in range(0, dp, os_):
        owned = sorted(lay[members[q]].os_chunk for q in range(start, start + os_))
        assert owned == list(range(os_))
    # 4. after the step: gather optimizer shards into P-chunks, then P-chunks into the whole
    params = rng.normal(size=n)
    p_shard = {}
    for r in members:
        group, slots = lay[r].param_gather_group, lay[r].gather_slots()
        assert len(group) == os_ // p and sorted(slots) == list(range(os_ // p))
        pieces = [None] * (os_ // p)
        for q, slot in zip(group, slots, strict=True):
            pieces[slot] = _chunks(params, os_)[lay[q].os_chunk]
        p_shard[r] = np.concatenate(pieces)
        np.testing.assert_array_equal(p_shard[r], _chunks(params, p)[lay[r].p_chunk])
    for r in members:
        group = lay[r].param_group
        assert len(group) == p
        assert [lay[q].p_chunk for q in group] == list(range(p))  # all-gather in rank order
        np.testing.assert_array_equal(np.concatenate([p_shard[q] for q in group]), params)


def test_zero_stages_and_mics_use_contiguous_groups():
    members = tuple(range(8))
    zero3 = ShardLayout(members, 5, 8, 8, 8)
    assert zero3.param_group == zero3.grad_group == members
    mics = ShardLayout(members, 5, 4, 4, 4)
    assert mics.param_group == (4, 5, 6, 7) and mics.replica_group == (1, 5)
    ddp = ShardLayout(members, 5)
    assert ddp.groups() == {members}
