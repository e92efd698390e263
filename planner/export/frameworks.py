"""What each training framework, at a named version, can run: as data.

A `FrameworkCapabilities` lists a framework's parallelisms, pipeline schedules, model-state
sharding patterns, recompute modes and the structural freedoms a heterogeneous plan needs
(unlike stages, mixed GPU types, tp per stage, unequal micro-batch counts).
`unsupported(plan, capabilities)` names, one line each, the settings of a Plan that the
framework cannot express; `plan export` refuses on them, and `plan search --framework`
searches only what the capabilities allow (planner/search/space.py `for_framework`,
planner/hetero/search.py `MixedSpace.for_framework`). The facts come from the pinned releases' own code, cited per entry; tests load the
exported configs with those releases' parsers (tests/planner/export/test_frameworks_*.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.costs.stages import bucket_params
from planner.specs.choices import (
    DType,
    EpLayout,
    ModelStates,
    Recompute,
    RecomputeModule,
    Schedule,
)
from planner.specs.layout import stage_layer_ranges
from planner.specs.model import ModelSpec
from planner.specs.plan import Communication, Plan, Sharding
from profiler.devices import device_efficiency
from profiler.kernels import SDPA_BACKENDS

__all__ = ["ANY_SHARDING", "CAPABILITIES", "FRAMEWORKS", "FrameworkCapabilities", "PlanShape", "ShardPattern",
           "chunk_layer_counts", "comm_differences", "computes_in_fp32",
           "distributed_optimizer_instances", "fsdp_dp_problem", "in_rank_order",
           "matches_pattern", "model_states_differ", "plan_chunk_counts", "plan_shape",
           "unsupported"]

# A model-state sharding pattern: one entry per (params, grads, optim), each "1"
# (replicated), "dp" (sharded over all data-parallel replicas) or "k" (sharded within
# groups of k replicas, 1 < k < dp, the same k wherever "k" appears; replicated across
# groups) or "*" (any size that divides the next). ZeRO-1 is ("1", "1", "dp"), MiCS / HSDP
# ("k", "k", "k").
ShardPattern = tuple[str, str, str]

NO_SHARDING: ShardPattern = ("1", "1", "1")
ZERO1: ShardPattern = ("1", "1", "dp")
ZERO2: ShardPattern = ("1", "dp", "dp")
ZERO3: ShardPattern = ("dp", "dp", "dp")
ANY_SHARDING: ShardPattern = ("*", "*", "*")  # AMSP: any nested group sizes


@dataclass(frozen=True, kw_only=True)
class FrameworkCapabilities:
    """What one framework at one version runs (`notes` add the framework's own words to a
    refusal, keyed by the setting: "schedule zb-h1", "sharding", "recompute selective")."""

    name: str
    version: str  # the release these facts were read from
    parallelisms: frozenset[str]  # of tp, pp, dp, cp, vp (interleaving), ep
    schedules: frozenset[str]  # Plan.training.schedule values
    sharding: tuple[ShardPattern, ...]
    sharding_with_pp: tuple[ShardPattern, ...] | None = None  # narrower when pp > 1
    recompute: frozenset[str]
    dtypes: frozenset[str]
    attention: frozenset[str]  # Plan.kernels.attention values it has a kernel for
    sequence_parallel: str  # "optional", "never", or "with tp" (always on when tp > 1)
    uneven_stages: bool  # stages (and interleaved chunks) of different layer counts
    mixed_gpu_types: bool
    per_stage_tp: bool  # tp (or cp) differing between stages or replicas
    unlike_replicas: bool  # replicas splitting the layers at different boundaries
    unequal_microbatches: bool  # replicas with different micro-batch sizes or counts
    per_stage_sharding: bool
    per_stage_recompute: bool
    tp_with_pp: bool = True
    # tp divides the key/value heads (no copies of a KV head on several tp ranks)
    kv_heads_split: bool = False
    rank_order: str | None = "tp-cp-dp-pp"  # how it numbers ranks (None: as the plan says)
    # what selective recomputation can re-run (Training.recompute_modules)
    recompute_modules: frozenset[str] = frozenset(RecomputeModule)
    # MoE: expert parallelism's own limits (defaults: none beyond specs/rules.py)
    ep_within_dp: bool = False  # ep groups are data-parallel replicas only (ep divides dp)
    ep_schedules: frozenset[str] | None = None  # schedules with ep > 1 (None: `schedules`)
    ep_recompute: frozenset[str] | None = None  # recompute modes with ep > 1 (None: all)
    ep_sharding_multiple: bool = False  # with ep > 1 each sharding degree <= ep or k x ep
    moe_expert_tp: bool = True  # expert tp = tp > 1 (False: an MoE model with tp needs etp 1)
    # 16-bit compute with tp or pp only where parameters are sharded over dp or cp > 1
    # (True: torchtitan, whose mixed precision is FSDP2's or, without tp and pp, autocast)
    amp_needs_sharding_with_tp_pp: bool = False
    # data parallelism beside tp, pp or cp is FSDP2 / HSDP (`fsdp_dp_problem`: DDP runs
    # 1-D only; cp shards the model states over dp_shard x cp)
    fsdp_data_parallel: bool = False
    moe_sequence_parallel: bool = True  # sequence parallelism on MoE models
    # the embedding / loss taking a layer's place in an interleaved chunk (Training.
    # embedding_in_pipeline_split, loss_in_pipeline_split with vp > 1)
    pipeline_split_slots: bool = True
    # 16-bit training whose optimizer updates the 16-bit weights themselves, gradients and
    # Adam moments alike, with no fp32 master copy (Training.master_weights false)
    without_master_weights: bool = False
    # what it keeps of the model states with master weights (`ModelStates`: its sources);
    # a search for it prices them so (`Training.model_states`), an export needs the plan's
    # rule to be it
    model_states: ModelStates
    # how it communicates: a `Communication.preset` name, which a search for it prices
    # and writes (`Training.comm`); an export needs the plan's settings to be the
    # preset's, except those in `comm_settable`, which its config writes as the plan has them
    comm: str
    comm_settable: frozenset[str] = frozenset()
    # multi-head latent attention (ModelSpec.kv_lora_rank: DeepSeek-V2 / V3)
    latent_attention: bool = True
    # a learned position table as long as the training sequence, past the model's own
    # (Megatron's export writes --max-position-embeddings from the sequence; DeepSpeed's
    # and torchtitan's model is the user's code): `rules.seq_problem`
    positions_past_the_table: bool = True
    # the position embeddings (ModelSpec.position_embedding) and a model without an
    # output projection (ModelSpec.lm_head false: Megatron-DeepSpeed's GPT-Neo pipe) its
    # model takes
    positions: frozenset[str] = frozenset({"learned", "rope", "alibi"})
    headless: bool = True
    # tied input and output embeddings on stages of different tp (one tensor, sharded alike
    # where it is used twice)
    tied_ends_any_tp: bool = True
    # model-state sharding at a stage position whose replicas differ in tp, beyond ZeRO-1
    # over all of them
    mixed_tp_sharding: bool = True
    # full recomputation past the first stage under zb-h1 (its W pass re-runs the layer)
    zb_full_recompute: bool = True
    # MLP activations (ModelSpec.activation) its model takes; DeepSpeed's config and
    # torchtitan's (a model registered by name, torchtitan's own or the user's:
    # protocols/train_spec.py register_train_spec) leave the model to the user's code
    activations: frozenset[str] = frozenset({"gelu", "swiglu", "geglu"})
    # the dtypes it trains an MoE model in (None: all of `dtypes`)
    moe_dtypes: frozenset[str] | None = None
    # MoE routing with a capacity factor (tokens over an expert's capacity dropped:
    # ModelSpec.capacity_factor) and expert inputs padded to it (pad_to_capacity)
    moe_capacity_factor: bool = True
    moe_pad_to_capacity: bool = True
    moe_pad_with_deepep: bool = True  # padding to capacity with the DeepEP dispatcher
    # the optimizer shard instances (P/G/OS 1/1/k: dp x cp / k) must divide the expert
    # data-parallel group too (Megatron-Core parallel_state.py)
    optimizer_instances_divide_expert_dp: bool = False
    # FP8 primary weights (Training.fp8_params) only with sharded optimizer states
    fp8_params_need_sharded_optimizer: bool = False
    notes: Mapping[str, str] = field(default_factory=dict)

    def dtypes_for(self, model: ModelSpec) -> frozenset[str]:
        """The dtypes it trains `model` in."""
        if model.is_moe and self.moe_dtypes is not None:
            return self.dtypes & self.moe_dtypes
        return self.dtypes

    @property
    def ep_layout(self) -> EpLayout:
        """The ranks it forms an ep group of: data-parallel replicas (`ep_within_dp`), else
        Megatron-Core's folding of a replica's tp / etp ranks."""
        return EpLayout.DATA_PARALLEL if self.ep_within_dp else EpLayout.FOLDED

    def communication(self, dtype: str) -> Communication:
        """How it communicates when it trains in `dtype` (its `Communication.preset`): what
        a search for it prices and writes, and what an export holds a plan's settings to."""
        return Communication.preset(self.comm, dtype=dtype)


_MEGATRON = FrameworkCapabilities(
    # megatron-core 0.16.1 (the last release for Python 3.11) with Megatron-LM core_r0.16.0:
    # model_parallel_config.py, transformer/transformer_config.py (pipeline_model_parallel_
    # layout: any layers per (virtual) stage), distributed/distributed_data_parallel_config.py
    # (use_distributed_optimizer; num_distributed_optimizer_instances shards the optimizer
    # within dp / instances replicas), transformer/enums.py AttnBackend.
    name="megatron", version="megatron-core 0.16.1 (Megatron-LM core_r0.16.0)",
    parallelisms=frozenset({"tp", "pp", "dp", "cp", "vp", "ep"}),
    # transformer/attention.py: num_query_groups_per_partition = divide(num_query_groups,
    # tp world size), which asserts an even split
    kv_heads_split=True,
    # --position-embedding-type: learned_absolute, rope, none (no ALiBi; BLOOM trained on
    # Megatron-DeepSpeed)
    positions=frozenset({"learned", "rope"}),
    schedules=frozenset({Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B}),
    sharding=(NO_SHARDING, ZERO1, ("1", "1", "k")),
    recompute=frozenset({"none", "selective", "full"}),
    dtypes=frozenset({"bf16", "fp16", "fp32", "fp8"}),  # fp8: Transformer Engine, --fp8-format
    attention=frozenset({"flash", "math"}),  # AttnBackend.flash, AttnBackend.unfused
    sequence_parallel="optional", uneven_stages=True, mixed_gpu_types=False, per_stage_tp=False,
    unlike_replicas=False, unequal_microbatches=False, per_stage_sharding=False,
    per_stage_recompute=False,
    # fp32 main gradients: distributed/distributed_data_parallel.py keeps them in fp32
    # where DistributedDataParallelConfig.grad_reduce_in_fp32 is on, which Megatron-LM
    # turns on for bf16 (arguments.py validate_args: "accumulate and all-reduce gradients
    # in fp32 for bfloat16 data type") and the export asks for in fp16
    # (--accumulate-allreduce-grads-in-fp32): the distributed-optimizer guide's "bf16
    # parameters, fp32 gradients: 18, 6 + 12/d"
    model_states=ModelStates.FP32_GRADS,
    # megatron/training/arguments.py core_transformer_config_from_args: gelu by default,
    # --swiglu (F.silu, gated), --quick-geglu (quick_gelu x * sigmoid(1.702 x), gated),
    # --squared-relu; no flag gates with GELU itself
    activations=frozenset({"gelu", "swiglu"}),
    # MoE in bf16 (and fp8, whose weights are bf16: --bf16 --fp8-format): Megatron-LM's
    # arguments.py asserts "Expert parallelism is not supported with fp16 training", and
    # the grouped expert GEMM the export writes (--moe-grouped-gemm) "only supports bf16"
    moe_dtypes=frozenset({"bf16", "fp8"}),
    # Megatron-Core's DDP and p2p defaults (`Communication`'s); the export writes
    # --overlap-grad-reduce (DistributedDataParallelConfig.overlap_grad_reduce, False
    # unless asked) and --ddp-bucket-size (bucket_size) as the plan has them
    comm="megatron", comm_settable=frozenset({"overlap_grad_reduce", "grad_bucket_params",
                                              "tp_comm_overlap"}),
    # transformer/transformer_config.py __post_init__: "Flex token dispatcher with deepep
    # backend does not support moe_pad_expert_input_to_capacity"
    moe_pad_with_deepep=False,
    # parallel_state.py initialize_model_parallel: "Expert data parallel size should be
    # divisible by partial DistOpt shard factor"
    optimizer_instances_divide_expert_dp=True,
    # arguments.py validate_args: "--fp8-param-gather only supported with distributed
    # optimizer, torch fsdp2, megatron fsdp, or inference mode" (the export writes the
    # distributed optimizer only)
    fp8_params_need_sharded_optimizer=True,
    notes={
        "activation geglu": "Megatron-LM's arguments gate the MLP with SiLU (--swiglu) or "
        "x * sigmoid(1.702 x) (--quick-geglu), not GELU; Megatron-Core's TransformerConfig "
        "takes activation_func F.gelu with gated_linear_unit from Python code only",
        "schedule zb-h1": "upstream Megatron-LM has no zero-bubble schedule; the zero-bubble "
        "fork sail-sg/zero-bubble-pipeline-parallelism runs a ZB-H1-like one with "
        "--enable-zero-bubble --zero-bubble-max-pending-backward PP",
        "schedule gpipe": "Megatron-LM runs 1F1B (forward_backward_pipelining_without_"
        "interleaving) or interleaved 1F1B, no GPipe",
        "sharding": "Megatron-LM shards only optimizer states: over the whole data-parallel "
        "group (--use-distributed-optimizer) or within dp/N replicas "
        "(--num-distributed-optimizer-instances N)",
        "attention memory_efficient": "--attention-backend has flash, fused (cuDNN), unfused "
        "and local; no memory-efficient (xformers-style) kernel",
        "master weights": "Megatron-Core's mixed-precision optimizer keeps main parameters "
        "beside the 16-bit weights (OptimizerConfig.main_params_dtype, fp32 or with "
        "--use-precision-aware-optimizer fp16; that option lowers main grads and Adam "
        "moments, not the copy away)",
        "model states": "Megatron-LM accumulates and reduces main gradients in fp32 "
        "(arguments.py turns --accumulate-allreduce-grads-in-fp32 on for bf16; the export "
        "writes it for fp16)",
        "comm pipeline_p2p": "Megatron-Core sends with batch_isend_irecv beside the compute "
        "(batch_p2p_comm; overlap_p2p_comm is non-blocking too)",
        "comm grad_reduce_dtype": "its gradients are reduced as its fp32 main gradients are "
        "kept (training.model_states fp32_grads)",
        "moe dtype": "Megatron-LM's arguments.py: 'Expert parallelism is not supported with "
        "fp16 training'; the grouped expert GEMM (--moe-grouped-gemm) takes bf16 only",
    },
)

_DEEPSPEED = FrameworkCapabilities(
    # deepspeed 0.19.6 (the last release with MiCS: 0.19.7 removed mics_shard_size):
    # runtime/config.py (DeepSpeedConfig, "pipeline" section), runtime/zero/config.py
    # (stage, mics_shard_size), runtime/tensor_parallel/config.py (autotp_size),
    # runtime/pipe/engine.py:77 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
    # parallelism"), runtime/pipe/schedule.py (TrainSchedule: 1F1B only).
    name="deepspeed", version="deepspeed 0.19.6",
    parallelisms=frozenset({"tp", "pp", "dp"}),
    schedules=frozenset({"1f1b"}),
    sharding=(NO_SHARDING, ZERO1, ZERO2, ZERO3, ("k", "k", "k")),
    sharding_with_pp=(NO_SHARDING, ZERO1),
    recompute=frozenset({"none", "full"}),
    dtypes=frozenset({"bf16", "fp16", "fp32"}),
    attention=frozenset({"flash", "memory_efficient", "math"}),  # the model's own choice
    sequence_parallel="never", uneven_stages=False, mixed_gpu_types=False, per_stage_tp=False,
    unlike_replicas=False, unequal_microbatches=False, per_stage_sharding=False, per_stage_recompute=False,
    tp_with_pp=False,
    # gradients in the training dtype at every ZeRO stage (runtime/engine.py
    # get_data_types: data_types.grad_accum_dtype unset is the model dtype)
    model_states=ModelStates.DEEPSPEED,
    # runtime/pipe/p2p.py's blocking send / recv, the engine's reduction after the backward
    # (runtime/zero/config.py: overlap_comm is on by default at stage 3 alone; the export
    # writes it off there), reduce_bucket_size 5e8; the config's communication_data_type
    # (runtime/config.py) sets the reduction dtype, which the export writes
    comm="deepspeed", comm_settable=frozenset({"grad_reduce_dtype"}),
    notes={
        "schedule zb-h1": "zero bubble is a Megatron-DeepSpeed flag (--enable-zbh1-pipeline), "
        "not in DeepSpeed's pipeline engine (TrainSchedule is 1F1B)",
        "schedule gpipe": "DeepSpeed's pipeline engine runs TrainSchedule (1F1B)",
        "vp": "interleaved pipeline stages are not available in DeepSpeed",
        "ep": "DeepSpeed's expert parallelism (deepspeed.moe.layer.MoE, ep_size) is built "
        "in the model code, not set by the config this export writes",
        "sharding": "DeepSpeed expresses ZeRO-1/2/3 over the data-parallel group and MiCS "
        "(all three within a group); with pipeline parallelism ZeRO-0/1 only "
        "(runtime/pipe/engine.py)",
        "recompute selective": "DeepSpeed checkpoints whole layers (full)",
        "sequence parallel": "Megatron-style sequence parallelism is set in the model code "
        "(Megatron-DeepSpeed --sequence-parallel), not in the DeepSpeed config",
        "tp with pp": "AutoTP (tensor_parallel.autotp_size) is documented with ZeRO data "
        "parallelism, not with the pipeline engine; tp with pp needs Megatron-DeepSpeed",
        "uneven stages": "PipelineModule(partition_method='uniform') balances layer counts",
        "master weights": "DeepSpeed's bf16 / fp16 optimizers (BF16_Optimizer, ZeRO) keep "
        "fp32 master weights and Adam moments",
        "model states": "DeepSpeed accumulates gradients in the model dtype unless "
        "data_types.grad_accum_dtype says otherwise, and takes fp32 only with bf16 at ZeRO "
        "stage 1 (BF16_Optimizer, runtime/engine.py _do_optimizer_sanity_check)",
        "comm pipeline_p2p": "runtime/pipe/p2p.py asserts async_op == False and calls the "
        "blocking dist.send / dist.recv",
        "comm overlap_grad_reduce": "the pipeline engine reduces in _exec_reduce_grads after "
        "the last backward, and the export turns ZeRO's overlap_comm off",
        "comm grad_bucket_params": "reduce_bucket_size 5e8 elements, the engine's "
        "MEMORY_OPT_ALLREDUCE_SIZE without ZeRO",
    },
)

_TORCHTITAN = FrameworkCapabilities(
    # torchtitan 0.2.2 (the last release with TOML job configs; 0.3.0 moved to Python
    # config registries): config/job_config.py (Parallelism, ActivationCheckpoint),
    # distributed/pipeline_parallel.py (module_fqns_per_model_part: any split; looped
    # schedules need >= 2 stages per rank), FSDP2 / HSDP via data_parallel_shard_degree and
    # data_parallel_replicate_degree.
    name="torchtitan", version="torchtitan 0.2.2",
    parallelisms=frozenset({"tp", "pp", "dp", "cp", "vp", "ep"}),
    schedules=frozenset({Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B}),
    sharding=(NO_SHARDING, ZERO3, ("k", "k", "k")),
    recompute=frozenset({"none", "full"}),
    dtypes=frozenset({"bf16", "fp32"}),
    attention=frozenset(SDPA_BACKENDS),
    sequence_parallel="with tp", uneven_stages=True, mixed_gpu_types=False,
    per_stage_tp=False, unlike_replicas=False, unequal_microbatches=False, per_stage_sharding=False, per_stage_recompute=False,
    amp_needs_sharding_with_tp_pp=True,
    fsdp_data_parallel=True,
    # FSDP2's MixedPrecisionPolicy (reduce_dtype None: the fp32 parameters' gradients;
    # the fp32 shard is the parameter where it shards)
    model_states=ModelStates.FP32_GRADS,
    # FSDP2 / DDP reducing in the backward in fp32 (training.mixed_precision_reduce admits
    # "float32" alone), torch.distributed.pipelining's batched sends
    comm="fsdp2",
    moe_capacity_factor=False, moe_pad_to_capacity=False,
    notes={
        "schedule zb-h1": "torch.distributed.pipelining's ScheduleInterleavedZeroBubble runs "
        "it with one stage per rank, but torchtitan requires at least 2 stages per rank for "
        "multi-stage schedules (distributed/pipeline_parallel.py)",
        "sharding": "FSDP2 shards parameters, gradients and optimizer states together "
        "(data_parallel_shard_degree; HSDP replicates across data_parallel_replicate_degree)",
        "dtype fp16": "torchtitan trains in bf16 or fp32 (no loss scaling)",
        "moe capacity": "torchtitan 0.2.2's MoE (models/moe) routes dropless: no capacity "
        "factor, no padding",
        "sequence parallel": "torchtitan's tensor parallel plan shards norms and dropout "
        "along the sequence (sequence parallelism) whenever tp > 1",
        "recompute selective": "torchtitan's selective modes (op-level SAC keeps matmul and "
        "attention outputs; layer-level checkpoints every Nth layer) are not the selective "
        "recompute of Korthikanti et al. 2022 that the plan was priced with",
        "master weights": "torchtitan builds its models in fp32 and computes in bf16 "
        "through FSDP2's MixedPrecisionPolicy (mixed_precision_param)",
        "model states": "FSDP2 keeps the gradients of its fp32 parameters in fp32 "
        "(MixedPrecisionPolicy reduce_dtype unset)",
        "comm pipeline_p2p": "torch.distributed.pipelining sends with batch_isend_irecv",
        "comm overlap_grad_reduce": "FSDP2's reduce-scatters and DDP's buckets run in the "
        "backward",
        "comm grad_reduce_dtype": "training.mixed_precision_reduce admits float32 alone",
        "amp with tp pp": "distributed/utils.py maybe_enable_amp: 'Mixed precision training "
        "with TP or PP is only supported when FSDP/HSDP/CP is enabled', else it is disabled",
    },
)

_TRAINPLAN = FrameworkCapabilities(
    # this repository's executor (executor/preflight.py says what it refuses; its MoE
    # layer, executor/moe.py, `_check_moe`: ep groups of data-parallel ranks, experts whole
    # on every tp rank, the whole sequence on each tp rank, ep peers running the same
    # passes: no ZB-H1 W pass, no full recomputation, expert states sharded in whole
    # numbers of ep groups)
    name="trainplan", version="trainplan 0.1.0 executor",
    parallelisms=frozenset({"tp", "pp", "dp", "vp", "ep"}),
    schedules=frozenset(Schedule),
    sharding=(ANY_SHARDING,),
    recompute=frozenset({"none", "selective", "full"}),
    # fp16 with dynamic loss scaling, tf32 as fp32 with TF32 matmuls (executor/precision.py)
    dtypes=frozenset({"bf16", "fp16", "fp32", "tf32"}),
    attention=frozenset(SDPA_BACKENDS),  # what the executor runs (executor/model.py)
    sequence_parallel="optional", uneven_stages=True, mixed_gpu_types=True, per_stage_tp=True,
    unlike_replicas=True, unequal_microbatches=True, per_stage_sharding=True,
    per_stage_recompute=True, rank_order=None,
    recompute_modules=frozenset({RecomputeModule.CORE_ATTN}),
    ep_within_dp=True, ep_schedules=frozenset(Schedule) - {Schedule.ZB_H1},
    ep_recompute=frozenset({"none", "selective"}), ep_sharding_multiple=True,
    moe_expert_tp=False, moe_sequence_parallel=False, pipeline_split_slots=False,
    latent_attention=False,  # executor/model.py: ordinary attention (preflight.check_model)
    positions_past_the_table=False,  # executor/model.py: the model's own table (preflight)
    # executor/model.py and executor/preflight.py: learned and rotary positions, an output
    # projection, one tp where a tied embedding is used twice, mixed tp only unsharded or
    # under ZeRO-1 over all replicas (executor/mixed_tp.py), ZB-H1's W pass without full
    # recomputation past the first stage
    positions=frozenset({"learned", "rope"}), headless=False, tied_ends_any_tp=False,
    mixed_tp_sharding=False, zb_full_recompute=False, kv_heads_split=True,
    # executor/moe.py drops the copies over an expert's capacity (weight 0) but computes
    # them, and pads nothing
    moe_pad_to_capacity=False,
    # fp32 gradients beside fp32 masters (executor/precision.py); at P = OS > 1 the fp32
    # shard is the parameter (executor/fsdp.py, executor/data_parallel.py)
    model_states=ModelStates.FP32_GRADS,
    # non-blocking sends, fp32 gradients reduced after the last backward (Communication.
    # preset "trainplan": executor/pipeline.py, executor/data_parallel.py)
    comm="trainplan",
    notes={"pipeline split slots": " (executor/preflight.py: every chunk runs a layer)",
           "recompute modules": "the executor's selective recomputation re-runs the "
           "attention core (executor/model.py)",
           "ep": "the executor's ep groups are data-parallel ranks (folding tp or cp into "
           "ep is not implemented)",
           "master weights": "the executor keeps fp32 master weights and reduces fp32 "
           "gradients (executor/precision.py)",
           "model states": "the executor accumulates and reduces fp32 gradients "
           "(executor/precision.py)",
           "comm pipeline_p2p": "executor/pipeline.py sends with isend / irecv",
           "comm overlap_grad_reduce": "the flat-buffer engine reduces once per iteration "
           "after the last backward (executor/data_parallel.py reduce_grads)",
           "comm grad_reduce_dtype": "the executor reduces fp32 gradients "
           "(executor/precision.py)"},
)

CAPABILITIES: dict[str, FrameworkCapabilities] = {
    c.name: c for c in (_MEGATRON, _DEEPSPEED, _TORCHTITAN, _TRAINPLAN)}
FRAMEWORKS = tuple(CAPABILITIES)


def matches_pattern(sizes: tuple[int, int, int], pattern: ShardPattern, dp: int) -> bool:
    """Whether P/G/OS group sizes `sizes` are an instance of `pattern` over `dp` ranks
    holding the same parameters (replicas x context-parallel ranks: `Sharding`)."""
    ks = set()
    for size, want in zip(sizes, pattern, strict=True):
        if want == "*":
            continue
        if want == "1" and size != 1 or want == "dp" and size != dp:
            return False
        if want == "k":
            if not 1 < size < dp:
                return False
            ks.add(size)
    return len(ks) <= 1


@dataclass(frozen=True)
class PlanShape:
    """What a framework sees of a plan: the first replica's knobs and whether the others
    (and the other stages) repeat them."""

    tp: int
    pp: int
    dp: int
    cp: int
    vp: int
    mbs: int
    num_microbatches: int
    layers: tuple[int, ...]  # per stage of the first replica
    gpu_types: tuple[str, ...]
    replicas_alike: bool  # same layer split, tp and cp in every replica
    batches_alike: bool  # same micro-batch size and count in every replica
    tp_alike: bool  # one tp and one cp in the whole plan
    recompute: tuple[str, ...]  # distinct recompute modes, first replica's order
    ep: int = 1  # expert-parallel degree (MoE)
    recompute_modules: tuple[str, ...] = ("core_attn",)  # what selective re-runs
    schedule: str = Schedule.ONE_F_ONE_B
    recompute_past_first: tuple[str, ...] = ()  # modes of any replica's stages 1..pp-1


def plan_shape(plan: Plan) -> PlanShape:
    first = plan.pipelines[0]
    stages = first.stages
    types = plan.gpu_types

    def key(p: object) -> list:
        return [(s.layers, s.tp, s.cp) for s in p.stages]  # type: ignore[attr-defined]  # a Pipeline's stages

    return PlanShape(
        tp=stages[0].tp, pp=len(stages), dp=plan.dp, cp=stages[0].cp,
        vp=plan.training.virtual_stages, mbs=first.micro_batch_size,
        num_microbatches=first.num_microbatches, layers=tuple(s.num_layers for s in stages),
        gpu_types=tuple(sorted(types)),
        replicas_alike=all(key(p) == key(first) for p in plan.pipelines[1:]),
        batches_alike=all((p.micro_batch_size, p.num_microbatches)
                          == (first.micro_batch_size, first.num_microbatches)
                          for p in plan.pipelines[1:]),
        tp_alike=len({(s.tp, s.cp) for p in plan.pipelines for s in p.stages}) == 1,
        recompute=tuple(dict.fromkeys(s.recompute for p in plan.pipelines for s in p.stages)),
        ep=plan.training.ep, recompute_modules=tuple(plan.training.recompute_modules),
        schedule=plan.training.schedule,
        recompute_past_first=tuple(dict.fromkeys(s.recompute for p in plan.pipelines
                                                 for s in p.stages[1:])))


def chunk_layer_counts(layers: tuple[int, ...], vp: int, *, lead: int = 0,
                       tail: int = 0) -> list[int]:
    """Layers of every model chunk in model order (chunk c of stage s is model chunk
    c * pp + s; a stage's layers split as evenly as possible, extra to its first chunks,
    with the embedding's `lead` and the loss's `tail` slots on the first and last stage:
    `layout.stage_layer_ranges`), as the executor (executor/topology.py) and the simulator
    lay them out."""
    ranges = stage_layer_ranges(tuple(layers), vp, lead=lead, tail=tail)
    return [len(ranges[s][c]) for c in range(vp) for s in range(len(layers))]


def plan_chunk_counts(plan: Plan) -> list[int]:
    """`chunk_layer_counts` of the plan's first replica with its embedding / loss slots."""
    tr = plan.training
    return chunk_layer_counts(tuple(s.num_layers for s in plan.pipelines[0].stages),
                              tr.virtual_stages, lead=int(tr.embedding_in_pipeline_split),
                              tail=int(tr.loss_in_pipeline_split))


def in_rank_order(plan: Plan) -> bool:
    """Whether the plan's GPUs, numbered in global order, are Megatron-LM's ranks: tp
    fastest, then cp, dp and pp (torchtitan's mesh and DeepSpeed's topology agree)."""
    used = sorted(d for p in plan.pipelines for s in p.stages for d in s.devices)
    rank = {d: r for r, d in enumerate(used)}
    width = len(plan.pipelines[0].stages[0].devices)  # tp * cp
    return all(rank[dev] == (si * plan.dp + pi) * width + t
               for pi, pipe in enumerate(plan.pipelines) for si, st in enumerate(pipe.stages)
               for t, dev in enumerate(st.devices))


def sp_tp_change(plan: Plan) -> tuple[int, int] | None:
    """The first (tp, next tp) of neighbouring stages that differ in tp, under sequence
    parallelism (the last stage's next is the first where chunks interleave); None where
    none do or the plan runs no sequence parallelism."""
    if not plan.training.sequence_parallel:
        return None
    wrap = plan.training.virtual_stages > 1
    for pipe in plan.pipelines:
        stages = pipe.stages
        for k, st in enumerate(stages):
            if k + 1 == len(stages) and not wrap:
                break
            nxt = stages[(k + 1) % len(stages)]
            if nxt.tp != st.tp:
                return st.tp, nxt.tp
    return None


def unsupported(plan: Plan, capabilities: FrameworkCapabilities, *,
                communication: bool = True) -> list[str]:
    """One line per setting of `plan` that the framework cannot express (empty: it
    expresses the plan exactly); `communication` False: leave out how the plan's
    communication was priced (whether the framework can run the layout at all)."""
    caps, s = capabilities, plan_shape(plan)
    out = _structure(plan, caps, s)
    out += _parallelisms(plan, caps, s)
    out += _schedule(plan, caps, s)
    out += _sharding(plan, caps, s)
    out += _recompute(caps, s)
    out += _precision_and_kernels(plan, caps)
    out += _moe(plan, caps, s)
    out += _model(plan, caps)
    out += _tp_mixes(plan, caps)
    if communication:
        out += _communication(plan, caps)
    return out


def _model(plan: Plan, caps: FrameworkCapabilities) -> list[str]:
    """The model's own architecture against what the framework's model takes."""
    out = []
    act = plan.model.activation
    if act not in caps.activations:
        out.append(f"activation {act}: {caps.version} has "
                   f"{', '.join(sorted(caps.activations))}{_note(caps, f'activation {act}')}")
    position = plan.model.position_embedding
    if position not in caps.positions:
        out.append(f"{position} positions: {caps.version} has "
                   f"{', '.join(sorted(caps.positions))}")
    if not plan.model.lm_head and not caps.headless:
        out.append(f"no output projection (lm_head false): {caps.version}'s models end in one")
    return out


def _tp_mixes(plan: Plan, caps: FrameworkCapabilities) -> list[str]:
    """Where tp differs between stages or replicas: a tied embedding used on stages of two
    tp, and model states sharded at a position whose replicas differ in tp."""
    out = []
    for p in plan.pipelines:
        first, last = p.stages[0].tp, p.stages[-1].tp
        if plan.model.tied_embeddings and first != last and not caps.tied_ends_any_tp:
            out.append(f"tied embeddings on a first stage of tp {first} and a last of tp "
                       f"{last}: {caps.version} needs one tp where the tied weight is used")
            break
    if not caps.mixed_tp_sharding:
        for si in range(len(plan.pipelines[0].stages)):
            tps = sorted({p.stages[si].tp for p in plan.pipelines})
            sh = plan.sharding_of(si)
            if len(tps) > 1 and not mixed_tp_sharding_runs(sh, plan.dp):
                out.append(f"P/G/OS {sh.params}/{sh.grads}/{sh.optim} at stage position {si}, "
                           f"whose replicas' tp differ ({tps}): {caps.version} runs mixed tp "
                           f"unsharded or with ZeRO-1 over all {plan.dp} replicas")
    return out


def mixed_tp_sharding_runs(sharding: Sharding, dp: int) -> bool:
    """Whether model states sharded so run at a stage position whose replicas differ in
    tp, where the framework lacks `mixed_tp_sharding` (executor/mixed_tp.py sums whole
    gradients: P/G/OS 1/1/1, or 1/1/dp)."""
    return (sharding.params, sharding.grads) == (1, 1) and sharding.optim in (1, dp)


def _note(caps: FrameworkCapabilities, key: str) -> str:
    return f" ({caps.notes[key]})" if key in caps.notes else ""


def _structure(plan: Plan, caps: FrameworkCapabilities, s: PlanShape) -> list[str]:
    out = []
    if len(s.gpu_types) > 1 and not caps.mixed_gpu_types:
        out.append(f"mixed GPU types {', '.join(s.gpu_types)}: {caps.version} runs one GPU "
                   "type (every rank alike: no per-type stages or batch shares)")
    if not s.replicas_alike and not caps.unlike_replicas:
        splits = sorted({tuple(st.num_layers for st in p.stages) for p in plan.pipelines})
        out.append(f"replicas differ (layer splits {[list(x) for x in splits]}, or tp/cp "
                   f"per replica): {caps.version} runs identical data-parallel replicas")
    if not s.batches_alike and not caps.unequal_microbatches:
        micro = sorted({(p.num_microbatches, p.micro_batch_size) for p in plan.pipelines})
        out.append(f"unequal micro-batches per replica ({', '.join(f'{m}x{b}' for m, b in micro)}"
                   f" count x size): {caps.version} gives every replica the same share")
    if not s.tp_alike and not caps.per_stage_tp:
        tps = sorted({(st.tp, st.cp) for p in plan.pipelines for st in p.stages})
        out.append(f"tp or cp differs between stages or replicas ({tps} as (tp, cp)): "
                   f"{caps.version} has one tp and one cp")
    change = sp_tp_change(plan)
    if change and caps.per_stage_tp:
        out.append(f"sequence parallelism with tp {change[0]} then {change[1]} on neighbouring "
                   f"stages: {caps.version} sends a stage's sequence-split activations to a "
                   "tp group of its own size (sequence parallelism needs equal tp there)")
    if caps.rank_order and s.replicas_alike and s.tp_alike and not in_rank_order(plan):
        out.append(f"rank placement: the plan puts its GPUs in another order than "
                   f"{caps.version}'s ranks ({caps.rank_order}, fastest first), so its "
                   "groups would land on other GPUs than the plan priced")
    uneven = len(set(s.layers)) > 1 or len(set(plan_chunk_counts(plan))) > 1
    if uneven and not caps.uneven_stages:
        out.append(f"uneven layers per stage {list(s.layers)}"
                   f"{f' (vp {s.vp} chunks)' if s.vp > 1 else ''}: {caps.version} splits "
                   f"layers evenly{_note(caps, 'uneven stages')}")
    tr = plan.training
    if (tr.embedding_in_pipeline_split or tr.loss_in_pipeline_split) and s.vp > 1 \
            and not caps.pipeline_split_slots:
        out.append(f"embedding / loss counted as layers of the interleaved split: "
                   f"{caps.version} splits each stage's chunks by layers"
                   f"{_note(caps, 'pipeline split slots')}")
    return out


def _parallelisms(plan: Plan, caps: FrameworkCapabilities, s: PlanShape) -> list[str]:
    out = []
    for axis, degree in (("tp", s.tp), ("pp", s.pp), ("cp", s.cp), ("vp", s.vp), ("ep", s.ep)):
        if degree > 1 and axis not in caps.parallelisms:
            what = {"vp": "interleaved stages", "ep": "expert parallelism in its config"
                    }.get(axis, f"{axis} parallelism")
            out.append(f"{axis} {degree}: {caps.version} has no {what}{_note(caps, axis)}")
    if s.tp > 1 and s.pp > 1 and not caps.tp_with_pp:
        out.append(f"tp {s.tp} with pp {s.pp}: {caps.version} does not combine them"
                   f"{_note(caps, 'tp with pp')}")
    sp = plan.training.sequence_parallel
    if sp and caps.sequence_parallel == "never":
        out.append(f"sequence parallelism: not in {caps.version}'s config"
                   f"{_note(caps, 'sequence parallel')}")
    if not sp and s.tp > 1 and caps.sequence_parallel == "with tp":
        out.append(f"tp {s.tp} without sequence parallelism: {caps.version} always runs it "
                   f"with tp{_note(caps, 'sequence parallel')}")
    kv = plan.model.kv_heads
    over = max((st.tp for p in plan.pipelines for st in p.stages if kv % st.tp), default=0)
    if caps.kv_heads_split and over:
        out.append(f"tp {over} over {kv} key/value heads: {caps.version} splits the "
                   "key/value heads over the tp ranks (tp must divide them)")
    return out


def _schedule(plan: Plan, caps: FrameworkCapabilities, s: PlanShape) -> list[str]:
    schedule, flushes = plan.training.schedule, plan.training.pipeline_flushes
    out = []
    if schedule not in caps.schedules:
        out.append(f"schedule {schedule}: {caps.version} runs "
                   f"{', '.join(sorted(caps.schedules))}{_note(caps, f'schedule {schedule}')}")
    if flushes > 1:  # NeMo AutoModel's schedule per local batch; none of the exporters'
        out.append(f"{flushes} pipeline schedules per step (training.pipeline_flushes): "
                   f"{caps.version} runs a step's micro-batches as one schedule")
    return out


def _sharding(plan: Plan, caps: FrameworkCapabilities, s: PlanShape) -> list[str]:
    out = []
    if len(plan.shardings) > 1 and not caps.per_stage_sharding:
        out.append(f"model-state sharding differs between stages ({plan.sharding_label}): "
                   f"{caps.version} shards every stage alike")
    patterns = caps.sharding_with_pp if s.pp > 1 and caps.sharding_with_pp else caps.sharding
    for sh in plan.shardings:
        sizes = (sh.params, sh.grads, sh.optim)
        if not any(matches_pattern(sizes, p, s.dp * s.cp) for p in patterns):
            over = f"dp {s.dp}" if s.cp == 1 else f"dp x cp {s.dp * s.cp}"
            out.append(f"sharding P/G/OS {sh.params}/{sh.grads}/{sh.optim} over {over}: "
                       f"not among {caps.version}'s{' (with pp > 1)' if patterns is not caps.sharding else ''} "
                       f"{', '.join('/'.join(p) for p in patterns)}{_note(caps, 'sharding')}")
    return out


def _recompute(caps: FrameworkCapabilities, s: PlanShape) -> list[str]:
    out = []
    if len(s.recompute) > 1 and not caps.per_stage_recompute:
        out.append(f"recompute differs between stages ({', '.join(s.recompute)}): "
                   f"{caps.version} recomputes every stage alike")
    for mode in s.recompute:
        if mode not in caps.recompute:
            out.append(f"recompute {mode}: {caps.version} has "
                       f"{', '.join(sorted(caps.recompute))}{_note(caps, f'recompute {mode}')}")
    if not caps.zb_full_recompute and s.schedule == Schedule.ZB_H1 and \
            Recompute.FULL in s.recompute_past_first:
        out.append(f"full recompute past the first stage under zb-h1: {caps.version}'s W "
                   "pass would run each layer's forward again (full on stage 0 only)")
    missing = [m for m in s.recompute_modules if m not in caps.recompute_modules]
    if Recompute.SELECTIVE in s.recompute and missing:
        out.append(f"selective recompute of {', '.join(missing)}: {caps.version} re-runs "
                   f"{', '.join(sorted(caps.recompute_modules))}"
                   f"{_note(caps, 'recompute modules')}")
    return out


def _moe(plan: Plan, caps: FrameworkCapabilities, s: PlanShape) -> list[str]:
    """An MoE plan's expert settings against the framework's own MoE limits."""
    if not plan.model.is_moe:
        return []
    out, tr, name = [], plan.training, caps.version
    m = plan.model
    if m.capacity_factor is not None and not caps.moe_capacity_factor:
        out.append(f"capacity factor {m.capacity_factor:g} (tokens over an expert's capacity "
                   f"dropped): {name} routes every token (dropless){_note(caps, 'moe capacity')}")
    elif m.pad_to_capacity and not caps.moe_pad_to_capacity:
        out.append(f"expert inputs padded to the capacity (pad_to_capacity): {name} runs each "
                   f"expert on the tokens it is sent{_note(caps, 'moe capacity')}")
    elif (m.pad_to_capacity and tr.comm.moe_dispatcher == "deepep"
          and not caps.moe_pad_with_deepep):
        out.append(f"expert inputs padded to the capacity with the DeepEP dispatcher: {name}'s "
                   "flex dispatcher with the DeepEP backend does not pad (transformer_config.py); "
                   "pad with the all-to-all dispatcher, or route dropless")
    if tr.dtype in caps.dtypes and tr.dtype not in caps.dtypes_for(plan.model):
        out.append(f"dtype {tr.dtype} on an MoE model: {name} trains MoE models in "
                   f"{', '.join(sorted(caps.dtypes_for(plan.model)))}"
                   f"{_note(caps, 'moe dtype')}")
    tps = {st.tp for p in plan.pipelines for st in p.stages}
    if not caps.moe_expert_tp and max(tps) > 1 and tr.etp != 1:
        out.append(f"expert tp {tr.etp or max(tps)} (= tp): {name} keeps the experts whole "
                   "on every tp rank (etp 1)")
    if not caps.moe_sequence_parallel and tr.sequence_parallel and max(tps) > 1:
        out.append(f"sequence parallelism on an MoE model: {name} runs the MoE layer on the "
                   "whole sequence")
    if s.ep == 1 or "ep" not in caps.parallelisms:  # no ep at all: `_parallelisms` says so
        return out
    if caps.ep_within_dp and s.dp % s.ep:
        out.append(f"ep {s.ep} not dividing dp {s.dp}: {name} carves ep groups out of the "
                   f"data-parallel replicas{_note(caps, 'ep')}")
    # ranks of a replica's stage that Megatron's folding puts in one ep group (1: the two
    # layouts are the same groups)
    folds = max(EpLayout.FOLDED.folded_ranks(tp=st.tp, cp=st.cp, etp=tr.etp)
                for p in plan.pipelines for st in p.stages)
    if folds > 1 and caps.ep_within_dp and tr.ep_layout == EpLayout.FOLDED:
        out.append(f"ep groups folded over {folds} ranks of each replica's stage (training."
                   f"ep_layout folded): {name} forms them of data-parallel replicas "
                   f"(ep_layout data_parallel){_note(caps, 'ep')}")
    if folds > 1 and not caps.ep_within_dp and tr.ep_layout == EpLayout.DATA_PARALLEL:
        out.append(f"ep groups of data-parallel replicas (training.ep_layout data_parallel): "
                   f"{name} folds them over tp / etp x cp x dp (ep_layout folded)")
    if caps.ep_schedules is not None and tr.schedule not in caps.ep_schedules:
        out.append(f"schedule {tr.schedule} with ep {s.ep}: {name} runs "
                   f"{', '.join(sorted(caps.ep_schedules))} with expert parallelism")
    for mode in s.recompute:
        if caps.ep_recompute is not None and mode not in caps.ep_recompute:
            out.append(f"recompute {mode} with ep {s.ep}: {name} recomputes "
                       f"{', '.join(sorted(caps.ep_recompute))} with expert parallelism")
    if caps.optimizer_instances_divide_expert_dp:
        etp = tr.etp or s.tp
        expert_dp = s.dp * s.cp * s.tp // (s.ep * etp)
        for sh in plan.shardings:
            instances = distributed_optimizer_instances(sh, s.dp * s.cp)
            if instances > 1 and expert_dp % instances:
                out.append(f"optimizer states sharded within {instances} instances (P/G/OS "
                           f"1/1/{sh.optim}) with an expert data-parallel group of "
                           f"{expert_dp} (dp x cp x tp / (ep x etp)): {name} needs the "
                           "instances to divide it (parallel_state.py)")
    if caps.ep_sharding_multiple:
        for sh in plan.shardings:
            if any(n > s.ep and n % s.ep for n in (sh.params, sh.grads, sh.optim)):
                out.append(f"sharding P/G/OS {sh.params}/{sh.grads}/{sh.optim} with ep "
                           f"{s.ep}: {name} shards expert states over dp/ep replicas, each "
                           "degree at most ep or a multiple of it")
    return out


def _precision_and_kernels(plan: Plan, caps: FrameworkCapabilities) -> list[str]:
    out = []
    dtype, attention = plan.training.dtype, plan.kernels.attention
    if dtype not in caps.dtypes:
        out.append(f"dtype {dtype}: {caps.version} trains in {', '.join(sorted(caps.dtypes))}"
                   f"{_note(caps, f'dtype {dtype}')}")
    if attention not in caps.attention:
        out.append(f"attention kernel {attention}: {caps.version} has "
                   f"{', '.join(sorted(caps.attention))}{_note(caps, f'attention {attention}')}")
    s = plan_shape(plan)
    if (why := fsdp_dp_problem(caps.fsdp_data_parallel, tp=s.tp, pp=s.pp, cp=s.cp, dp=s.dp,
                               params=plan.sharding.params)):
        out.append(why)
    if computes_in_fp32(caps.amp_needs_sharding_with_tp_pp, dtype, tp=s.tp, pp=s.pp, cp=s.cp,
                        params=plan.sharding.params):
        out.append(f"{dtype} with tp {s.tp} / pp {s.pp} and unsharded parameters (no "
                   f"FSDP/HSDP or cp): {caps.version} computes it in fp32"
                   f"{_note(caps, 'amp with tp pp')}")
    if (DType(dtype).master_weights and not plan.training.master_weights
            and not caps.without_master_weights):
        out.append(f"no fp32 master weights (training.master_weights false): {caps.version} "
                   f"updates an fp32 copy{_note(caps, 'master weights')}")
    if (plan.training.fp8_params and caps.fp8_params_need_sharded_optimizer
            and all(sh.optim <= 1 for sh in plan.shardings)):
        out.append(f"FP8 parameters (training.fp8_params) with unsharded optimizer states: "
                   f"{caps.version} gathers FP8 parameters only with the distributed optimizer "
                   "(arguments.py: --fp8-param-gather)")
    states = plan.training.model_states
    if states != caps.model_states and model_states_differ(plan):
        out.append(f"model states kept with {_STATES[states]} (training.model_states "
                   f"{states}): {caps.version} keeps {_STATES[caps.model_states]}, "
                   f"{'more' if states is ModelStates.DEEPSPEED else 'less'} memory than "
                   f"the plan priced{_note(caps, 'model states')}")
    return out


def distributed_optimizer_instances(sh: Sharding, ranks: int) -> int:
    """Megatron-LM's --num-distributed-optimizer-instances for sharding `sh` over `ranks`
    (dp x cp): ranks / OS where only the optimizer states are sharded (P = G = 1 < OS,
    OS dividing the ranks), 0 where its distributed optimizer does not express `sh`."""
    if (sh.params, sh.grads) == (1, 1) and 1 < sh.optim and ranks % sh.optim == 0:
        return ranks // sh.optim
    return 0


def fsdp_dp_problem(fsdp_data_parallel: bool, *, tp: int, pp: int, cp: int, dp: int,
                    params: int) -> str | None:
    """Why a framework whose data parallelism beside other parallelisms is FSDP2 / HSDP
    (`FrameworkCapabilities.fsdp_data_parallel`: torchtitan 0.2.2) does not run a layout
    with parameters sharded over `params` of its dp x cp ranks as priced, or None:
    torchtitan shards over dp_shard x cp whenever cp > 1 (parallel_dims.py:
    `fsdp_enabled = dp_shard_enabled or cp_enabled`), so P must be a multiple of cp; and
    unsharded data parallelism is DDP, which raises "DDP has not supported > 1D
    parallelism" beside tp or pp (models/llama3/infra/parallelize.py)."""
    if not fsdp_data_parallel:
        return None
    if cp > 1 and params % cp:
        return (f"parameters sharded over {params} rank(s) with cp {cp}: torchtitan shards "
                f"them over dp_shard x cp whenever cp > 1 (FSDP), a multiple of cp")
    if cp == 1 and dp > 1 and params <= 1 and (tp > 1 or pp > 1):
        return (f"unsharded data parallelism (dp {dp}) with tp {tp} / pp {pp}: torchtitan "
                "runs it as DDP, which raises 'DDP has not supported > 1D parallelism'; "
                "shard the parameters (FSDP / HSDP)")
    return None


def computes_in_fp32(amp_needs_sharding_with_tp_pp: bool, dtype: str, *, tp: int, pp: int,
                     cp: int, params: int) -> bool:
    """Whether a framework whose mixed precision needs sharded parameters with tp or pp
    (`FrameworkCapabilities.amp_needs_sharding_with_tp_pp`: torchtitan) computes a 16-bit
    layout in fp32: tp or pp > 1 with parameters unsharded and no context parallelism."""
    return (amp_needs_sharding_with_tp_pp and dtype in ("bf16", "fp16")
            and (tp > 1 or pp > 1) and params <= 1 and cp == 1)


# what each rule keeps, in a refusal's words (`ModelStates` gives the sources)
_STATES = {ModelStates.FP32_GRADS: "fp32 gradients",
           ModelStates.DEEPSPEED: "gradients in the training dtype"}


def model_states_differ(plan: Plan) -> bool:
    """Whether the plan's model states take other bytes under another rule: only 16-bit
    training with fp32 master weights keeps gradients in a dtype of the framework's
    choosing (`costs/memory.state_bytes_per_param`)."""
    return DType(plan.training.dtype).keeps_master(plan.training.master_weights)


def _comm_values(plan: Plan, comm: Communication) -> dict[str, object]:
    """The settings of `comm` that change how `plan` is priced: pipeline sends with
    pp > 1; the gradient reduction where a data-parallel group has more than one rank
    (its buckets as `dp_sync` cuts them); ZeRO-3 units where parameters are sharded.
    The MoE dispatch settings are the exporters' own (`--moe-token-dispatcher-type`)."""
    out: dict[str, object] = {}
    if any(len(p.stages) > 1 for p in plan.pipelines):
        out["pipeline_p2p"] = comm.pipeline_p2p
    ranks = plan.dp * max(s.cp for p in plan.pipelines for s in p.stages)
    if ranks > 1:
        out["overlap_grad_reduce"] = comm.overlap_grad_reduce
        out["grad_reduce_dtype"] = comm.grad_reduce_dtype
        out["grad_bucket_params"] = bucket_params(comm, plan.dp)
    if any(sh.params > 1 for sh in plan.shardings):
        out["shard_unit_params"] = comm.shard_unit_params
        out["shard_prefetch"] = comm.shard_prefetch
    if tp_overlap_prices(plan):
        out["tp_comm_overlap"] = comm.tp_comm_overlap
    return out


def tp_overlap_prices(plan: Plan) -> bool:
    """Whether `Communication.tp_comm_overlap` changes the plan's price: sequence-parallel
    tp collectives on a GPU whose architecture hides a share of them."""
    return plan.training.sequence_parallel and any(
        s.tp > 1 and device_efficiency(plan.group_of(s).device).tp_comm_overlap > 0
        for p in plan.pipelines for s in p.stages)


def comm_differences(plan: Plan, caps: FrameworkCapabilities
                     ) -> list[tuple[str, object, object]]:
    """(setting, the plan's value, the framework's) for each `Communication` setting that
    prices this plan, differs from how the framework communicates, and is not one its
    config writes (`comm_settable`): the framework would run the plan otherwise than it
    was priced."""
    mine = _comm_values(plan, plan.training.comm)
    theirs = _comm_values(plan, caps.communication(plan.training.dtype))
    return [(key, value, theirs[key]) for key, value in mine.items()
            if key not in caps.comm_settable and value != theirs[key]]


# a Communication setting's value in a refusal's words
_COMM_WORDS = {
    "pipeline_p2p": lambda v: {"batched": "pipeline sends beside the compute (batched "
                               "isend / irecv)", "blocking": "blocking pipeline sends "
                               "holding both stages' compute"}[str(v)],
    "overlap_grad_reduce": lambda v: ("gradients reduced while the backward runs" if v
                                      else "gradients reduced after the last backward"),
    "grad_reduce_dtype": lambda v: f"gradients reduced in {v}",
    "grad_bucket_params": lambda v: f"gradient buckets of {v:.3g} parameters",
    "shard_unit_params": lambda v: ("one ZeRO-3 unit per layer" if v is None
                                    else f"ZeRO-3 units of {v:.3g} parameters"),
    "shard_prefetch": lambda v: f"{v} ZeRO-3 unit(s) gathered ahead",
    "tp_comm_overlap": lambda v: ("sequence-parallel tp collectives under the GEMMs" if v
                                  else "sequence-parallel tp collectives in line"),
}


def comm_value(value: object) -> str:
    """A `Communication` setting's value as a plan file writes it (`true`, `4e+07`)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def comm_words(key: str, value: object) -> str:
    """A `Communication` setting's value in words ('gradients reduced after the last
    backward')."""
    return _COMM_WORDS[key](value)


def _communication(plan: Plan, caps: FrameworkCapabilities) -> list[str]:
    return [f"{comm_words(key, mine)} (training.comm.{key} {comm_value(mine)}): "
            f"{caps.version} runs {comm_words(key, theirs)}, which the plan was not priced with"
            f"{_note(caps, f'comm {key}')}"
            for key, mine, theirs in comm_differences(plan, caps)]
