"""Transformer Engine's FP8 quantization work around each low-precision GEMM
(planner/costs/workload.py `_linear`), delayed per-tensor scaling, Megatron-Core's TE
layer spec. Bytes and launches from TE's source:

* `fp8_cast_transpose_fused` (TE 1.x module/linear.py forward; module/base.py
  `grad_output_preprocess` in backward): one launch reads the bf16 tensor (2 B a value)
  and writes its FP8 copy and the FP8 transpose (1 + 1 B).
* LayerNormLinear (module/layernorm_linear.py): the norm writes FP8 itself (the fused
  kernel for delayed scaling, csrc/extensions/normalization.cpp); the wgrad operand is
  `tex.fp8_transpose(ln_out_total)` in backward: read 1 B, write 1 B.
* sequence parallel: `cast_to_fp8` on the rank's rows (2 + 1 B), the FP8 all-gather,
  then `tex.fp8_transpose` of the gathered rows (1 + 1 B).
* GroupedLinear (module/grouped_linear.py): `fused_multi_quantize` /
  `fp8_multi_cast_transpose_fused`, one launch for all local experts.
"""

import pytest

from planner.costs.workload import Op, WorkloadShape, layer_work
from planner.specs.model import preset


def _ops(items: tuple) -> dict[str, Op]:
    return {i.name: i for i in items if isinstance(i, Op)}


def _shape(**kw) -> WorkloadShape:
    return WorkloadShape(micro_batch_size=kw.pop("mbs", 1), seq_len=kw.pop("seq", 4096), **kw)


def test_no_quantization_outside_fp8():
    m = preset("llama3-8b")
    for dtype in ("bf16", "fp16", "fp32", "tf32"):
        w = layer_work(m, _shape(dtype=dtype, tp=2, sequence_parallel=True))
        names = [i.name for i in (*w.forward, *w.backward, *w.selective_recompute)]
        assert not [n for n in names if "fp8" in n], dtype


def test_linear_input_and_grad_cast_transpose():
    # attn.proj (TE Linear, row parallel) without sequence parallelism: the attention
    # output [n, heads x d] and the output gradient [n, h] each take one fused
    # cast + transpose of 2 + 1 + 1 B a value
    m = preset("llama3-8b")
    n, tp = 4096, 2
    w = layer_work(m, _shape(dtype="fp8", tp=tp))
    fwd, bwd = _ops(w.forward), _ops(w.backward)
    x = n * m.num_heads // tp * m.head_dim
    cast = fwd["attn.proj.fp8_cast_x"]
    assert cast.bytes == 4 * x and cast.kernels == 1
    dy = bwd["attn.proj.fp8_cast_dy"]
    assert dy.bytes == 4 * n * m.hidden_size and dy.kernels == 1
    # the cast runs right before its GEMM, the gradient's before the dgrad
    names = [i.name for i in w.forward]
    assert names.index("attn.proj.fp8_cast_x") + 1 == names.index("attn.proj")
    bnames = [i.name for i in w.backward]
    assert bnames.index("attn.proj.fp8_cast_dy") + 1 == bnames.index("attn.proj.dgrad")
    # fc2's input is the SwiGLU output [n, ffn / tp]
    assert fwd["mlp.fc2.fp8_cast_x"].bytes == 4 * n * m.ffn_hidden_size // tp


def test_norm_fused_linear_transposes_in_backward():
    # QKV and fc1 are LayerNormLinear: no forward cast, a 1 + 1 B transpose of the
    # norm's FP8 output for wgrad, and the norm writes 1 B a value instead of 2
    m = preset("llama3-8b")
    n, h = 4096, m.hidden_size
    bf16, fp8 = layer_work(m, _shape(dtype="bf16")), layer_work(m, _shape(dtype="fp8"))
    fwd, bwd = _ops(fp8.forward), _ops(fp8.backward)
    assert "attn.qkv.fp8_cast_x" not in fwd and "mlp.fc1.fp8_cast_x" not in fwd
    assert bwd["attn.qkv.fp8_transpose_x"].bytes == 2 * n * h
    assert bwd["mlp.fc1.fp8_transpose_x"].bytes == 2 * n * h
    for norm in ("attn.norm", "mlp.norm"):
        assert _ops(bf16.forward)[norm].bytes - fwd[norm].bytes == n * h
        # its backward reads and writes bf16 gradients as before
        assert bwd[norm + ".bwd"].bytes == _ops(bf16.backward)[norm + ".bwd"].bytes


def test_sequence_parallel_gathers_in_fp8():
    # with sequence parallelism TE gathers the norm output and the row-parallel output
    # gradient: the cast on the rank's n / tp rows (2 + 1 B), the transpose on all n
    # rows after the gather (1 + 1 B), two launches for the gradient
    m = preset("llama3-8b")
    n, h, tp = 4096, m.hidden_size, 4
    w = layer_work(m, _shape(dtype="fp8", tp=tp, sequence_parallel=True))
    bwd = _ops(w.backward)
    assert bwd["attn.qkv.fp8_transpose_x"].bytes == 2 * n * h
    dy = bwd["attn.proj.fp8_cast_dy"]
    assert dy.bytes == pytest.approx(3 * n * h / tp + 2 * n * h) and dy.kernels == 2
    # the row-parallel input is the rank's own: one fused cast + transpose
    assert _ops(w.forward)["attn.proj.fp8_cast_x"].kernels == 1


def test_grouped_linear_quantizes_all_experts_in_one_launch():
    m = preset("mixtral-8x7b")
    w = layer_work(m, _shape(dtype="fp8", tp=1, ep=8))
    fwd, bwd = _ops(w.forward), _ops(w.backward)
    fc1 = fwd["moe.expert.fc1"]
    batch, rows, _, k = fc1.shape
    cast = fwd["moe.expert.fc1.fp8_cast_x"]
    assert cast.kernels == 1 and cast.bytes == 4 * batch * rows * k
    dy = bwd["moe.expert.fc2.fp8_cast_dy"]
    assert dy.kernels == 1 and dy.bytes == 4 * batch * rows * m.hidden_size
    # the MoE layer's pre-MLP norm is a TENorm (bf16 out): not priced as fused
    bf16 = layer_work(m, _shape(dtype="bf16", tp=1, ep=8))
    assert _ops(bf16.forward)["mlp.norm"].bytes == fwd["mlp.norm"].bytes


def test_mla_down_projections_each_quantize_their_input():
    # DeepSeek-V3: q_down and kv_down are TE Linears on the input norm's bf16 output,
    # each casting it; the latent norms are fused into the up-projections
    m = preset("deepseek-v3")
    w = layer_work(m, _shape(dtype="fp8", tp=2, sequence_parallel=True, ep=8))
    fwd, bwd = _ops(w.forward), _ops(w.backward)
    n_sp = 4096 // 2
    assert fwd["attn.q_down.fp8_cast_x"].bytes == 4 * n_sp * m.hidden_size
    assert fwd["attn.kv_down.fp8_cast_x"].bytes == 4 * n_sp * m.hidden_size
    assert "attn.q_up.fp8_cast_x" not in fwd and "attn.q_up.fp8_transpose_x" in bwd
    # the input norm is a TENorm (bf16 output) under MLA
    bf16 = layer_work(m, _shape(dtype="bf16", tp=2, sequence_parallel=True, ep=8))
    assert _ops(bf16.forward)["attn.norm"].bytes == fwd["attn.norm"].bytes
    assert _ops(bf16.forward)["attn.latent_norm"].bytes > fwd["attn.latent_norm"].bytes


def test_recompute_requantizes():
    # moe_act: the recomputed activation is quantized again for fc2's wgrad
    m = preset("mixtral-8x7b")
    w = layer_work(m, _shape(dtype="fp8", ep=8, recompute_modules=("moe_act",)))
    assert [i.name for i in w.selective_recompute] == ["moe.expert.swiglu",
                                                      "moe.expert.fc2.fp8_cast_x"]
    bf16 = layer_work(m, _shape(dtype="bf16", ep=8, recompute_modules=("moe_act",)))
    assert [i.name for i in bf16.selective_recompute] == ["moe.expert.swiglu"]


def test_quantization_slows_an_fp8_layer():
    from planner.costs.compute import ComputeCosts
    from profiler.devices import device

    m, h100 = preset("llama3-8b"), device("H100-80GB-SXM")
    w = layer_work(m, _shape(dtype="fp8", mbs=2, tp=2, sequence_parallel=True))
    costs = ComputeCosts(h100, "fp8")
    quant = costs.total_s(tuple(i for i in (*w.forward, *w.backward)
                                if isinstance(i, Op) and "fp8_" in i.name))
    total = costs.total_s((*w.forward, *w.backward))
    assert 0.02 < quant / total < 0.25
