"""Kernel selection: which attention and optimizer implementation a plan uses.

`--attention` (or a measured profile) decides. With a profile that measured several
attention backends or AdamW implementations, `fastest_kernels` picks the fastest of those
the plan's GPUs can run and the profile holds (priced with the same cost model the
simulation uses), and the plan records it for the executor. Without either, the analytic model
assumes the attention kernel of the published runs it was calibrated against on that
GPU generation (docs/calibration.md): Megatron-LM's fused softmax around two batched
GEMMs ("math") on Volta and Ampere, as in the Megatron-LM and Korthikanti et al. runs
and vTrain's A100 measurements; fused flash attention on Hopper and newer, as
Megatron-Core with Transformer Engine runs there. The fused AdamW everywhere.
"""

from __future__ import annotations

from dataclasses import replace

from planner.costs.compute import ComputeCosts, measured_op_time_s
from planner.costs.memory import rank_param_count
from planner.costs.workload import Op, layer_work, optimizer_work
from planner.specs.plan import Kernels, Plan
from profiler.devices import DeviceSpec
from profiler.kernels import Attention, OptimizerKernel
from profiler.schema import fail
from profiler.store import Profile, Profiles

__all__ = ["ATTENTION_SUPPORT", "CALIBRATED_ATTENTION", "default_kernels", "fastest_kernels"]

# Attention backends each architecture can run (PyTorch SDPA: flash needs sm80+).
ATTENTION_SUPPORT: dict[str, tuple[str, ...]] = {
    "volta": ("memory_efficient", "math"),
    "turing": ("memory_efficient", "math"),
    "ampere": ("flash", "memory_efficient", "math"),
    "ada": ("flash", "memory_efficient", "math"),
    "hopper": ("flash", "memory_efficient", "math"),
    "blackwell": ("flash", "memory_efficient", "math"),
    "cdna2": ("memory_efficient", "math"),
    "cdna3": ("flash", "memory_efficient", "math"),
    "cpu": ("flash", "math"),
}


# The attention kernel the calibration data of each generation used (see module doc).
CALIBRATED_ATTENTION: dict[str, str] = {"volta": "math", "turing": "math", "ampere": "math"}


def default_kernels(devices: list[DeviceSpec], *, attention: str | None = None,
                    where: str = "--attention") -> Kernels:
    """The kernels a plan uses: the one asked for if every device supports it, else the
    calibrated assumption for the plan's GPUs (see the module doc)."""
    common = [k for k in ("flash", "memory_efficient", "math")
              if all(k in ATTENTION_SUPPORT.get(d.arch, ("math",)) for d in devices)]
    if attention is None:
        assumed = [CALIBRATED_ATTENTION.get(d.arch) for d in devices]
        choice = "math" if "math" in assumed else common[0]
        return Kernels(attention=choice)  # type: ignore[arg-type]  # a member name from the registry
    if attention not in common:
        names = ", ".join(sorted({d.name for d in devices}))
        fail(where, attention, f"{names} support {', '.join(common)}")
    return Kernels(attention=attention)  # type: ignore[arg-type]  # checked against the registry above


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
    core = [op for op in work.selective_recompute if isinstance(op, Op)]  # the backend's ops
    if any(measured_op_time_s(profile, op) is None for op in core):
        return None
    costs = ComputeCosts(_first_device(plan).name, shape.dtype, profile)
    return sum(costs.time_s(op) for op in ops)


def _optimizer_s(plan: Plan, profile: Profile, implementation: str) -> float | None:
    stage = plan.pipelines[0].stages[0]
    pp = len(plan.pipelines[0].stages)
    params = rank_param_count(plan.model, num_layers=stage.num_layers, first=True,
                              last=pp == 1, tp=stage.tp, pp=pp) / plan.sharding_of(0).optim
    op = optimizer_work(params, dtype=plan.training.dtype, implementation=implementation,
                        num_tensors=max(1, 6 * stage.num_layers))
    return measured_op_time_s(profile, op)


def _first_device(plan: Plan) -> DeviceSpec:
    """The GPU type of the plan's first stage."""
    slot = plan.cluster.slots[plan.pipelines[0].stages[0].devices[0]]
    return plan.cluster.node_groups[slot.group].device


def fastest_kernels(plan: Plan, profiles: Profiles, *, keep_attention: bool = False) -> Kernels:
    """The plan's kernels, with each alternative the profile of its first stage's GPU
    measured replaced by the fastest valid one: attention backends the GPUs support
    (fused only with context parallelism), AdamW implementations."""
    profile = profiles.get(_first_device(plan).name)
    kernels = plan.kernels
    if profile is None:
        return kernels
    archs = {g.device.arch for g in plan.cluster.node_groups}
    valid = [k for k in ("flash", "memory_efficient", "math")
             if all(k in ATTENTION_SUPPORT.get(a, ("math",)) for a in archs)
             and (Attention(k).fused or all(s.cp == 1 for p in plan.pipelines for s in p.stages))]
    if not keep_attention:
        timed = {k: t for k in valid if (t := _attention_s(plan, profile, k)) is not None}
        if timed:
            kernels = replace(kernels, attention=Attention(min(timed, key=timed.__getitem__)))
    timed = {k: t for k in ("fused", "foreach", "for_loop")
             if (t := _optimizer_s(plan, profile, k)) is not None}
    if timed:
        kernels = replace(kernels,
                          optimizer=OptimizerKernel(min(timed, key=timed.__getitem__)))
    return kernels
