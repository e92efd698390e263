"""The planner's ops as torch code, for measurement (imports torch: load lazily).

Each `impl` builds one op of the workload (planner/costs/workload.py) at given dimensions as
a `Fragment`: leaf tensors and a forward that records autograd, as training runs it.
An op's backward is the autograd backward of its fragment with respect to its inputs
(`.dgrad`), its weights (`.wgrad`) or all of them (`.bwd`). The code is what the
executor model (executor/model.py) runs for that op: the same torch calls, layouts
and copies, so that measured ops add up to a measured training step.

Dimension tuples per impl are listed in `IMPLS`. `fp8_linear` and `fp8_qkv` are `linear`
and `qkv` with the GEMM in FP8 (`torch._scaled_mm`), as Transformer Engine's `te.Linear`
runs it: e4m3 activations and weights, e5m2 output gradients, one scale per tensor, bf16
output. Their operands are cast to FP8 when the fragment is built, not in the timed call
(Transformer Engine fuses the casts into the neighbouring norm, activation and
cast-transpose kernels), so an FP8 row is the GEMM alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from planner.specs.model import ROPE_THETA  # RoPE's default base: the model spec's

__all__ = ["IMPLS", "Fragment", "apply_rope", "build", "fp8_mm", "rope_tables",
           "sdpa_backend"]

DROPOUT_P = 0.1  # Megatron-LM's attention and hidden dropout


@dataclass
class Fragment:
    """Leaves by role ("input" / "weight") and a forward over them."""

    inputs: tuple[torch.Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    forward: Callable[[], tuple[torch.Tensor, ...]]
    # torch's own ops compute only the gradients `autograd.grad` asks for; a custom
    # autograd Function (the FP8 GEMM) computes those its leaves require at forward time,
    # so a measurement freezes the leaves it does not differentiate
    prunes_backward: bool = True


def sdpa_backend(name: str) -> object:
    """The torch SDPA backend for a planner attention kernel name."""
    from torch.nn.attention import SDPBackend

    table = {"flash": SDPBackend.FLASH_ATTENTION,
             "memory_efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if name not in table:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(table)}")
    return table[name]


def rope_tables(seq_len: int, head_dim: int, *, device: torch.device | str = "cpu",
                base: float = ROPE_THETA) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each [s, d/2] (Su et al. 2021; `base`: the model's
    `rope_theta`)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves (x[..., :d/2], x[..., d/2:]) of x [b, heads, s, d] by the angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    s = x.size(-2)
    cos, sin = cos[:s], sin[:s]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class _Maker:
    """Random leaves of one dtype on one device."""

    def __init__(self, dtype: torch.dtype, device: str) -> None:
        self.dtype, self.device = dtype, device
        self.gen = torch.Generator(device=device).manual_seed(0)

    def __call__(self, *shape: int, grad: bool = True) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype)
        return t.requires_grad_(grad)


def fp8_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           *, fast_accum: bool) -> torch.Tensor:
    """a [m, k] x b [k, n] in FP8 with per-tensor scales, output bf16. FP8 tensor cores take
    `a` row-major and `b` column-major with every dimension a multiple of 16 (cuBLASLt);
    checked here so that the CPU, whose `_scaled_mm` is laxer, catches a wrong layout."""
    if not a.is_contiguous() or not b.t().is_contiguous():
        raise ValueError("FP8 GEMM operands must be row-major x column-major")
    (m, k), n = a.shape, b.shape[1]
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"FP8 GEMMs need dimensions divisible by 16, not {m}x{n}x{k}")
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=fast_accum)


def _to_fp8(t: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` in an FP8 format, scaled so that its largest magnitude maps to the format's
    largest value, and the float32 scale that undoes it (what `_scaled_mm` multiplies by)."""
    dtype = getattr(torch, fmt)
    scale = t.detach().abs().amax().float().clamp(min=1e-12) / torch.finfo(dtype).max
    return (t.detach().float() / scale).to(dtype), scale


@dataclass
class _Fp8Operands:
    """One GEMM's FP8 operands: x [m, k] and w [n, k] in e4m3, the output gradient g
    [m, n] in e5m2 (Transformer Engine's HYBRID recipe), and the transposed copies the
    backward GEMMs take (Hopper's FP8 GEMMs run only with both operands K-major, so
    Transformer Engine keeps transposes)."""

    x: torch.Tensor
    x_t: torch.Tensor
    x_scale: torch.Tensor
    w: torch.Tensor
    w_t: torch.Tensor
    w_scale: torch.Tensor
    g: torch.Tensor
    g_t: torch.Tensor
    g_scale: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> _Fp8Operands:
        (x8, xs), (w8, ws), (g8, gs) = (_to_fp8(x, "float8_e4m3fn"),
                                        _to_fp8(w, "float8_e4m3fn"), _to_fp8(g, "float8_e5m2"))
        return cls(x=x8, x_t=x8.t().contiguous(), x_scale=xs, w=w8, w_t=w8.t().contiguous(),
                   w_scale=ws, g=g8, g_t=g8.t().contiguous(), g_scale=gs)


class _Fp8Linear(torch.autograd.Function):
    """y = x w^T from the prepared FP8 operands (their values stand in for x's and the
    incoming gradient's: this times the GEMMs, it is not a numerics model). Forward with
    fast accumulation, gradients without, as Transformer Engine does on Hopper."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, ops: _Fp8Operands
                ) -> torch.Tensor:
        ctx.ops = ops
        y = fp8_mm(ops.x, ops.w.t(), ops.x_scale, ops.w_scale, fast_accum=True)  # [m, n]
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        ops = ctx.ops
        dx = dw = None
        if ctx.needs_input_grad[0]:  # [m, n] x [n, k]
            dx = fp8_mm(ops.g, ops.w_t.t(), ops.g_scale, ops.w_scale, fast_accum=False)
            dx = dx.view(*grad.shape[:-1], ops.w.shape[1])
        if ctx.needs_input_grad[1]:  # [n, m] x [m, k]
            dw = fp8_mm(ops.g_t, ops.x_t.t(), ops.g_scale, ops.x_scale, fast_accum=False)
        return dx, dw, None


def _projection(t: _Maker, x: torch.Tensor, w: torch.Tensor, *, fp8: bool
                ) -> Callable[[], torch.Tensor]:
    """x [..., k] -> [..., n] through w [n, k], in the leaves' dtype or in FP8."""
    if not fp8:
        return lambda: F.linear(x, w)
    tokens = x.numel() // x.size(-1)
    ops = _Fp8Operands.of(x.reshape(tokens, -1), w, t(tokens, w.size(0), grad=False))
    return lambda: _Fp8Linear.apply(x, w, ops)


def _linear(t: _Maker, m: int, n: int, k: int, *, fp8: bool = False) -> Fragment:
    x, w = t(m, k), t(n, k)  # [m, k] x [n, k]^T -> [m, n], as nn.Linear stores weights
    project = _projection(t, x, w, fp8=fp8)
    return Fragment((x,), (w,), lambda: (project(),), prunes_backward=not fp8)


def _qkv(t: _Maker, b: int, s: int, h: int, heads: int, kv_heads: int, d: int,
         rope: int, *, fp8: bool = False) -> Fragment:
    """The QKV projection, the head split and (for rope models) the rotation."""
    x, w = t(b, s, h), t((heads + 2 * kv_heads) * d, h)
    tables = rope_tables(s, d, device=t.device) if rope else None
    project = _projection(t, x, w, fp8=fp8)

    def forward() -> tuple[torch.Tensor, ...]:
        q, k, v = project().split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q = q.view(b, s, -1, d).transpose(1, 2)  # [b, a, s, d]
        k = k.view(b, s, -1, d).transpose(1, 2)
        v = v.view(b, s, -1, d).transpose(1, 2)
        if tables is not None:
            q, k = apply_rope(q, *tables), apply_rope(k, *tables)
        return q, k, v

    return Fragment((x,), (w,), forward, prunes_backward=not fp8)


def _sdpa(t: _Maker, b: int, heads: int, kv_heads: int, s_q: int, s_kv: int, d: int,
          dropout: int, *, backend: str) -> Fragment:
    """Fused attention under one SDPA backend, and the copy back to [b, s, a*d]."""
    from torch.nn.attention import sdpa_kernel

    q, k, v = t(b, s_q, heads, d), t(b, s_kv, kv_heads, d), t(b, s_kv, kv_heads, d)
    kernel = sdpa_backend(backend)

    def forward() -> tuple[torch.Tensor, ...]:
        with sdpa_kernel(kernel):
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                dropout_p=DROPOUT_P if dropout else 0.0, enable_gqa=kv_heads != heads)
        return (y.transpose(1, 2).reshape(b, s_q, heads * d),)

    return Fragment((q, k, v), (), forward)


def _scores(t: _Maker, b: int, heads: int, kv_heads: int, s_q: int, s_kv: int,
            d: int) -> Fragment:
    """Unfused attention scores (q / sqrt(d)) k^T, K repeated for grouped heads."""
    q, k = t(b, heads, s_q, d), t(b, kv_heads, s_kv, d)
    scale = 1.0 / math.sqrt(d)

    def forward() -> tuple[torch.Tensor, ...]:
        keys = k.repeat_interleave(heads // kv_heads, dim=1) if kv_heads != heads else k
        return ((q * scale) @ keys.transpose(-2, -1),)  # [b, a, s_q, s_kv]

    return Fragment((q,), (k,), forward)


def _causal_softmax(t: _Maker, batch: int, s_q: int, s_kv: int) -> Fragment:
    x = t(batch, s_q, s_kv)
    keep = torch.ones(s_q, s_kv, dtype=torch.bool, device=t.device).tril(s_kv - s_q)
    return Fragment((x,), (), lambda: (x.masked_fill(~keep, float("-inf")).softmax(-1),))


def _dropout(t: _Maker, elements: int) -> Fragment:
    x = t(elements)
    return Fragment((x,), (), lambda: (F.dropout(x, DROPOUT_P, training=True),))


def _context(t: _Maker, b: int, heads: int, kv_heads: int, s_q: int, s_kv: int,
             d: int) -> Fragment:
    """Unfused probs @ V and the copy back to [b, s, a*d]."""
    p, v = t(b, heads, s_q, s_kv), t(b, kv_heads, s_kv, d)

    def forward() -> tuple[torch.Tensor, ...]:
        values = v.repeat_interleave(heads // kv_heads, dim=1) if kv_heads != heads else v
        return ((p @ values).transpose(1, 2).reshape(b, s_q, heads * d),)

    return Fragment((p,), (v,), forward)


def _layernorm(t: _Maker, n: int, h: int) -> Fragment:
    x, w, bias = t(n, h), t(h), t(h)
    return Fragment((x,), (w, bias), lambda: (F.layer_norm(x, (h,), w, bias),))


def _rmsnorm(t: _Maker, n: int, h: int) -> Fragment:
    x, w = t(n, h), t(h)
    return Fragment((x,), (w,), lambda: (F.rms_norm(x, (h,), w, eps=1e-5),))


def _residual(t: _Maker, n: int, h: int, dropout: int) -> Fragment:
    """x + dropout(branch), the end of each half of a layer."""
    x, y = t(n, h), t(n, h)
    if dropout:
        return Fragment((x, y), (), lambda: (x + F.dropout(y, DROPOUT_P, training=True),))
    return Fragment((x, y), (), lambda: (x + y,))


def _gelu(t: _Maker, n: int, f: int) -> Fragment:
    x = t(n, f)
    return Fragment((x,), (), lambda: (F.gelu(x),))


def _swiglu(t: _Maker, n: int, f: int) -> Fragment:
    x = t(n, 2 * f)  # gate and up, from one fused GEMM

    def forward() -> tuple[torch.Tensor, ...]:
        gate, up = x.chunk(2, dim=-1)
        return (F.silu(gate) * up,)

    return Fragment((x,), (), forward)


def _geglu(t: _Maker, n: int, f: int) -> Fragment:
    """GELU of the gate times the up half (Shazeer 2020), as executor/moe.py's MLP."""
    x = t(n, 2 * f)  # gate and up, from one fused GEMM

    def forward() -> tuple[torch.Tensor, ...]:
        gate, up = x.chunk(2, dim=-1)
        return (F.gelu(gate) * up,)

    return Fragment((x,), (), forward)


def _embedding(t: _Maker, b: int, s: int, vocab: int, h: int, positions: int,
               dropout: int) -> Fragment:
    """Token lookup, plus learned positions when `positions` (their count) is set."""
    tokens = torch.randint(vocab, (b, s), generator=t.gen, device=t.device)
    wte = t(vocab, h)
    wpe = t(positions, h) if positions else None

    def forward() -> tuple[torch.Tensor, ...]:
        x = F.embedding(tokens, wte)
        if wpe is not None:
            x = x + F.embedding(torch.arange(s, device=t.device), wpe)
        return (F.dropout(x, DROPOUT_P, training=True) if dropout else x,)

    return Fragment((), (wte,) if wpe is None else (wte, wpe), forward)


def _cross_entropy(t: _Maker, n: int, vocab: int) -> Fragment:
    """The loss on fp32 logits (Megatron-LM's vocab cross entropy, one shard)."""
    logits = t(n, vocab)
    targets = torch.randint(vocab, (n,), generator=t.gen, device=t.device)
    return Fragment((logits,), (), lambda: (F.cross_entropy(logits.float(), targets),))


# impl name -> (builder, names of its dimensions)
IMPLS: dict[str, tuple[Callable[..., Fragment], tuple[str, ...]]] = {
    "linear": (_linear, ("m", "n", "k")),
    "qkv": (_qkv, ("b", "s", "h", "heads", "kv_heads", "d", "rope")),
    "fp8_linear": (partial(_linear, fp8=True), ("m", "n", "k")),
    "fp8_qkv": (partial(_qkv, fp8=True), ("b", "s", "h", "heads", "kv_heads", "d", "rope")),
    "sdpa": (_sdpa, ("b", "heads", "kv_heads", "s_q", "s_kv", "d", "dropout")),
    "scores": (_scores, ("b", "heads", "kv_heads", "s_q", "s_kv", "d")),
    "causal_softmax": (_causal_softmax, ("batch", "s_q", "s_kv")),
    "dropout": (_dropout, ("elements",)),
    "context": (_context, ("b", "heads", "kv_heads", "s_q", "s_kv", "d")),
    "layernorm": (_layernorm, ("n", "h")),
    "rmsnorm": (_rmsnorm, ("n", "h")),
    "residual": (_residual, ("n", "h", "dropout")),
    "gelu": (_gelu, ("n", "f")),
    "swiglu": (_swiglu, ("n", "f")),
    "geglu": (_geglu, ("n", "f")),
    "embedding": (_embedding, ("b", "s", "vocab", "h", "positions", "dropout")),
    "cross_entropy": (_cross_entropy, ("n", "vocab")),
}


def build(impl: str, dims: tuple[int, ...], *, variant: str | None, dtype: torch.dtype,
          device: str) -> Fragment:
    """The fragment of `impl` at `dims` (attention backends come as `variant`)."""
    builder, names = IMPLS[impl]
    if len(dims) != len(names):
        raise ValueError(f"{impl} takes dimensions {names}, got {dims}")
    maker = _Maker(dtype, device)
    if impl == "sdpa":
        return builder(maker, *dims, backend=variant or "flash")
    return builder(maker, *dims)
