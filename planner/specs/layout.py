"""Homogeneous parallel configurations (tp, pp, dp, cp, vp, batch) and the Plan they make.

`ParallelConfig` holds the knobs of one homogeneous layout; `homogeneous_plan` turns it
into an explicit Plan. Ranks are laid out as Megatron-LM does (tp fastest, then cp, then
dp, then pp), so tensor-parallel groups sit inside a node and pipeline stages span nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import (
    Kernels,
    Pipeline,
    Plan,
    Recompute,
    Sharding,
    Stage,
    TrainDType,
    Training,
)
from profiler.schema import at, fail, spec_field

__all__ = ["SCHEDULES", "ParallelConfig", "check_parallel", "check_tp", "homogeneous_plan",
           "sharding_preset", "split_layers"]

# Schedules of a homogeneous layout (with vp > 1, 1f1b is interleaved 1F1B); zb-h1 is the
# zero-bubble schedule of Qi et al. 2024 (needs pp > 1, vp = 1).
SCHEDULES = ("1f1b", "gpipe", "zb-h1")


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
    recompute: Recompute = "none"
    sequence_parallel: bool = False
    sharding: Sharding = Sharding()
    dtype: TrainDType = "bf16"
    schedule: str = "1f1b"  # 1f1b | gpipe | zb-h1; vp > 1 means interleaved 1F1B

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)


def sharding_preset(name: str, dp: int) -> Sharding:
    """ZeRO stages as points of the AMSP space."""
    return {
        "none": Sharding(),
        "zero1": Sharding(optim=dp),
        "zero2": Sharding(grads=dp, optim=dp),
        "zero3": Sharding(params=dp, grads=dp, optim=dp),
    }[name]


def check_tp(model: ModelSpec, tp: int, *, where: str = "--tp") -> None:
    """Tensor parallelism splits the heads: tp must divide them (and the K/V heads, or be
    a multiple of them, which are then replicated), and the MLP's inner size (Megatron-LM's
    column-parallel fc1; the vocabulary is padded instead)."""
    if model.num_heads % tp:
        fail(where, tp, f"must divide num_heads {model.num_heads}")
    if model.kv_heads % tp and tp % model.kv_heads:
        fail(where, tp, f"must divide num_kv_heads {model.kv_heads} or be a multiple of it")
    if model.ffn_hidden_size % tp:
        fail(where, tp, f"must divide ffn_hidden_size {model.ffn_hidden_size}")


def check_parallel(cfg: ParallelConfig, model: ModelSpec, cluster: ClusterSpec, *,
                   where: str = "--") -> None:
    """Reject configurations that cannot run, naming the knob (a SpecError)."""
    check_tp(model, cfg.tp, where=at(where, "tp"))
    if cfg.pp * cfg.vp > model.num_layers:
        fail(at(where, "pp"), cfg.pp,
             f"pp*vp = {cfg.pp * cfg.vp} model chunks need at least that many layers "
             f"(the model has {model.num_layers})")
    if cfg.num_gpus != cluster.num_gpus:
        fail(at(where, "dp"), cfg.dp,
             f"tp*pp*dp*cp = {cfg.tp}*{cfg.pp}*{cfg.dp}*{cfg.cp} = {cfg.num_gpus} must equal "
             f"the cluster's {cluster.num_gpus} GPUs")
    if cfg.gbs % (cfg.mbs * cfg.dp):
        fail(at(where, "gbs"), cfg.gbs, f"must be a multiple of mbs*dp = {cfg.mbs * cfg.dp}")
    if cfg.cp > 1 and cfg.seq_len % (2 * cfg.cp):
        fail(at(where, "cp"), cfg.cp, f"2*cp must divide the sequence length {cfg.seq_len}")
    if cfg.schedule not in SCHEDULES:
        fail(at(where, "schedule"), cfg.schedule, f"allowed: {', '.join(SCHEDULES)}")
    if cfg.schedule == "zb-h1" and (cfg.pp == 1 or cfg.vp > 1):
        fail(at(where, "schedule"), cfg.schedule,
             f"zb-h1 needs pp > 1 and vp = 1 (here pp {cfg.pp}, vp {cfg.vp}); "
             f"allowed here: {'1f1b' if cfg.vp > 1 else '1f1b, gpipe'}")
    if cfg.vp > 1 and (cfg.pp == 1 or cfg.schedule != "1f1b"):
        fail(at(where, "vp"), cfg.vp, "interleaving needs pp > 1 and the 1f1b schedule")
    if cfg.vp > 1 and not cfg.gbs % (cfg.mbs * cfg.dp) and (cfg.gbs // (cfg.mbs * cfg.dp)) % cfg.pp:
        fail(at(where, "vp"), cfg.vp, f"interleaving needs micro-batches per pipeline "
             f"(gbs/(mbs*dp) = {cfg.gbs // (cfg.mbs * cfg.dp)}) to be a multiple of pp = {cfg.pp}")
    for name in ("params", "grads", "optim"):
        size = getattr(cfg.sharding, name)
        if cfg.dp % size:
            fail(at(where, f"shard_{name}"), size, f"must divide dp = {cfg.dp}")


def split_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per stage: as even as possible, extra layers to the middle stages (the first
    holds the most activations under 1F1B, the last computes the logits)."""
    base, extra = divmod(num_layers, pp)
    order = sorted(range(pp), key=lambda i: (abs(i - (pp - 1) / 2), i))
    counts = [base] * pp
    for i in order[:extra]:
        counts[i] += 1
    return counts


def homogeneous_plan(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, *,
                     kernels: Kernels | None = None) -> Plan:
    """The explicit Plan of a homogeneous layout (validate with `check_parallel` first)."""
    per_stage = cfg.tp * cfg.cp
    bounds = [0]
    for count in split_layers(model.num_layers, cfg.pp):
        bounds.append(bounds[-1] + count)
    pipelines = []
    for d in range(cfg.dp):
        stages = []
        for p in range(cfg.pp):
            first = p * per_stage * cfg.dp + d * per_stage
            stages.append(Stage(layers=(bounds[p], bounds[p + 1]),
                                devices=tuple(range(first, first + per_stage)),
                                tp=cfg.tp, cp=cfg.cp, recompute=cfg.recompute))
        pipelines.append(Pipeline(stages=tuple(stages), micro_batch_size=cfg.mbs,
                                  num_microbatches=cfg.num_microbatches))
    schedule = "interleaved-1f1b" if cfg.vp > 1 else cfg.schedule
    # Sequence parallelism splits along the tp group; with tp 1 it is a no-op (as in Megatron).
    training = Training(global_batch_size=cfg.gbs, seq_len=cfg.seq_len, dtype=cfg.dtype,
                        sequence_parallel=cfg.sequence_parallel and cfg.tp > 1,
                        schedule=schedule,  # type: ignore[arg-type]
                        virtual_stages=cfg.vp)
    plan = Plan(model=model, cluster=cluster, training=training, pipelines=tuple(pipelines),
                sharding=cfg.sharding, kernels=kernels or Kernels())
    plan.check("plan")
    return plan
