"""FLOP counts against the Megatron-LM formulas (Narayanan et al. 2021, Appendix;
Korthikanti et al. 2022 §6) and activation bytes against Korthikanti et al. 2022 §4."""

import math

import pytest

from planner.costs.workload import (
    Op,
    WorkloadShape,
    hardware_flops_per_token,
    layer_work,
    model_flops_per_token,
)
from planner.specs.model import ModelSpec, preset


def _gemm_flops(items):
    return sum(i.flops for i in items if isinstance(i, Op) and i.kind == "gemm")


def _softmax_ops(model, shape):
    """The attention softmax's forward and backward ops of `model`'s layer at `shape`."""
    w = layer_work(model, shape)
    [fwd] = [i for i in w.forward if isinstance(i, Op) and i.name == "attn.softmax"]
    [bwd] = [i for i in w.backward if isinstance(i, Op) and i.name == "attn.softmax.bwd"]
    return fwd, bwd


def _score_kernels(out, scores, names):
    """The ops among `names` that the backward of `out` runs on tensors of `scores`
    elements, in order (torch's CPU profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out.backward(torch.ones_like(out))
    return [e.name for e in prof.events() if e.name in names
            and any(math.prod(shape) == scores for shape in e.input_shapes if shape)]


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_layer_gemm_flops_match_megatron(tp):
    m = preset("megatron-22b")
    b, s, h = 4, 2048, m.hidden_size
    w = layer_work(m, WorkloadShape(micro_batch_size=b, seq_len=s, tp=tp, attention="math"))
    expected = 24 * b * s * h * h * (1 + s / (6 * h)) / tp
    assert _gemm_flops(w.forward) == pytest.approx(expected, rel=1e-12)
    assert _gemm_flops(w.backward) == pytest.approx(2 * expected, rel=1e-12)


def test_flash_attention_skips_the_causal_half():
    m = preset("megatron-22b")
    flash = layer_work(m, WorkloadShape(micro_batch_size=1, seq_len=2048, attention="flash"))
    math = layer_work(m, WorkloadShape(micro_batch_size=1, seq_len=2048, attention="math"))

    def core(w):
        return sum(i.flops for i in w.forward if isinstance(i, Op) and i.kind != "elementwise"
                   and i.name.startswith("attn.") and i.name not in ("attn.qkv", "attn.proj"))

    assert core(flash) == pytest.approx(core(math) / 2)


@pytest.mark.parametrize("dtype", ["fp32", "tf32"])
def test_fp32_softmax_is_megatrons_unfused_path(dtype):
    """Megatron's FusedScaleMaskSoftmax fuses scale, mask and softmax only for 16-bit
    inputs (`is_kernel_available` requires `input_in_float16`, megatron/core/fusions/
    fused_softmax.py): in fp32 / tf32 `forward_torch_softmax` runs the mask (an in-place
    masked_fill) and torch's softmax as two kernels, each reading and writing the b x a x
    s x s scores once. The math path's softmax then moves 4 fp32 words per score element
    forward (twice what the fused kernel does), in two launches. Its backward moves 16 in
    8 launches, as autograd runs it (the masked_fill is in place on a view of the
    baddbmm's output: `test_fp32_softmax_backward_is_what_autograd_runs`)."""
    m = preset("megatron-22b")
    b, s, tp = 2, 1024, 2
    heads = m.num_heads // tp

    def softmax(dt):
        return _softmax_ops(m, WorkloadShape(micro_batch_size=b, seq_len=s, tp=tp, dtype=dt,
                                             attention="math"))

    scores = b * heads * s * s
    fwd, bwd = softmax(dtype)
    assert fwd.bytes == pytest.approx(4 * 4 * scores) and fwd.kernels == 2
    assert bwd.bytes == pytest.approx(16 * 4 * scores) and bwd.kernels == 8
    fused, _ = softmax("bf16")  # the fused kernel: one read, one write of 2-byte scores
    assert fused.bytes == pytest.approx(2 * 2 * scores) and fused.kernels == 1


def test_fp32_softmax_backward_is_what_autograd_runs():
    """Megatron's fp32 attention (megatron/core/transformer/dot_product_attention.py;
    Megatron-DeepSpeed's ParallelAttention and Sailor's OPT / GPT-Neo attention alike):
    `baddbmm` into a [b*np, sq, sk] buffer, `.view(b, np, sq, sk)`, then
    `attention_mask_func`'s in-place `masked_fill_` on that view and torch's softmax. An
    in-place op on a view makes autograd rewrite the base's history: the view's gradient
    goes through AsStridedBackward0 (a zeroed base-sized buffer, a copy into it) and the
    base's through CopySlices (a copy of the gradient, a clone of the slice, the
    masked_fill backward as clone + masked_fill_, a copy back; torch/csrc/autograd/
    functions/tensor.cpp). Run on torch here, the score-sized kernels of that backward
    are the 8 launches and 16 words per score the planner prices."""
    torch = pytest.importorskip("torch")
    b, heads, s, d = 2, 3, 64, 16
    qkv = torch.randn(s, b, heads * 3 * d, requires_grad=True)
    mask = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
    q, k, v = (x.reshape(s, b * heads, d) for x in
               torch.split(qkv.view(s, b, heads, 3 * d), d, dim=-1))
    scores = torch.baddbmm(torch.empty(b * heads, s, s), q.transpose(0, 1),
                           k.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=1.0)
    view = scores.view(b, heads, s, s)
    view.masked_fill_(mask, -10000.0)
    probs = torch.nn.functional.softmax(view, dim=-1)
    context = torch.bmm(probs.view(b * heads, s, s), v.transpose(0, 1))
    # words each kernel moves per score: read + write, a zeroing writes, softmax's backward
    # reads the output and its gradient and writes one
    words = {"aten::copy_": 2, "aten::zero_": 1, "aten::masked_fill_": 2,
             "aten::_softmax_backward_data": 3}
    ran = _score_kernels(context, b * heads * s * s, words)
    _, bwd = _softmax_ops(preset("megatron-22b"), WorkloadShape(
        micro_batch_size=1, seq_len=256, tp=1, dtype="fp32", attention="math"))
    per_score = bwd.bytes / 4 / (preset("megatron-22b").num_heads * 256 * 256)
    assert len(ran) == bwd.kernels == 8, ran
    assert sum(words[name] for name in ran) == pytest.approx(per_score) == 16


def test_16_bit_unfused_softmax_backward_is_what_autograd_runs():
    """Megatron-DeepSpeed's torch softmax path for 16-bit scores the fused kernel does not
    take (`forward_torch_softmax`): cast to fp32, scale, the in-place masked_fill (on the
    scaled copy, not a view: no CopySlices), softmax, cast back. Run on torch here, its
    backward is 6 score-sized kernels: the cast (2 + 4 bytes), softmax's backward
    (4 + 4 + 4), the masked_fill backward as a clone (4 + 4) and a masked_fill_ (4 + 4),
    the scale (4 + 4), the cast back (4 + 2): 48 bytes a score, what the planner prices."""
    torch = pytest.importorskip("torch")
    b, heads, s = 2, 3, 64
    scores = torch.randn(b * heads, s, s, dtype=torch.float16, requires_grad=True)
    mask = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
    scaled = scores.view(b, heads, s, s).float() * 3.0
    scaled.masked_fill_(mask, -10000.0)
    probs = torch.nn.functional.softmax(scaled, dim=-1).half()
    ran = _score_kernels(probs, b * heads * s * s, (
        "aten::copy_", "aten::_softmax_backward_data", "aten::masked_fill_", "aten::mul"))
    assert ran == ["aten::copy_", "aten::_softmax_backward_data", "aten::copy_",
                   "aten::masked_fill_", "aten::mul", "aten::copy_"]
    moved = [6, 12, 8, 8, 8, 6]
    m = ModelSpec(name="gpt-16-heads", num_layers=2, hidden_size=1024, ffn_hidden_size=4096,
                  num_heads=16, vocab_size=50257, seq_len=1024)
    _, bwd = _softmax_ops(m, WorkloadShape(micro_batch_size=1, seq_len=1024, tp=8,
                                           dtype="fp16", attention="math"))
    assert bwd.kernels == len(ran)
    assert bwd.bytes == pytest.approx(sum(moved) * 2 * 1024 * 1024)


@pytest.mark.parametrize(("b", "tp", "s", "fused"), [
    (1, 8, 1024, False),  # 1 x 2 heads: 2 score matrices, not a multiple of 4
    (2, 8, 1024, True),  # 4 matrices
    (1, 4, 1024, True),
    (3, 8, 1024, False),  # 6 matrices
    (4, 8, 8192, False),  # keys beyond the kernel's 4096
    (4, 8, 16, False),  # keys at or below 16
])
def test_fused_softmax_falls_back_where_megatron_does(b, tp, s, fused):
    """FusedScaleMaskSoftmax.is_kernel_available (megatron/core/fusions/fused_softmax.py;
    Megatron-DeepSpeed's megatron/model/fused_softmax.py: `attn_batch_size % 4 == 0`)
    takes 16 < s_k <= 4096 and b x heads-per-rank score matrices a multiple of 4 (and of
    the kernel's matrices per thread block, 4 for s_k > 128). Elsewhere a 16-bit run
    takes the torch path with query-key layer scaling on (Megatron-DeepSpeed's default):
    cast to fp32, scale, mask, softmax, cast back: 5 kernels, 36 bytes per score forward
    and 48 backward in 6 (the mask's backward is a clone and a masked_fill_:
    `test_16_bit_unfused_softmax_backward_is_what_autograd_runs`), against the fused
    kernel's one launch and 4 bytes."""
    m = ModelSpec(name="gpt-16-heads", num_layers=2, hidden_size=1024, ffn_hidden_size=4096,
                  num_heads=16, vocab_size=50257, seq_len=s)
    fwd, bwd = _softmax_ops(m, WorkloadShape(micro_batch_size=b, seq_len=s, tp=tp,
                                             dtype="fp16", attention="math"))
    scores = b * (16 // tp) * s * s
    if fused:
        assert fwd.kernels == 1 and fwd.bytes == pytest.approx(4 * scores)
        assert bwd.bytes == pytest.approx(6 * scores)
    else:
        assert fwd.kernels == 5 and fwd.bytes == pytest.approx(36 * scores)
        assert bwd.kernels == 6 and bwd.bytes == pytest.approx(48 * scores)


def test_model_and_hardware_flops_match_megatron_formulas():
    m = preset("megatron-175b")
    s, layers, h, V = 2048, m.num_layers, m.hidden_size, m.vocab_size
    model = 72 * s * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h)) / s
    hw = 96 * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h)) / s
    # The presets count no biases, as the formula does not.
    assert model_flops_per_token(m, s) == pytest.approx(model, rel=1e-12)
    assert hardware_flops_per_token(m, s, "full") == pytest.approx(hw, rel=1e-12)


def test_gqa_swiglu_flops_are_6n_plus_attention():
    m = preset("llama3-8b")
    s = 8192
    n_matmul = m.num_layers * (m.params_per_layer() - 2 * m.hidden_size) + m.vocab_size * m.hidden_size
    expected = 6 * n_matmul + 12 * m.num_layers * m.hidden_size * s
    assert model_flops_per_token(m, s) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("tp, sp", [(1, False), (8, False), (8, True)])
def test_activation_bytes_match_korthikanti(tp, sp):
    m = preset("megatron-22b")  # GPT with dropout, 16-bit activations
    b, s, h, a = 4, 2048, m.hidden_size, m.num_heads
    w = layer_work(m, WorkloadShape(micro_batch_size=b, seq_len=s, tp=tp, sequence_parallel=sp,
                                    attention="math"))
    sbh = s * b * h
    if sp:
        none = sbh / tp * (34 + 5 * a * s / h)
        selective = sbh * 34 / tp
    else:
        none = sbh * (10 + 24 / tp + 5 * a * s / (h * tp))
        selective = sbh * (10 + 24 / tp)
    assert w.activation_bytes == pytest.approx(none, rel=1e-12)
    assert w.selective_activation_bytes == pytest.approx(selective, rel=1e-12)
    assert w.input_bytes == pytest.approx(2 * sbh / (tp if sp else 1))


def test_attention_dropout_apart_from_the_hidden_dropout():
    """Korthikanti et al. 2022 §4.1: with dropout a layer keeps 5as²b bytes of attention
    core (2 softmax output, 1 mask, 2 dropout output) and two 1-byte residual masks
    (2sbh). GPT-Neo in Megatron-DeepSpeed never applies its attention dropout but keeps
    the residual ones (`attention_dropout: false`): its core keeps the softmax output
    alone (2as²b), no attention-dropout kernel runs, the residual masks stay."""
    from dataclasses import replace

    m = preset("megatron-22b")
    b, s, h, a = 4, 2048, m.hidden_size, m.num_heads
    shape = WorkloadShape(micro_batch_size=b, seq_len=s, attention="math")
    both = layer_work(m, shape)
    neo = layer_work(replace(m, attention_dropout=False), shape)
    none = layer_work(replace(m, dropout=False), shape)
    assert both.activation_bytes - neo.activation_bytes == pytest.approx(3 * a * s * s * b)
    assert neo.activation_bytes - none.activation_bytes == pytest.approx(2 * s * b * h)

    def names(w):
        return {i.name for i in (*w.forward, *w.backward) if isinstance(i, Op)}

    assert "attn.dropout" in names(both) and "attn.dropout" not in names(neo)
    residual = {i.name: i.bytes for i in neo.forward if isinstance(i, Op)}
    assert residual["attn.residual"] > {i.name: i.bytes for i in none.forward
                                        if isinstance(i, Op)}["attn.residual"]
    # and the other way round: attention dropout alone (attention_dropout over dropout)
    assert replace(m, dropout=False, attention_dropout=True).drops_attention
    assert not replace(m, attention_dropout=False).drops_attention


def test_tp_collectives_per_layer():
    m = preset("megatron-22b")
    for sp, kinds in ((False, ["all_reduce"] * 4), (True, ["all_gather", "reduce_scatter"] * 4)):
        w = layer_work(m, WorkloadShape(micro_batch_size=1, seq_len=2048, tp=8, sequence_parallel=sp))
        got = sorted(c.kind for c in (*w.forward, *w.backward) if not isinstance(c, Op))
        assert got == sorted(kinds)


def test_optimizer_step_traffic_follows_the_state_dtype():
    """Bytes an AdamW step moves per parameter (`optimizer_work`): Megatron-LM's mixed
    precision reads the fp32 gradient to unscale and check it (4), for its norm (4), then
    AdamW reads gradient, master weight, m, v and writes the last three (28), copies the
    master into the bf16 weight (2) and zeroes the gradient (4): 42. Without master
    weights the same passes run over bf16 gradient, weight and moments (2 + 2 + 14 + 2) and
    nothing is copied back: 20 (PyTorch's Adam updating bf16 parameters in place)."""
    from planner.costs.workload import optimizer_work

    mixed = optimizer_work(1e6, dtype="bf16")
    pure = optimizer_work(1e6, dtype="bf16", master_weights=False)
    assert mixed.bytes == pytest.approx(42e6)
    assert pure.bytes == pytest.approx(20e6)
    assert pure.flops == mixed.flops
    # fp32 training: the setting changes nothing
    assert (optimizer_work(1e6, dtype="fp32", master_weights=False).bytes
            == optimizer_work(1e6, dtype="fp32").bytes)


def test_geglu_is_priced_as_swiglus_shape_with_its_own_op():
    """GeGLU (Shazeer 2020) runs SwiGLU's GEMMs and moves the same bytes (reads gate and up,
    writes their product; keeps both for backward); its elementwise op is `.geglu`, at 9
    FLOPs an element (GELU's 8, as `mlp.gelu` counts it, and the gate's multiply) against
    SwiGLU's 5 (SiLU x / (1 + exp(-x)): 4, and the multiply). Dense and MoE layers alike;
    grok-1 (GeGLU) is priced exactly as its shape with SwiGLU."""
    from dataclasses import replace

    from planner.costs.compute import ComputeCosts
    from profiler.devices import device

    w = WorkloadShape(micro_batch_size=2, seq_len=1024, tp=2, ep=2, etp=1)
    costs = ComputeCosts(device("H100-80GB-SXM"), "bf16")
    for name in ("llama3-8b", "mixtral-8x7b"):
        swiglu = preset(name)
        geglu = replace(swiglu, activation="geglu")
        a, b = layer_work(swiglu, w), layer_work(geglu, w)
        acts = {}
        for work, act in ((a, "swiglu"), (b, "geglu")):
            ops = [o for o in work.forward if isinstance(o, Op) and o.name.endswith(act)]
            assert ops and all(o.kind == "elementwise" for o in ops), (name, act)
            acts[act] = ops
        for s_op, g_op in zip(acts["swiglu"], acts["geglu"], strict=True):
            assert g_op.name == s_op.name.replace("swiglu", "geglu")
            assert g_op.bytes == s_op.bytes and g_op.shape == s_op.shape
            assert g_op.flops == pytest.approx(s_op.flops * 9 / 5)
        others = [(o.name, o.flops, o.bytes) for o in a.forward + a.backward
                  if isinstance(o, Op) and "swiglu" not in o.name]
        assert others == [(o.name, o.flops, o.bytes) for o in b.forward + b.backward
                          if isinstance(o, Op) and "geglu" not in o.name]
        assert (a.activation_bytes, a.selective_activation_bytes) == (
            b.activation_bytes, b.selective_activation_bytes)
        assert costs.total_s(a.forward + a.backward) == costs.total_s(b.forward + b.backward)
        assert model_flops_per_token(geglu, 4096) == model_flops_per_token(swiglu, 4096)
