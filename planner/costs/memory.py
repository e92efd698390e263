"""Per-rank memory: model states under AMSP sharding, activations per recompute mode.

Model states (Rajbhandari et al. 2020, ZeRO; Chen et al. 2023, AMSP), as the framework
keeps them (`Training.model_states`, one rule: `state_bytes_per_param`). Mixed-precision
training keeps 16-bit weights, fp32 gradients (Megatron accumulates main grads in fp32)
and an fp32 master copy plus Adam's two moments: 2 + 4 + 12 = 18 bytes per parameter,
which reproduces Korthikanti et al. 2022 Figure 1 and Megatron-Core's distributed-optimizer
guide (18; 6 + 12/d with the optimizer sharded). Where the parameters are sharded as the
optimizer states are (ZeRO-3 / HSDP: FSDP2, torchtitan, trainplan's executor) the fp32
shard is the parameter and no 16-bit copy is kept: 4 + 4 + 8 = 16 bytes. DeepSpeed ZeRO
keeps gradients in the training dtype: 2 + 2 + 12 = 16 bytes (ZeRO §3). Without master
weights (`Training.master_weights` false: the optimizer updates the 16-bit weights)
gradients and moments are 16-bit too: 2 + 2 + 4 = 8 bytes. Parameters, gradients and
optimizer states are each divided by their own sharding group size.

Activations (Korthikanti et al. 2022 §4): per layer and micro-batch from the workload's
saved tensors; times the layers a rank holds and the micro-batches in flight under the
pipeline schedule (1F1B: p - stage on stage `stage`; interleaved: Megatron's warm-up count;
GPipe: all of them; ZB-H1: p on every stage, as activations wait for the deferred weight
gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from planner.costs.workload import WorkloadShape, head_work, layer_work
from planner.specs.choices import DType, EpLayout, ModelStates, Recompute, Schedule
from planner.specs.model import ModelSpec
from planner.specs.plan import Sharding
from profiler.devices import DeviceSpec

__all__ = ["FP8_WEIGHT_CACHE_BYTES", "MEMORY_SOURCE", "StageMemory", "activation_memory", "in_flight_chunks", "layers_in_flight",
           "model_state_bytes", "rank_expert_param_count", "rank_param_count",
           "rank_param_tensors", "rank_te_weight_count",
           "runtime_reserve_bytes", "stage_memory", "state_bytes_per_param"]

MEMORY_SOURCE = "analytic memory model (ZeRO/AMSP states; Korthikanti et al. 2022 activations)"
GIB = 1024**3
# CUDA context, NCCL buffers, cuBLAS workspaces and allocator fragmentation: what a real
# run loses before the first tensor (PyTorch on A100/H100 typically 1.5-3 GiB).
_GPU_RESERVE_BYTES = 2 * GIB
_CPU_RESERVE_BYTES = GIB // 4


def runtime_reserve_bytes(device: DeviceSpec) -> int:
    return _CPU_RESERVE_BYTES if device.vendor == "cpu" else _GPU_RESERVE_BYTES


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on one rank of a stage, by kind."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float  # gathered params (sharded P), logits, transient recompute
    reserve_bytes: float
    capacity_bytes: float
    activations_per_layer_bytes: float = 0.0  # one layer, one micro-batch in flight
    gathered_bytes: float = 0.0  # the part of `buffers_bytes` that gathers sharded params

    def with_states(self, params: float, grads: float, optimizer: float,
                    gathered: float) -> StageMemory:
        """The same rank with these model-state bytes (`model_state_bytes`)."""
        return StageMemory(params, grads, optimizer, self.activations_bytes,
                           self.buffers_bytes - self.gathered_bytes + gathered,
                           self.reserve_bytes, self.capacity_bytes,
                           self.activations_per_layer_bytes, gathered)

    def with_layers_in_flight(self, layers: float) -> StageMemory:
        """The same rank holding activations of `layers` layer-micro-batches at its peak
        (built directly: dataclasses.replace is slow, and a search makes millions)."""
        return StageMemory(self.params_bytes, self.grads_bytes, self.optimizer_bytes,
                           self.activations_per_layer_bytes * layers, self.buffers_bytes,
                           self.reserve_bytes, self.capacity_bytes,
                           self.activations_per_layer_bytes, self.gathered_bytes)

    @property
    def model_states_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return (self.model_states_bytes + self.activations_bytes + self.buffers_bytes
                + self.reserve_bytes)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def shortfall_bytes(self) -> float:
        return max(0.0, self.total_bytes - self.capacity_bytes)


def _moe_layers(model: ModelSpec, num_layers: int, moe_layers: int | None) -> int:
    """MoE layers among a stage's `num_layers`: `moe_layers` where the caller knows which
    layers the stage holds (`PlacedStage.moe_layers`, `layout.stage_moe_layers`), else the
    model's share of them (exact where every layer is alike)."""
    if moe_layers is not None:
        return moe_layers
    return round(num_layers * model.moe_layer_fraction)


def rank_expert_param_count(model: ModelSpec, *, num_layers: int, etp: int, ep: int,
                            moe_layers: int | None = None) -> float:
    """Routed-expert parameters one rank of a stage holds: E/ep experts of each MoE
    layer, each split by the expert tp `etp` (Megatron's --expert-tensor-parallel-size,
    default tp)."""
    return float(_moe_layers(model, num_layers, moe_layers)
                 * model.expert_params_per_moe_layer() / (ep * etp))


def rank_param_tensors(model: ModelSpec, *, num_layers: int, first: bool, last: bool,
                       tp: int, pp: int, ep: int = 1, etp: int | None = None,
                       moe_layers: int | None = None) -> tuple[int, ...]:
    """Sizes of the parameter tensors one tp rank of a stage holds, in model order (the
    optimizer's per-tensor work depends on them, not only on their sum). An MoE layer
    holds the router (replicated), the shared experts (split by tp) and E/ep routed
    experts (each split by tp). `moe_layers`: how many of its layers are MoE
    (`_moe_layers`)."""
    h, d = model.hidden_size, model.head_dim
    kv_local = max(model.kv_heads // tp, 1) * d
    q_local = model.num_heads // tp * d
    norm = (h, h) if model.norm == "layernorm" else (h,)  # weight (and bias)
    # MLA: replicated down-projections and latent norms, split up- and output projections
    projections = (model.mla_tensors(tp) if model.is_mla
                   else (h * (q_local + 2 * kv_local), q_local * h))
    attention = (*norm, *projections, *norm)
    layer = (*attention, h * model.mlp_in_width // tp, model.ffn_hidden_size // tp * h)
    gated = 2 if model.gated else 1
    shared = model.shared_ffn // tp
    expert = model.expert_ffn // (etp or tp)
    moe_layer = (*attention, model.num_experts * h,
                 *((h * gated * shared, shared * h) if shared else ()),
                 *(h * gated * expert, expert * h) * max(model.num_experts // ep, 1))
    vocab_local = math.ceil(model.vocab_size / tp) * h
    tensors: list[int] = []
    if first:
        tensors.append(vocab_local)
        if model.position_embedding == "learned":
            tensors.append(model.seq_len * h)
    moe = _moe_layers(model, num_layers, moe_layers)
    tensors.extend(layer * (num_layers - moe))
    tensors.extend(moe_layer * moe)
    if last:
        tensors.extend(norm)
        # An untied head has its own weights; a tied one needs a copy when the embedding
        # lives on another stage (Megatron keeps it and all-reduces its gradient).
        if model.lm_head and (not model.tied_embeddings or pp > 1):
            tensors.append(vocab_local)
    return tuple(tensors)


def rank_param_count(model: ModelSpec, *, num_layers: int, first: bool, last: bool,
                     tp: int, pp: int, ep: int = 1, etp: int | None = None,
                     moe_layers: int | None = None) -> float:
    """Parameters held by one tp rank of a stage."""
    return float(sum(rank_param_tensors(model, num_layers=num_layers, first=first, last=last,
                                        tp=tp, pp=pp, ep=ep, etp=etp, moe_layers=moe_layers)))


def rank_te_weight_count(model: ModelSpec, *, num_layers: int, tp: int, ep: int = 1,
                         etp: int | None = None, moe_layers: int | None = None) -> float:
    """Parameters of one tp rank of a stage that are the weights of Transformer Engine's
    linear layers: the attention projections, the MLP and the experts' GEMMs
    (Megatron-Core's TELayerNormColumnParallelLinear, TERowParallelLinear,
    TEGroupedLinear). Under FP8 these are the weights TE casts to FP8; the embedding
    (VocabParallelEmbedding), the output layer (tensor_parallel.ColumnParallelLinear,
    gpt_model.py), the norms and the router are not TE linear modules and stay 16-bit.
    MLA's latent norms, counted among its tensors, are counted here too (a few thousand
    parameters)."""
    layer = rank_param_count(model, num_layers=num_layers, first=False, last=False, tp=tp,
                             pp=1, ep=ep, etp=etp, moe_layers=moe_layers)
    norms = (2 if model.norm == "layernorm" else 1) * model.hidden_size * 2  # two per layer
    router = model.num_experts * model.hidden_size
    return layer - num_layers * norms - _moe_layers(model, num_layers, moe_layers) * router


def in_flight_chunks(*, schedule: Schedule, stage: int, pp: int, num_microbatches: int,
                     virtual_stages: int) -> int:
    """Model chunks x micro-batches whose activations a stage holds at its peak.

    A chunk is 1/virtual_stages of the stage's layers. Interleaved 1F1B: Megatron runs
    (p - stage - 1)*2 + (v - 1)*p warm-up forwards before the first backward, which
    gives Korthikanti et al.'s (1 + (p-1)/(p·v)) factor on the first stage. ZB-H1 (Qi et
    al. 2024 §2.1): stage s defers each weight gradient by s micro-batches and frees a
    micro-batch's activations after it, so every stage holds p, 1F1B's first-stage peak
    (counted in full: the part only B needs is in fact freed earlier).
    """
    total = num_microbatches * virtual_stages
    if schedule == Schedule.GPIPE:
        return total
    if schedule == Schedule.ZB_H1:
        return min(num_microbatches, pp)
    if schedule == Schedule.INTERLEAVED_1F1B:
        warmup = (pp - stage - 1) * 2 + (virtual_stages - 1) * pp
        return min(total, warmup + 1)
    return min(num_microbatches, pp - stage)


@cache
def layers_in_flight(schedule: Schedule, *, stage: int, pp: int, num_microbatches: int,
                     chunk_layers: tuple[int, ...], flushes: int = 1) -> float:
    """Layer-micro-batches whose activations a stage holds at its peak: `in_flight_chunks`
    x its chunks' layers where they are alike, else its pass order walked (`simulator.
    schedules.stage_order`: a forward holds its chunk's layers until the pass completing
    its gradients, B or with a split backward W), as the simulation counts them. With
    chunks of unequal layers (an interleaved stage whose layers vp does not divide) the
    warm-up's forwards are of the first, larger chunks and the steady state's backwards
    of the last, smaller ones, so the peak exceeds the chunks in flight x the average:
    Llama 3 70B in 8 stages x 8 chunks of 2, 2, 1, ... layers holds 89 layers at the last
    stage, not 71.25."""
    vp = len(chunk_layers)
    if len(set(chunk_layers)) <= 1:
        chunks = in_flight_chunks(schedule=schedule, stage=stage, pp=pp,
                                  num_microbatches=num_microbatches // flushes,
                                  virtual_stages=vp)
        return chunks * (chunk_layers[0] if chunk_layers else 0)
    from planner.simulator.schedules import stage_order  # pure; the package imports costs

    order = stage_order(schedule, stage=stage, pp=pp, num_microbatches=num_microbatches,
                        virtual_stages=vp, flushes=flushes)
    grad = "W" if any(phase == "W" for phase, _, _ in order) else "B"
    held = peak = 0
    for phase, chunk, _ in order:
        held += chunk_layers[chunk] if phase == "F" else -chunk_layers[chunk] if phase == grad else 0
        peak = max(peak, held)
    return float(peak)


def state_bytes_per_param(*, dtype: str, master_weights: bool, sizes: tuple[float, float, float],
                          states: ModelStates = ModelStates.FP32_GRADS,
                          grad_dtype: str | None = None) -> tuple[float, float, float]:
    """Bytes per parameter one rank keeps of (parameters, gradients, optimizer states) with
    them sharded over `sizes` = (P, G, OS) ranks, as the framework `states` keeps them
    (`ModelStates`, whose docstring gives the sources).

    16-bit weights (fp32 when training in fp32), gradients (`DType.state_bytes`: fp32
    beside a master copy; DeepSpeed: the training dtype), an fp32 master (mixed precision)
    and Adam's two moments (`DType.state_bytes`). FSDP2's rule (`FP32_GRADS` with P = OS > 1
    and a master copy): the fp32 shard is the parameter, counted as the parameters' bytes,
    and no 16-bit copy is kept. FP8 training keeps bf16 weights here; the FP8 copies
    Transformer Engine caches of its linear layers' weights are `model_state_bytes`'s.

    `grad_dtype`: the dtype Megatron-Core keeps its gradient buffer in, which is the dtype
    it reduces them in (`DistributedDataParallelConfig.grad_reduce_in_fp32`;
    param_and_grad_buffer.py allocates the grad buffer in fp32 only with it;
    `Communication.grad_reduce_dtype`). A 16-bit buffer holds 2 bytes per parameter:
    2 + 2 + 12/d. Megatron-LM's docs/source/distrib_optimizer.md table gives 4 + 16/d
    ("fp16 param, fp16 grads: 20"): its 4/d more is the optimizer's fp32 copy of its
    gradient shard, made for the step (distrib_optimizer.py `_copy_model_grads_to_main_grads`:
    `shard_model_grad.float()`) and dropped by the next `zero_grad`, so it exists only
    after the backward has freed the activations, never beside them; the activation peak
    priced here leaves it out (the step's own peak, states + 4/d, is not priced: it is
    below the activation peak wherever activations exceed 4/d bytes per parameter).
    None or fp32: the fp32 buffer of `FP32_GRADS`."""
    dt = DType(dtype)
    p, g, o = sizes
    low = dt.element_bytes
    master = 4 if dt.keeps_master(master_weights) else 0
    state = dt.state_bytes(master_weights)  # each of: gradient, Adam's m, Adam's v
    grad = dt.element_bytes if states is ModelStates.DEEPSPEED else state
    if (states is ModelStates.FP32_GRADS and master and dt is not DType.FP8
            and p == o > 1):
        return master / p, grad / g, 2 * state / o
    if (states is ModelStates.FP32_GRADS and master and grad_dtype is not None
            and DType(grad_dtype).element_bytes < grad):
        # a 16-bit gradient buffer (the step's fp32 copy of its shard: not at this peak)
        return low / p, DType(grad_dtype).element_bytes / g, (master + 2 * state) / o
    return low / p, grad / g, (master + 2 * state) / o


# Bytes per weight Transformer Engine keeps beside a 16-bit weight under FP8 (delayed
# per-tensor scaling) when the weights are not FP8 themselves: the FP8 cast and its
# transpose, cached across a step's micro-batches (TE 1.x module/base.py `set_fp8_weights`:
# "workspace buffers ... used for FP8 training when the module parameters are not natively
# in FP8 ... `weight1_fp8` and `weight1_t_fp8`, cache the FP8 values and transposed FP8
# values in between microbatches"; `prepare_forward` creates them "only when fp8 weight
# caching is used and weights are not in fp8"; TE 2.x linear.py: `get_weight_workspace(...,
# cache_name="weight", update_workspace=is_first_microbatch)`). With FP8 primary weights
# (TE `fp8_model_init`; Megatron-Core `fp8_param`, NeMo `fp8_params` / `fp8_param_gather`)
# the weight is the FP8 tensor, 1 byte and 1 for its transpose, in place of the 16-bit
# one: 2 bytes, as a bf16 weight, and no cache.
FP8_WEIGHT_CACHE_BYTES = 2


def model_state_bytes(model: ModelSpec, *, params: float, dtype: str, sharding: Sharding,
                      tp: int, pp: int, expert_params: float = 0.0,
                      ep: int = 1, etp: int | None = None, master_weights: bool = True,
                      ep_layout: EpLayout = EpLayout.FOLDED,
                      states: ModelStates = ModelStates.FP32_GRADS,
                      te_weights: float | None = None, fp8_params: bool = False,
                      grad_dtype: str | None = None
                      ) -> tuple[float, float, float, float]:
    """(parameters, gradients, optimizer states, gathered-parameter buffers) in bytes on one
    rank holding `params` parameters, each part at `state_bytes_per_param` over its own
    sharding group (`states`: as `Training.model_states`; `grad_dtype`: the gradient
    buffer's dtype, `state_bytes_per_param`); sharded parameters need the layer in use and
    the next one gathered in the training dtype (an MoE layer where `expert_params` holds
    any).

    FP8: of `params`, the `te_weights` weights of Transformer Engine's linear layers
    (`rank_te_weight_count`; None: all of them) carry TE's FP8 weight cache,
    `FP8_WEIGHT_CACHE_BYTES` each, unless `fp8_params` (FP8 primary weights: none).

    The sharding sizes count ranks of the stage's data- x context-parallel group (dp x
    cp: context-parallel ranks hold the same weights, and Megatron-Core's distributed
    optimizer shards over `get_data_parallel_group(with_context_parallel=True)`).
    Of `params`, the `expert_params` routed-expert weights (already split over ep) have
    fewer data-parallel peers: Megatron-Core shards their states over the
    expert-data-parallel group, dp x cp x tp / (ep x etp) (parallel_state.py), so a
    sharding group of S > 1 of the dp x cp ranks holds them over
    max(1, S x tp / (ep x etp)) ranks (S = 1: replicated, as the dense states). With ep
    groups of data-parallel replicas only (`EpLayout.DATA_PARALLEL`: trainplan's executor,
    executor/groups.py `expert_shard_layout`) the tp ranks are not among them: S / ep."""
    dt = DType(dtype)
    low = dt.element_bytes + (FP8_WEIGHT_CACHE_BYTES if dt is DType.FP8 else 0)
    gathered = 0.0
    if sharding.params > 1:
        # the largest layer the rank holds: an MoE one where it holds experts
        layer = rank_param_count(model, num_layers=1, first=False, last=False, tp=tp, pp=pp,
                                 ep=ep, etp=etp, moe_layers=int(expert_params > 0))
        gathered = 2 * layer * low
    fold = tp / (etp or tp) if ep_layout == EpLayout.FOLDED else 1.0

    def expert_group(size: int) -> float:
        return max(1.0, size * fold / ep) if size > 1 else 1.0

    sizes = (sharding.params, sharding.grads, sharding.optim)
    out = [0.0, 0.0, 0.0]
    for count, group in ((params - expert_params, float), (expert_params, expert_group)):
        if count:
            per = state_bytes_per_param(dtype=dtype, master_weights=master_weights,
                                        sizes=(group(sizes[0]), group(sizes[1]),
                                               group(sizes[2])), states=states,
                                        grad_dtype=grad_dtype)
            out = [o + count * b for o, b in zip(out, per, strict=True)]
    if dt is DType.FP8 and not fp8_params:
        cached = params if te_weights is None else te_weights
        dense = max(cached - expert_params, 0.0)
        out[0] += FP8_WEIGHT_CACHE_BYTES * (dense / sharding.params
                                            + expert_params / expert_group(sharding.params))
    return out[0], out[1], out[2], gathered


def activation_memory(model: ModelSpec, *, device: DeviceSpec, shape: WorkloadShape,
                      num_layers: int, last: bool, recompute: Recompute,
                      layers_in_flight: float) -> StageMemory:
    """Peak memory of one rank of a stage without its model states (see `with_states`):
    activations of `layers_in_flight` layer-micro-batches, transient buffers, the runtime
    reserve."""
    work = layer_work(model, shape)
    per_layer = {Recompute.NONE: work.activation_bytes,
                 Recompute.SELECTIVE: work.selective_activation_bytes,
                 Recompute.FULL: work.input_bytes}[recompute]
    buffers = 0.0
    # one layer's recomputed tensors exist while its backward runs
    if recompute == Recompute.FULL:
        buffers += work.activation_bytes
    elif recompute == Recompute.SELECTIVE:
        buffers += work.activation_bytes - work.selective_activation_bytes
    if last:
        buffers += head_work(model, shape)[2]
    return StageMemory(params_bytes=0.0, grads_bytes=0.0, optimizer_bytes=0.0,
                       activations_bytes=per_layer * layers_in_flight, buffers_bytes=buffers,
                       reserve_bytes=runtime_reserve_bytes(device),
                       capacity_bytes=float(device.memory_bytes),
                       activations_per_layer_bytes=per_layer)


def stage_memory(model: ModelSpec, *, device: DeviceSpec, shape: WorkloadShape,
                 num_layers: int, first: bool, last: bool, pp: int, recompute: Recompute,
                 sharding: Sharding, layers_in_flight: float,
                 master_weights: bool = True,
                 states: ModelStates = ModelStates.FP32_GRADS, fp8_params: bool = False,
                 grad_dtype: str | None = None, moe_layers: int | None = None
                 ) -> StageMemory:
    """Peak memory of one rank of a stage holding activations of `layers_in_flight`
    layer-micro-batches at its peak: `activation_memory` with the stage's model states
    (`fp8_params`, `grad_dtype`: as `model_state_bytes`; `moe_layers`: how many of its
    layers are MoE, `_moe_layers`)."""
    params = rank_param_count(model, num_layers=num_layers, first=first, last=last,
                              tp=shape.tp, pp=pp, ep=shape.ep, etp=shape.etp,
                              moe_layers=moe_layers)
    experts = rank_expert_param_count(model, num_layers=num_layers, etp=shape.etp or shape.tp,
                                      ep=shape.ep, moe_layers=moe_layers)
    held = model_state_bytes(model, params=params, dtype=shape.dtype, sharding=sharding,
                             tp=shape.tp, pp=pp, expert_params=experts, ep=shape.ep,
                             etp=shape.etp, master_weights=master_weights, states=states,
                             te_weights=rank_te_weight_count(model, num_layers=num_layers,
                                                             tp=shape.tp, ep=shape.ep,
                                                             etp=shape.etp,
                                                             moe_layers=moe_layers),
                             fp8_params=fp8_params, grad_dtype=grad_dtype)
    return activation_memory(model, device=device, shape=shape, num_layers=num_layers,
                             last=last, recompute=recompute,
                             layers_in_flight=layers_in_flight).with_states(*held)
