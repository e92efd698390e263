"""Model states as Transformer Engine and Megatron-Core keep them under FP8 and with a
16-bit gradient buffer (planner/costs/memory.py `model_state_bytes`,
`state_bytes_per_param`; docs/calibration.md, "Memory: FP8 weights and 16-bit
gradient buffers")."""

import pytest

from planner.calibration.published import dgxc_cases
from planner.costs.memory import (
    FP8_WEIGHT_CACHE_BYTES,
    model_state_bytes,
    rank_param_count,
    rank_te_weight_count,
    state_bytes_per_param,
)
from planner.simulator import simulate
from planner.specs.model import ModelSpec
from planner.specs.plan import Sharding

LLAMA8B = ModelSpec(name="llama3.1-8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                    num_heads=32, num_kv_heads=8, vocab_size=128256, seq_len=8192,
                    activation="swiglu", norm="rmsnorm")


def _states(dtype, *, fp8_params=False, grad_dtype=None, optim=8, first=True, last=True):
    params = rank_param_count(LLAMA8B, num_layers=32, first=first, last=last, tp=1, pp=1)
    te = rank_te_weight_count(LLAMA8B, num_layers=32, tp=1)
    return params, te, model_state_bytes(LLAMA8B, params=params, dtype=dtype,
                                         sharding=Sharding(optim=optim), tp=1, pp=1,
                                         te_weights=te, fp8_params=fp8_params,
                                         grad_dtype=grad_dtype)


def test_te_linear_weights_exclude_embedding_head_and_norms():
    """Megatron-Core's GPT builds its embedding (VocabParallelEmbedding) and output layer
    (tensor_parallel.ColumnParallelLinear) outside Transformer Engine; the norms are not
    GEMM weights. Llama 3.1 8B: 32 x (4096 x 6144 + 4096 x 4096 + 3 x 4096 x 14336)."""
    te = rank_te_weight_count(LLAMA8B, num_layers=32, tp=1)
    assert te == 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    full = rank_param_count(LLAMA8B, num_layers=32, first=True, last=True, tp=1, pp=1)
    assert full - te == 2 * 128256 * 4096 + 65 * 4096  # embedding, head, 65 RMSNorms


def test_fp8_weight_cache_is_two_bytes_per_te_weight_only():
    """TE 1.x module/base.py `set_fp8_weights`: each TE linear weight gets `weight1_fp8` and
    `weight1_t_fp8` (1 byte each) cached across micro-batches when its parameter is not
    FP8; the embedding and the head are not TE modules and get none."""
    params, te, (p8, *_) = _states("fp8")
    _, _, (p16, *_) = _states("bf16")
    assert p16 == pytest.approx(2 * params)
    assert p8 - p16 == pytest.approx(FP8_WEIGHT_CACHE_BYTES * te)
    assert p8 - p16 < FP8_WEIGHT_CACHE_BYTES * params  # the old rule cached every weight


def test_fp8_primary_weights_keep_no_bf16_copy():
    """Megatron-Core TransformerConfig.fp8_param ("keep the parameters in fp8 precision to
    save memory"; NeMo fp8_params / fp8_param_gather): TE's `set_fp8_weights` returns early
    for `primary_weights_in_fp8`, and the weight is the FP8 tensor (1 byte) with its
    transpose (1 byte): 2 bytes per TE weight, as bf16, 2 bytes less than the cached
    copies."""
    params, te, (p8, g8, o8, _) = _states("fp8", fp8_params=True)
    _, _, (p16, g16, o16, _) = _states("bf16")
    assert (p8, g8, o8) == pytest.approx((p16, g16, o16))
    _, _, (cached, *_) = _states("fp8")
    assert cached - p8 == pytest.approx(2 * te)


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_16_bit_gradient_buffer_is_4_plus_12_over_d_beside_the_activations(d):
    """Megatron-LM docs/source/distrib_optimizer.md: "fp16 param, fp16 grads" keep 4 + 16/d
    with the distributed optimizer, of which 4/d is the optimizer's fp32 copy of its gradient
    shard, made for the step (distrib_optimizer.py `_copy_model_grads_to_main_grads`) after
    the activations are freed: 4 + 12/d beside them; bf16 params with fp32 grads keep
    6 + 12/d. The grad buffer's dtype is the reduce dtype
    (DistributedDataParallelConfig.grad_reduce_in_fp32)."""
    bf16_grads = sum(state_bytes_per_param(dtype="bf16", master_weights=True, sizes=(1, 1, d),
                                           grad_dtype="bf16"))
    fp32_grads = sum(state_bytes_per_param(dtype="bf16", master_weights=True, sizes=(1, 1, d),
                                           grad_dtype="fp32"))
    assert bf16_grads == pytest.approx(4 + 12 / d)
    assert fp32_grads == pytest.approx(6 + 12 / d)
    assert sum(state_bytes_per_param(dtype="bf16", master_weights=True,
                                     sizes=(1, 1, d))) == pytest.approx(fp32_grads)


def test_16_bit_reduction_leaves_deepspeed_and_fsdp_rules_alone():
    """DeepSpeed already keeps its gradients in the training dtype; FSDP2 casts its reduced
    gradients to its fp32 sharded parameters: neither keeps Megatron's buffer."""
    from planner.specs.choices import ModelStates

    for sizes, states in (((1, 1, 8), ModelStates.DEEPSPEED), ((8, 8, 8), ModelStates.FP32_GRADS)):
        assert (state_bytes_per_param(dtype="bf16", master_weights=True, sizes=sizes,
                                      states=states, grad_dtype="bf16")
                == state_bytes_per_param(dtype="bf16", master_weights=True, sizes=sizes,
                                         states=states))


def test_dgxc_llama_8b_fp8_recipes_fit_as_they_ran():
    """Llama 3.1 8B FP8 at tp 1 cp 2 ran under NeMo 24.09 (+model.fp8_params, llama3.1/
    configure.sh) and NeMo 2.0 (bf16_with_fp8_mixed with grad_reduce_in_fp32 False,
    llama3.1/pretrain_llama31.py): predicted 80.0-89.8 GiB of 79.6 before, within it now."""
    cases = {c.id: c for c in dgxc_cases()}
    for cid in ("dgxc-llama31-8b-h100-fp8-8-nemo2409", "dgxc-llama31-8b-h100-fp8-8-nemo2502"):
        plan = cases[cid].plans[0]
        assert plan.training.fp8_params
        assert simulate(plan).fits, cid
    nemo2 = cases["dgxc-llama31-8b-h100-fp8-8-nemo2502"].plans[0]
    assert nemo2.training.comm.grad_reduce_dtype == "bf16"
    assert cases["dgxc-llama31-8b-h100-fp8-8-nemo2409"].plans[0].training.comm.grad_reduce_dtype == "fp32"


def test_fp8_params_needs_fp8():
    from planner.specs.plan import Training
    from profiler.schema import SpecError

    with pytest.raises(SpecError):
        Training(global_batch_size=8, seq_len=128, dtype="bf16", fp8_params=True).check("t")
