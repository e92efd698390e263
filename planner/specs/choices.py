"""The closed sets a plan chooses from, one registry each: pipeline schedules,
recomputation modes and sharding presets. Each is a `StrEnum` (its members equal their
names as strings, so YAML and flags read as before) whose properties say what the rest of
the planner needs to know. Adding a schedule touches its member here, its order in
`planner/simulator/schedules.py` (and the activation count in `costs/memory.py`), and its
implementation in `executor/pipeline.py`; nothing else asks for it by name.

Kernel names (attention backends, AdamW implementations) are shared with the profiler
and live in `profiler/kernels.py`.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DEFAULT_RECOMPUTE_MODULES", "DType", "EpLayout", "PipelineP2P", "Recompute",
           "RecomputeModule", "Schedule", "ShardingPreset", "values"]


class Schedule(StrEnum):
    ONE_F_ONE_B = "1f1b"  # PipeDream-flush (Narayanan et al. 2021)
    GPIPE = "gpipe"  # all forwards, then all backwards (Huang et al. 2019)
    INTERLEAVED_1F1B = "interleaved-1f1b"  # vp > 1 model chunks per stage (Narayanan et al. 2021)
    ZB_H1 = "zb-h1"  # zero bubble, weight gradients deferred (Qi et al. 2024 §2.1)

    @property
    def interleaved(self) -> bool:
        """Runs virtual_stages > 1 model chunks per stage (and only then)."""
        return self is Schedule.INTERLEAVED_1F1B

    @property
    def splits_backward(self) -> bool:
        """Splits each backward into B (input gradients) and W (weight gradients)."""
        return self is Schedule.ZB_H1

    @property
    def min_stages(self) -> int:
        """Pipeline stages it needs (a zero-bubble schedule has nothing to defer into
        with one stage)."""
        return 2 if self.splits_backward or self.interleaved else 1

    @property
    def described(self) -> str:
        return "a zero-bubble schedule" if self.splits_backward else f"the {self} schedule"

    @classmethod
    def chosen(cls) -> tuple[Schedule, ...]:
        """What a user or the search names for a layout; with vp > 1 the 1F1B choice
        becomes interleaved 1F1B (`for_chunks`)."""
        return tuple(s for s in cls if not s.interleaved)

    def for_chunks(self, virtual_stages: int) -> Schedule:
        """The schedule a plan records for this choice at `virtual_stages` chunks per
        stage (Megatron-LM: 1F1B with vp > 1 is the interleaved schedule)."""
        if virtual_stages > 1 and self is Schedule.ONE_F_ONE_B:
            return Schedule.INTERLEAVED_1F1B
        return self


def values(choices: type[StrEnum] | tuple[StrEnum, ...]) -> tuple[str, ...]:
    """The names of a registry's members (for a flag's `choices`)."""
    return tuple(str(c) for c in choices)


class Recompute(StrEnum):
    """Activation recomputation (Korthikanti et al. 2022): nothing, the attention core
    (selective), or each whole layer (full)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeModule(StrEnum):
    """What selective recomputation re-runs: Megatron-Core's `recompute_modules`
    (megatron/core/transformer/transformer_config.py, with --recompute-granularity
    selective; default ["core_attn"]). "layernorm" and "moe_act" discard their outputs
    and recompute them before the backward needs them (output-discarding checkpointing);
    the others keep only their input (normal checkpointing). A module the model does not
    have (moe_act on a dense model) recomputes nothing."""

    CORE_ATTN = "core_attn"  # scores, softmax, context (Korthikanti et al. 2022 §5)
    LAYERNORM = "layernorm"  # the input and pre-MLP norms
    MLP = "mlp"  # a dense layer's whole MLP
    MOE = "moe"  # an MoE layer's whole block: router, dispatch, experts, combine, shared
    MOE_ACT = "moe_act"  # the routed experts' activation function
    SHARED_EXPERTS = "shared_experts"  # an MoE layer's shared experts
    # MLA's up-projections and rotary embedding: Q, K and V are dropped after the
    # attention core and recomputed from the latents (MultiLatentAttention
    # recompute_up_proj, output-discarding)
    MLA_UP_PROJ = "mla_up_proj"


# Megatron-Core's default `recompute_modules`: selective recomputation of the attention core.
DEFAULT_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = (RecomputeModule.CORE_ATTN,)


class ShardingPreset(StrEnum):
    """ZeRO stages (Rajbhandari et al. 2020) as points of the AMSP space: how many of the
    ranks holding the same parameters (a stage's data- x context-parallel group, dp x cp:
    `Sharding`) share one copy of (parameters, gradients, optimizer states)."""

    NONE = "none"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"

    def group_sizes(self, ranks: int) -> tuple[int, int, int]:
        """(P, G, OS) over `ranks` = dp x cp ranks holding the same parameters."""
        n = ranks
        return {ShardingPreset.NONE: (1, 1, 1), ShardingPreset.ZERO1: (1, 1, n),
                ShardingPreset.ZERO2: (1, n, n), ShardingPreset.ZERO3: (n, n, n)}[self]


class DType(StrEnum):
    """Training precisions: how weights and activations are stored, what GEMMs run in.

    `fp32` is what PyTorch does by default since 1.12: fp32 matmuls do NOT use TF32
    (torch.backends.cuda.matmul.allow_tf32 = False, pytorch/pytorch#77114); `tf32` is fp32
    storage with TF32 tensor-core GEMMs where the device has them (allow_tf32 = True, or
    NVIDIA's containers with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1). `fp8` is Transformer
    Engine style: FP8 GEMMs with per-tensor scaling, bf16 weights and activations, fp32
    master weights."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def storage(self) -> DType:
        """The dtype of weights and activations."""
        return _STORAGE.get(self, self)

    @property
    def element_bytes(self) -> int:
        return 4 if self.storage is DType.FP32 else 2

    @property
    def gemm_operand_bytes(self) -> int:
        """Bytes a GEMM reads per input element (FP8 GEMMs read their 1-byte casts)."""
        return 1 if self is DType.FP8 else self.element_bytes

    @property
    def master_weights(self) -> bool:
        """Mixed precision keeps an fp32 copy of the weights for the optimizer."""
        return self.storage is not DType.FP32

    def keeps_master(self, master_weights: bool) -> bool:
        """Whether the optimizer updates an fp32 master copy: 16-bit training with
        `Training.master_weights` on (fp32 training updates its weights directly)."""
        return master_weights and self.master_weights

    def state_bytes(self, master_weights: bool) -> int:
        """Bytes per element of the gradients and of each Adam moment the optimizer keeps:
        fp32 beside a master copy (Megatron's main grads, Micikevicius et al. 2018), else
        the dtype of the weights it updates (PyTorch's Adam allocates its moments with
        zeros_like(param), and a parameter's gradient takes its dtype)."""
        return 4 if self.keeps_master(master_weights) else self.element_bytes


# `DType.storage` where it is not the dtype itself (a search asks it millions of times)
_STORAGE = {DType.TF32: DType.FP32, DType.FP8: DType.BF16}


class PipelineP2P(StrEnum):
    """How a framework moves activations and their gradients between pipeline stages.

    BATCHED: Megatron-LM / Megatron-Core (`batch_p2p_comm`, default True): the sends and
    receives of one exchange go out as one `batch_isend_irecv`, both directions at once,
    on communication streams beside the compute (NVIDIA/Megatron-LM
    megatron/core/model_parallel_config.py, pipeline_parallel/p2p_communication.py).
    BLOCKING: DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/p2p.py asserts
    `async_op == False` and calls the blocking `dist.send` / `dist.recv`): each transfer
    holds the compute of both the sender and the receiver, one direction at a time.
    """

    BATCHED = "batched"
    BLOCKING = "blocking"

    @property
    def blocks_compute(self) -> bool:
        return self is PipelineP2P.BLOCKING


class EpLayout(StrEnum):
    """Which ranks an MoE layer's expert-parallel group is made of.

    FOLDED: Megatron-Core's MoE Parallel Folding (Liu et al. 2025; parallel_state.py
    orders the expert ranks etp-ep-dp-pp over the attention's tp-cp-dp-pp): an ep group is
    ep consecutive ranks of the stage's tp / etp x cp ranks in every replica, so with expert
    tp 1 it takes the tp (and cp) ranks of one replica before the next replica's (DeepSpeed
    and torchtitan likewise carve ep out of dp x cp, or dp x cp x tp at etp 1).
    DATA_PARALLEL: an ep group is one tp (and cp) rank of ep data-parallel replicas, and
    each tp rank runs its own groups (trainplan's executor, executor/topology.py
    `ep_group`; its MoE layer runs whole on every tp rank, etp 1). The two are the same
    groups where a stage folds nothing in (tp / etp x cp = 1)."""

    FOLDED = "folded"
    DATA_PARALLEL = "data_parallel"

    def folded_ranks(self, *, tp: int, cp: int, etp: int | None) -> int:
        """How many of a stage's ranks of one replica an ep group may take: tp / etp x cp
        folded (etp None: tp), 1 over data-parallel replicas only."""
        return tp // (etp or tp) * cp if self == EpLayout.FOLDED else 1


class ModelStates(StrEnum):
    """Which framework's rule says what a rank keeps of its model states in 16-bit training
    with fp32 master weights (`costs/memory.state_bytes_per_param`; fp32 training and
    `Training.master_weights` false keep the same under both).

    FP32_GRADS: fp32 gradients beside 16-bit weights and an fp32 master copy with Adam's
    moments, 2 + 4 + 12 = 18 bytes per parameter (Megatron-Core's distributed optimizer
    guide: "bf16 parameters, fp32 gradients: 18, 6 + 12/d"). Where the parameters are
    sharded as the optimizer states are (P = OS > 1: ZeRO-3, HSDP) the fp32 shard is the
    parameter and no 16-bit copy of it is kept, 4 + 4 + 8 = 16 bytes: torch FSDP2
    (`fully_shard` with `MixedPrecisionPolicy(param_dtype=bf16)`: "FSDP does not require
    any extra memory to keep a high-precision copy of the parameters for the optimizer
    step", torch/distributed/fsdp/_fully_shard/_fsdp_api.py), torchtitan, and trainplan's
    executor (executor/fsdp.py; its flat-buffer engine, executor/data_parallel.py, does the
    same at P = OS > 1).
    DEEPSPEED: DeepSpeed ZeRO keeps the gradients in the training dtype (0.19.6
    runtime/engine.py `get_data_types`: `data_types.grad_accum_dtype` unset is the model
    dtype; zero/stage_1_and_2.py and zero/stage3.py accumulate in it) and stage 3 keeps
    16-bit partitions beside the fp32 ones: 2 + 2 + 12 = 16 bytes, each part over its own
    group (Rajbhandari et al. 2020 §3: (2 + 2 + K)Ψ with K = 12 for mixed-precision Adam).
    """

    FP32_GRADS = "fp32_grads"
    DEEPSPEED = "deepspeed"
