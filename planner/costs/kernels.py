"""Kernel selection: which attention and optimizer implementation a plan uses.

Each GPU type runs its own attention kernel: the fastest its PyTorch runs for the
training dtype (flash where supported, memory-efficient elsewhere; FlashAttention needs
16-bit inputs on GPUs; math, Megatron-LM's unfused softmax between two batched GEMMs,
only when asked). `--attention` asks for one kernel everywhere; a measured profile
(`fastest_kernels`) picks the fastest it timed. The fused AdamW everywhere unless a
profile says otherwise. The published runs the analytic model was calibrated against
name their own kernels (planner/calibration/published.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.costs.compute import ComputeCosts, profiled_op_time_s
from planner.costs.memory import rank_param_count
from planner.costs.workload import Op, layer_work, optimizer_work
from planner.specs.layout import pipeline_moe_layers
from planner.specs.plan import Kernels, Plan
from profiler.devices import DeviceSpec
from profiler.kernels import Attention, OptimizerKernel
from profiler.schema import fail
from profiler.store import Profile, Profiles

__all__ = ["attention_for", "default_kernels", "fastest_kernels", "supported_attention"]


def supported_attention(dev: DeviceSpec, dtype: str, *, dropout: bool = False
                        ) -> tuple[Attention, ...]:
    """The attention kernels `dev` runs in `dtype` for a model with or without attention
    `dropout`, fastest first (`DeviceSpec.attention_in`)."""
    return dev.attention_in(dtype, dropout=dropout)


def attention_for(dev: DeviceSpec, dtype: str, asked: Attention | str | None = None, *,
                  where: str = "--attention", dropout: bool = False) -> Attention:
    """The kernel `dev` runs: the one asked for if it can, else its fastest (an asked
    kernel it cannot run is a SpecError naming the device)."""
    if asked is None:
        return dev.default_attention(dtype, dropout=dropout)
    kernels = supported_attention(dev, dtype, dropout=dropout)
    if asked not in kernels:
        fail(where, asked, f"{dev.name} runs {', '.join(kernels)} in {dtype}")
    return Attention(asked)


def default_kernels(devices: Sequence[DeviceSpec], *, dtype: str = "bf16",
                    attention: Attention | str | None = None,
                    where: str = "--attention", dropout: bool = False) -> Kernels:
    """The kernels of a plan on `devices`: the attention asked for (every device must run
    it), else the first device's own (a mixed plan gives each stage its own:
    `attention_for`)."""
    chosen = [attention_for(d, dtype, attention, where=where, dropout=dropout) for d in devices]
    return Kernels(attention=chosen[0])


def _attention_s(plan: Plan, profile: Profile, attention: str) -> float | None:
    """Forward plus backward op time of the first stage's layer with `attention`, or None
    if the profile did not measure that backend's attention ops."""
    from planner.costs.stages import plan_replicas, plan_runs, replica_specs, workload_shape

    stages = plan_replicas(plan)[0]
    spec = replica_specs(plan.cluster, stages, groups=None,
                         shardings=[plan.sharding] * len(stages))[0]
    shape = replace(workload_shape(spec, plan_runs(plan)[0]), attention=attention)
    work = layer_work(plan.model, shape)
    ops = [op for op in (*work.forward, *work.backward) if isinstance(op, Op)]
    core = [op for op in work.attention_core if isinstance(op, Op)]  # the backend's ops
    dev = _first_device(plan)
    if any(profiled_op_time_s(profile, dev, shape.dtype, op) is None for op in core):
        return None
    costs = ComputeCosts(dev, shape.dtype, profile)
    return sum(costs.time_s(op) for op in ops)


def _optimizer_s(plan: Plan, profile: Profile, implementation: str) -> float | None:
    stage = plan.pipelines[0].stages[0]
    pp = len(plan.pipelines[0].stages)
    params = rank_param_count(plan.model, num_layers=stage.num_layers, first=True,
                              last=pp == 1, tp=stage.tp, pp=pp,
                              moe_layers=pipeline_moe_layers(plan, plan.pipelines[0])[0]
                              ) / plan.sharding_of(0).optim
    op = optimizer_work(params, dtype=plan.training.dtype, implementation=implementation,
                        num_tensors=max(1, 6 * stage.num_layers),
                        master_weights=plan.training.master_weights)
    return profiled_op_time_s(profile, _first_device(plan), plan.training.dtype, op)


def _first_device(plan: Plan) -> DeviceSpec:
    """The GPU type of the plan's first stage."""
    return plan.group_of(plan.pipelines[0].stages[0]).device


def fastest_kernels(plan: Plan, profiles: Profiles, *, keep_attention: bool = False) -> Kernels:
    """The plan's kernels, with each alternative the profile of its first stage's GPU
    measured replaced by the fastest valid one: attention backends the GPUs support
    (fused only with context parallelism), AdamW implementations. A kernel is replaced only
    where the profile measured it too: a profile of other backends alone says nothing of
    how the plan's own compares (its time would be the analytic model's, not measured)."""
    profile = profiles.get(_first_device(plan).name)
    kernels = plan.kernels
    if profile is None:
        return kernels
    valid = [k for k in Attention
             if all(k in supported_attention(g.device, plan.training.dtype,
                                             dropout=plan.model.drops_attention)
                    for g in plan.cluster.node_groups)
             and (k.fused or all(s.cp == 1 for p in plan.pipelines for s in p.stages))]
    if not keep_attention:
        attention = {k: t for k in valid if (t := _attention_s(plan, profile, k)) is not None}
        if kernels.attention in attention:
            kernels = replace(kernels, attention=min(attention, key=attention.__getitem__))
    optimizer = {k: t for k in OptimizerKernel if (t := _optimizer_s(plan, profile, k)) is not None}
    if kernels.optimizer in optimizer:
        kernels = replace(kernels, optimizer=min(optimizer, key=optimizer.__getitem__))
    return kernels
