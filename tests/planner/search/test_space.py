import dataclasses

import pytest

from planner.search.space import candidates, default_space, layouts
from planner.specs.model import preset


def test_layouts_use_every_gpu_and_respect_heads_and_batch():
    model = preset("llama2-70b")  # 64 heads, 8 kv heads, 80 layers
    space = default_space(model, num_gpus=(256,), nvlink_domain_gpus=8, seq_len=4096)
    found = list(layouts(space, model, gbs=512, seq_len=4096))
    assert found
    for lo in found:
        assert lo.tp * lo.cp * lo.pp * lo.dp == 256
        assert lo.tp <= 8 and model.num_heads % lo.tp == 0
        assert lo.pp <= model.num_layers and 512 % lo.dp == 0
    assert {lo.cp for lo in found} == {1, 2}  # chunks of at least 2,048 tokens


def test_candidates_respect_interleaving_and_batch():
    model = preset("gpt3-13b")
    space = default_space(model, num_gpus=(64,), nvlink_domain_gpus=8, seq_len=2048)
    for lo in layouts(space, model, gbs=128, seq_len=2048):
        for mi in candidates(space, model, lo, gbs=128, seq_len=2048):
            m = mi.num_microbatches(128, lo.dp)
            assert m * mi.mbs * lo.dp == 128
            if mi.vp > 1:
                assert lo.pp > 1 and m % lo.pp == 0 and lo.pp * mi.vp <= model.num_layers
            if mi.schedule == "zb-h1":
                assert lo.pp > 1 and mi.vp == 1
            assert lo.tp > 1 or not mi.sequence_parallel
        if lo.pp > 1:  # ZB-H1 is a point of the space wherever it can run
            found = set(candidates(space, model, lo, gbs=128, seq_len=2048))
            assert {dataclasses.replace(mi, schedule="zb-h1") for mi in found
                    if mi.vp == 1} <= found


@pytest.mark.parametrize("framework", ["trainplan", "megatron", "torchtitan"])
def test_sequence_parallelism_is_searched_only_where_tp_splits_the_sequence(framework):
    """`sp_problem`: a sequence of 2,047 tokens splits evenly over no tp > 1, so the
    space keeps tp > 1 only without sequence parallelism (none where the framework always
    runs it with tp: torchtitan); 2,048 keeps both."""
    from planner.export.frameworks import CAPABILITIES
    from planner.search.space import for_framework

    model = preset("gpt3-1.3b")
    for seq_len, odd in ((2047, True), (2048, False)):
        space = for_framework(default_space(model, num_gpus=(8,), nvlink_domain_gpus=8,
                                            seq_len=seq_len), CAPABILITIES[framework])
        found = [(lo, mi) for lo in layouts(space, model, gbs=64, seq_len=seq_len)
                 for mi in candidates(space, model, lo, gbs=64, seq_len=seq_len)]
        split = [(lo, mi) for lo, mi in found if lo.tp > 1]
        if odd:
            assert not any(mi.sequence_parallel for _, mi in split)
            assert bool(split) == (framework != "torchtitan")
        else:
            assert any(mi.sequence_parallel for _, mi in split)
