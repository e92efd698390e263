"""Plan: the configuration the planner writes and the executor runs.

A plan is explicit: every data-parallel replica is a `Pipeline` of `Stage`s, each stage
names its layer range, its physical GPUs (global indices into the cluster) and its
tensor / context parallel degrees. Replicas may differ (unlike GPU types, layer splits,
micro-batch counts), which is how heterogeneous plans are written; a homogeneous plan is
the special case where they do not. Model-state sharding (AMSP) gives parameters,
gradients and optimizer states each their own group size among the replicas.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Literal, get_args

from planner.outputs import PLAN_SUFFIXES, atomic_path
from planner.specs.choices import (
    DEFAULT_RECOMPUTE_MODULES,
    DType,
    EpLayout,
    ModelStates,
    PipelineP2P,
    Recompute,
    RecomputeModule,
    Schedule,
)
from planner.specs.cluster import TRAIN_DTYPES, ClusterSpec, NodeGroup, check_train_dtype
from planner.specs.files import refuse_other_kind
from planner.specs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from planner.specs.model import ModelSpec
from planner.specs.rules import (
    cp_problem,
    ep_problem,
    etp_problem,
    require,
    sharding_problem,
    sp_problem,
    tp_problem,
)
from profiler.kernels import Attention, OptimizerKernel
from profiler.schema import SpecError, at, coerce_choices, dump, fail, load_yaml, parse, spec_field

__all__ = ["COMM_PRESETS", "DEFAULT_COMM", "REDUCE_DTYPES", "SCHEMA_VERSION", "TRAIN_DTYPES", "Communication", "Kernels",
           "Pipeline", "Plan", "Predicted", "Provenance", "Sharding", "Stage", "Training",
           "describe_layout", "expert_words", "flush_words", "load_plan", "other_attention",
           "plan_from_dict",
           "plan_to_dict", "save_plan"]

SCHEMA_VERSION = 1
ReduceDType = Literal["fp32", "bf16", "fp16"]
# the frameworks `Communication.preset` knows
COMM_PRESETS = ("megatron", "deepspeed", "fsdp2", "trainplan")
REDUCE_DTYPES: tuple[str, ...] = get_args(ReduceDType)


@dataclass(frozen=True, kw_only=True)
class Stage:
    """Layers [first, last) of the model on `tp * cp` GPUs (index = cp_rank * tp + tp_rank)."""

    layers: tuple[int, ...] = spec_field(min=0, max=1024, help="[first, last) layer range")
    devices: tuple[int, ...] = spec_field(min=0, max=MAX_GPUS - 1, help="global GPU indices")
    tp: int = spec_field(default=1, min=1, max=16_384)
    cp: int = spec_field(default=1, min=1, max=16_384)
    recompute: Recompute = Recompute.NONE
    attention: Attention | None = spec_field(
        default=None, help="this stage's attention kernel (default: kernels.attention); a "
        "mixed plan runs each GPU type's own")

    def check(self, where: str) -> None:
        if len(self.layers) != 2 or self.layers[0] > self.layers[1]:
            fail(at(where, "layers"), list(self.layers), "[first, last) with first ≤ last")
        if len(self.devices) != self.tp * self.cp:
            fail(at(where, "devices"), list(self.devices),
                 f"tp*cp = {self.tp * self.cp} GPU indices")

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def __post_init__(self) -> None:
        coerce_choices(self)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """One data-parallel replica: its stages in order and its share of the global batch."""

    stages: tuple[Stage, ...]
    micro_batch_size: int = spec_field(min=1, max=MAX_GLOBAL_BATCH)
    num_microbatches: int = spec_field(min=1, max=MAX_GLOBAL_BATCH)

    def check(self, where: str) -> None:
        if not self.stages:
            fail(at(where, "stages"), [], "at least one stage")

    @property
    def samples(self) -> int:
        return self.micro_batch_size * self.num_microbatches


@dataclass(frozen=True, kw_only=True)
class Sharding:
    """AMSP: how many of the ranks holding the same parameters share one copy of each
    model state. Those ranks are a stage's data- x context-parallel group (dp x cp, context
    ranks fastest): context-parallel ranks hold the same weights and reduce the same
    gradients, and ZeRO shards over all of them (Megatron-Core's distributed optimizer
    takes `get_data_parallel_group(with_context_parallel=True)`, optimizer/__init__.py;
    torchtitan's FSDP mesh is dp_shard x cp; DeepSpeed-Ulysses shards over dp x sp).

    1 = replicated. ZeRO-1 is optim=dp x cp; ZeRO-2 grads=optim=dp x cp; ZeRO-3 all three;
    MiCS is all three = a node's worth of those ranks. Each size divides the next
    (P | G | OS) so that the groups nest. With cp = 1 the sizes count replicas.
    """

    params: int = spec_field(default=1, min=1, max=MAX_GPUS)
    grads: int = spec_field(default=1, min=1, max=MAX_GPUS)
    optim: int = spec_field(default=1, min=1, max=MAX_GPUS)

    def check(self, where: str) -> None:
        # a size left out is 1, so `params: 3` alone fails on grads: say so
        if self.grads % self.params:
            fail(at(where, "grads"), self.grads, f"must be a multiple of params ({self.params}): "
                 "P | G | OS, a size left out is 1")
        if self.optim % self.grads:
            fail(at(where, "optim"), self.optim, f"must be a multiple of grads ({self.grads}): "
                 "P | G | OS, a size left out is 1")


@dataclass(frozen=True, kw_only=True)
class Communication:
    """How the training framework issues its communication. The defaults are
    Megatron-LM's (Megatron-Core 0.16 `DistributedDataParallelConfig`,
    `ModelParallelConfig`), which the cost model assumed before these settings existed;
    `Communication.preset` gives DeepSpeed's, FSDP2's and trainplan's executor's, and a
    search plans with its framework's (planner/export/frameworks.py
    `FrameworkCapabilities.comm`). Sources:
    planner/data/reference/framework_defaults.md."""

    # pipeline sends: batched isend/irecv beside the compute (Megatron) or blocking (DeepSpeed)
    pipeline_p2p: PipelineP2P = PipelineP2P.BATCHED
    # gradient buckets reduced while the backward runs (Megatron --overlap-grad-reduce,
    # PyTorch DDP, FSDP); false: after the backward (DeepSpeed's engine below ZeRO-3)
    overlap_grad_reduce: bool = True
    # the dtype gradients are reduced in: fp32 (Megatron's main grads: --bf16 forces
    # --accumulate-allreduce-grads-in-fp32); DeepSpeed reduces in the training dtype
    grad_reduce_dtype: ReduceDType = "fp32"
    # parameters per gradient bucket; None: Megatron's max(4e7, 1e6 x dp)
    grad_bucket_params: float | None = spec_field(default=None, min=1, max=1e15)
    # ZeRO-3 / FSDP: parameters per all-gather and reduce-scatter unit; None: one
    # transformer layer per unit (FSDP2's fully_shard per block)
    shard_unit_params: float | None = spec_field(default=None, min=1, max=1e15)
    # ZeRO-3 / FSDP: units gathered ahead of the one computing (FSDP2: 1; 0: none)
    shard_prefetch: int = spec_field(default=1, min=0, max=1024)
    # MoE token dispatch: NCCL all-to-all (Megatron --moe-token-dispatcher-type alltoall)
    # or DeepEP (flex + deepep), which sends a token once to each rank holding one of its
    # experts (over the network once to each such node), not once per routed expert
    moe_dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    # which experts a token goes to: "learned" (the router's choice, spread over the
    # experts as if at random) or "fake_balanced", NeMo AutoModel's benchmark-only
    # FakeBalancedGate (components/moe/layers.py: token i takes experts ik .. ik+k-1 mod
    # E, so its k experts sit side by side on one or two ranks); the load is even in both
    moe_routing: Literal["learned", "fake_balanced"] = "learned"
    # sequence-parallel tp all-gathers and reduce-scatters run under the GEMMs beside them
    # (Transformer Engine's userbuffers: Megatron --tp-comm-overlap, NeMo's
    # tp_comm_overlap, which Megatron-Core's performance recipes turn on and the Hopper
    # rows the cost model is calibrated on ran), as far as the GPU's architecture hides
    # them (`ArchEfficiency.tp_comm_overlap`: Hopper 1.0, Ampere 0); false: in line
    # (DeepSpeed, FSDP2 / torchtitan without async TP, trainplan's executor)
    tp_comm_overlap: bool = True

    def __post_init__(self) -> None:
        coerce_choices(self)

    @classmethod
    def preset(cls, framework: str, *, dtype: str) -> Communication:
        """A framework's defaults for training in `dtype` (`COMM_PRESETS`):

        * "megatron": the defaults;
        * "deepspeed" (0.19: blocking pipeline p2p, reduction after the backward in the
          training dtype, reduce_bucket_size 5e8 elements, tp collectives in line);
        * "fsdp2" (torch fully_shard as torchtitan 0.2.2 applies it: MixedPrecisionPolicy
          reduce_dtype float32, config/job_config.py `mixed_precision_reduce` admitting
          "float32" alone; reduce-scatters in the backward; one unit per block, the next
          one prefetched, FSDP2's implicit default, models/llama3/infra/parallelize.py
          `apply_fsdp` setting no explicit prefetch; DDP, `replicate`, also reduces in the
          backward; torch.distributed.pipelining's `batch_isend_irecv` sends; tp
          collectives in line: async TP is torchtitan's opt-in under torch.compile);
        * "trainplan" (this repository's executor: non-blocking isend / irecv with each
          receive posted one ahead, executor/pipeline.py `Links`; the flat-buffer engine
          reduces fp32 gradients once per iteration, after the last backward,
          executor/data_parallel.py `reduce_grads` called from executor/runtime.py
          `iteration` once the pipeline has run, nothing overlapped; its FSDP2 path,
          executor/fsdp.py, taken at P = G = OS > 1 with tp 1 and equal micro-batch
          counts, reduces in the backward as FSDP2 does, and is priced as the flat engine:
          only HSDP's all-reduce across blocks, which FSDP2 overlaps, differs; DTensor's
          tp collectives in line)."""
        reduce_dtype = str(dtype) if dtype in REDUCE_DTYPES else "fp32"  # a DType: its name
        if framework == "megatron":
            return cls()
        if framework == "deepspeed":
            return cls(pipeline_p2p=PipelineP2P.BLOCKING, overlap_grad_reduce=False,
                       grad_reduce_dtype=reduce_dtype,  # type: ignore[arg-type]  # checked above
                       grad_bucket_params=5e8, tp_comm_overlap=False)
        if framework == "fsdp2":
            return cls(overlap_grad_reduce=True, grad_reduce_dtype="fp32", shard_prefetch=1,
                       tp_comm_overlap=False)
        if framework == "trainplan":
            return cls(overlap_grad_reduce=False, grad_reduce_dtype="fp32",
                       tp_comm_overlap=False)
        fail("framework", framework, " or ".join(COMM_PRESETS))


# Megatron-LM's communication, `Communication`'s defaults (what a plan without settings has)
DEFAULT_COMM = Communication()


@dataclass(frozen=True, kw_only=True)
class Training:
    global_batch_size: int = spec_field(min=1, max=MAX_GLOBAL_BATCH, help="sequences; at "
                                        f"most {MAX_GLOBAL_BATCH:,}")
    seq_len: int = spec_field(min=1, max=MAX_SEQ_LEN)
    dtype: DType = DType.BF16
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = spec_field(default=1, min=1, max=1024,
                                     help="interleaved chunks per stage (vp)")
    optimizer: Literal["adamw"] = "adamw"
    master_weights: bool = spec_field(
        default=True, help="16-bit training keeps fp32 master weights, fp32 gradients and "
        "fp32 Adam moments beside the 16-bit weights (Megatron, DeepSpeed: 18 bytes per "
        "parameter); false: the optimizer updates the 16-bit weights themselves, and their "
        "gradients and Adam moments take the same dtype (8 bytes; NeMo AutoModel builds its "
        "models in config.torch_dtype and trains them with torch.optim.Adam). fp32 training "
        "has no master copy either way")
    model_states: ModelStates = spec_field(
        default=ModelStates.FP32_GRADS, help="what the framework keeps of the model states "
        "with master weights: fp32_grads (Megatron-Core, FSDP2 / torchtitan, trainplan's "
        "executor: fp32 gradients, 18 bytes per parameter; 16 where parameters shard as "
        "the optimizer states do, the fp32 shard being the parameter) or deepspeed "
        "(ZeRO: gradients in the training dtype, 16 bytes)")
    fp8_params: bool = spec_field(
        default=False, help="fp8 training keeps its Transformer Engine linear weights in FP8 "
        "(TE fp8_model_init; Megatron-Core fp8_param, NeMo fp8_params / fp8_param_gather: "
        "1 byte and 1 for the transpose, no bf16 copy); false: bf16 weights, and TE caches "
        "an FP8 copy and its transpose of each (2 bytes more)")
    comm: Communication = Communication()
    ep: int = spec_field(default=1, min=1, max=MAX_GPUS,
                         help="expert parallel: each MoE layer's routed experts split over "
                         "ep data/context-parallel ranks (Megatron --expert-model-parallel-size)")
    etp: int | None = spec_field(default=None, min=1, max=MAX_GPUS,
                                 help="expert tensor parallel: 1 or tp (default tp; Megatron "
                                 "--expert-tensor-parallel-size)")
    ep_layout: EpLayout = spec_field(
        default=EpLayout.FOLDED, help="which ranks an ep group is: folded (Megatron-Core's "
        "MoE Parallel Folding: ep consecutive ranks of tp / etp x cp x dp, a replica's tp "
        "ranks first) or data_parallel (one tp rank of ep data-parallel replicas, as "
        "trainplan's executor forms them); the same where tp / etp x cp is 1")
    recompute_modules: tuple[RecomputeModule, ...] = spec_field(
        default=DEFAULT_RECOMPUTE_MODULES, help="what stages with selective recompute re-run "
        "(Megatron --recompute-modules; default core_attn)")
    embedding_in_pipeline_split: bool = spec_field(
        default=False, help="the embedding takes a layer's place in the first stage's first "
        "chunk (Megatron --account-for-embedding-in-pipeline-split)")
    loss_in_pipeline_split: bool = spec_field(
        default=False, help="the loss takes a layer's place in the last stage's last chunk "
        "(Megatron --account-for-loss-in-pipeline-split)")
    pipeline_flushes: int = spec_field(
        default=1, min=1, max=MAX_GLOBAL_BATCH,
        help="schedules a step's micro-batches run as, each with its own fill and drain "
        "(NeMo AutoModel: one torch.distributed.pipelining schedule.step per local batch, "
        "its gradient accumulation steps of them per step; Megatron, DeepSpeed, torchtitan: 1)")

    def slots(self, stage: int, stages: int) -> tuple[int, int]:
        """(lead, tail): the embedding and loss slots stage `stage` of `stages` holds in
        its layer split (`layout.chunk_sizes`)."""
        return (int(stage == 0 and self.embedding_in_pipeline_split),
                int(stage == stages - 1 and self.loss_in_pipeline_split))

    def check(self, where: str) -> None:
        if self.schedule.interleaved != (self.virtual_stages > 1):
            fail(at(where, "virtual_stages"), self.virtual_stages,
                 "> 1 exactly when schedule is interleaved-1f1b")
        if self.fp8_params and self.dtype != DType.FP8:
            fail(at(where, "fp8_params"), self.fp8_params, "applies only to dtype fp8")
        modules = self.recompute_modules
        if not modules or len(set(modules)) != len(modules):
            fail(at(where, "recompute_modules"), [str(m) for m in modules],
                 "one or more distinct modules: " + ", ".join(RecomputeModule))

    def __post_init__(self) -> None:
        coerce_choices(self)
        object.__setattr__(self, "recompute_modules",
                           tuple(RecomputeModule(m) for m in self.recompute_modules))


@dataclass(frozen=True, kw_only=True)
class Kernels:
    """Kernel choices the executor must use (the planner records the fastest valid one)."""

    attention: Attention = Attention.FLASH
    optimizer: OptimizerKernel = OptimizerKernel.FUSED

    def __post_init__(self) -> None:
        coerce_choices(self)


@dataclass(frozen=True, kw_only=True)
class Predicted:
    iteration_time_s: float = spec_field(gt=0)
    tokens_per_s: float = spec_field(gt=0)
    tflops_per_gpu_model: float = spec_field(min=0)
    mfu: float = spec_field(min=0)
    peak_memory_bytes: tuple[int, ...] = spec_field(min=0, help="per pipeline stage")
    fits: bool = True
    sources: dict[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class Provenance:
    tool: str
    created: str
    command: str | None = None
    profile: str | None = None


@dataclass(frozen=True, kw_only=True)
class Plan:
    schema_version: int = spec_field(default=SCHEMA_VERSION, min=1)
    model: ModelSpec
    cluster: ClusterSpec
    training: Training
    pipelines: tuple[Pipeline, ...]
    sharding: Sharding = Sharding()
    stage_sharding: tuple[Sharding, ...] | None = spec_field(
        default=None, help="per stage position, overriding `sharding` there (needs every "
        "replica to split the layers at the same boundaries)")
    kernels: Kernels = Kernels()
    predicted: Predicted | None = None
    provenance: Provenance | None = None

    def __post_init__(self) -> None:
        # A plan file may leave node fields to the catalog's standard node, as a cluster
        # file may: fill them in, so that every consumer reads a resolved cluster.
        if not self.cluster.is_resolved:
            object.__setattr__(self, "cluster", self.cluster.resolved())

    def check(self, where: str) -> None:
        if self.schema_version != SCHEMA_VERSION:
            fail(at(where, "schema_version"), self.schema_version,
                 f"this trainplan reads version {SCHEMA_VERSION}")
        if not self.pipelines:
            fail(at(where, "pipelines"), [], "at least one pipeline")
        # A plan built in code (search, hetero, replan) was never parsed: check its
        # training settings here too (parsing a file checks them before, cheaply again).
        self.training.check(at(where, "training"))
        dispatcher = self.training.comm.moe_dispatcher
        if not self.model.num_experts and dispatcher != Communication().moe_dispatcher:
            fail(at(where, "training.comm.moe_dispatcher"), dispatcher,
                 f"{self.model.name} has no experts: a token dispatcher applies to MoE models "
                 f"(leave it {Communication().moe_dispatcher})")
        if self.training.sequence_parallel and all(
                s.tp == 1 for p in self.pipelines for s in p.stages):
            fail(at(where, "training.sequence_parallel"), True, "needs a stage of tp > 1 "
                 "(it splits the tp group's activations; Megatron turns it off at tp 1)")
        self._check_batch(where)
        self._check_stages(where)
        check_train_dtype((self.group_of(s).device for p in self.pipelines for s in p.stages),
                          self.training.dtype, where=at(where, "training.dtype"))
        self._check_attention(where)
        self._check_interleaving(where)
        schedule = self.training.schedule
        if any(len(p.stages) < schedule.min_stages for p in self.pipelines):
            allowed = ", ".join(s for s in Schedule if s.min_stages == 1)
            fail(at(where, "training.schedule"), schedule,
                 f"{schedule.described} needs every pipeline to have at least "
                 f"{schedule.min_stages} stages; allowed with 1 stage: {allowed}")
        dp = len(self.pipelines)
        ep, etp = self.training.ep, self.training.etp
        first = self.pipelines[0].stages[0]
        require(at(where, "training.etp"), etp, etp_problem(self.model, etp, tp=first.tp))
        require(at(where, "training.ep"), ep, ep_problem(self.model, ep, dp=dp, cp=first.cp,
                                                         tp=first.tp, etp=etp,
                                                         layout=self.training.ep_layout))
        if ep > 1 and not self.aligned_stages:
            fail(at(where, "training.ep"), ep, "expert parallelism needs every pipeline to "
                 "split the layers at the same boundaries (ep peers hold the same layers)")
        for path, sh, cps in self._shardings(where):
            sh.check(path)
            for cp in cps:  # a stage shards over the replicas x its own context ranks
                for name in ("params", "grads", "optim"):
                    size = getattr(sh, name)
                    require(at(path, name), size, sharding_problem(
                        size, dp * cp, what="the data-parallel replicas x context-parallel "
                        f"ranks{'' if len(cps) == 1 else f' of the stages with cp {cp}'}"))

    def _shardings(self, where: str) -> list[tuple[str, Sharding, list[int]]]:
        """Every sharding the plan states, with where it is and the context-parallel sizes
        of the stages it shards; checks stage_sharding's shape."""
        if self.stage_sharding is None:
            return [(at(where, "sharding"), self.sharding,
                     sorted({s.cp for p in self.pipelines for s in p.stages}))]
        out = [(at(where, "sharding"), self.sharding, [self.pipelines[0].stages[0].cp])]
        if not self.aligned_stages:
            fail(at(where, "stage_sharding"), "per stage",
                 "only when every pipeline splits the layers at the same boundaries")
        pp = len(self.pipelines[0].stages)
        if len(self.stage_sharding) != pp:
            fail(at(where, "stage_sharding"), f"{len(self.stage_sharding)} entries",
                 f"one per stage ({pp})")
        first, last = self.stage_sharding[0], self.stage_sharding[-1]
        if self.model.tied_embeddings and pp > 1 and first != last:
            fail(at(where, f"stage_sharding[{pp - 1}]"),
                 f"{last.params}/{last.grads}/{last.optim}",
                 f"the model ties its embeddings: the last stage holds the first stage's "
                 f"twin and shards like it ({first.params}/{first.grads}/{first.optim})")
        return out + [(at(where, f"stage_sharding[{k}]"), sh,
                       sorted({p.stages[k].cp for p in self.pipelines}))
                      for k, sh in enumerate(self.stage_sharding)]

    @property
    def aligned_stages(self) -> bool:
        """Whether every replica splits the layers into the same stages (then stage s of
        every pipeline holds the same parameters and syncs with its peers)."""
        first = [s.layers for s in self.pipelines[0].stages]
        return all([s.layers for s in p.stages] == first for p in self.pipelines[1:])

    def group_of(self, stage: Stage) -> NodeGroup:
        """The node group a stage runs on (a stage's GPUs are of one type: its first
        GPU's group)."""
        return self.cluster.group_of(stage.devices[0])

    @property
    def gpu_types(self) -> set[str]:
        """The GPU types the plan's stages use."""
        return {self.cluster.group_of(d).gpu for p in self.pipelines for s in p.stages
                for d in s.devices}

    def attention_of(self, stage: Stage) -> Attention:
        """The attention kernel a stage runs."""
        return stage.attention or self.kernels.attention

    def sharding_of(self, stage: int) -> Sharding:
        """The model-state sharding of stage position `stage`."""
        return self.sharding if self.stage_sharding is None else self.stage_sharding[stage]

    @property
    def sharding_label(self) -> str:
        """'P/G/OS 1/1/8', or per stage: 'P/G/OS per stage 1/1/1, 8/8/8'."""
        text = [f"{s.params}/{s.grads}/{s.optim}" for s in self.stage_sharding or (self.sharding,)]
        return f"P/G/OS {'per stage ' if self.stage_sharding else ''}{', '.join(text)}"

    @property
    def shardings(self) -> tuple[Sharding, ...]:
        """The distinct shardings the plan uses (one unless stage_sharding differs)."""
        return tuple(dict.fromkeys(self.stage_sharding or (self.sharding,)))

    def _check_interleaving(self, where: str) -> None:
        """Each of the `pipeline_flushes` schedules of a step runs the same number of
        micro-batches; interleaved 1F1B runs them in groups of pp (Narayanan et al. 2021,
        §2.2): each schedule's count must be a multiple of the pipeline's stages."""
        flushes = self.training.pipeline_flushes
        for pi, p in enumerate(self.pipelines):
            if p.num_microbatches % flushes:
                fail(at(where, f"pipelines[{pi}].num_microbatches"), p.num_microbatches,
                     f"a multiple of training.pipeline_flushes ({flushes})")
            if (self.training.schedule.interleaved
                    and (p.num_microbatches // flushes) % len(p.stages)):
                each = (f" in each of its {flushes} schedules (training.pipeline_flushes: "
                        f"{p.num_microbatches // flushes} each)" if flushes > 1 else "")
                fail(at(where, f"pipelines[{pi}].num_microbatches"), p.num_microbatches,
                     f"interleaved-1f1b needs a multiple of the pipeline's {len(p.stages)} "
                     f"stages{each}")

    def _check_batch(self, where: str) -> None:
        for pi, pipe in enumerate(self.pipelines):
            if pipe.num_microbatches < 1 or pipe.micro_batch_size < 1:
                fail(at(where, f"pipelines[{pi}]"),
                     f"{pipe.num_microbatches} x {pipe.micro_batch_size}",
                     "at least one micro-batch of at least one sample")
        total = sum(p.samples for p in self.pipelines)
        if total != self.training.global_batch_size:
            fail(at(where, "pipelines"), f"{total} samples",
                 f"micro_batch_size x num_microbatches over all pipelines must equal "
                 f"training.global_batch_size {self.training.global_batch_size}")

    def _check_stages(self, where: str) -> None:
        num_layers, num_gpus = self.model.num_layers, self.cluster.num_gpus
        used: dict[int, str] = {}
        for pi, pipe in enumerate(self.pipelines):
            expect = 0
            for si, stage in enumerate(pipe.stages):
                path = at(where, f"pipelines[{pi}].stages[{si}]")
                if stage.layers[0] != expect:
                    fail(at(path, "layers"), list(stage.layers),
                         f"stages must cover layers in order; this one must start at {expect}")
                expect = stage.layers[1]
                ends = len(pipe.stages) > 1 and si in (0, len(pipe.stages) - 1)
                vp = self.training.virtual_stages
                # the embedding / loss slots a stage holds in the split count as layers
                slots = stage.num_layers + sum(self.training.slots(si, len(pipe.stages)))
                if stage.num_layers == 0 and not (ends and (vp == 1 or slots >= vp)):
                    fail(at(path, "layers"), list(stage.layers), "no layers only for a first "
                         "stage (the embedding alone) or a last one (the head alone) of a "
                         "pipeline without interleaving (with it: as many embedding / loss "
                         "slots and layers as chunks)")
                if 0 < stage.num_layers and slots < vp:
                    fail(at(path, "layers"), list(stage.layers),
                         f"at least virtual_stages = {vp} layers"
                         f"{' and embedding / loss slots' if slots > stage.num_layers else ''}")
                self._check_stage_parallel(stage, path)
                for d in stage.devices:
                    if d >= num_gpus:
                        fail(at(path, "devices"), d, f"GPU indices are 0..{num_gpus - 1}")
                    if d in used:
                        fail(at(path, "devices"), d, f"GPU {d} is already used by {used[d]}")
                    used[d] = path
                if len(self.cluster.node_groups) > 1:
                    self._check_one_type(stage, path)
            if expect != num_layers:
                fail(at(where, f"pipelines[{pi}].stages"), f"layers 0..{expect}",
                     f"stages must cover all {num_layers} layers")

    def _check_one_type(self, stage: Stage, path: str) -> None:
        """A stage is priced, run and exported as its first GPU's type: all are of it."""
        first = self.group_of(stage).gpu
        other = next((d for d in stage.devices if self.cluster.group_of(d).gpu != first), None)
        if other is not None:
            fail(at(path, "devices"), other, f"GPU {other} is "
                 f"{self.cluster.group_of(other).gpu}, GPU {stage.devices[0]} "
                 f"{first}: a stage's GPUs are of one type")

    def _check_attention(self, where: str) -> None:
        """A stage's own kernel runs on its GPUs; the plan's runs on some stage's (a stage
        whose GPUs lack it runs their fastest: `costs/stages.stage_attention`)."""
        dtype = self.training.dtype
        kernels_of: dict[str, tuple[Attention, ...]] = {}  # per GPU type
        for pi, pipe in enumerate(self.pipelines):
            for si, stage in enumerate(pipe.stages):
                dev = self.group_of(stage).device
                if dev.name not in kernels_of:
                    kernels_of[dev.name] = dev.attention_in(dtype, dropout=self.model.drops_attention)
                kernels = kernels_of[dev.name]
                if stage.attention is not None and stage.attention not in kernels:
                    fail(at(where, f"pipelines[{pi}].stages[{si}].attention"), stage.attention,
                         f"{dev.name} runs {', '.join(kernels)} in {dtype}")
        runs = {k for kernels in kernels_of.values() for k in kernels}
        if self.kernels.attention not in runs:
            types = sorted(kernels_of)
            fail(at(where, "kernels.attention"), self.kernels.attention,
                 f"{', '.join(types)} run{'s' if len(types) == 1 else ''} "
                 f"{', '.join(k for k in Attention if k in runs)} in {dtype}")

    def _check_stage_parallel(self, stage: Stage, path: str) -> None:
        require(at(path, "tp"), stage.tp, tp_problem(self.model, stage.tp))
        require(at(path, "cp"), stage.cp, cp_problem(self.training.seq_len, stage.cp))
        if self.training.sequence_parallel:
            require(at(path, "tp"), stage.tp,
                    sp_problem(self.training.seq_len, stage.tp, stage.cp))

    @property
    def dp(self) -> int:
        return len(self.pipelines)

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same parameters (dp x cp, the first stage's cp): what the
        sharding sizes divide."""
        return self.dp * self.pipelines[0].stages[0].cp

    @property
    def num_gpus_used(self) -> int:
        return sum(len(s.devices) for p in self.pipelines for s in p.stages)


def expert_words(training: Training) -> str:
    """', ep 8 (ep_layout data_parallel), etp 1, deepep dispatch': the expert settings of
    a layout line, each only where it is set (the ep layout whenever ep > 1: which ranks
    an ep group is changes its links and its price)."""
    tr = training
    ep = f", ep {tr.ep} (ep_layout {tr.ep_layout})" if tr.ep > 1 else ""
    etp = f", etp {tr.etp}" if tr.etp else ""
    dispatch = (f", {tr.comm.moe_dispatcher} dispatch"
                if tr.comm.moe_dispatcher != Communication().moe_dispatcher else "")
    return ep + etp + dispatch


def flush_words(training: Training) -> str:
    """', 4 pipeline flushes per step' where a step runs its micro-batches as several
    schedules (`Training.pipeline_flushes` > 1), else nothing."""
    flushes = training.pipeline_flushes
    return f", {flushes} pipeline flushes per step" if flushes > 1 else ""


def describe_layout(plan: Plan) -> str:
    """One line: the parallel layout, batch, schedule, sharding and kernels of a plan."""
    p0 = plan.pipelines[0]
    tr, k = plan.training, plan.kernels
    tps = sorted({s.tp for p in plan.pipelines for s in p.stages})
    cps = sorted({s.cp for p in plan.pipelines for s in p.stages})
    recomputes = list(dict.fromkeys(str(s.recompute) for p in plan.pipelines for s in p.stages))
    micro = sorted({(p.micro_batch_size, p.num_microbatches) for p in plan.pipelines})
    return (f"dp {plan.dp}, pp {len(p0.stages)}, tp {'/'.join(map(str, tps))}"
            f"{'' if cps == [1] else ', cp ' + '/'.join(map(str, cps))}"
            f"{expert_words(tr)}, "
            f"layers {'/'.join(str(s.num_layers) for s in p0.stages)}, "
            f"micro-batches {', '.join(f'{m}x{b}' for b, m in micro)} (count x size), "
            f"gbs {tr.global_batch_size}, seq {tr.seq_len}, {tr.dtype}, {tr.schedule}"
            f"{f' vp {tr.virtual_stages}' if tr.virtual_stages > 1 else ''}"
            f"{flush_words(tr)}"
            f"{', sequence parallel' if tr.sequence_parallel else ''}, recompute "
            f"{'/'.join(recomputes)}, {plan.sharding_label}, "
            f"{k.attention} attention{other_attention(plan)}, {k.optimizer} AdamW"
            f"{'' if tr.master_weights else ' without fp32 master weights'}")


def other_attention(plan: Plan) -> str:
    """Stages that run another attention kernel than the plan's (GPU types without it)."""
    other = sorted({str(s.attention) for p in plan.pipelines for s in p.stages
                    if s.attention is not None and s.attention != plan.kernels.attention})
    return f" ({', '.join(other)} on some stages)" if other else ""


def plan_to_dict(plan: Plan) -> dict:
    return dump(plan)


def plan_from_dict(data: object, *, where: str = "plan") -> Plan:
    return parse(Plan, data, where=where)


def save_plan(plan: Plan, path: str) -> None:
    """Write YAML (.yaml/.yml) or JSON (.json); reading it back gives an equal Plan. The
    extension is checked before anything is written, and the file is written atomically
    (an existing file stays whole until the new one is)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in PLAN_SUFFIXES:
        raise SpecError(f"-o: {path!r} is not allowed (use a .yaml, .yml or .json file)")
    data = plan_to_dict(plan)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        if ext == ".json":
            json.dump(data, fh, indent=1)
            fh.write("\n")
        else:
            import yaml

            yaml.safe_dump(data, fh, sort_keys=False, default_flow_style=None, width=100)


def load_plan(path: str) -> Plan:
    """Read a plan (YAML or JSON: JSON is YAML) and validate it."""
    raw = load_yaml(path)
    refuse_other_kind(raw, path, "plan", "`model`, `cluster`, `training` and `pipelines`: "
                      "`plan search -o` or `plan simulate -o` writes one")
    return parse(Plan, raw, where=f"{path}:")
