"""A Plan in the configuration language of the frameworks people train with.

Each exporter returns the text and the list of what the framework cannot express (the
text then covers what it can). A plan must be homogeneous to export: every replica with
the same stages on the same GPU type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from planner.specs.plan import Plan

__all__ = ["Export", "FORMATS", "export_plan"]


@dataclass(frozen=True)
class Export:
    text: str
    unsupported: tuple[str, ...]


@dataclass(frozen=True)
class _Shape:
    """The homogeneous knobs of a plan."""

    tp: int
    pp: int
    dp: int
    cp: int
    vp: int
    mbs: int
    gbs: int
    seq: int
    recompute: str
    layers: tuple[int, ...]  # per stage


def _shape(plan: Plan) -> tuple[_Shape, list[str]]:
    issues = []
    first = plan.pipelines[0]
    stages = first.stages
    if any([(s.layers, s.tp, s.cp) for s in p.stages] != [(s.layers, s.tp, s.cp) for s in stages]
           or p.micro_batch_size != first.micro_batch_size
           or p.num_microbatches != first.num_microbatches for p in plan.pipelines[1:]):
        issues.append("replicas differ (heterogeneous pipelines or micro-batch counts)")
    if len({s.recompute for s in stages}) > 1:
        issues.append("recompute differs between stages")
    if len({s.tp for s in stages}) > 1 or len({s.cp for s in stages}) > 1:
        issues.append("tp or cp differs between stages")
    if len(plan.shardings) > 1:
        issues.append(f"model-state sharding differs between stages ({plan.sharding_label}); "
                      "exported with the plan's overall sharding")
    tr = plan.training
    return _Shape(tp=stages[0].tp, pp=len(stages), dp=plan.dp, cp=stages[0].cp,
                  vp=tr.virtual_stages, mbs=first.micro_batch_size, gbs=tr.global_batch_size,
                  seq=tr.seq_len, recompute=stages[0].recompute,
                  layers=tuple(s.num_layers for s in stages)), issues


def _megatron(plan: Plan) -> Export:
    s, issues = _shape(plan)
    m, tr, sh = plan.model, plan.training, plan.sharding
    args = [
        f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}", f"--num-attention-heads {m.num_heads}",
        f"--seq-length {s.seq}", f"--max-position-embeddings {max(s.seq, m.seq_len)}",
        f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {s.pp}",
        f"--context-parallel-size {s.cp}", f"--micro-batch-size {s.mbs}",
        f"--global-batch-size {s.gbs}", {"bf16": "--bf16", "fp16": "--fp16"}.get(tr.dtype, ""),
    ]
    if m.kv_heads != m.num_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.activation == "swiglu":
        args.append("--swiglu")
    if m.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if m.position_embedding == "rope":
        args.append("--position-embedding-type rope")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if s.vp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {m.num_layers // (s.pp * s.vp)}")
        if m.num_layers % (s.pp * s.vp):
            issues.append(f"interleaving needs num_layers divisible by pp*vp = {s.pp * s.vp}")
    if tr.schedule == "zb-h1":
        issues.append(f"schedule zb-h1: upstream Megatron-LM has no zero-bubble schedule (these "
                      f"flags run 1F1B); the zero-bubble fork sail-sg/zero-bubble-pipeline-"
                      f"parallelism runs a ZB-H1-like one with --enable-zero-bubble "
                      f"--zero-bubble-max-pending-backward {s.pp}")
    if len(set(s.layers)) > 1:
        issues.append(f"uneven layers per stage {list(s.layers)} (Megatron splits evenly; "
                      "newer versions take --decoder-first/last-pipeline-num-layers)")
    if tr.sequence_parallel:
        args.append("--sequence-parallel")
    if s.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif s.recompute == "selective":
        args.append("--recompute-granularity selective")
    if plan.kernels.attention == "flash":
        args.append("--use-flash-attn")
    if (sh.params, sh.grads) == (1, 1) and sh.optim == s.dp and s.dp > 1:
        args.append("--use-distributed-optimizer")
    elif (sh.params, sh.grads, sh.optim) != (1, 1, 1):
        issues.append(f"sharding P/G/OS {sh.params}/{sh.grads}/{sh.optim}: Megatron-LM shards "
                      "only optimizer states over the whole data-parallel group "
                      "(--use-distributed-optimizer)")
    return Export(" \\\n    ".join(a for a in args if a) + "\n", tuple(issues))


def _deepspeed(plan: Plan) -> Export:
    s, issues = _shape(plan)
    sh, tr = plan.sharding, plan.training
    config: dict = {
        "train_batch_size": s.gbs,
        "train_micro_batch_size_per_gpu": s.mbs,
        "gradient_accumulation_steps": s.gbs // (s.mbs * s.dp),
        "gradient_clipping": 1.0,
    }
    if tr.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif tr.dtype == "fp16":
        config["fp16"] = {"enabled": True}
    stage, zero = _zero_stage(sh, s.dp)
    if stage is None:
        issues.append(f"sharding P/G/OS {sh.params}/{sh.grads}/{sh.optim}: DeepSpeed expresses "
                      "ZeRO-1/2/3 over the data-parallel group and MiCS (all three within a "
                      "group); this mix is not among them")
    else:
        config["zero_optimization"] = {"stage": stage, **zero}
    if s.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": tr.sequence_parallel,
                                              "contiguous_memory_optimization": False}
        if s.recompute == "selective":
            issues.append("selective recompute: DeepSpeed checkpoints whole layers (full)")
    if s.tp > 1 or s.pp > 1 or s.cp > 1:
        issues.append(f"tp {s.tp}, pp {s.pp}, cp {s.cp} are set in the model code (Megatron-"
                      "DeepSpeed's --tensor/--pipeline-model-parallel-size), not in this JSON")
    if s.vp > 1:
        issues.append("interleaved pipeline stages are not available in DeepSpeed")
    if tr.schedule == "zb-h1":
        issues.append("schedule zb-h1 is a Megatron-DeepSpeed flag (--enable-zbh1-pipeline), "
                      "not set in this JSON")
    return Export(json.dumps(config, indent=2) + "\n", tuple(issues))


def _zero_stage(sh: object, dp: int) -> tuple[int | None, dict]:
    p, g, o = sh.params, sh.grads, sh.optim  # type: ignore[attr-defined]
    if (p, g, o) == (1, 1, 1):
        return 0, {}
    if (p, g) == (1, 1) and o == dp:
        return 1, {}
    if p == 1 and g == o == dp:
        return 2, {}
    if p == g == o == dp:
        return 3, {}
    if p == g == o:
        return 3, {"mics_shard_size": p, "mics_hierarchical_params_gather": True}
    return None, {}


def _torchtitan(plan: Plan) -> Export:
    s, issues = _shape(plan)
    sh, tr = plan.sharding, plan.training
    if (sh.params, sh.grads, sh.optim) == (1, 1, 1):
        shard, replicate = 1, s.dp
    elif sh.params == sh.grads == sh.optim:
        shard, replicate = sh.params, s.dp // sh.params  # FSDP2, or HSDP across groups
    else:
        shard, replicate = sh.optim, s.dp // sh.optim
        issues.append(f"sharding P/G/OS {sh.params}/{sh.grads}/{sh.optim}: FSDP2 shards all "
                      f"three states together; exported as sharding all over {sh.optim}")
    # torch.distributed.pipelining's class names; ScheduleInterleavedZeroBubble is ZB-H1's
    # order (ZB1P) for any number of stages per rank
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                "zb-h1": "InterleavedZeroBubble"}
    lines = [
        "[training]", f"local_batch_size = {s.mbs}", f"global_batch_size = {s.gbs}",
        f"seq_len = {s.seq}", f'mixed_precision_param = "{"float32" if tr.dtype == "fp32" else "bfloat16"}"',
        "", "[parallelism]", f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {s.tp}",
        f"pipeline_parallel_degree = {s.pp}", f"context_parallel_degree = {s.cp}",
        f'pipeline_parallel_schedule = "{schedule[tr.schedule]}"',
        "", "[activation_checkpoint]", f'mode = "{s.recompute}"',
    ]
    if tr.dtype == "fp16":
        issues.append("fp16 with loss scaling: torchtitan trains in bf16 or fp32")
    if s.vp > 1:  # pp*vp stages, v of them on each rank
        chunks = s.pp * s.vp
        if plan.model.num_layers % chunks:
            issues.append(f"interleaving needs num_layers divisible by pp*vp = {chunks}")
        else:
            lines.insert(lines.index("[activation_checkpoint]") - 1,
                         f"pipeline_parallel_layers_per_stage = {plan.model.num_layers // chunks}")
    if tr.schedule == "zb-h1":
        issues.extend(_torchtitan_zb_h1(plan, s, lines))
    if len(set(s.layers)) > 1:
        issues.append(f"uneven layers per stage {list(s.layers)}: set pipeline splits by hand "
                      "(pipeline_parallel_split_points)")
    return Export("\n".join(lines) + "\n", tuple(issues))


def _torchtitan_zb_h1(plan: Plan, s: _Shape, lines: list[str]) -> list[str]:
    """One stage per rank under InterleavedZeroBubble (set in `lines`), and why torchtitan
    may still refuse it."""
    issues = [f"schedule zb-h1: torch.distributed.pipelining's ScheduleInterleavedZeroBubble "
              f"runs it with one stage per rank, but torchtitan requires at least 2 stages per "
              f"rank for multi-stage schedules; build the schedule with the class directly, "
              f"or use vp 2 (ZB1P over {2 * s.pp} stages, not the plan simulated)"]
    if plan.model.num_layers % s.pp == 0:
        lines.insert(lines.index("[activation_checkpoint]") - 1,
                     f"pipeline_parallel_layers_per_stage = {plan.model.num_layers // s.pp}")
    m = s.gbs // (s.mbs * s.dp)
    rounds = max(1, m // s.pp)
    if m % rounds:
        issues.append(f"{m} micro-batches: ScheduleInterleavedZeroBubble needs a multiple of "
                      f"max(1, m // pp) = {rounds}")
    return issues


FORMATS = {"megatron": _megatron, "deepspeed": _deepspeed, "torchtitan": _torchtitan}


def export_plan(plan: Plan, fmt: str) -> Export:
    return FORMATS[fmt](plan)
