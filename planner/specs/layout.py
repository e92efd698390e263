"""Homogeneous parallel configurations (tp, pp, dp, cp, vp, batch) and the Plan they make.

`ParallelConfig` holds the knobs of one homogeneous layout; `homogeneous_plan` turns it
into an explicit Plan. Ranks are laid out as Megatron-LM does (tp fastest, then cp, then
dp, then pp), so tensor-parallel groups sit inside a node and pipeline stages span nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from planner.specs.choices import (
    DEFAULT_RECOMPUTE_MODULES,
    DType,
    EpLayout,
    ModelStates,
    Recompute,
    RecomputeModule,
    Schedule,
    ShardingPreset,
)
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import (
    Communication,
    Kernels,
    Pipeline,
    Plan,
    Sharding,
    Stage,
    Training,
)
from planner.specs.rules import (
    batch_problem,
    chunks_problem,
    cp_problem,
    ep_problem,
    etp_problem,
    interleaving_problem,
    require,
    schedule_problem,
    sharding_problem,
    sp_problem,
    tp_problem,
)
from profiler.schema import at, coerce_choices, fail, spec_field

__all__ = ["ParallelConfig", "check_parallel", "check_tp", "homogeneous_plan",
           "chunk_sizes", "megatron_devices", "sharding_preset", "split_layers",
           "pipeline_moe_layers", "stage_layer_ranges", "stage_moe_layers"]


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    tp: int = spec_field(default=1, min=1)
    pp: int = spec_field(default=1, min=1)
    dp: int = spec_field(default=1, min=1)
    cp: int = spec_field(default=1, min=1)
    vp: int = spec_field(default=1, min=1, help="interleaved chunks per pipeline stage")
    mbs: int = spec_field(min=1, help="micro-batch size")
    gbs: int = spec_field(min=1, help="global batch size")
    seq_len: int = spec_field(min=1)
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    sharding: Sharding = Sharding()
    dtype: DType = DType.BF16
    schedule: Schedule = Schedule.ONE_F_ONE_B  # with vp > 1: interleaved 1F1B
    ep: int = spec_field(default=1, min=1, help="expert-parallel degree (MoE; divides dp x cp)")
    etp: int | None = spec_field(default=None, min=1, help="expert tensor parallel: 1 or tp")
    ep_layout: EpLayout = EpLayout.FOLDED  # which ranks an ep group is (Training.ep_layout)
    recompute_modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES  # selective's
    # Megatron-Core --account-for-embedding-in-pipeline-split / --account-for-loss-in-
    # pipeline-split: the embedding (the loss) takes a layer's place in the split
    embedding_in_pipeline_split: bool = False
    loss_in_pipeline_split: bool = False
    # what the framework keeps of the model states (Training.model_states)
    model_states: ModelStates = ModelStates.FP32_GRADS
    # fp8 with FP8 primary weights (Training.fp8_params)
    fp8_params: bool = False
    # how the framework communicates (Training.comm; default Megatron-LM's)
    comm: Communication = Communication()

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    def __post_init__(self) -> None:
        coerce_choices(self)


def sharding_preset(name: str, ranks: int) -> Sharding:
    """A ZeRO stage as a point of the AMSP space (see `ShardingPreset`) over `ranks` =
    dp x cp ranks holding the same parameters."""
    params, grads, optim = ShardingPreset(name).group_sizes(ranks)
    return Sharding(params=params, grads=grads, optim=optim)


def check_tp(model: ModelSpec, tp: int, *, where: str = "--tp") -> None:
    require(where, tp, tp_problem(model, tp))


def check_parallel(cfg: ParallelConfig, model: ModelSpec, cluster: ClusterSpec, *,
                   where: str = "--") -> None:
    """Reject configurations that cannot run, naming the knob (a SpecError)."""
    check_tp(model, cfg.tp, where=at(where, "tp"))
    slots = (model.num_layers + int(cfg.embedding_in_pipeline_split)
             + int(cfg.loss_in_pipeline_split))
    # with interleaving, the chunks per stage are what the user added: name --vp
    knob = "vp" if cfg.vp > 1 else "pp"
    require(at(where, knob), getattr(cfg, knob), chunks_problem(slots, cfg.pp, cfg.vp))
    if cfg.num_gpus != cluster.num_gpus:
        fail(at(where, "dp"), cfg.dp,
             f"tp*pp*dp*cp = {cfg.tp}*{cfg.pp}*{cfg.dp}*{cfg.cp} = {cfg.num_gpus} must equal "
             f"the cluster's {cluster.num_gpus} GPUs")
    require(at(where, "gbs"), cfg.gbs, batch_problem(cfg.gbs, cfg.mbs, cfg.dp))
    require(at(where, "cp"), cfg.cp, cp_problem(cfg.seq_len, cfg.cp))
    if cfg.sequence_parallel:
        require(at(where, "sequence_parallel"), True, sp_problem(cfg.seq_len, cfg.tp, cfg.cp))
    require(at(where, "etp"), cfg.etp, etp_problem(model, cfg.etp, tp=cfg.tp))
    require(at(where, "ep"), cfg.ep, ep_problem(model, cfg.ep, dp=cfg.dp, cp=cfg.cp, tp=cfg.tp,
                                                etp=cfg.etp, layout=cfg.ep_layout))
    require(at(where, "schedule"), cfg.schedule, schedule_problem(cfg.schedule, cfg.pp, cfg.vp))
    require(at(where, "vp"), cfg.vp, interleaving_problem(
        cfg.pp, cfg.vp, cfg.schedule,
        cfg.gbs // (cfg.mbs * cfg.dp) if not cfg.gbs % (cfg.mbs * cfg.dp) else None))
    for name in ("params", "grads", "optim"):
        size = getattr(cfg.sharding, name)
        require(at(where, f"shard_{name}"), size, sharding_problem(
            size, cfg.dp * cfg.cp, what="dp" if cfg.cp == 1 else "dp x cp"))


def split_layers(num_layers: int, pp: int, *, lead: int = 0, tail: int = 0) -> list[int]:
    """Layers per stage: as even as possible, extra layers to the middle stages (the first
    holds the most activations under 1F1B, the last computes the logits). `lead` (`tail`)
    slots of the first (last) stage hold no layer: Megatron-Core's
    --account-for-embedding-in-pipeline-split (--account-for-loss-in-pipeline-split)
    counts the embedding (the loss) as a layer of the split (transformer_block.py
    `get_num_layers_to_build`)."""
    base, extra = divmod(num_layers + lead + tail, pp)
    order = sorted(range(pp), key=lambda i: (abs(i - (pp - 1) / 2), i))
    counts = [base] * pp
    for i in order[:extra]:
        counts[i] += 1
    counts[0] -= lead
    counts[-1] -= tail
    return counts


def chunk_sizes(num_layers: int, vp: int, *, lead: int = 0, tail: int = 0) -> list[int]:
    """Layers of each of a stage's `vp` interleaved chunks: its layers and `lead` (`tail`)
    slots (the embedding before its first chunk's layers, the loss after its last's:
    `split_layers`) as even as possible, extra to the first chunks; a slot takes a layer's
    place (Megatron-Core subtracts it from the first / last virtual stage)."""
    base, extra = divmod(num_layers + lead + tail, vp)
    sizes = [base + (1 if c < extra else 0) for c in range(vp)]
    sizes[0] -= lead
    sizes[-1] -= tail
    return sizes


@cache
def stage_layer_ranges(counts: tuple[int, ...], vp: int = 1, *, lead: int = 0,
                       tail: int = 0) -> tuple[tuple[range, ...], ...]:
    """The model's layers each stage of `counts` layers holds, chunk by chunk: chunk c of
    stage s is model chunk c * pp + s, each stage's layers split by `chunk_sizes` with the
    embedding's `lead` and the loss's `tail` slots on the first and last stage (as the
    executor, the simulator and the exports lay them out; vp = 1: stages in order)."""
    pp = len(counts)
    sizes = [chunk_sizes(n, vp, lead=lead if s == 0 else 0, tail=tail if s == pp - 1 else 0)
             for s, n in enumerate(counts)]
    out: list[list[range]] = [[] for _ in counts]
    start = 0
    for c in range(vp):
        for s in range(pp):
            out[s].append(range(start, start + sizes[s][c]))
            start += sizes[s][c]
    return tuple(tuple(chunks) for chunks in out)


@cache
def stage_moe_layers(model: ModelSpec, counts: tuple[int, ...], vp: int = 1, *,
                     lead: int = 0, tail: int = 0) -> tuple[int | None, ...]:
    """MoE layers among each stage's (`stage_layer_ranges`), for a model whose layers are
    not all alike (dense layers first or between MoE ones: DeepSeek-V3's first three,
    Llama 4 Maverick's every other); None for each stage where they are (a dense model,
    or MoE in every layer), whose stages the model's average layer prices exactly."""
    if model.moe_layer_fraction in (0.0, 1.0):
        return (None,) * len(counts)
    return tuple(sum(model.is_moe_layer(i) for r in chunks for i in r)
                 for chunks in stage_layer_ranges(counts, vp, lead=lead, tail=tail))


def pipeline_moe_layers(plan: Plan, pipeline: Pipeline) -> tuple[int | None, ...]:
    """`stage_moe_layers` of one of the plan's pipelines, with its chunks and slots."""
    tr = plan.training
    return stage_moe_layers(plan.model, tuple(s.num_layers for s in pipeline.stages),
                            tr.virtual_stages, lead=int(tr.embedding_in_pipeline_split),
                            tail=int(tr.loss_in_pipeline_split))


def megatron_devices(*, tp: int, cp: int, dp: int, pp: int
                     ) -> list[list[tuple[int, ...]]]:
    """GPUs of each replica's stages ([replica][stage]) in Megatron-LM's rank order: tp
    fastest, then cp, then dp, then pp (so a stage's tp group is inside a node and
    pipeline stages span nodes)."""
    width = tp * cp
    return [[tuple(range(p * width * dp + d * width, p * width * dp + (d + 1) * width))
             for p in range(pp)] for d in range(dp)]


def homogeneous_plan(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, *,
                     kernels: Kernels | None = None) -> Plan:
    """The explicit Plan of a homogeneous layout (validate with `check_parallel` first)."""
    bounds = [0]
    for count in split_layers(model.num_layers, cfg.pp,
                              lead=int(cfg.embedding_in_pipeline_split),
                              tail=int(cfg.loss_in_pipeline_split)):
        bounds.append(bounds[-1] + count)
    devices = megatron_devices(tp=cfg.tp, cp=cfg.cp, dp=cfg.dp, pp=cfg.pp)
    pipelines = []
    for d in range(cfg.dp):
        stages = tuple(Stage(layers=(bounds[p], bounds[p + 1]), devices=devices[d][p],
                             tp=cfg.tp, cp=cfg.cp, recompute=cfg.recompute)
                       for p in range(cfg.pp))
        pipelines.append(Pipeline(stages=stages, micro_batch_size=cfg.mbs,
                                  num_microbatches=cfg.num_microbatches))
    # Sequence parallelism splits along the tp group; with tp 1 it is a no-op (as in Megatron).
    training = Training(global_batch_size=cfg.gbs, seq_len=cfg.seq_len, dtype=cfg.dtype,
                        sequence_parallel=cfg.sequence_parallel and cfg.tp > 1,
                        schedule=cfg.schedule.for_chunks(cfg.vp), virtual_stages=cfg.vp,
                        ep=cfg.ep, etp=None if cfg.etp == cfg.tp else cfg.etp,
                        ep_layout=cfg.ep_layout,
                        recompute_modules=cfg.recompute_modules,
                        embedding_in_pipeline_split=cfg.embedding_in_pipeline_split,
                        loss_in_pipeline_split=cfg.loss_in_pipeline_split,
                        model_states=cfg.model_states, fp8_params=cfg.fp8_params,
                        comm=cfg.comm)
    plan = Plan(model=model, cluster=cluster, training=training, pipelines=tuple(pipelines),
                sharding=cfg.sharding,
                kernels=kernels or Kernels(attention=cluster.node_groups[0].device
                                           .default_attention(cfg.dtype,
                                                              dropout=model.drops_attention)))
    plan.check("plan")
    return plan
