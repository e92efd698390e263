"""Workload: one transformer layer (and the embedding, head and optimizer) as ops.

For a micro-batch on one rank of a stage with tensor parallel `tp`, context parallel `cp`
and optional sequence parallel, each op carries its shape, FLOPs and DRAM traffic, and
each collective its payload. FLOP counts and saved activations come only from here, so
the cost model, the memory model and the MFU numbers agree.

Conventions (Megatron-LM, Shoeybi et al. 2019; Korthikanti et al. 2022):
* b micro-batch, s sequence (per cp rank), h hidden, a heads, t tp. Tokens n = b*s.
* A GEMM [m, k] x [k, n] costs 2mnk FLOPs; backward is two GEMMs (dgrad, wgrad) of the same size.
* Collective payloads are the full per-rank buffer (NCCL's "size").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

from planner.specs.choices import DType
from planner.specs.model import ModelSpec
from profiler.kernels import Attention

__all__ = ["EXPERT_GEMM_STREAMS", "FP8_QUANTIZE_SUFFIXES", "GROUPED_GEMM_STREAMS", "Comm",
           "HostSync", "LayerWork", "Op", "Work", "WorkloadShape", "embedding_work",
           "attention_core_flops_per_token", "expert_tokens_factor",
           "hardware_flops_per_token", "head_work", "is_fp8_quantization", "layer_work",
           "model_flops_per_token",
           "optimizer_work"]

OpKind = Literal["gemm", "attention", "elementwise", "embedding", "optimizer"]
CommKind = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"]
Axis = Literal["tp", "cp", "dp", "pp", "ep"]

# The local experts' GEMMs as every MoE implementation this project prices runs them on
# Hopper: one cuBLAS GEMM per expert, round-robin over 4 CUDA streams.
# * Transformer Engine's GroupedLinear (Megatron-Core TEGroupedMLP, `--moe-grouped-gemm`
#   with the TE spec): forward, dgrad and wgrad are each one `general_grouped_gemm` over
#   `num_gemms = len(m_splits)` GEMMs (transformer_engine/pytorch/module/grouped_linear.py),
#   which `nvte_multi_stream_cublas_gemm` / `nvte_multi_tensor_gemm` launches as one
#   cublasLt GEMM per expert on compute stream `i % num_streams`
#   (transformer_engine/common/gemm/cublaslt_gemm.cu `multi_stream_cublas_gemm`), with
#   `num_compute_streams = 4` (common/util/multi_stream.cpp). TE's CUTLASS grouped GEMM
#   runs only with NVTE_USE_CUTLASS_GROUPED_GEMM=1 (default off).
# * The grouped_gemm package (`grouped_gemm.ops.gmm`: Megatron-Core's legacy GroupedMLP,
#   NeMo AutoModel's GroupedExpertsDeepEP; AutoModel installs nv-grouped-gemm 1.1.4, the
#   fanshiqing/grouped_gemm fork): on any device but sm80 `CublasGroupedGemm`, one
#   cublasGemmEx per expert on `cublas_handle[i % NUM_STREAM]`, NUM_STREAM 4
#   (csrc/grouped_gemm.cu); wgrad the same (`CublasGroupedGemmVariableK`).
GROUPED_GEMM_STREAMS = 4
# What `_moe_block` prices the local experts' GEMMs with: 0, one batched GEMM over all of
# them (the catalog's calibration was made so); GROUPED_GEMM_STREAMS prices them as the
# implementations above run them. Examined and not adopted (docs/calibration.md, "MoE":
# "Grouped expert GEMMs"): it moves the MoE rows 14.0 -> 14.1% at the catalog's Hopper
# GEMM rate and does not make the 0.594 refit adoptable.
EXPERT_GEMM_STREAMS = 0


@dataclass(frozen=True)
class Op:
    """Work on one rank. GEMM shape is (batch, m, n, k); attention (b, heads, s_q, s_kv, d).

    `kernels` counts the launches it takes in a Megatron-style implementation (a GEMM plus
    its bias add or layout copies, say): each costs the host a dispatch and the GPU a gap.
    """

    name: str
    kind: OpKind
    flops: float
    bytes: float
    shape: tuple[int, ...] = ()
    kernels: int = 1
    backward_kernels: int | None = None  # launches of its backward (default: `kernels`)
    # DRAM bytes of an elementwise op's backward (default: 1.5 x `bytes`, `_backward_of`)
    backward_bytes: float | None = None
    variant: str | None = None  # the implementation, where there are alternatives
    low_precision: bool = False  # a linear layer's GEMM: FP8 under fp8 training (TE Linear)
    # the fraction of the layers that run it (an average layer of a model with dense and
    # MoE layers): `flops` and `bytes` count that share; `shape` stays the op's own, so
    # its time is `share` x the time of one run of the whole op (`ComputeCosts.time_s`)
    share: float = 1.0
    # a GEMM's `batch` run as that many separate launches round-robin over `streams` CUDA
    # streams (0: one batched launch): a grouped GEMM of local experts (`grouped_gemm_streams`)
    streams: int = 0


@dataclass(frozen=True)
class Comm:
    """A collective over one parallel axis; `bytes` is the full per-rank buffer."""

    name: str
    kind: CommKind
    bytes: float
    axis: Axis
    # MoE dispatch / combine sent DeepEP's way: a token once to each rank (and over the
    # network once to each node) holding one of its `top_k` of `experts` experts, not once
    # per expert (`comm.dispatch_time_s`; 0: a plain all-to-all of every copy)
    top_k: int = 0
    experts: int = 0
    consecutive: bool = False  # a token's top-k experts side by side (`moe_routing`)


@dataclass(frozen=True)
class HostSync:
    """A point where the host waits for the GPU (a device-to-host copy it needs): at
    "record" the GPU's progress is noted (the copy is queued behind the work so far); at
    "wait" the host stops issuing kernels until the GPU has got there, so the kernels
    queued ahead of the GPU drain (`stages._issue_queue_s`). `share`: the fraction of the
    layers that have it (an average layer of a model with dense and MoE layers)."""

    name: str
    point: Literal["record", "wait"]
    share: float = 1.0


Work = Op | Comm | HostSync


@dataclass(frozen=True)
class WorkloadShape:
    """What the per-rank work of a layer depends on (a cache key)."""

    micro_batch_size: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    dtype: str = "bf16"
    attention: str = "flash"  # flash | memory_efficient | math
    ep: int = 1  # expert parallel: routed experts split over ep ranks (MoE models)
    etp: int | None = None  # expert tensor parallel: 1 or tp (None: tp, Megatron's default)
    dispatcher: str = "alltoall"  # MoE token dispatch: alltoall | deepep
    routing: str = "learned"  # which experts a token takes: learned | fake_balanced
    # what selective recomputation re-runs (`RecomputeModule` values; Megatron's default)
    recompute_modules: tuple[str, ...] = ("core_attn",)
    # the share of the stage's layers that are MoE, where it holds a known set of them
    # (`layout.stage_moe_layers`); None: the model's share (`moe_share`)
    moe_layers_share: float | None = None
    # sequence-parallel tp collectives under the GEMMs (`Communication.tp_comm_overlap`)
    tp_comm_overlap: bool = True


def moe_share(model: ModelSpec, w: WorkloadShape) -> float:
    """The share of MoE layers the average layer of `w`'s stage prices."""
    return model.moe_layer_fraction if w.moe_layers_share is None else w.moe_layers_share


@dataclass(frozen=True)
class LayerWork:
    forward: tuple[Work, ...]
    backward: tuple[Work, ...]
    selective_recompute: tuple[Work, ...]  # re-run before backward under selective recompute
    activation_bytes: float  # saved for backward, no recompute
    selective_activation_bytes: float  # saved under selective recompute
    input_bytes: float  # the layer input, all that full recompute keeps
    attention_core: tuple[Work, ...] = ()  # the attention backend's ops (and cp's ring)


def _gemm(name: str, m: int, n: int, k: int, elem: int, batch: int = 1, kernels: int = 1,
          low_precision: bool = False, streams: int = 0) -> Op:
    return Op(name, "gemm", 2.0 * batch * m * n * k, float(elem * batch * (m * k + k * n + m * n)),
              (batch, m, n, k), kernels, low_precision=low_precision, streams=streams)


@dataclass(frozen=True)
class _Linear:
    """A linear layer's GEMM and the work Transformer Engine runs around it: under fp8 the
    quantization of its inputs (`_linear`), before the GEMM in `forward` and before its
    dgrad and wgrad in `backward`; otherwise the GEMM alone."""

    gemm: Op
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]


# The names Transformer Engine's FP8 quantization kernels take (`_linear`): a linear's name
# with one of these suffixes. `plan profile` does not measure them (planner/profiling/cases.py):
# they are priced from their bytes.
FP8_QUANTIZE_SUFFIXES = (".fp8_cast_x", ".fp8_transpose_x", ".fp8_cast_dy")


def is_fp8_quantization(op: Op) -> bool:
    """Whether `op` is one of TE's FP8 quantization kernels around a linear layer."""
    return op.name.endswith(FP8_QUANTIZE_SUFFIXES)


def _quantize(name: str, elements: float, reads: float, writes: float, kernels: int) -> Op:
    """A Transformer Engine quantization kernel over `elements` values: `reads` and
    `writes` bytes per value; scaling and the amax it records: 2 FLOPs per value."""
    return Op(name, "elementwise", 2.0 * elements, elements * (reads + writes),
              (int(elements),), kernels)


def _linear(gemm: Op, w: WorkloadShape, *, source: Literal["cast", "norm"] = "cast",
            gather_in: int = 1, gather_grad: int = 1) -> _Linear:
    """A low-precision GEMM with the FP8 quantization of its operands as Transformer
    Engine runs it under delayed per-tensor scaling (this project's fp8), with
    Megatron-Core's TE layer spec. Per value of the GEMM's input X [m, k] and of its
    output gradient dY [m, n] (all `batch` groups of a GroupedLinear in one launch:
    `fused_multi_quantize`, TE 2.x grouped_linear.py; `fp8_multi_cast_transpose_fused`,
    TE 1.x):

    * X from a plain Linear / GroupedLinear input (`source` "cast"): one fused
      cast + transpose, read bf16 (2 B), write the FP8 copy and its transpose for wgrad
      (1 + 1 B) (`fp8_cast_transpose_fused`, TE 1.x linear.py; the input quantizer's
      rowwise + columnwise usage, TE 2.x). The amax is taken in the same pass: delayed
      scaling reads its scale from the amax history (TE docs, "FP8 Delayed Scaling": one
      tensor read per quantization, against two for current scaling).
    * X from a norm fused into the linear (`source` "norm": TE LayerNormLinear,
      Megatron's TELayerNormColumnParallelLinear): the norm kernel writes FP8 itself
      (`layernorm_fwd` / `rmsnorm_fwd` use the fused kernel for FP8 delayed scaling,
      csrc/extensions/normalization.cpp; the norm op's 1-byte write is the caller's); its
      transpose for wgrad is a separate kernel, read 1 B, write 1 B, in backward
      (`tex.fp8_transpose(ln_out_total)`, TE 1.x layernorm_linear.py).
    * X all-gathered over `gather_in` tp ranks by TE (column-parallel with sequence
      parallelism): cast rowwise before the gather on the rank's own rows (2 B read,
      1 B written), and transposed after the gather again in backward (1 + 1 B, on all
      m rows) (`cast_to_fp8` when `sequence_parallel`, TE 1.x linear.py; FP8 Float8
      tensors gather rowwise only, TE 2.x `supports_only_rowwise_all_gather`).
    * dY: one fused cast + transpose, 2 B read, 1 + 1 B written (`grad_output_preprocess`,
      TE 1.x module/base.py: `fp8_cast_transpose_fused`); where TE all-gathers it over
      `gather_grad` ranks (row-parallel with sequence parallelism) a cast of the rank's
      own rows, the FP8 gather, and a transpose of all m rows (`cast_to_fp8`,
      `gather_along_first_dim`, `tex.fp8_transpose`): two launches.

    Not here: the weights' casts (once per step, on the first micro-batch:
    `is_first_microbatch`, Megatron's `set_is_first_microbatch`; cached for the rest),
    the amax reduction and scale update (one small all-reduce and one fused kernel per
    autocast region and pass), and the halved bytes of TE's FP8 all-gathers."""
    if w.dtype != DType.FP8.value or not gemm.low_precision:
        return _Linear(gemm, (gemm,), _backward_of(gemm))
    batch, m, n, k = gemm.shape
    rows = batch * m
    forward: list[Op] = []
    backward: list[Op] = []
    x, dy = rows * k, rows * n
    if source == "norm":
        backward.append(_quantize(gemm.name + ".fp8_transpose_x", x, 1, 1, 1))
    elif gather_in > 1:
        forward.append(_quantize(gemm.name + ".fp8_cast_x", x / gather_in, 2, 1, 1))
        backward.append(_quantize(gemm.name + ".fp8_transpose_x", x, 1, 1, 1))
    else:
        forward.append(_quantize(gemm.name + ".fp8_cast_x", x, 2, 2, 1))
    if gather_grad > 1:
        backward.insert(0, Op(gemm.name + ".fp8_cast_dy", "elementwise", 2.0 * dy,
                              dy / gather_grad * 3 + dy * 2, (int(dy),), 2))
    else:
        backward.insert(0, _quantize(gemm.name + ".fp8_cast_dy", dy, 2, 2, 1))
    return _Linear(gemm, (*forward, gemm), (*backward, *_backward_of(gemm)))


def _fp8_norm_output(norm: Op, w: WorkloadShape, share: float = 1.0) -> Op:
    """A norm fused into the linear layer after it (TE LayerNormLinear) under fp8: the
    kernel writes its output in FP8, 1 B a value instead of 2 (`_linear`, source
    "norm"), on `share` of the layers; its backward is unchanged (bf16 gradients)."""
    if w.dtype != DType.FP8.value or share == 0.0:
        return norm
    backward = 1.5 * norm.bytes if norm.backward_bytes is None else norm.backward_bytes
    return replace(norm, bytes=norm.bytes - share * norm.shape[0], backward_bytes=backward)


def _elementwise(name: str, elements: float, elem: int, *, reads: float, writes: float,
                 flops_per_elem: float = 1.0, kernels: int = 1,
                 backward_kernels: int | None = None,
                 backward_bytes_per_elem: float | None = None) -> Op:
    return Op(name, "elementwise", flops_per_elem * elements, elem * elements * (reads + writes),
              (int(elements),), kernels, backward_kernels,
              backward_bytes=(None if backward_bytes_per_elem is None
                              else backward_bytes_per_elem * elements))


def _backward_of(op: Op) -> tuple[Op, ...]:
    bwd_kernels = op.backward_kernels or op.kernels
    if op.kind == "gemm":  # dgrad, and wgrad with whatever the forward added (bias grad)
        batch, m, n, k = op.shape
        return (Op(op.name + ".dgrad", "gemm", op.flops, op.bytes, (batch, m, k, n),
                   low_precision=op.low_precision, share=op.share, streams=op.streams),
                Op(op.name + ".wgrad", "gemm", op.flops, op.bytes, (batch, k, n, m), bwd_kernels,
                   low_precision=op.low_precision, share=op.share, streams=op.streams))
    if op.kind == "attention":
        # FlashAttention-2 backward recomputes the scores: 2.5x the forward FLOPs (Dao 2023).
        return (Op(op.name + ".bwd", "attention", 2.5 * op.flops, 2.0 * op.bytes, op.shape,
                   bwd_kernels, variant=op.variant, share=op.share),)
    # Elementwise backward reads the saved input and the output gradient, writes one grad
    # (unless the op says what its backward moves).
    bwd_bytes = op.bytes * 1.5 if op.backward_bytes is None else op.backward_bytes
    return (Op(op.name + ".bwd", op.kind, op.flops, bwd_bytes, op.shape, bwd_kernels,
               share=op.share),)


def _fused_softmax_fits(attn_batches: int, s_q: int, s_kv: int) -> bool:
    """Whether Megatron's fused causal scale-mask-softmax takes these scores
    (FusedScaleMaskSoftmax.is_kernel_available, megatron/core/fusions/fused_softmax.py;
    Megatron-DeepSpeed's megatron/model/fused_softmax.py checks the same): 16 < s_kv <=
    4096, s_q and s_kv multiples of 4, the b x heads-per-rank score matrices a multiple
    of 4 and of the matrices one thread block takes (get_batch_per_block in
    megatron/fused_kernels/scaled_masked_softmax.h: 128 threads, one warp of
    min(32, next_pow2(s_kv)) threads a row, two rows a warp up to 128 keys)."""
    if not (16 < s_kv <= 4096 and s_q % 4 == 0 and s_kv % 4 == 0 and attn_batches % 4 == 0):
        return False
    pow2 = 1 << max(0, math.ceil(math.log2(s_kv)))
    per_block = (128 // min(pow2, 32)) * (2 if pow2 <= 128 else 1)
    return attn_batches % per_block == 0


def _softmax(probs: float, dtype: str, *, fused: bool = True) -> Op:
    """Megatron's scale-mask-softmax over `probs` score elements. Its fused kernel reads
    and writes the scores once, but takes only 16-bit inputs (FusedScaleMaskSoftmax.
    is_kernel_available requires `input_in_float16`; megatron/core/fusions/
    fused_softmax.py, Megatron-DeepSpeed's megatron/model/fused_softmax.py alike): an
    fp32 or tf32 run takes `forward_torch_softmax`, the mask (`attention_mask_func`, an
    in-place masked_fill) and torch's softmax as two kernels, each reading and writing
    the scores (a scale, where query-key layer scaling is on, would be a third). Its
    backward is what autograd makes of that masked_fill_, in place on the `.view` of the
    baddbmm's output (megatron/core/transformer/dot_product_attention.py; Megatron-
    DeepSpeed's and Sailor's attention alike): the view's gradient through
    AsStridedBackward0 (zero a base-sized buffer, copy into it: 1 + 2 words a score), the
    base's through CopySlices (copy the gradient, clone the slice, the masked_fill
    backward as a clone and a masked_fill_, copy back: 2 + 2 + 2 + 2 + 2;
    torch/csrc/autograd/functions/tensor.cpp) and softmax's backward (read the output and
    its gradient, write one: 3): 16 words a score in 8 kernels, counted on torch by
    `test_fp32_softmax_backward_is_what_autograd_runs`.

    A 16-bit run whose scores the fused kernel does not take (`fused` false,
    `_fused_softmax_fits`) takes the same torch path with query-key layer scaling on
    (Megatron-DeepSpeed's default: `--no-query-key-layer-scaling` is store_false, and
    scaling forces `attention_softmax_in_fp32`, megatron/arguments.py and
    megatron/model/transformer.py): cast to fp32 (read 2 B, write 4), scale (4 + 4),
    mask (4 + 4), softmax (4 + 4), cast back (4 + 2) = 36 B per score in 5 kernels; its
    backward runs them in reverse under autograd: 6 + 12, the mask's backward as a clone
    and a masked_fill_ (8 + 8), then 8 + 6 = 48 B in 6 kernels."""
    elem = DType(dtype).element_bytes
    if DType(dtype).storage is DType.FP32:
        return _elementwise("attn.softmax", probs, elem, reads=2, writes=2, flops_per_elem=4,
                            kernels=2, backward_kernels=8, backward_bytes_per_elem=16 * elem)
    if not fused:
        return _elementwise("attn.softmax", probs, 1, reads=18, writes=18, flops_per_elem=6,
                            kernels=5, backward_kernels=6, backward_bytes_per_elem=48)
    return _elementwise("attn.softmax", probs, elem, reads=1, writes=1, flops_per_elem=4)


def _attention_core(model: ModelSpec, w: WorkloadShape, heads: int) -> tuple[Op, ...]:
    """Scores, softmax and weighted sum for `heads` local query heads: scores over
    `head_dim_qk`, values of `head_dim_v` (equal but for MLA: 192 and 128 in DeepSeek-V3)."""
    b, s, d = w.micro_batch_size, w.seq_len // w.cp, model.head_dim_qk
    d_v = model.head_dim_v
    s_kv = w.seq_len  # with cp, K/V of the whole sequence pass by (ring attention)
    elem = DType(w.dtype).element_bytes
    if not Attention(w.attention).fused:
        # Megatron's unfused path computes the full s x s matrix (Korthikanti et al. 2022 §4.1).
        # Kernels: baddbmm, scale-mask-softmax (fused in 16 bits, `_softmax`), dropout
        # (mask + apply), bmm + the permute copy back to [s, b, h].
        probs = b * heads * s * s_kv
        ops = [_gemm("attn.scores", s, s_kv, d, elem, batch=b * heads),
               _softmax(probs, w.dtype, fused=_fused_softmax_fits(b * heads, s, s_kv))]
        if model.drops_attention:
            # forward: read the scores, write them and a byte mask; backward (torch's
            # native_dropout_backward): read the gradient and the mask, write the gradient
            ops.append(_elementwise("attn.dropout", probs, elem, reads=1, writes=1.5, kernels=2,
                                    backward_kernels=1))
        ops.append(_gemm("attn.context", s, d_v, s_kv, elem, batch=b * heads, kernels=2))
        return tuple(ops)
    # Fused kernels skip the masked half of causal attention (FlashAttention, Dao 2022):
    # 2 s s_kv d_qk for the scores and 2 s s_kv d_v for the context, per head, halved.
    flops = 2.0 * b * heads * s * s_kv * (d + d_v) * 0.5
    # read q and k (upper bound: k per query head), v, write out
    io = elem * b * s * heads * (2 * d + 2 * d_v)
    # MLA's shape names both widths (the profiles measured ordinary heads only)
    shape = (b, heads, s, s_kv, d) if d == d_v else (b, heads, s, s_kv, d, d_v)
    # Kernels: the fused kernel and the layout copies around it.
    return (Op("attn.core", "attention", flops, float(io), shape, 3, variant=w.attention),)


@dataclass(frozen=True)
class _Ffn:
    """The feed-forward part of a layer between its norm and its residual."""

    forward: tuple[Work, ...]
    backward: tuple[Work, ...]
    saved_bytes: float  # kept for backward (split by tp)
    # per recompute module of this part ("mlp", "moe", "moe_act", "shared_experts"):
    # the forward work it re-runs and the saved bytes it frees
    modules: tuple[tuple[str, tuple[Work, ...], float], ...] = ()


def _mlp_ops(prefix: str, model: ModelSpec, w: WorkloadShape, *, tokens: float,
             ffn_local: int, elem: int, linear: int, batch: int = 1,
             fc1_source: Literal["cast", "norm"] = "cast", tp_gather: int = 1,
             streams: int = 0) -> tuple[_Linear, Op, _Linear, float]:
    """fc1, activation, fc2 of an MLP (or of `batch` experts at once: a grouped GEMM of
    `tokens` rows each) and the bytes they keep for backward: the fc1 input is the
    block's, counted by the caller; gate and up for the activation's backward, its
    output as fc2's input. `fc1_source` and `tp_gather` (the tp ranks TE gathers fc1's
    input and fc2's output gradient over) place their FP8 quantization (`_linear`)."""
    rows = int(math.ceil(tokens))
    width = ffn_local * (2 if model.gated else 1)
    fc1 = _linear(_gemm(f"{prefix}.fc1", rows, width, model.hidden_size, linear, batch=batch,
                        low_precision=True, streams=streams), w, source=fc1_source,
                  gather_in=tp_gather)
    fc2 = _linear(_gemm(f"{prefix}.fc2", rows, model.hidden_size, ffn_local, linear,
                        batch=batch, low_precision=True, streams=streams), w,
                  gather_grad=tp_gather)
    elements = batch * rows * ffn_local
    # One kernel, named by the activation (`{prefix}.gelu`, `.swiglu`, `.geglu`); a gated
    # one reads gate and up and writes act(gate) * up. FLOPs per output element, exp,
    # erf and tanh one each: SwiGLU 5 (SiLU x / (1 + exp(-x)): negate, exp, add, divide;
    # times up), GeGLU 9 (GELU at the 8 this model has always counted for gelu, times
    # up; GELU's tanh form 0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2))), which
    # Megatron-Core's fused geglu and Grok-1's jax.nn.gelu compute, is 9 by the same
    # rule, its erf form 5). Elementwise ops are priced by their bytes (memory-bound:
    # `analytic.memory_time_s`; a profile interpolates them by bytes too), so GeGLU and
    # SwiGLU, which move the same bytes, take the same time unless a profile measured
    # them apart (each under its own name, profiler/torch_ops.py).
    if model.gated:
        act = _elementwise(f"{prefix}.{model.activation}", elements, elem, reads=2, writes=1,
                           flops_per_elem=5 if model.activation == "swiglu" else 9)
    else:
        act = _elementwise(f"{prefix}.gelu", elements, elem, reads=1, writes=1,
                           flops_per_elem=8)
    saved = elements * (elem * (2 if model.gated else 1) + linear)
    return fc1, act, fc2, float(saved)


def _ffn_block(model: ModelSpec, w: WorkloadShape, mlp_in: tuple[Comm, ...],
               mlp_in_bwd: tuple[Comm, ...], mlp_out: tuple[Comm, ...],
               mlp_out_bwd: tuple[Comm, ...]) -> _Ffn:
    """The dense MLP, the MoE block, or for a model with both kinds of layer the average
    layer: each kind's work scaled by its share of the stage's layers (`moe_share`)."""
    elem = DType(w.dtype).element_bytes
    linear = DType(w.dtype).gemm_operand_bytes
    n = w.micro_batch_size * w.seq_len // w.cp
    # fc1 is TE's LayerNormLinear with the pre-MLP norm (TELayerNormColumnParallelLinear)
    fc1, act, fc2, saved = _mlp_ops("mlp", model, w, tokens=n,
                                    ffn_local=model.ffn_hidden_size // w.tp, elem=elem,
                                    linear=linear, fc1_source="norm",
                                    tp_gather=w.tp if w.sequence_parallel else 1)
    forward: tuple[Work, ...] = (*mlp_in, *fc1.forward, act, *fc2.forward, *mlp_out)
    dense = _Ffn(forward,
                 (*mlp_out_bwd, *fc2.backward, *_backward_of(act), *fc1.backward,
                  *mlp_in_bwd), saved, (("mlp", forward, saved),))
    share = moe_share(model, w)
    if share == 0.0:
        return dense
    moe = _moe_block(model, w, mlp_in, mlp_in_bwd, mlp_out, mlp_out_bwd)
    if share == 1.0:
        return moe
    return _Ffn((*_scaled(dense.forward, 1 - share), *_scaled(moe.forward, share)),
                (*_scaled(moe.backward, share), *_scaled(dense.backward, 1 - share)),
                dense.saved_bytes * (1 - share) + moe.saved_bytes * share,
                tuple((name, _scaled(ops, part), freed * part)
                      for kind, part in ((dense, 1 - share), (moe, share))
                      for name, ops, freed in kind.modules))


def _scaled(items: tuple[Work, ...], share: float) -> tuple[Work, ...]:
    """Work done on `share` of the layers, spread over all of them (an op keeps its shape
    and carries the share: `Op.share`)."""
    return tuple(replace(i, flops=i.flops * share, bytes=i.bytes * share, share=i.share * share,
                         backward_bytes=(None if i.backward_bytes is None
                                         else i.backward_bytes * share))
                 if isinstance(i, Op) else replace(i, share=i.share * share)
                 if isinstance(i, HostSync) else replace(i, bytes=i.bytes * share)
                 for i in items)


def expert_tokens_factor(model: ModelSpec) -> float:
    """Tokens the busiest expert rank computes, as a multiple of its even share: the
    load imbalance, capped by the capacity factor when tokens beyond it are dropped
    (Megatron: capacity = tokens x top-k x capacity_factor / experts)."""
    if model.capacity_factor is None:
        return model.load_imbalance
    if model.pad_to_capacity:  # every expert computes its capacity, padded
        return model.capacity_factor
    return min(model.load_imbalance, model.capacity_factor)


def _expert_tp_comms(size: float, *, sequence_parallel: bool
                     ) -> tuple[tuple[Comm, ...], ...]:
    """The expert-tp collectives around the experts on the dispatched tokens (`size`
    bytes gathered; 0: expert tp 1, none): into the experts, out of them, and their
    backwards (Megatron's g / g-bar as for a dense MLP)."""
    if not size:
        return (), (), (), ()
    if sequence_parallel:
        return ((Comm("moe.allgather", "all_gather", size, "tp"),),
                (Comm("moe.reduce_scatter", "reduce_scatter", size, "tp"),),
                (Comm("moe.allgather.bwd", "reduce_scatter", size, "tp"),),
                (Comm("moe.reduce_scatter.bwd", "all_gather", size, "tp"),))
    return ((), (Comm("moe.reduce", "all_reduce", size, "tp"),),
            (Comm("moe.allgather.bwd", "all_reduce", size, "tp"),), ())


def _moe_block(model: ModelSpec, w: WorkloadShape, mlp_in: tuple[Comm, ...],
               mlp_in_bwd: tuple[Comm, ...], mlp_out: tuple[Comm, ...],
               mlp_out_bwd: tuple[Comm, ...]) -> _Ffn:
    """An MoE block as Megatron-Core's all-to-all token dispatcher runs it (MoE README,
    `MoEAlltoAllTokenDispatcher`): router GEMM and top-k on the rank's (sequence-parallel)
    tokens, permute (a memory-bound gather of k copies of each token), all-to-all dispatch
    over the ep group, all-gather over the expert tp group (= tp), grouped expert GEMMs of
    E/ep local experts, then back: reduce-scatter, all-to-all combine, unpermute (weighted
    sum of the k copies). Shared experts run as a dense MLP on the tp-gathered tokens.
    With expert tp 1 (MoE Parallel Folding, Liu et al. 2025) the experts are whole and
    the tp ranks' tokens stay apart: no tp collectives around the experts.

    Tokens per expert = tokens x top-k / experts x imbalance (Fedus et al. 2022 §2.2);
    each all-to-all moves every routed copy once, (ep-1)/ep of it off the rank
    (`collective_time_s`)."""
    b, t, h = w.micro_batch_size, w.tp, model.hidden_size
    elem = DType(w.dtype).element_bytes
    linear = DType(w.dtype).gemm_operand_bytes
    n = b * w.seq_len // w.cp
    n_r = n // t if w.sequence_parallel else n  # tokens this rank routes
    k, experts = model.experts_per_token, model.num_experts
    local = max(experts // w.ep, 1)
    imbalance = expert_tokens_factor(model)
    routed = n_r * k * imbalance  # token copies this rank sends and receives
    etp = w.etp or t
    # after the expert-tp all-gather (none at expert tp 1)
    computed = (n_r * etp if w.sequence_parallel else n) * k * imbalance
    router = Op("moe.router", "gemm", 2.0 * n_r * experts * h,
                float(elem * (n_r * h + h * experts) + 4 * n_r * experts), (1, n_r, experts, h))
    # softmax / sigmoid, top-k and the routing map: fp32 scores, three launches
    topk = _elementwise("moe.topk", n_r * experts, 4, reads=1, writes=1, flops_per_elem=4,
                        kernels=3)
    permute = _elementwise("moe.permute", routed * h, elem, reads=1, writes=1,
                           flops_per_elem=0, kernels=2)
    unpermute = _elementwise("moe.unpermute", routed * h, elem, reads=1, writes=1 / k,
                             flops_per_elem=2, kernels=2)
    dedup = ((k, experts, w.routing == "fake_balanced") if w.dispatcher == "deepep"
             else (0, 0, False))
    dispatch = Comm("moe.dispatch", "all_to_all", routed * h * elem, "ep", *dedup)
    combine = Comm("moe.combine", "all_to_all", routed * h * elem, "ep", *dedup)
    tp_in, tp_out, tp_in_bwd, tp_out_bwd = _expert_tp_comms(
        computed * h * elem if etp > 1 else 0.0, sequence_parallel=w.sequence_parallel)
    # TEGroupedLinear experts: TE quantizes each GEMM's input and output gradient for all
    # local experts at once; the dispatcher, not TE, moves the tokens (no TE gathers)
    fc1, act, fc2, saved = _mlp_ops("moe.expert", model, w, tokens=computed / local,
                                    ffn_local=model.expert_ffn // etp, elem=elem, linear=linear,
                                    batch=local, streams=EXPERT_GEMM_STREAMS)
    # kept: router probabilities (fp32), the permuted tokens (fc1's input) and their
    # probabilities: Megatron-Core's experts weigh their activation by them
    # (TEGroupedMLP `activation_func_with_probs`), so the unpermute is a plain scatter-add
    # that keeps nothing
    saved += 4 * n_r * experts + computed * h * linear + 4 * computed
    send: tuple[Comm, ...] = (dispatch,) if w.ep > 1 else ()
    back: tuple[Comm, ...] = (combine,) if w.ep > 1 else ()
    # The host waits for the GPU once in every MoE layer's forward:
    # * Megatron-Core's MoEAlltoAllTokenDispatcher, routing not padded to capacity: the
    #   per-expert token counts (and all-to-all splits) are copied to the host after the
    #   routing ("before_permutation_1") and the host waits for them before the dispatch
    #   (`_maybe_dtoh_and_synchronize` at "before_ep_alltoall"; dropless or dropping); only
    #   `moe_pad_expert_input_to_capacity` (`drop_and_pad`) skips it;
    # * DeepEP (ep > 1): the forward's dispatch has no cached handle, so after its layout
    #   and notify kernels the host busy-waits for the receive counts before it allocates
    #   the receive buffer and launches the transfer (Megatron-Core and NeMo AutoModel
    #   moe/fused_a2a.py `FusedDispatch.forward`: "the CPU will wait for GPU's signal to
    #   arrive, so this is not compatible with CUDA graph"; DeepEP csrc/deep_ep.cpp
    #   `intranode_dispatch` / `internode_dispatch`, `moe_recv_counter`, skipped only with
    #   `num_worst_tokens`, which neither passes). The backward's dispatch (the combine's
    #   gradient) reuses the forward's handle (cached mode) and does not wait. DeepEP
    #   permutes the tokens after it receives them.
    deepep = w.dispatcher == "deepep"
    sync = (deepep and w.ep > 1) or (not deepep and not model.pad_to_capacity)
    record: tuple[Work, ...] = (HostSync("moe.tokens_per_expert.d2h", "record"),) if sync else ()
    wait: tuple[Work, ...] = (HostSync("moe.tokens_per_expert.sync", "wait"),) if sync else ()
    into: list[Work] = ([*record, *wait, *send, permute] if deepep
                        else [*record, permute, *wait, *send])
    into_bwd: list[Work] = ([*_backward_of(permute), *send] if deepep
                            else [*send, *_backward_of(permute)])
    forward: list[Work] = [router, topk, *into, *tp_in,
                           *fc1.forward, act, *fc2.forward, *tp_out, *back, unpermute]
    backward: list[Work] = [*_backward_of(unpermute), *back, *tp_out_bwd, *fc2.backward,
                            *_backward_of(act), *fc1.backward, *tp_in_bwd, *into_bwd,
                            *_backward_of(topk), *_backward_of(router)]
    # moe_act: fc2's input is dropped and the activation run again (with fp8, Megatron
    # has fc2 save its bf16 input for this, `set_save_original_input`, then drops it, and
    # TE quantizes the recomputed input again for wgrad: fc2's input cast)
    modules: list[tuple[str, tuple[Work, ...], float]] = [
        ("moe_act", (act, *fc2.forward[:-1]), float(act.shape[0] * linear))]
    if model.num_shared_experts:
        # a dense MLP of TE Linears on the normed hidden state (TENorm: not fused); with
        # sequence parallelism TE gathers fc1's input and fc2's output gradient
        s1, s_act, s2, s_saved = _mlp_ops("moe.shared", model, w, tokens=n,
                                          ffn_local=model.shared_ffn // t, elem=elem,
                                          linear=linear,
                                          tp_gather=t if w.sequence_parallel else 1)
        shared: tuple[Work, ...] = (*mlp_in, *s1.forward, s_act, *s2.forward, *mlp_out)
        forward.extend(shared)
        backward[:0] = (*mlp_out_bwd, *s2.backward, *_backward_of(s_act),
                        *s1.backward, *mlp_in_bwd)
        saved += s_saved
        modules.append(("shared_experts", shared, s_saved))
    # moe: the whole block again, its all-to-alls too (MoELayer checkpoints router,
    # dispatch, experts, combine and shared experts as one function of its input)
    modules.append(("moe", tuple(forward), float(saved)))
    return _Ffn(tuple(forward), tuple(backward), float(saved), tuple(modules))


@dataclass(frozen=True)
class _Projections:
    """The attention's input projections: from the norm's output to Q, K and V."""

    forward: tuple[Work, ...]
    backward: tuple[Work, ...]
    saved_bytes: float = 0.0  # kept for backward beside the norm output and Q, K, V
    up: tuple[Work, ...] = ()  # what MLA's up-projection recompute (mla_up_proj) re-runs


def _mla_projections(model: ModelSpec, w: WorkloadShape, hidden_in: tuple[Comm, ...],
                     hidden_in_bwd: tuple[Comm, ...]) -> _Projections:
    """MLA's projections as Megatron-Core's MLASelfAttention runs them with the TE layer
    spec (megatron/core/transformer/multi_latent_attention.py, gpt_layer_specs.py):
    the replicated down-projections (TELinear "duplicated") on the rank's own tokens,
    [n_sp, h] -> the query latent [n_sp, q_lora] and the K/V latent plus the shared
    rotary key [n_sp, kv_lora + rope]; the latents' RMSNorms (fused into the
    up-projections, TELayerNormColumnParallelLinear); with sequence parallelism the
    normed latents and the rotary key are all-gathered over tp (TE gathers the norm's
    output; `gather_from_sequence_parallel_region` the key), not the hidden state;
    the column-parallel up-projections to this rank's heads, [n, heads * (nope + rope)]
    for Q and [n, heads * (nope + v)] for K and V; the rotary embedding applied to the
    rope parts and Q, K, V concatenated (Megatron's fused_apply_mla_rope_for_q / _kv,
    one kernel each). Without sequence parallelism the latents' gradients are summed
    over tp (ColumnParallelLinear's copy_to_tensor_model_parallel_region). Without a
    query latent (q_lora_rank none, DeepSeek-V2-Lite) Q comes from a column-parallel
    projection of the gathered hidden state, as an ordinary QKV does."""
    assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
    b, s, h, t = w.micro_batch_size, w.seq_len // w.cp, model.hidden_size, w.tp
    elem = DType(w.dtype).element_bytes
    linear = DType(w.dtype).gemm_operand_bytes
    n = b * s
    n_sp = n // t if w.sequence_parallel else n  # tokens of the replicated down-projections
    heads, qk, v = model.num_heads // t, model.head_dim_qk, model.head_dim_v
    rope, kv_rank, q_rank = model.qk_rope_head_dim, model.kv_lora_rank, model.q_lora_rank or 0
    nope = qk - rope
    latents = q_rank + kv_rank
    # the down-projections are TE Linears on the input norm's bf16 output (TENorm), each
    # quantizing it; the latents' norms are fused into the up-projections
    # (TELayerNormColumnParallelLinear), which TE gathers under sequence parallelism
    gather_up = t if w.sequence_parallel else 1
    kv_down = _linear(_gemm("attn.kv_down", n_sp, kv_rank + rope, h, linear,
                            low_precision=True), w)
    norm = _fp8_norm_output(_elementwise(
        "attn.latent_norm", n_sp * latents, elem, reads=1.5, writes=1, flops_per_elem=5,
        kernels=2 if q_rank else 1, backward_kernels=4 if q_rank else 2), w)
    gather: list[Comm] = []
    gather_bwd: list[Comm] = []
    if t > 1 and w.sequence_parallel:
        for name, width in (("attn.q_latent", q_rank), ("attn.kv_latent", kv_rank),
                            ("attn.k_rope", rope)):
            if width:
                gather.append(Comm(name + ".allgather", "all_gather", n * width * elem, "tp"))
                gather_bwd.append(Comm(name + ".allgather.bwd", "reduce_scatter",
                                       n * width * elem, "tp"))
    elif t > 1:
        gather_bwd = [Comm(name + ".bwd", "all_reduce", n * width * elem, "tp")
                      for name, width in (("attn.q_latent", q_rank), ("attn.kv_latent", kv_rank))
                      if width]
    kv_up = _linear(_gemm("attn.kv_up", n, heads * (nope + v), kv_rank, linear,
                          low_precision=True), w, source="norm", gather_in=gather_up)
    # Megatron's fused MLA rope (megatron/core/fusions/fused_mla_yarn_rope_apply.py):
    # Q's rotary part rotated in place; K (the rotary key broadcast to every head) and V
    # written from the K/V up-projection, contiguous for the attention kernel
    written = heads * (rope + qk + v)
    rope_op = _elementwise("attn.rope", n * written, elem,
                           reads=(heads * (rope + nope + v) + rope) / written, writes=1,
                           flops_per_elem=1, kernels=2)
    if q_rank:
        q_down = _linear(_gemm("attn.q_down", n_sp, q_rank, h, linear, low_precision=True), w)
        q_up = _linear(_gemm("attn.q_up", n, heads * qk, q_rank, linear, low_precision=True),
                       w, source="norm", gather_in=gather_up)
        forward: tuple[Work, ...] = (*q_down.forward, *kv_down.forward, norm, *gather,
                                     *q_up.forward, *kv_up.forward, rope_op)
        backward: tuple[Work, ...] = (
            *_backward_of(rope_op), *kv_up.backward, *q_up.backward, *gather_bwd,
            *_backward_of(norm), *kv_down.backward, *q_down.backward)
        up: tuple[Work, ...] = (*q_up.forward, *kv_up.forward, rope_op)
    else:
        # Q from a column-parallel TE Linear on the gathered hidden state
        q_proj = _linear(_gemm("attn.q_proj", n, heads * qk, h, linear, low_precision=True),
                         w, gather_in=gather_up)
        forward = (*kv_down.forward, norm, *gather, *hidden_in, *q_proj.forward,
                   *kv_up.forward, rope_op)
        backward = (*_backward_of(rope_op), *kv_up.backward, *q_proj.backward,
                    *hidden_in_bwd, *gather_bwd, *_backward_of(norm), *kv_down.backward)
        up = (*q_proj.forward, *kv_up.forward, rope_op)
    # kept: the latents before their norm (its backward) and after it (the
    # up-projections' inputs, the rank's own tokens: TE gathers them again for wgrad)
    saved = n_sp * latents * (elem + linear)
    return _Projections(forward, backward, float(saved), up)


@cache
def layer_work(model: ModelSpec, w: WorkloadShape) -> LayerWork:
    """Ops of one transformer layer for one micro-batch on one tp/cp rank."""
    b, s, h, t = w.micro_batch_size, w.seq_len // w.cp, model.hidden_size, w.tp
    elem = DType(w.dtype).element_bytes
    linear = DType(w.dtype).gemm_operand_bytes  # what a linear layer's GEMM reads
    n = b * s  # tokens on this rank
    n_sp = n // t if w.sequence_parallel else n  # tokens the norms and dropouts see
    q_heads = model.num_heads // t
    kv_heads = max(model.kv_heads // t, 1)  # replicated when tp > kv heads
    d = model.head_dim
    act = n * h * elem  # one [b, s, h] activation

    def norm(name: str) -> Op:
        # One read, one write, plus the statistics pass of a fused norm kernel; its
        # backward is two kernels (input grad, weight grads).
        return _elementwise(name, n_sp * h, elem, reads=1.5, writes=1, flops_per_elem=5,
                            backward_kernels=2)

    def residual(name: str) -> Op:
        # bias + dropout (if any) + residual add, fused: read two, write one (+ a byte mask).
        return _elementwise(name, n_sp * h, elem, reads=2, writes=1 + (0.5 if model.dropout else 0),
                            kernels=2)

    def block_in(name: str) -> tuple[tuple[Comm, ...], tuple[Comm, ...]]:
        """Collectives entering a tp block, forward and backward (Megatron's f / g-bar)."""
        if t == 1:
            return (), ()
        if w.sequence_parallel:
            return ((Comm(name, "all_gather", act, "tp"),),
                    (Comm(name + ".bwd", "reduce_scatter", act, "tp"),))
        return (), (Comm(name + ".bwd", "all_reduce", act, "tp"),)

    def block_out(name: str) -> tuple[tuple[Comm, ...], tuple[Comm, ...]]:
        """Collectives leaving a tp block, forward and backward (Megatron's g / g)."""
        if t == 1:
            return (), ()
        if w.sequence_parallel:
            return ((Comm(name, "reduce_scatter", act, "tp"),),
                    (Comm(name + ".bwd", "all_gather", act, "tp"),))
        return (Comm(name, "all_reduce", act, "tp"),), ()

    # per rank: the K and V widths (ordinary: kv heads x d; MLA: every head's K and V,
    # up-projected from the latent)
    k_width, v_width = ((q_heads * model.head_dim_qk, q_heads * model.head_dim_v)
                        if model.is_mla else (kv_heads * d, kv_heads * d))
    cp_comm: tuple[Comm, ...] = ()
    if w.cp > 1:  # ring attention passes K and V around the cp group (Liu et al. 2023);
        # MLA's too: Transformer Engine's ring takes the up-projected K and V it is given
        cp_comm = (Comm("attn.kv_ring", "send_recv",
                        float(n * (k_width + v_width) * elem * (w.cp - 1)), "cp"),)
    core = _attention_core(model, w, q_heads)
    attn_in, attn_in_bwd = block_in("attn.allgather")
    attn_out, attn_out_bwd = block_out("attn.reduce")
    mlp_in, mlp_in_bwd = block_in("mlp.allgather")
    mlp_out, mlp_out_bwd = block_out("mlp.reduce")
    attn_norm, mlp_norm = norm("attn.norm"), norm("mlp.norm")
    # the pre-MLP norm is fused into fc1 in dense layers only (an MoE layer's is a TENorm
    # whose bf16 output the router and the dispatch take)
    mlp_norm = _fp8_norm_output(mlp_norm, w, 1.0 - moe_share(model, w))
    if model.is_mla:
        qkv = _mla_projections(model, w, attn_in, attn_in_bwd)
    else:
        # The QKV GEMM brings its bias add and the copies that split heads (4 launches);
        # with the input norm fused (TELayerNormColumnParallelLinear)
        fused = _linear(_gemm("attn.qkv", n, (q_heads + 2 * kv_heads) * d, h, linear,
                              kernels=4, low_precision=True), w, source="norm",
                        gather_in=t if w.sequence_parallel else 1)
        qkv = _Projections((*attn_in, *fused.forward), (*fused.backward, *attn_in_bwd))
        attn_norm = _fp8_norm_output(attn_norm, w)
    proj = _linear(_gemm("attn.proj", n, h, q_heads * model.head_dim_v, linear,
                         low_precision=True), w, gather_grad=t if w.sequence_parallel else 1)
    ffn = _ffn_block(model, w, mlp_in, mlp_in_bwd, mlp_out, mlp_out_bwd)
    attn_res, mlp_res = residual("attn.residual"), residual("mlp.residual")
    forward: tuple[Work, ...] = (
        attn_norm, *qkv.forward, *cp_comm, *core, *proj.forward, *attn_out, attn_res,
        mlp_norm, *ffn.forward, mlp_res,
    )
    core_bwd = [b for op in reversed(core) for b in _backward_of(op)]
    backward: tuple[Work, ...] = (
        *_backward_of(mlp_res), *ffn.backward, *_backward_of(mlp_norm),
        *_backward_of(attn_res), *attn_out_bwd, *proj.backward, *core_bwd, *cp_comm,
        *qkv.backward, *_backward_of(attn_norm),
    )
    saved, core_bytes, norm_out_bytes = _saved_activation_bytes(
        model, w, q_heads, k_width + v_width, ffn.saved_bytes + qkv.saved_bytes)
    # each recompute module: the forward work it re-runs and the saved bytes it frees
    parts: list[tuple[str, tuple[Work, ...], float]] = [
        ("layernorm", (attn_norm,), 0.0), ("core_attn", (*cp_comm, *core), core_bytes),
        ("layernorm", (mlp_norm,), norm_out_bytes), *ffn.modules]
    if model.is_mla:  # Q, K and V are dropped after the core and projected again
        parts.append(("mla_up_proj", qkv.up, n * (q_heads * model.head_dim_qk + k_width
                                                  + v_width) * elem))
    chosen = set(w.recompute_modules)
    if "moe" in chosen:  # the MoE block's checkpoint already re-runs these
        chosen -= {"moe_act", "shared_experts"}
    again = [(ops, freed) for name, ops, freed in parts if name in chosen]
    return LayerWork(
        forward=forward,
        backward=backward,
        selective_recompute=tuple(op for ops, _ in again for op in ops),
        activation_bytes=saved,
        selective_activation_bytes=saved - sum(freed for _, freed in again),
        input_bytes=float(n_sp * h * elem),
        attention_core=(*cp_comm, *core),
    )


def _saved_activation_bytes(model: ModelSpec, w: WorkloadShape, q_heads: int,
                            kv_width: int, mlp: float) -> tuple[float, float, float]:
    """Bytes a layer keeps for backward without recompute, of which the attention core's
    (what recomputing it frees) and the two norms' outputs (the QKV and MLP inputs, what
    recomputing the norms frees: with fp8 Megatron has those linears save the bf16 norm
    output, `set_for_recompute_input_layernorm`, and drops it).

    Korthikanti et al. 2022 §4.1, generalised per tensor (GQA, SwiGLU, fused attention):
    for GPT with 16-bit activations and dropout this is sbh(34/t) + 5as²b/t with sequence
    parallel, and sbh(10 + 24/t + 5as/(ht)) without it.
    """
    b, s, h, t = w.micro_batch_size, w.seq_len // w.cp, model.hidden_size, w.tp
    e = DType(w.dtype).element_bytes
    g = DType(w.dtype).gemm_operand_bytes  # inputs a linear layer saves (TE saves FP8 casts)
    n = b * s
    n_rep = n // t if w.sequence_parallel else n  # tensors not split by tp unless sp
    mask = 1 if model.dropout else 0  # one byte per element
    # Replicated across tp (split by sp): two norm inputs, QKV input, MLP input, two masks.
    norm_outputs = n_rep * h * (g + g)
    replicated = n_rep * h * (2 * e + 2 * mask) + norm_outputs
    # Split by tp: Q, K, V (K and V `kv_width` wide on this rank); the output-projection
    # input; the MLP activations and MLA's latents (`mlp`, from `_ffn_block` and
    # `_mla_projections`).
    qkv = n * (q_heads * model.head_dim_qk + kv_width) * e
    proj_in = n * q_heads * model.head_dim_v * g
    selective = replicated + qkv + proj_in + mlp
    if not Attention(w.attention).fused:
        scores = b * q_heads * s * w.seq_len
        drop = 1 if model.drops_attention else 0
        core = scores * (e + drop * (1 + e))  # softmax out; with dropout its mask and output
    else:
        core = b * q_heads * s * 4  # fp32 log-sum-exp per row; the output is proj_in
    if g != e:  # the attention output is saved at full precision beside its FP8 cast
        core += n * q_heads * model.head_dim_v * e
    return float(selective + core), float(core), float(norm_outputs)


@cache
def embedding_work(model: ModelSpec, w: WorkloadShape) -> tuple[tuple[Work, ...], tuple[Work, ...]]:
    """Forward and backward of the vocab-parallel embedding on the first stage."""
    n = w.micro_batch_size * w.seq_len // w.cp
    elem = DType(w.dtype).element_bytes
    h = model.hidden_size
    lookup = _elementwise("embed.lookup", n * h, elem, reads=1, writes=1, flops_per_elem=0)
    comm: tuple[Comm, ...] = ()
    if w.tp > 1:  # partial sums from each vocab shard
        kind: CommKind = "reduce_scatter" if w.sequence_parallel else "all_reduce"
        comm = (Comm("embed.reduce", kind, n * h * elem, "tp"),)
    grad = _elementwise("embed.grad", n * h, 4, reads=2, writes=1, flops_per_elem=1)
    bwd_comm = tuple(Comm(c.name + ".bwd", "all_gather", c.bytes, c.axis)
                     for c in comm if c.kind == "reduce_scatter")
    return (lookup, *comm), (*bwd_comm, grad)


@cache
def head_work(model: ModelSpec, w: WorkloadShape) -> tuple[tuple[Work, ...], tuple[Work, ...], float]:
    """Forward and backward of final norm, logits and loss on the last stage, and the
    bytes they keep for backward (the fp32 logits dominate). Without an LM head the loss
    runs on the final norm's output (each tp rank on its replicated copy)."""
    n = w.micro_batch_size * w.seq_len // w.cp
    elem = DType(w.dtype).element_bytes
    h = model.hidden_size
    v_local = -(-model.vocab_size // w.tp) if model.lm_head else h
    n_sp = n // w.tp if w.sequence_parallel else n
    norm = _elementwise("head.norm", n_sp * h, elem, reads=1.5, writes=1, flops_per_elem=5)
    gather: tuple[Comm, ...] = ()
    if w.sequence_parallel and w.tp > 1:
        gather = (Comm("head.allgather", "all_gather", n * h * elem, "tp"),)
    if not model.lm_head:
        return _hidden_state_loss(n, h, elem, norm, gather)
    logits = _gemm("head.logits", n, v_local, h, elem)
    # Megatron's vocab-parallel cross entropy on fp32 logits, per logit element: convert
    # (read 2, write 4), max (read 4), subtract (8), exp (8), sum (4), normalise (8) =
    # 38 bytes in 7 kernels; backward: subtract the one-hot and scale (8), convert back
    # (read 4, write 2) = 14 bytes in 3 kernels.
    loss = Op("head.loss", "elementwise", 5.0 * n * v_local, 38.0 * n * v_local, (n * v_local,),
              7)
    loss_comm: tuple[Comm, ...] = ()
    if w.tp > 1:
        loss_comm = (Comm("head.loss_reduce", "all_reduce", 3.0 * n * 4, "tp"),)
    forward: tuple[Work, ...] = (norm, *gather, logits, loss, *loss_comm)
    backward: list[Work] = [
        Op("head.loss.bwd", "elementwise", 2.0 * n * v_local, 14.0 * n * v_local,
           (n * v_local,), 3),
        *_backward_of(logits)]
    if w.tp > 1:
        kind: CommKind = "reduce_scatter" if w.sequence_parallel else "all_reduce"
        backward.append(Comm("head.input_grad", kind, n * h * elem, "tp"))
    backward.extend(_backward_of(norm))
    saved = float(n * v_local * 4 + n * h * elem)
    return forward, tuple(backward), saved


def _hidden_state_loss(n: int, h: int, elem: int, norm: Op, gather: tuple[Comm, ...]
                       ) -> tuple[tuple[Work, ...], tuple[Work, ...], float]:
    """The head of a model without an output projection: cross entropy straight on the
    [n, h] final hidden states (the same per-element cost as over logits)."""
    loss = Op("head.loss", "elementwise", 5.0 * n * h, 38.0 * n * h, (n * h,), 7)
    grad = Op("head.loss.bwd", "elementwise", 2.0 * n * h, 14.0 * n * h, (n * h,), 3)
    bwd_gather = tuple(Comm(c.name + ".bwd", "reduce_scatter", c.bytes, c.axis) for c in gather)
    return ((norm, *gather, loss), (grad, *bwd_gather, *_backward_of(norm)),
            float(n * h * 4 + n * h * elem))


def optimizer_work(num_params: float, *, dtype: str, implementation: str = "fused",
                   num_tensors: int = 1, master_weights: bool = True) -> Op:
    """One optimizer step over `num_params` local parameters, as Megatron-LM's
    mixed-precision optimizer runs it: unscale the fp32 gradients and check them for
    inf/NaN (read 4 B), take their norm for clipping (read 4 B), AdamW (read grad, master
    weight, m, v; write master, m, v: 28 B), copy the master weight into the 16-bit model
    weight (write 2 B) and zero the gradient buffer (write 4 B). Without master weights
    (`Training.master_weights` false) the same passes read and write the 16-bit weights,
    gradients and moments (`DType.state_bytes`: 2 + 2 + 14 + 2 = 20 B in bf16) and
    nothing is copied back."""
    dt = DType(dtype)
    low, state = dt.element_bytes, dt.state_bytes(master_weights)
    master = dt.keeps_master(master_weights)
    # the weight AdamW updates: the fp32 master, or the 16-bit weight itself; fp32 training
    # is priced as before this setting, without its weight's own read and write
    weight = 4 if master else (low if dt.master_weights else 0)
    adam = state + (weight + 2 * state) * 2
    per_param = state + state + adam + (low if master else 0) + state
    kernels = {"fused": 4, "foreach": max(4, num_tensors // 16), "for_loop": 8 * num_tensors}
    return Op("optimizer.adamw", "optimizer", 14.0 * num_params, float(per_param * num_params),
              (int(num_params),), kernels[implementation], variant=implementation)


def attention_core_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of one layer's scores and context per token, the causal mask not
    skipped: 2 x s x heads x (d_qk + d_v). MLA: scores over qk_nope + qk_rope, context
    over v_head_dim (megatron/training/training.py num_floating_point_operations, MLA
    branch: seq x heads x (qk_head_dim + qk_pos_emb_head_dim) + seq x heads x
    v_head_dim, halved there for the causal mask)."""
    return 2.0 * seq_len * model.num_heads * (model.head_dim_qk + model.head_dim_v)


def _forward_flops_per_token(model: ModelSpec, seq_len: int) -> tuple[float, float, float]:
    """(layer matmuls, attention scores+context, logits) forward FLOPs per token, with full
    (non-causal-skipping) attention as the Megatron-LM formula counts it; an MoE model's
    average layer counts its active experts only."""
    per_layer = sum(_layer_matmul_flops_per_token(model).values())
    attention = attention_core_flops_per_token(model, seq_len)
    return per_layer, attention, 2.0 * model.hidden_size * model.vocab_size if model.lm_head else 0.0


def _mla_up_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of MLA's up-projections (what mla_up_proj recomputes)."""
    if not model.is_mla:
        return 0.0
    *q, _, _, kv_up, _ = model.mla_tensors()
    return 2.0 * (q[-1] + kv_up)


def _layer_matmul_flops_per_token(model: ModelSpec) -> dict[str, float]:
    """Forward matmul FLOPs per token of the model's average layer, by part: attention
    projections, dense MLP, MoE router + routed experts, shared experts."""
    h = model.hidden_size
    dense_mlp = h * model.mlp_in_width + model.ffn_hidden_size * h
    # An MoE layer's active weights: router, shared experts, top-k routed experts (how
    # Megatron-Bridge's flop_utils counts "model FLOPs" of MoE models)
    gated = 3 if model.gated else 2
    share = model.moe_layer_fraction
    # attention projections: 2 FLOPs per weight (MLA: megatron/training/training.py
    # num_floating_point_operations counts q_lora x (h + heads x (qk + rope) + 1) +
    # kv_lora x (h + heads x (qk + v) + 1) + h x rope + heads x v x h, the latent norms'
    # weights included: exactly `ModelSpec.attention_params` with RMSNorm)
    return {"attention": 2.0 * model.attention_params(),
            "mlp": 2 * (1 - share) * dense_mlp,
            "routed": 2 * share * h * (model.num_experts
                                       + gated * model.experts_per_token * model.expert_ffn),
            "shared_experts": 2 * share * h * gated * model.shared_ffn}


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token, forward and backward, without recompute.

    Megatron-LM's 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per batch (Narayanan et al. 2021,
    App.), which equals 6·N·tokens + 12·l·h·s per token for GQA/SwiGLU models.
    """
    per_layer, attention, logits = _forward_flops_per_token(model, seq_len)
    return 3.0 * (model.num_layers * (per_layer + attention) + logits)


def hardware_flops_per_token(model: ModelSpec, seq_len: int, recompute: str,
                             modules: tuple[str, ...] = ("core_attn",)) -> float:
    """Model FLOPs plus what recomputation runs again (Megatron's hardware-FLOPs count:
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) for full recompute); selective recomputation
    re-runs the matmuls of its `modules` (norms and activations have none)."""
    per_layer, attention, _ = _forward_flops_per_token(model, seq_len)
    parts = _layer_matmul_flops_per_token(model)
    selective = (attention if "core_attn" in modules else 0.0) + (
        _mla_up_flops_per_token(model) if "mla_up_proj" in modules else 0.0) + sum(
        parts[name] for name, chosen in (("mlp", "mlp"), ("routed", "moe"),
                                         ("shared_experts", "shared_experts"))
        if chosen in modules or (name == "shared_experts" and "moe" in modules))
    again = {"none": 0.0, "selective": selective, "full": per_layer + attention}[recompute]
    return model_flops_per_token(model, seq_len) + model.num_layers * again
