"""Zorse's measured per-layer times on 17 GPU types as cases for the cost builder.

Data: planner/data/validation/zorse_layer_latencies.json and zorse_model_stats.json, from
the public repository of Zorse (benson-guo/zorse, `data/`, MIT licence). What the numbers
are, read from that repository's benchmark (`profile_models.sh` → `bench/bench_layer.py`
→ `utils/runtime_estimator.py`, torch 2.5.1 and transformers 4.46.2 per `setup.sh`):

* ONE transformer layer, built with `layers=1`, on one GPU. Forward: 15 calls of the
  layer under `torch.autocast(dtype)`; backward: 15 calls of `output.backward(grads,
  retain_graph=True)` on the saved graph, so nothing is recomputed. The time is the SUM
  OF CUDA KERNEL DURATIONS in a torch.profiler trace divided by 15 (`extract_kernel_runtime`
  in `utils/profile.py`): GPU busy time, no host launch gaps. We compare it with the cost
  builder's `compute_s` (its `host_s` is the host falling behind, which a kernel sum omits).
* `float16` is PyTorch AMP: fp32 parameters, the layer run under autocast to fp16 (our
  `fp16`; no bf16 anywhere). `float32` is plain fp32; nothing in the benchmark path turns
  TF32 on, so PyTorch's default (no TF32) holds: our `fp32`.
* Micro-batch sizes 1, 2, ... until the first that runs out of memory.
* GPU names are the driver's (`utils/comm.py` `get_gpu_name`: the last word of
  `torch.cuda.get_device_name()`, lower-cased, with "A100-SXM4-40GB" → a100x40,
  "V100-SXM2-16GB" → v100x16, "V100-PCIE-16GB" → v100-pciex16, "P100-PCIE-12GB" → p100,
  "H100 NVL" → h100-nvl), so the form factor is known, not guessed (GPU_MAP).

The measured layer moves more bytes than the layer of planner/costs/workload.py, which
follows Megatron-LM's fused kernels; `harness_terms` prices the difference with the
device's own streaming bandwidth (no fitted factor; bytes counted from the sources named
at _LAYER_EXTRA): HuggingFace's unfused fp32 norms, autocast's casts, unfused rotary
embeddings and activations, the eager attention paths, and the gradient accumulation into
fp32 `.grad` after every backward. Without them the A100 layers run 12-20% faster than
measured; with them, 1-6% slower, on the parameters calibrated to Megatron runs.

Families (MODELS): Llama (HF LlamaDecoderLayer; MHA: the LlamaConfig has no
num_key_value_heads), Llama-v2 (torchtitan-style block, `F.scaled_dot_product_attention`),
Mistral-7B (HF MistralDecoderLayer, eager attention, GQA with 8 KV heads), OpenAI-GPT
blocks (post-norm, GELU, eager attention with an unfused causal mask; 1.3B and 6.7B have
head dim 16 and 32) and BERT encoders. A BERT layer is our decoder layer with
bidirectional attention: the same GEMMs, and the unfused ("math") attention computes the
whole s x s score matrix either way, so no causal skip is lost. Left out (EXCLUDED): ViT
(the sequence length depends on `--image_size`, which the data does not record and which
visibly differs between runs: V100 fp16 ViT-e would run at 231 TFLOP/s with 577 tokens);
the non-"deepspeed" HuggingFace entries (no shapes in the stats file, most only a single
combined number); entries holding only a combined forward+backward line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Literal

from planner.calibration.published import VALIDATION_DIR
from planner.costs.kernels import attention_for
from planner.costs.stages import layer_parts
from planner.costs.workload import Op, WorkloadShape, layer_work
from planner.specs.choices import Recompute
from planner.specs.model import ModelSpec
from profiler.analytic import memory_time_s
from profiler.devices import DeviceSpec, device
from profiler.kernels import Attention

__all__ = ["EXCLUDED", "GPU_MAP", "MODELS", "ZorseCase", "ZorseModel", "harness_terms",
           "measured_device", "predict_s", "zorse_cases"]

LATENCIES = os.path.join(VALIDATION_DIR, "zorse_layer_latencies.json")
STATS = os.path.join(VALIDATION_DIR, "zorse_model_stats.json")

# Zorse GPU name -> catalog entry. The names are the driver's (see the module doc).
GPU_MAP: dict[str, str] = {
    "a100x40": "A100-40GB-SXM",      # "NVIDIA A100-SXM4-40GB" (AWS p4d is this part)
    "a100x80": "A100-80GB-SXM",      # "NVIDIA A100-SXM4-80GB"
    "h100-nvl": "H100-94GB-NVL",     # "NVIDIA H100 NVL"
    "a10g": "A10G-24GB",             # AWS G5
    "a6000": "A6000-48GB",           # "NVIDIA RTX A6000"
    "l4": "L4-24GB",
    "l40s": "L40S-48GB",
    "t4": "T4-16GB",
    "v100x16": "V100-16GB-SXM2",     # "Tesla V100-SXM2-16GB"
    "v100x32": "V100-32GB-SXM2",     # "Tesla V100-SXM2-32GB"
    "v100-pciex16": "V100-16GB-PCIe",
    "p100": "P100-12GB-PCIe",        # "Tesla P100-PCIE-12GB"
    "p40": "P40-24GB",
    "rtx3090": "RTX3090-24GB",
    "w6800": "W6800-32GB",           # "AMD Radeon PRO W6800", ROCm
}

Family = Literal["llama", "llama_v2", "mistral", "gpt", "bert"]
# Attention as the measured code runs it: "sdpa" = the kernel PyTorch's SDPA (or, for
# HF Llama in fp16 on sm80+, flash-attn 2) picks; the "eager" kinds are HF's unfused paths.
AttentionCode = Literal["sdpa", "llama_eager", "bert_eager", "gpt_eager"]


@dataclass(frozen=True)
class ZorseModel:
    """One Zorse model's layer, from its definition in benson-guo/zorse `models/`."""

    family: Family
    hidden: int
    heads: int
    ffn: int
    kv_heads: int | None = None
    param_tensors: int = 9  # weight (and bias) tensors of one layer: kernels per grad pass


def _llama(hidden: int, heads: int, ffn: int, family: Family = "llama") -> ZorseModel:
    return ZorseModel(family, hidden, heads, ffn)


def _bert(hidden: int, heads: int) -> ZorseModel:
    return ZorseModel("bert", hidden, heads, 4 * hidden, param_tensors=16)


def _gpt(hidden: int, heads: int) -> ZorseModel:
    return ZorseModel("gpt", hidden, heads, 4 * hidden, param_tensors=12)


# models/llama_simple.py, llama_v2.py, mistral_simple.py, gpt_simple.py, bert_simple.py
MODELS: dict[str, ZorseModel] = {
    "deepspeedllama_tiny": _llama(2048, 32, 5632),
    "deepspeedllama_3b": _llama(3200, 32, 8640),
    "deepspeedllama_7b": _llama(4096, 32, 11008),
    "deepspeedllama_13b": _llama(5120, 40, 13824),
    "deepspeedllama_33b": _llama(6656, 52, 17920),
    "deepspeedllama_65b": _llama(8192, 64, 22016),
    "deepspeedllamav2_tiny": _llama(2048, 32, 5632, "llama_v2"),
    "deepspeedllamav2_3b": _llama(3200, 32, 8640, "llama_v2"),
    "deepspeedllamav2_7b": _llama(4096, 32, 11008, "llama_v2"),
    "deepspeedllamav2_13b": _llama(5120, 40, 13824, "llama_v2"),
    # MistralConfig() defaults: 8 KV heads; the hidden and FFN sizes set in get_model
    "deepspeedmistral_7b": ZorseModel("mistral", 4096, 32, 14336, kv_heads=8),
    "deepspeedgpt_test": _gpt(512, 128),
    "deepspeedgpt_1.3b": _gpt(2048, 128),
    "deepspeedgpt_2.7b": _gpt(2560, 80),
    "deepspeedgpt_6.7b": _gpt(4096, 128),
    "deepspeedgpt_175b": _gpt(12288, 96),
    "deepspeedbert_base": _bert(768, 12),
    "deepspeedbert_large": _bert(1024, 16),
    "deepspeedbert_xlarge": _bert(1536, 24),
}

EXCLUDED: dict[str, str] = {
    "deepspeedvit_*": "sequence length (--image_size) not recorded and differing between runs",
    "bert_*, gpt_*, vit_*, mistral_7b, toygpt_*": "HuggingFace models without shapes in the "
    "stats file; mostly one combined number",
    "combined lines": "only a forward+backward slope and intercept (rtx3090, v100x32 fp16)",
}

AUTOCAST_CALLS = 15  # forward calls inside one autocast region (get_compute_latency)


@cache
def _stats() -> dict[str, dict]:
    with open(STATS, encoding="utf-8") as fh:
        return json.load(fh)


def model_spec(name: str) -> ModelSpec:
    """Our ModelSpec of one Zorse model's layer (vocab and layer count do not enter a
    layer's time; Zorse's default vocab 49152)."""
    m = MODELS[name]
    llama_like = m.family in ("llama", "llama_v2", "mistral")
    return ModelSpec(name=name, num_layers=1, hidden_size=m.hidden, ffn_hidden_size=m.ffn,
                     num_heads=m.heads, num_kv_heads=m.kv_heads, vocab_size=49152,
                     seq_len=512, activation="swiglu" if llama_like else "gelu",
                     norm="rmsnorm" if llama_like else "layernorm",
                     position_embedding="rope" if llama_like else "learned",
                     dropout=not llama_like)  # GPT: attn/resid pdrop 0.1; BERT: 0.1


def layer_params(name: str) -> int:
    """Parameters of one layer as Zorse counts them (with biases): the stats file, else
    ours plus the linear biases."""
    if name in _stats():
        return int(_stats()[name]["parameters_per_layer"])
    m = MODELS[name]
    biases = 5 * m.hidden + m.ffn if m.family in ("bert", "gpt") else 0  # q k v proj fc1 fc2
    return model_spec(name).params_per_layer() + biases


def measured_device(gpu: str) -> DeviceSpec:
    """The catalog entry of a Zorse GPU, as the card they measured."""
    return device(GPU_MAP[gpu])


def attention_code(name: str, gpu: str, dtype: str) -> AttentionCode:
    """Which attention the measured layer ran (models/llama_simple.py LlamaDecoderLayer:
    flash-attn 2 for fp16 on compute capability >= 8, HF eager on the P40, SDPA
    otherwise; the v2 block always calls SDPA; Mistral, GPT and BERT use eager)."""
    family = MODELS[name].family
    if family == "llama":
        return "llama_eager" if gpu == "p40" else "sdpa"
    return _EAGER_CODE[family]


_EAGER_CODE: dict[str, AttentionCode] = {"llama_v2": "sdpa", "mistral": "llama_eager",
                                         "gpt": "gpt_eager", "bert": "bert_eager"}


@dataclass(frozen=True)
class ZorseCase:
    """One measured (model, GPU, sequence, dtype, micro-batch) forward and backward."""

    model: str
    gpu: str
    seq_len: int
    dtype: str  # fp16 | fp32
    micro_batch_size: int
    forward_s: float
    backward_s: float
    from_line: bool  # the value of Zorse's fitted line (only the line was kept)

    @property
    def id(self) -> str:
        return f"{self.model}/{self.gpu}/s{self.seq_len}/{self.dtype}/b{self.micro_batch_size}"

    @property
    def family(self) -> Family:
        return MODELS[self.model].family

    @property
    def device(self) -> DeviceSpec:
        return measured_device(self.gpu)

    @property
    def shape(self) -> WorkloadShape:
        code = attention_code(self.model, self.gpu, self.dtype)
        kernel = (attention_for(self.device, self.dtype) if code == "sdpa" else Attention.MATH)
        return WorkloadShape(micro_batch_size=self.micro_batch_size, seq_len=self.seq_len,
                             dtype=self.dtype, attention=kernel)


def _entry_cases(model: str, gpu: str, seq: int, dtype: str, entry: list) -> list[ZorseCase]:
    """[[fwd slope, fwd intercept], [bwd slope, bwd intercept], fwd ms per micro-batch
    1.., bwd ms per micro-batch 1..] in milliseconds; an entry with only the two lines
    gives micro-batches 1 to 4 from them (profile_models.sh profiles 4)."""
    if len(entry) == 4:
        fwd, bwd = entry[2], entry[3]
        return [ZorseCase(model, gpu, seq, dtype, b + 1, f / 1e3, w / 1e3, False)
                for b, (f, w) in enumerate(zip(fwd, bwd, strict=True))]
    (fs, fi), (bs, bi) = entry
    return [ZorseCase(model, gpu, seq, dtype, b, (fs * b + fi) / 1e3, (bs * b + bi) / 1e3, True)
            for b in range(1, 5)]


@cache
def zorse_cases() -> tuple[ZorseCase, ...]:
    """Every case of a model in MODELS on a GPU in GPU_MAP (see EXCLUDED for the rest)."""
    with open(LATENCIES, encoding="utf-8") as fh:
        data = json.load(fh)
    cases: list[ZorseCase] = []
    for model, gpus in sorted(data.items()):
        if model not in MODELS:
            continue
        for gpu, seqs in sorted(gpus.items()):
            if gpu not in GPU_MAP:
                continue
            for seq, dtypes in sorted(seqs.items(), key=lambda kv: int(kv[0])):
                for zorse_dtype, entry in sorted(dtypes.items()):
                    if not (isinstance(entry, list) and isinstance(entry[0], list)):
                        continue  # a combined forward+backward number or line
                    dtype = {"float16": "fp16", "float32": "fp32"}[zorse_dtype]
                    cases.extend(_entry_cases(model, gpu, int(seq), dtype, entry))
    return tuple(cases)


# What the measured layers move through DRAM beyond the workload's Megatron-style layer
# (fused norms, one fused QKV GEMM, fused scale-mask-softmax, gradients accumulated in the
# weight-gradient GEMM). Counted from the sources the benchmark ran: transformers 4.46.2
# LlamaDecoderLayer / MistralDecoderLayer, Zorse's torchtitan-style Llama-v2 block, HF
# BertLayer and OpenAI-GPT Block (Zorse `models/*_simple.py`, `llama_v2.py`), under
# torch.autocast with fp32 parameters. Forward and backward, bytes per token per unit of
# width (H hidden, QK = query plus key width, F FFN width), each net of what the workload
# already counts for the same op. Derivations (fp16 AMP; fp32 has no casts):
#
# Llama (HF and v2 alike): each RMSNorm runs unfused in fp32 (to-fp32 6, pow 8, mean 4,
#   x*rsqrt 8, to-fp16 6, fp32 weight * fp16 -> fp32 6 = 38 H against the workload's 5);
#   its fp32 output is cast again by autocast for each of q, k, v, gate, up (5 x 6 H);
#   rotary embedding unfused on q and k (mul 4, neg 2, cat 4, mul 4, add 6 = 20 per
#   element); SiLU and the product as two kernels (10 F against 6). Backward: each norm's
#   autograd chain (weight grad 14, mul + cast 14, cast 6, x*rsqrt 24, mean 4, pow 28,
#   sum 12, cast 6 = 108 H against 7.5), the five casts back to fp32 (30 H) and the fp32
#   sums of the q/k/v and gate/up input gradients (3 x 12 H), rotary 30 per element,
#   SwiGLU 18 F against 9. fp32: norms 28 H and 92 H, sums 36 H, rotary 40 and 60,
#   SwiGLU 20 F and 36 F.
# BERT: the head split/merge permutes copied by matmul (q, k, v, context: 4 x 4 H), the
#   residual dropout, add and the fp32 LayerNorm with autocast's cast (25 H against 12),
#   the cast of the fp32 LayerNorm output for the FFN (6 H), the output block's mixed
#   fp16 + fp32 add (23 H against 12). Backward: LayerNorm weight/bias reductions, the
#   casts back, the q/k/v gradient sums and copies, bias gradients (fp32: dropout's 9 H
#   against the workload's 21 H per residual).
# GPT: as BERT for permutes and the post-norms, plus HF's unfused tanh GELU (`gelu_new`:
#   pow under autocast is fp32, 8 more elementwise kernels, 70 F, and the cast of its fp32
#   output for c_proj, 6 F, against the workload's 4 F); backward ~1.5x the GELU chain.
# Attention layout copies: SDPA's output transpose (2 H elements, forward and backward);
# eager: that plus the value copy for matmul (MHA) or repeat_kv's K and V copies (GQA).
_LAYER_EXTRA: dict[tuple[str, str], tuple[tuple[float, float, float], tuple[float, float, float],
                                          int, int]] = {
    # (implementation, dtype): ((H, QK, F) forward, (H, QK, F) backward, kernels fwd, bwd)
    ("llama", "fp16"): ((96, 20, 4), (267, 30, 9), 33, 70),
    ("llama", "fp32"): ((36, 40, 8), (190, 60, 18), 23, 55),
    ("bert", "fp16"): ((46, 0, 0), (94, 0, 2), 14, 28),
    ("bert", "fp32"): ((42, 0, 0), (74, 0, 4), 10, 24),
    ("gpt", "fp16"): ((46, 0, 72), (69, 0, 107), 22, 44),
    ("gpt", "fp32"): ((42, 0, 64), (38, 0, 100), 18, 40),
}

# What the HF eager attention paths move per attention-score element, kernel by kernel
# (bytes read + written), forward and backward, with softmax on autocast's fp32 list (a
# fp16 score is cast up, the fp32 probabilities cast down for the second matmul).
# `_eager_extra` subtracts what the workload's "math" path prices for the same scores
# (its `attn.softmax` and `attn.dropout` ops and their gradients: Megatron's
# scale-mask-softmax, fused in 16 bits; in fp32 a masked_fill and a softmax whose
# backward under autograd moves 16 words a score in 8 kernels, CopySlices of the in-place
# masked_fill on a view, which HF's out-of-place masks do not), so that it is counted once.
#   llama_eager (LlamaAttention / MistralAttention): scores / sqrt(d); softmax(dtype=fp32);
#     .to(fp16); dropout p=0 (no kernel).
#   bert_eager (BertSelfAttention): / sqrt(d); cast to fp32; softmax; dropout 0.1 (fp32,
#     byte mask); cast to fp16.
#   gpt_eager (OpenAI-GPT Attention._attn): / sqrt(d); w * tril (a fp32 buffer: the product
#     is fp32); + -1e4 * (1 - tril); softmax; dropout 0.1; cast to fp16.
_EAGER_KERNELS: dict[tuple[str, int], tuple[tuple[float, ...], tuple[float, ...]]] = {
    # (code, element bytes): (forward kernels' bytes, backward kernels' bytes)
    ("llama_eager", 2): ((4, 6, 6), (6, 10, 4)),
    ("llama_eager", 4): ((8, 8), (12, 8)),
    ("bert_eager", 2): ((4, 6, 8, 9, 6), (6, 9, 12, 6, 4)),
    ("bert_eager", 4): ((8, 8, 9), (9, 12, 8)),
    ("gpt_eager", 2): ((4, 6, 8, 8, 9, 6), (6, 9, 12, 0, 14, 4)),
    ("gpt_eager", 4): ((8, 8, 8, 8, 9), (9, 12, 0, 8, 8)),
}
_SCORE_OPS = ("attn.softmax", "attn.dropout")  # the workload's ops over the scores


@cache
def _eager_extra(case: ZorseCase) -> tuple[float, float, int]:
    """Bytes forward and backward, and kernels, that the case's eager attention moves and
    launches beyond the workload's own ops over the same scores (negative where it moves
    less than Megatron's fp32 path). It depends on the case alone, so a fit that prices
    the case on many trial devices computes it once."""
    fwd, bwd = _EAGER_KERNELS[(attention_code(case.model, case.gpu, case.dtype),
                               2 if case.dtype == "fp16" else 4)]
    scores = case.micro_batch_size * MODELS[case.model].heads * case.seq_len ** 2
    work = layer_work(model_spec(case.model), case.shape)

    def ours(ops: Iterable[object]) -> list[Op]:
        return [op for op in ops if isinstance(op, Op)
                and op.name.removesuffix(".bwd") in _SCORE_OPS]

    ours_f, ours_b = ours(work.forward), ours(work.backward)
    return (sum(fwd) * scores - sum(op.bytes for op in ours_f),
            sum(bwd) * scores - sum(op.bytes for op in ours_b),
            len(fwd) + len(bwd) - sum(op.kernels for op in (*ours_f, *ours_b)))


def _implementation(family: Family) -> str:
    return {"llama": "llama", "llama_v2": "llama", "mistral": "llama", "gpt": "gpt",
            "bert": "bert"}[family]


def _layer_extra_bytes(case: ZorseCase) -> tuple[float, float, int, int]:
    """Forward and backward bytes (and kernels) per micro-batch that the measured layer
    implementation moves beyond the workload's layer (_LAYER_EXTRA, layout copies)."""
    m, spec = MODELS[case.model], model_spec(case.model)
    e = 2 if case.dtype == "fp16" else 4
    q, k, f = spec.num_heads * spec.head_dim, spec.kv_dim, m.ffn
    (fh, fqk, ff), (bh, bqk, bf), kf, kb = _LAYER_EXTRA[(_implementation(m.family), case.dtype)]
    fwd = fh * m.hidden + fqk * (q + k) + ff * f
    bwd = bh * m.hidden + bqk * (q + k) + bf * f
    code = attention_code(case.model, case.gpu, case.dtype)
    if code == "sdpa" and case.shape.attention is not Attention.FLASH:
        fwd, bwd = fwd + 2 * e * m.hidden, bwd + 2 * e * m.hidden  # output transpose copy
    elif code == "llama_eager":
        kv = 2 * e * (k + q) if k < q else 2 * e * k  # repeat_kv copies, else the V copy
        fwd, bwd = fwd + 2 * e * m.hidden + kv, bwd + 2 * e * m.hidden + kv
    tokens = case.micro_batch_size * case.seq_len
    return fwd * tokens, bwd * tokens, kf, kb


def harness_terms(case: ZorseCase, dev: DeviceSpec | None = None) -> tuple[float, float]:
    """Seconds Zorse's measured layer spends beyond our workload's layer, forward and
    backward, at the streaming bandwidth of `dev` (default the case's device;
    analytic.memory_time_s):

    * its implementation's extra elementwise traffic (_LAYER_EXTRA, _EAGER_KERNELS);
    * gradient accumulation: the layer's parameters are fp32 and their `.grad`s persist
      across the 15 backward calls (and the memory probe before them), so every backward
      adds each weight gradient into `.grad` (read 4 + 4, write 4 bytes per parameter)
      after, under AMP, casting the fp16 gradient of autocast's weight copy to fp32
      (read 2, write 4); the input's `.grad` accumulates too (a leaf requiring grad).
      Megatron fuses this into the weight-gradient GEMM (main_grad), which is what the
      workload prices;
    * autocast's fp16 weight copies (read 4, write 2 per parameter), made once per
      autocast region, i.e. once in 15 forward calls.
    """
    dev = dev or case.device
    params, m = layer_params(case.model), MODELS[case.model]
    fp16 = case.dtype == "fp16"
    elem = 2 if fp16 else 4
    tokens = case.micro_batch_size * case.seq_len
    fwd_b, bwd_b, fwd_k, bwd_k = _layer_extra_bytes(case)
    bwd_b += params * (18 if fp16 else 12) + tokens * m.hidden * 3 * elem
    bwd_k += m.param_tensors * (2 if fp16 else 1)
    if fp16:
        fwd_b += params * 6 / AUTOCAST_CALLS
    if attention_code(case.model, case.gpu, case.dtype) != "sdpa":
        eager_f, eager_b, kernels = _eager_extra(case)
        fwd_b, bwd_b, bwd_k = fwd_b + eager_f, bwd_b + eager_b, bwd_k + kernels
    return (memory_time_s(fwd_b, device=dev, kernels=fwd_k),
            memory_time_s(bwd_b, device=dev, kernels=bwd_k))


_NO_COLLECTIVES = (("tp", ()), ("cp", ()))


def predict_s(case: ZorseCase, dev: DeviceSpec | None = None) -> tuple[float, float]:
    """Predicted forward and backward GPU time of the case's layer: the cost builder's
    `layer_parts` (no tp, nothing recomputed; its kernel time `compute_s`, not the host's
    `host_s`), plus the harness terms. `dev` replaces the case's device (a fit's trial
    parameters)."""
    dev = dev or case.device
    fwd, bwd = layer_parts(model_spec(case.model), case.shape, dev, _NO_COLLECTIVES,
                           Recompute.NONE)
    extra_f, extra_b = harness_terms(case, dev)
    return fwd.compute_s + extra_f, bwd.compute_s + extra_b
