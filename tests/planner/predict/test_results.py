"""What a result says of its FLOP/s and MFU."""

import pytest

from planner.predict.estimate import estimate
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Sharding


@pytest.mark.parametrize("seq, share", [(4096, "14%"), (131072, "84%")])
def test_the_flops_source_says_how_much_of_the_count_is_unmasked_attention(seq, share):
    """FLOP/s and MFU are Megatron-LM's count, whose attention term (12 l h s a token) counts
    the half of causal attention that fused kernels skip; llama2-7b at 128k tokens printed
    MFU 82.9% while its kernels ran about 48% of peak, with nothing saying why (CLI audit,
    2026-12-06). By hand: 12 x 32 x 4096 x s against 6 x 6.74e9 for the rest: 14% at 4k,
    84% at 128k."""
    plan = homogeneous_plan(preset("llama2-7b"), parse_gpus_arg("A100-80GB-SXM:16"),
                            ParallelConfig(tp=8, dp=2, mbs=1, gbs=16, seq_len=seq,
                                           sequence_parallel=True, sharding=Sharding(optim=2)))
    source = estimate(plan).sources["flops"]
    assert source.startswith("Megatron-LM's count (Narayanan et al. 2021")
    assert f"counted unmasked: {share} of the count here" in source
