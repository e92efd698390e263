"""The nearest plan a framework expresses (`plan export --approximate`).

Only settings change: the schedule (and the schedules per step), interleaving, sequence parallelism, model-state
sharding (and fp32 master weights, and the dtype gradients are kept in), recompute, the layer split, which ranks an ep group is, dtype, the
attention kernel and how the framework communicates (`Training.comm`). The GPUs, the
replicas and their batch shares stay, so a plan whose structure the framework lacks
(mixed GPU types, unlike replicas, tp per stage, context parallelism it does not have)
has no approximation here: that needs a new search for the framework.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from planner.export.frameworks import (
    FrameworkCapabilities,
    comm_differences,
    comm_value,
    matches_pattern,
    model_states_differ,
    plan_shape,
)
from planner.specs.choices import DType, EpLayout, Recompute
from planner.specs.cluster import runs_dtype
from planner.specs.layout import split_layers
from planner.specs.plan import Kernels, Pipeline, Plan, Sharding, Training
from planner.specs.rules import sp_problem
from profiler.kernels import Attention

__all__ = ["nearest"]

_HEAVIER = ("none", "selective", "full")  # recompute, lightest first


def nearest(plan: Plan, caps: FrameworkCapabilities) -> tuple[Plan, list[str]]:
    """The nearest plan `caps` can express, and one line per change (the plan itself and
    no lines when nothing needs to change; check the result with `unsupported`)."""
    changes: list[str] = []
    for step in (_schedule, _sequence_parallel, _master_weights, _ep_layout, _sharding,
                 _recompute, _even_split, _kernels, _model_states, _communication):
        plan = step(plan, caps, changes)
    plan.check("plan")
    return plan, changes


def _training(plan: Plan, **kw: Any) -> Plan:
    return replace(plan, training=replace(plan.training, **kw))


def _schedule(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    if plan.training.pipeline_flushes > 1:  # every exporter runs one schedule per step
        changes.append(f"{plan.training.pipeline_flushes} pipeline schedules per step -> 1")
        plan = _training(plan, pipeline_flushes=1)
    tr = plan.training
    if tr.schedule in caps.schedules and (tr.virtual_stages == 1 or "vp" in caps.parallelisms):
        return plan
    to = "1f1b" if "1f1b" in caps.schedules else sorted(caps.schedules)[0]
    changes.append(f"schedule {tr.schedule}{f' vp {tr.virtual_stages}' if tr.virtual_stages > 1 else ''}"
                   f" -> {to}")
    return _training(plan, schedule=to, virtual_stages=1)


def _sequence_parallel(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    sp, tp = plan.training.sequence_parallel, plan_shape(plan).tp
    if sp and caps.sequence_parallel == "never":
        changes.append("sequence parallelism -> off")
        return _training(plan, sequence_parallel=False)
    if not sp and tp > 1 and caps.sequence_parallel == "with tp" and not any(
            sp_problem(plan.training.seq_len, s.tp, s.cp) for p in plan.pipelines
            for s in p.stages):  # else unsupported: tp does not split the sequence evenly
        changes.append("sequence parallelism -> on (tp > 1)")
        return _training(plan, sequence_parallel=True)
    return plan


def _candidates(caps: FrameworkCapabilities, dp: int, pp: int) -> list[Sharding]:
    patterns = caps.sharding_with_pp if pp > 1 and caps.sharding_with_pp else caps.sharding
    sizes = [k for k in range(1, dp + 1) if dp % k == 0]
    out = []
    for p in sizes:
        for g in (x for x in sizes if x % p == 0):
            for o in (x for x in sizes if x % g == 0):
                if any(matches_pattern((p, g, o), pat, dp) for pat in patterns):
                    out.append(Sharding(params=p, grads=g, optim=o))
    return out


def _master_weights(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    """16-bit states without an fp32 master copy -> the framework's mixed precision (more
    memory per parameter: 18 bytes instead of 8, `costs/memory.model_state_bytes`)."""
    tr = plan.training
    if tr.master_weights or not DType(tr.dtype).master_weights or caps.without_master_weights:
        return plan
    changes.append("no fp32 master weights -> fp32 master weights, gradients and Adam moments")
    return _training(plan, master_weights=True)


def _model_states(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    """The framework's rule for the model states (`Training.model_states`): the layout
    stays, the memory per parameter changes (2 bytes of each gradient more or less,
    `costs/memory.state_bytes_per_param`). After `_master_weights` and `_kernels`, which
    decide whether the rules differ at all."""
    states = plan.training.model_states
    if states == caps.model_states or not model_states_differ(plan):
        return plan
    changes.append(f"model states {states} -> {caps.model_states} (gradients in "
                   f"{'fp32' if caps.model_states == 'fp32_grads' else 'the training dtype'})")
    return _training(plan, model_states=caps.model_states)


def _communication(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    """The framework's way of communicating where the plan's differs and its config cannot
    say so (`comm_differences`: pipeline sends, when gradients are reduced, their dtype and
    buckets); the layout stays, the times change. Last: the other steps decide which
    settings price the plan at all."""
    differ = comm_differences(plan, caps)
    if not differ:
        return plan
    theirs = caps.communication(plan.training.dtype)
    for key, mine, value in differ:
        changes.append(f"comm.{key} {comm_value(mine)} -> {comm_value(value)}")
    return _training(plan, comm=replace(plan.training.comm, **{
        key: getattr(theirs, key) for key, _, _ in differ}))


def _ep_layout(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    """The framework's ep groups: data-parallel replicas for trainplan's executor (where ep
    divides dp), Megatron-Core's folding for the others; nothing changes where the two are
    the same groups (`EpLayout.folded_ranks` 1)."""
    tr = plan.training
    want = caps.ep_layout
    if tr.ep == 1 or tr.ep_layout == want or plan.dp % tr.ep:
        return plan
    if all(EpLayout.FOLDED.folded_ranks(tp=st.tp, cp=st.cp, etp=tr.etp) == 1
           for p in plan.pipelines for st in p.stages):
        return plan
    changes.append(f"ep groups {tr.ep_layout} -> {want}")
    return _training(plan, ep_layout=want)


def _sharding(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    """The expressible sharding that shards every state at least as much (so memory does
    not grow) and is nearest in log2 group sizes; else the nearest of all."""
    s = plan_shape(plan)
    per_stage = len(plan.shardings) > 1 and not caps.per_stage_sharding
    sh = plan.sharding  # with stage_sharding: the most sharded stage's
    have = (sh.params, sh.grads, sh.optim)
    options = _candidates(caps, s.dp * s.cp, s.pp)  # sizes count dp x cp ranks
    if not per_stage and any(have == (c.params, c.grads, c.optim) for c in options):
        return plan

    def distance(c: Sharding) -> tuple[bool, float, int]:
        got = (c.params, c.grads, c.optim)
        return (any(g < h for g, h in zip(got, have, strict=True)),
                sum(abs(math.log2(g) - math.log2(h)) for g, h in zip(got, have, strict=True)),
                -sum(got))

    best = min(options, key=distance) if options else sh
    changes.append(f"sharding {plan.sharding_label} -> P/G/OS "
                   f"{best.params}/{best.grads}/{best.optim}")
    return replace(plan, sharding=best, stage_sharding=None)


def _recompute(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    modes = plan_shape(plan).recompute
    need = max(modes, key=_HEAVIER.index) if not caps.per_stage_recompute else None
    target = {m: need or m for m in modes}
    for m, t in target.items():
        if t not in caps.recompute:  # the next heavier it has, else the next lighter
            order = _HEAVIER[_HEAVIER.index(t):] + _HEAVIER[_HEAVIER.index(t)::-1]
            target[m] = next(x for x in order if x in caps.recompute)
    if all(m == t for m, t in target.items()):
        return plan
    changes.append(f"recompute {', '.join(modes)} -> {', '.join(dict.fromkeys(target.values()))}")
    pipes = tuple(replace(p, stages=tuple(replace(st, recompute=Recompute(target[st.recompute]))
                                          for st in p.stages)) for p in plan.pipelines)
    return replace(plan, pipelines=pipes)


def _even_split(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    s = plan_shape(plan)
    chunks = s.pp * s.vp
    if caps.uneven_stages or not s.replicas_alike or plan.model.num_layers % chunks:
        return plan  # nothing to do, or no even split exists: the refusal stays
    even = split_layers(plan.model.num_layers, s.pp)
    if list(s.layers) == even:
        return plan
    bounds = [0]
    for n in even:
        bounds.append(bounds[-1] + n)
    changes.append(f"layers per stage {list(s.layers)} -> {even}")
    pipes = tuple(Pipeline(stages=tuple(replace(st, layers=(bounds[i], bounds[i + 1]))
                                        for i, st in enumerate(p.stages)),
                           micro_batch_size=p.micro_batch_size,
                           num_microbatches=p.num_microbatches) for p in plan.pipelines)
    return replace(plan, pipelines=pipes)


def _kernels(plan: Plan, caps: FrameworkCapabilities, changes: list[str]) -> Plan:
    tr: Training = plan.training
    # a dtype every GPU type of the plan runs (a V100 has no bf16); none: the dtype stays,
    # and `unsupported` names it
    devices = {plan.group_of(st).device for p in plan.pipelines for st in p.stages}
    runnable = [d for d in ("bf16", *sorted(caps.dtypes)) if d in caps.dtypes
                and all(runs_dtype(dev, d) for dev in devices)]
    if tr.dtype not in caps.dtypes and runnable:
        changes.append(f"dtype {tr.dtype} -> {runnable[0]}")
        plan = _training(plan, dtype=runnable[0])
    k: Kernels = plan.kernels
    if k.attention not in caps.attention:
        to = "flash" if "flash" in caps.attention else sorted(caps.attention)[0]
        changes.append(f"attention kernel {k.attention} -> {to}")
        plan = replace(plan, kernels=replace(k, attention=Attention(to)))
    return plan
