"""Multi-head latent attention (DeepSeek-V2 arXiv:2405.04434 §2.1) in the workload, the
FLOP counts and the memory model, against Megatron-Core's MLASelfAttention
(megatron/core/transformer/multi_latent_attention.py) and Megatron-LM's
num_floating_point_operations (megatron/training/training.py, MLA branch)."""

import pytest

from planner.calibration.moe import source_flops_per_token
from planner.costs.memory import rank_param_count, rank_param_tensors
from planner.costs.workload import (
    Comm,
    Op,
    WorkloadShape,
    hardware_flops_per_token,
    layer_work,
    model_flops_per_token,
)
from planner.specs.model import ModelSpec, preset

# a dense MLA model small enough to count by hand
TINY = ModelSpec(name="mla-tiny", num_layers=2, hidden_size=64, ffn_hidden_size=96,
                 num_heads=4, vocab_size=256, seq_len=64, activation="swiglu", norm="rmsnorm",
                 position_embedding="rope", tied_embeddings=False, dropout=False,
                 q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                 v_head_dim=6)


def _shape(**fields):
    return WorkloadShape(**{"micro_batch_size": 2, "seq_len": 64, **fields})


def _ops(model, shape, kind=Op):
    return {o.name: o for o in layer_work(model, shape).forward if isinstance(o, kind)}


def _megatron_flops_per_token(m: ModelSpec, seq: int) -> float:
    """megatron/training/training.py num_floating_point_operations for a dense MLA model
    with SwiGLU, per token: 3 (fwd + bwd) x 2 (FMA) x per layer [q_term + kv_lora x (h +
    heads x (qk_head_dim + v_head_dim) + 1) + h x qk_pos_emb_head_dim + heads x v x h +
    seq x heads x (qk + pos) / 2 + seq x heads x v / 2] + the MLP (3 x h x ffn weights)
    and the logits, written out as the source has it."""
    h, a, s = m.hidden_size, m.num_heads, seq
    qk, pos, v = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    if m.q_lora_rank is None:
        q_term = h * a * (qk + pos)
    else:
        q_term = m.q_lora_rank * (h + a * (qk + pos) + 1)
    attn = (q_term + m.kv_lora_rank * (h + a * (qk + v) + 1) + h * pos + a * v * h
            + s * a * (qk + pos) / 2 + s * a * v / 2)
    mlp = 3 * h * m.ffn_hidden_size
    return 6.0 * (m.num_layers * (attn + mlp) + h * m.vocab_size)


@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_flops_are_megatrons_mla_count(q_lora_rank):
    import dataclasses

    m = dataclasses.replace(TINY, q_lora_rank=q_lora_rank)
    for seq in (64, 4096):
        assert source_flops_per_token(m, seq) == pytest.approx(
            _megatron_flops_per_token(m, seq), rel=1e-12)
        # the model FLOPs count the attention core in full (the causal half not skipped)
        core = 6.0 * m.num_layers * seq * m.num_heads * (12 + 6)
        assert model_flops_per_token(m, seq) - source_flops_per_token(m, seq) == (
            pytest.approx(core / 2))


def test_up_projection_recompute_counts_in_hardware_flops():
    # mla_up_proj re-runs the Q and K/V up-projections: 2 FLOPs per weight
    up = 2.0 * TINY.num_layers * (32 * 4 * 12 + 16 * 4 * (8 + 6))
    assert hardware_flops_per_token(TINY, 64, "selective", ("mla_up_proj",)) == pytest.approx(
        model_flops_per_token(TINY, 64) + up)


def test_attention_core_at_mla_widths():
    """Scores over qk_nope + qk_rope = 12, context over v_head_dim = 6 (FlashAttention's
    causal half); the unfused path as two batched GEMMs at those widths."""
    b, s, heads = 2, 64, 4
    core = _ops(TINY, _shape())["attn.core"]
    assert core.flops == 2.0 * b * heads * s * s * (12 + 6) * 0.5
    assert core.shape == (b, heads, s, s, 12, 6)
    unfused = _ops(TINY, _shape(attention="math"))
    assert unfused["attn.scores"].shape == (b * heads, s, s, 12)
    assert unfused["attn.context"].shape == (b * heads, s, 6, s)


def test_tensor_parallel_as_megatron_core_splits_mla():
    """tp 2 with sequence parallelism: the down-projections replicated on the rank's own
    tokens (TELinear "duplicated"), the latents and the rotary key all-gathered (not the
    hidden state), the up-projections split by heads, the output projection by its input."""
    n, t = 2 * 64, 2
    ops = _ops(TINY, _shape(tp=t, sequence_parallel=True))
    assert ops["attn.q_down"].shape == (1, n // t, 32, 64)
    assert ops["attn.kv_down"].shape == (1, n // t, 16 + 4, 64)
    assert ops["attn.q_up"].shape == (1, n, 4 // t * 12, 32)
    assert ops["attn.kv_up"].shape == (1, n, 4 // t * (8 + 6), 16)
    assert ops["attn.proj"].shape == (1, n, 64, 4 // t * 6)
    gathers = {c.name: c.bytes for c in _ops(TINY, _shape(tp=t, sequence_parallel=True), Comm)
               .values() if c.kind == "all_gather"}
    assert gathers == {"attn.q_latent.allgather": n * 32 * 2,
                       "attn.kv_latent.allgather": n * 16 * 2,
                       "attn.k_rope.allgather": n * 4 * 2, "mlp.allgather": n * 64 * 2}
    # without sp: replicated down-projections on every token, the latents' gradients summed
    plain = layer_work(TINY, _shape(tp=t))
    assert _ops(TINY, _shape(tp=t))["attn.q_down"].shape == (1, n, 32, 64)
    reduced = {c.name: c.bytes for c in plain.backward
               if isinstance(c, Comm) and c.name.startswith("attn.")}
    assert reduced == {"attn.q_latent.bwd": n * 32 * 2, "attn.kv_latent.bwd": n * 16 * 2}


def test_without_a_query_latent_the_hidden_state_is_gathered_for_q():
    """DeepSeek-V2-Lite: a column-parallel Q projection of the gathered hidden state."""
    lite = preset("deepseek-v2-lite")
    ops = _ops(lite, WorkloadShape(micro_batch_size=1, seq_len=4096, tp=2,
                                   sequence_parallel=True))
    assert "attn.q_down" not in ops and ops["attn.q_proj"].shape == (1, 4096, 8 * 192, 2048)
    comms = _ops(lite, WorkloadShape(micro_batch_size=1, seq_len=4096, tp=2,
                                     sequence_parallel=True), Comm)
    assert comms["attn.allgather"].bytes == 4096 * 2048 * 2
    assert "attn.q_latent.allgather" not in comms


def test_parameters_per_rank():
    """Each rank holds the replicated down-projections and latent norms and 1/tp of the
    up- and output projections; at tp 1 the tensors add up to the model."""
    for m in (TINY, preset("deepseek-v3"), preset("deepseek-v2-lite")):
        assert rank_param_count(m, num_layers=m.num_layers, first=True, last=True, tp=1,
                                pp=1) == m.num_params()
    # q_down 64x32, q_norm 32, q_up 32x(2x12), kv_down 64x20, kv_norm 16, kv_up 16x(2x14),
    # proj (2x6)x64, between the two layer norms
    tensors = rank_param_tensors(TINY, num_layers=1, first=False, last=False, tp=2, pp=1)
    assert tensors[:9] == (64, 64 * 32, 32, 32 * 24, 64 * 20, 16, 16 * 28, 12 * 64, 64)


def test_saved_activations_per_recompute_mode():
    """Per layer and micro-batch, 16-bit, no sp: the layer norms' inputs and outputs, the
    latents before and after their norm, Q (12 wide), K (12) and V (6) of each head,
    the output projection's input (6 per head), the core's fp32 log-sum-exp and the
    SwiGLU MLP's gate, up and fc2 input; mla_up_proj frees Q, K and V, core_attn the
    log-sum-exp, full recompute keeps the layer input only."""
    b, s, h, heads, e = 2, 64, 64, 4, 2
    n = b * s
    norms = n * h * (2 * e + 2 * e)  # inputs and outputs of the two layer norms
    latents = n * (32 + 16) * (e + e)
    qkv = n * heads * (12 + 12 + 6) * e
    proj_in = n * heads * 6 * e
    lse = b * heads * s * 4
    mlp = n * 96 * (2 * e + e)
    work = layer_work(TINY, _shape())
    assert work.activation_bytes == norms + latents + qkv + proj_in + lse + mlp
    up = layer_work(TINY, _shape(recompute_modules=("mla_up_proj",)))
    assert up.selective_activation_bytes == work.activation_bytes - qkv
    assert {op.name for op in up.selective_recompute} == {"attn.q_up", "attn.kv_up",
                                                           "attn.rope"}
    core = layer_work(TINY, _shape(recompute_modules=("core_attn",)))
    assert core.selective_activation_bytes == work.activation_bytes - lse
    assert work.input_bytes == n * h * e
