"""What `plan profile` measures: the workload's ops at the planner's shapes, as OpCases.

For each (tp, micro-batch, sequence) setting and attention backend, the ops of one layer
(forward and backward), the embedding, the head and the optimizer step come from
`planner/costs/workload.py`, so the profile's rows carry exactly the names, shapes, FLOPs and
bytes the cost model will look up. Each op is paired with the torch code that runs it
(profiler/torch_ops.py); a backward op is the autograd backward of its forward op with
respect to the forward's input (`.dgrad`), weight (`.wgrad`) or both (`.bwd`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from planner.costs.memory import rank_param_tensors
from planner.costs.workload import (
    Op,
    WorkloadShape,
    embedding_work,
    head_work,
    is_fp8_quantization,
    layer_work,
    optimizer_work,
)
from planner.specs.model import ModelSpec
from profiler.measure import GradOf, OpCase
from profiler.store import SHAPE_LENGTHS

__all__ = ["FP8_GEMMS", "OPTIMIZERS", "op_cases", "op_dtype", "optimizer_cases", "step_bytes",
           "unmeasured_ops"]

OPTIMIZERS = ("fused", "foreach", "for_loop")
# The GEMMs an fp8 run computes in FP8 (with their .dgrad / .wgrad / .bwd): the layers'
# linear layers, Transformer Engine's te.Linear in Megatron-LM. The LM head stays bf16
# (Megatron-LM's output layer is not a Transformer Engine module), as does everything else.
FP8_GEMMS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
_FP8_IMPLS = {"linear": "fp8_linear", "qkv": "fp8_qkv"}  # profiler/torch_ops.py
# Backward op name suffix -> which leaves of the forward fragment it differentiates.
_BACKWARD: dict[str, GradOf] = {".dgrad": "input", ".wgrad": "weight", ".bwd": "all"}
_LINEARS = ("attn.proj", "mlp.fc1", "mlp.fc2", "head.logits")


def _forward_impl(model: ModelSpec, w: WorkloadShape, op: Op
                  ) -> tuple[str, tuple[int, ...]] | None:
    """The torch impl and its dimensions for a forward op of the workload; None for an op
    profiler/torch_ops.py has no code for (`unmeasured_ops`)."""
    if len(op.shape) != SHAPE_LENGTHS.get(op.kind, len(op.shape)):
        return None  # MLA's attention (query-key and value head sizes apart): no row holds it
    b, s, t = w.micro_batch_size, w.seq_len // w.cp, w.tp
    h, d = model.hidden_size, model.head_dim
    heads, kv_heads = model.num_heads // t, max(model.kv_heads // t, 1)
    attention = (b, heads, kv_heads, s, w.seq_len, d)
    dropout, attention_dropout = int(model.dropout), int(model.drops_attention)
    elements = op.shape[0] if op.shape else 0
    name = op.name
    if name in ("attn.norm", "mlp.norm", "head.norm"):
        return model.norm, (elements // h, h)
    if name in _LINEARS:
        _, m, n, k = op.shape
        return _in_fp8("linear", name, w.dtype), (m, n, k)
    table: dict[str, tuple[str, tuple[int, ...]]] = {
        "attn.qkv": ("qkv", (b, s, h, heads, kv_heads, d,
                             int(model.position_embedding == "rope"))),
        "attn.core": ("sdpa", (*attention, attention_dropout)),
        "attn.scores": ("scores", attention),
        "attn.softmax": ("causal_softmax", (b * heads, s, w.seq_len)),
        "attn.dropout": ("dropout", (elements,)),
        "attn.context": ("context", attention),
        "attn.residual": ("residual", (elements // h, h, dropout)),
        "mlp.residual": ("residual", (elements // h, h, dropout)),
        "mlp.gelu": ("gelu", (b * s, model.ffn_hidden_size // t)),
        "mlp.swiglu": ("swiglu", (b * s, model.ffn_hidden_size // t)),
        "mlp.geglu": ("geglu", (b * s, model.ffn_hidden_size // t)),
        "embed.lookup": ("embedding", (b, s, -(-model.vocab_size // t), h,
                                       model.seq_len if model.position_embedding == "learned"
                                       else 0, dropout)),
        "head.loss": ("cross_entropy", (b * s, -(-model.vocab_size // t))),
    }
    if name in table:
        impl, dims = table[name]
        return _in_fp8(impl, name, w.dtype), dims
    if op.kind == "gemm" and op.shape[0] == 1:  # one plain GEMM: MoE's router, MLA's and
        _, m, n, k = op.shape  # the shared experts' projections
        return "linear", (m, n, k)
    activation = name.rsplit(".", 1)[-1]  # the experts': over the tokens routed to them
    if op.kind == "elementwise" and activation in ("gelu", "swiglu", "geglu") \
            and elements % (b * s) == 0:
        return activation, (b * s, elements // (b * s))
    return None  # MoE's grouped expert GEMMs and token shuffles, MLA's attention and rope


def unmeasured_ops(model: ModelSpec, w: WorkloadShape) -> list[str]:
    """The forward ops of `model` at `w` that `plan profile` does not measure (no torch
    code runs them as the frameworks do); they and their gradients stay with the
    analytic model."""
    forward, _ = _ops(model, w)
    return [op.name for op in forward if _forward_impl(model, w, op) is None]


def _ops(model: ModelSpec, w: WorkloadShape) -> tuple[list[Op], list[Op]]:
    """The forward and backward ops of a layer, the embedding and the head at `w`."""
    work = layer_work(model, w)
    emb_fwd, emb_bwd = embedding_work(model, w)
    head_fwd, head_bwd, _ = head_work(model, w)

    def kept(ops: Iterable[object]) -> list[Op]:
        # TE's FP8 quantization kernels (cast, transpose) have no torch op here that runs
        # as they do: they stay with the analytic memory model, priced from their bytes
        return [op for op in ops if isinstance(op, Op) and not is_fp8_quantization(op)]

    return (kept((*work.forward, *emb_fwd, *head_fwd)),
            kept((*work.backward, *emb_bwd, *head_bwd)))


def _in_fp8(impl: str, name: str, dtype: str) -> str:
    """The FP8 impl of a GEMM an fp8 run computes in FP8; `impl` otherwise."""
    return _FP8_IMPLS[impl] if dtype == "fp8" and name in FP8_GEMMS else impl


def op_dtype(dtype: str, name: str) -> str:
    """The dtype an op (forward or backward, by name) of a `dtype` profile ran in: in an
    fp8 profile fp8 for FP8_GEMMS and bf16 for the rest; `dtype` otherwise."""
    if dtype != "fp8":
        return dtype
    forward = _forward_name(name)
    return "fp8" if (forward[0] if forward else name) in FP8_GEMMS else "bf16"


def _forward_name(name: str) -> tuple[str, GradOf] | None:
    """The forward op a backward op differentiates, and with respect to what."""
    if name == "embed.grad":
        return "embed.lookup", "weight"
    for suffix, grad_of in _BACKWARD.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], grad_of
    return None


def _case(op: Op, impl: str, dims: tuple[int, ...], grad_of: GradOf | None,
          reuse_bytes: float) -> OpCase:
    return OpCase(name=op.name, kind=op.kind, variant=op.variant, shape=op.shape,
                  flops=op.flops, bytes=op.bytes, kernels=op.kernels, impl=impl, dims=dims,
                  grad_of=grad_of, reuse_bytes=reuse_bytes)


def step_bytes(model: ModelSpec, w: WorkloadShape) -> float:
    """The bytes one training step of the whole model on one tp rank moves (the sum of
    its ops' memory traffic): about what passes through the caches between two uses of
    an op's weights or saved activations, i.e. their reuse distance."""
    work = layer_work(model, w)
    emb_fwd, emb_bwd = embedding_work(model, w)
    head_fwd, head_bwd, _ = head_work(model, w)
    tensors = rank_param_tensors(model, num_layers=model.num_layers, first=True, last=True,
                                 tp=w.tp, pp=1)
    layer = sum(op.bytes for op in (*work.forward, *work.backward) if isinstance(op, Op))
    rest = sum(op.bytes for op in (*emb_fwd, *emb_bwd, *head_fwd, *head_bwd)
               if isinstance(op, Op))
    step = optimizer_work(float(sum(tensors)), dtype=w.dtype, num_tensors=len(tensors))
    return model.num_layers * layer + rest + step.bytes


def _shape_cases(model: ModelSpec, w: WorkloadShape) -> list[OpCase]:
    """Forward and backward ops of a layer, the embedding and the head at one shape."""
    forward, backward = _ops(model, w)
    impls = {op.name: _forward_impl(model, w, op) for op in forward}
    reuse = step_bytes(model, w)
    cases = [_case(op, *impl, None, reuse) for op in forward
             if (impl := impls[op.name]) is not None]
    for op in backward:
        source = _forward_name(op.name)
        if source is None or source[0] not in impls:
            raise ValueError(f"backward op {op.name!r} has no forward op to differentiate")
        if (impl := impls[source[0]]) is not None:
            cases.append(_case(op, *impl, source[1], reuse))
    return cases


def optimizer_cases(model: ModelSpec, *, tp: int, dtype: str,
                    implementations: Iterable[str] = OPTIMIZERS,
                    step: tuple[int, int] | None = None) -> list[OpCase]:
    """One AdamW step over the parameters of the whole model on one tp rank, its operands
    as cold as the training step between two optimizer steps leaves them: that step's
    traffic (`step_bytes`) at `step` (micro-batch, sequence; default one sequence of the
    model's length) is their reuse distance. A plan steps the optimizer once an iteration,
    after at least one micro-batch's forward and backward, so `op_cases` gives the
    largest shape it measures: a tiny model's states fit the last-level cache when timed
    back to back, not after a step at the plan's batch (debug-tiny's fused AdamW on this
    VM: 0.10 ms back to back, 0.18 after a 32 MB sweep; its step at 8 x 64 moves 42 MB,
    at 1 x 64 10 MB)."""
    tensors = rank_param_tensors(model, num_layers=model.num_layers, first=True, last=True,
                                 tp=tp, pp=1)
    mbs, seq = step or (1, model.seq_len)
    reuse = step_bytes(model, WorkloadShape(micro_batch_size=mbs, seq_len=seq, tp=tp,
                                            dtype=dtype))
    out = []
    for impl in implementations:
        op = optimizer_work(float(sum(tensors)), dtype=dtype, implementation=impl,
                            num_tensors=len(tensors))
        out.append(_case(op, "adamw", tensors, None, reuse))
    return out


def op_cases(model: ModelSpec, *, tps: Sequence[int], micro_batch_sizes: Sequence[int],
             seq_lens: Sequence[int], dtype: str, attentions: Sequence[str],
             optimizers: Sequence[str] = OPTIMIZERS,
             sequence_parallel: bool = False) -> list[OpCase]:
    """Every distinct op the planner may ask for at these settings (each measured once)."""
    seen: dict[tuple, OpCase] = {}
    # the largest step measured: the least traffic a plan at that shape runs between two
    # optimizer steps (`optimizer_cases`)
    largest = max(((b, q) for b in micro_batch_sizes for q in seq_lens),
                  key=lambda bq: bq[0] * bq[1], default=None)
    # each (tp, mbs, seq) is a step shape (`OpCase.step`: measured in turn, its cases take
    # turns, its attention backends' among them); the optimizer steps after the largest
    step = 0
    for tp in tps:
        at_largest = step
        for mbs in micro_batch_sizes:
            for seq in seq_lens:
                for attention in attentions:
                    w = WorkloadShape(micro_batch_size=mbs, seq_len=seq, tp=tp,
                                      sequence_parallel=sequence_parallel and tp > 1,
                                      dtype=dtype, attention=attention)
                    for case in _shape_cases(model, w):
                        seen.setdefault((case.key, case.grad_of), replace(case, step=step))
                if (mbs, seq) == largest:
                    at_largest = step
                step += 1
        for case in optimizer_cases(model, tp=tp, dtype=dtype, implementations=optimizers,
                                    step=largest):
            seen.setdefault((case.key, None), replace(case, step=at_largest))
    return list(seen.values())


