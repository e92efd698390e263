"""Per-stage costs of a Plan: what one micro-batch costs on each stage, and the
data-parallel and optimizer work at the end of an iteration.

The analytic estimate and the event simulator both build on these numbers, so they
price the same work the same way.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, replace
from functools import cache

from planner.costs.comm import COMM_SOURCE, Tier, collective_time_s, group_tiers
from planner.costs.compute import ANALYTIC_SOURCE, ComputeCosts, clear_op_cache, compute_source
from planner.costs.memory import StageMemory, in_flight_chunks, rank_param_count, stage_memory
from planner.costs.workload import (
    Comm,
    LayerWork,
    Op,
    Work,
    WorkloadShape,
    embedding_work,
    head_work,
    layer_work,
    optimizer_work,
)
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Sharding, Stage
from profiler.analytic import launch_overhead_s
from profiler.devices import DeviceSpec, arch_efficiency, device, dtype_bytes
from profiler.store import Profiles

__all__ = ["BUCKET_PARAMS", "DPSync", "Part", "StageCost", "StageSetup", "clear_cost_caches",
           "cost_sources", "dp_sync", "exposed_s", "layer_parts", "layer_weight_grad",
           "plan_stage_setup", "stage_cost",
           "pipeline_key", "plan_stage_costs", "stage_device", "stage_shape"]

GRAD_BYTES = 4  # gradients are reduced in fp32 (Megatron main_grad)
BUCKET_PARAMS = 40e6  # gradient bucket size in parameters (Megatron DDP default)


@dataclass(frozen=True)
class Part:
    """Seconds on a rank's compute stream, by what they are spent on. Tensor- and
    context-parallel collectives block the compute stream (Megatron runs them in line);
    `host_s` is the GPU waiting for the host to issue kernels."""

    compute_s: float = 0.0
    tp_s: float = 0.0
    cp_s: float = 0.0
    host_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_s + self.cp_s + self.host_s

    def __add__(self, other: Part) -> Part:
        return Part(self.compute_s + other.compute_s, self.tp_s + other.tp_s,
                    self.cp_s + other.cp_s, self.host_s + other.host_s)

    def __sub__(self, other: Part) -> Part:
        return Part(self.compute_s - other.compute_s, self.tp_s - other.tp_s,
                    self.cp_s - other.cp_s, self.host_s - other.host_s)

    def __mul__(self, k: float) -> Part:
        return Part(self.compute_s * k, self.tp_s * k, self.cp_s * k, self.host_s * k)


@dataclass(frozen=True)
class StageCost:
    """One stage of one pipeline; times are per micro-batch unless named per iteration."""

    pipeline: int
    stage: int
    device: str
    num_layers: int
    num_params: float  # on one rank, before sharding
    layer_forward: Part  # one layer
    layer_backward: Part  # one layer, with its recomputation
    embed_forward: Part  # first stage only, else zero
    embed_backward: Part
    head_forward: Part  # last stage only, else zero
    head_backward: Part
    p2p_s: float  # one activation (or its gradient) to the next stage
    dp: DPSync
    optimizer_s: float  # per iteration
    memory: StageMemory
    # The weight-gradient GEMMs of one layer's backward (a share of `layer_backward`), which
    # zero-bubble schedules run apart from the rest (W); embedding and head stay whole.
    layer_weight_grad: Part = Part()

    def with_sync(self, dp: DPSync, optimizer_s: float) -> StageCost:
        """This stage under another sharding: only its data-parallel traffic and optimizer
        step change. (A shallow copy keeps the cached pass times, computed here first so
        that every copy shares them; `replace` would not.)"""
        _ = self.forward_s, self.backward_s, self.weight_grad_s
        out = copy.copy(self)
        object.__setattr__(out, "dp", dp)
        object.__setattr__(out, "optimizer_s", optimizer_s)
        return out

    @functools.cached_property
    def forward(self) -> Part:
        return self.layer_forward * self.num_layers + self.embed_forward + self.head_forward

    @functools.cached_property
    def backward(self) -> Part:
        return self.layer_backward * self.num_layers + self.embed_backward + self.head_backward

    @functools.cached_property
    def weight_grad(self) -> Part:
        """The W part of `backward` (its layers' weight gradients)."""
        return self.layer_weight_grad * self.num_layers

    @functools.cached_property
    def weight_grad_s(self) -> float:
        return self.weight_grad.total_s

    @functools.cached_property
    def forward_s(self) -> float:
        return self.forward.total_s

    @functools.cached_property
    def backward_s(self) -> float:
        return self.backward.total_s


def stage_device(plan: Plan, stage: Stage) -> DeviceSpec:
    slots = plan.cluster.slots
    return plan.cluster.node_groups[slots[stage.devices[0]].group].device


def stage_shape(plan: Plan, pipeline: int, stage: Stage) -> WorkloadShape:
    tr = plan.training
    return WorkloadShape(micro_batch_size=plan.pipelines[pipeline].micro_batch_size,
                         seq_len=tr.seq_len, tp=stage.tp, cp=stage.cp,
                         sequence_parallel=tr.sequence_parallel, dtype=tr.dtype,
                         attention=plan.kernels.attention)


def _issue_queue_s(items: list[tuple[float, int]], launch_s: float, repeats: int) -> float:
    """Wall time of `repeats` passes over `items` = (GPU seconds, kernel launches) when a
    host issues the kernels one by one (`launch_s` each) and the GPU runs them in order:
    an item starts once the GPU is free and the host has issued its first kernel, and
    lasts at least as long as the host takes to issue the rest."""
    host = gpu = 0.0
    for _ in range(repeats):
        for busy, launches in items:
            gpu = max(gpu, host + launch_s) + max(busy, (launches - 1) * launch_s)
            host += launches * launch_s
    return gpu


def _part(items: tuple[Work, ...], costs: ComputeCosts, tiers: dict[str, tuple[Tier, ...]],
          launch_s: float, *, steady: bool = False, tp_hidden: float = 0.0,
          profiles: Profiles | None = None) -> Part:
    """Time of a sequence of ops and in-line collectives on one rank. With `steady`, the
    per-repetition time once the host-GPU queue has settled (a layer among many).
    `tp_hidden` of each sequence-parallel tp collective runs under the GEMMs beside it."""
    compute = tp = cp = 0.0
    timeline: list[tuple[float, int]] = []
    for item in items:
        if isinstance(item, Comm):
            t = collective_time_s(item.kind, item.bytes, tiers[item.axis], profiles=profiles)
            if item.axis == "tp" and item.kind in ("all_gather", "reduce_scatter"):
                t *= 1.0 - tp_hidden
            if item.axis == "cp":
                cp += t
            else:
                tp += t
            timeline.append((t, 1))
        else:
            t = costs.time_s(item)
            compute += t
            timeline.append((t, item.kernels))
    wall = _issue_queue_s(timeline, launch_s, 1)
    if steady:
        wall = _issue_queue_s(timeline, launch_s, 2) - wall
    return Part(compute, tp, cp, max(0.0, wall - compute - tp - cp))


def _compute_costs(device_name: str, dtype: str, profiles: Profiles | None) -> ComputeCosts:
    return ComputeCosts(device_name, dtype, profiles.get(device_name) if profiles else None)


def _recomputed(work: LayerWork, recompute: str) -> tuple[Work, ...]:
    """What a layer runs again before its backward."""
    return {"none": (), "selective": work.selective_recompute, "full": work.forward}[recompute]


@cache
def layer_parts(model: ModelSpec, shape: WorkloadShape, device_name: str, tiers_key: tuple,
                recompute: str, profiles: Profiles | None = None) -> tuple[Part, Part]:
    """Forward and backward (with recomputation first) of one layer for one micro-batch,
    in the steady state of a pass over many layers. `profiles` is part of the cache key,
    so costs with and without a profile never mix."""
    tiers = dict(tiers_key)
    costs = _compute_costs(device_name, shape.dtype, profiles)
    dev = device(device_name)
    launch_s = launch_overhead_s(dev)
    hidden = arch_efficiency(dev.arch).tp_comm_overlap
    work = layer_work(model, shape)
    again = _recomputed(work, recompute)
    fwd = _part(work.forward, costs, tiers, launch_s, steady=True, tp_hidden=hidden,
                profiles=profiles)
    bwd = _part((*again, *work.backward), costs, tiers, launch_s, steady=True, tp_hidden=hidden,
                profiles=profiles)
    return fwd, bwd


@cache
def layer_weight_grad(model: ModelSpec, shape: WorkloadShape, device_name: str,
                      tiers_key: tuple, recompute: str, profiles: Profiles | None = None) -> Part:
    """The weight-gradient share of one layer's backward (`layer_parts`): its `.wgrad`
    GEMMs, priced as the backward prices them, with no collectives (Qi et al. 2024 §2:
    W needs only the saved input and the output gradient). Its host wait is at most the
    backward's, so the rest of the backward (B) never goes negative."""
    costs = _compute_costs(device_name, shape.dtype, profiles)
    launch_s = launch_overhead_s(device(device_name))
    wgrad = tuple(op for op in layer_work(model, shape).backward
                  if isinstance(op, Op) and op.name.endswith(".wgrad"))
    part = _part(wgrad, costs, {}, launch_s, steady=True, profiles=profiles)
    bwd = layer_parts(model, shape, device_name, tiers_key, recompute, profiles)[1]
    return replace(part, host_s=min(part.host_s, bwd.host_s))


@dataclass(frozen=True)
class DPSync:
    """Data-parallel traffic of one rank position of a stage under AMSP sharding."""

    grad_iteration_s: float = 0.0  # once per iteration, after the last backward
    grad_microbatch_s: float = 0.0  # after every backward (sharded gradients)
    param_iteration_s: float = 0.0  # after the optimizer step
    param_microbatch_s: float = 0.0  # before every forward and backward (sharded params)


@cache
def dp_sync(cluster: ClusterSpec, group: tuple[int, ...], params: float, concurrency: int,
            sharding: Sharding, dtype: str, profiles: Profiles | None = None) -> DPSync:
    """Traffic of the data-parallel group `group` (one GPU per replica, in replica order)
    holding `params` parameters each (Rajbhandari et al. 2020; Chen et al. 2023, AMSP),
    with gradients sharded over g replicas, optimizer states over os and parameters over p
    (p | g | os | dp):

    * sharded gradients (g > 1) are reduce-scattered inside their g-group after every
      micro-batch's backward, so only the 1/g shard is kept;
    * once per iteration each optimizer shard needs its gradients reduced over all
      replicas: a reduce-scatter over the os/g groups sharing an optimizer group (of the
      1/g shard), then an all-reduce over the dp/os optimizer groups (of the 1/os shard).
      Plain data parallelism is the all-reduce alone; ZeRO-1 (Megatron's distributed
      optimizer) the reduce-scatter alone;
    * after the step, parameters are all-gathered from the 1/os shard back to the 1/p
      the model keeps;
    * sharded parameters (p > 1) are all-gathered before every forward and backward.
    """
    dp = len(group)
    if dp == 1:
        return DPSync()
    low = dtype_bytes(dtype)
    grad_bytes = params * GRAD_BYTES

    def time_s(kind: str, size: float, members: int, stride: int) -> float:
        tiers = group_tiers(cluster, group[0:members * stride:stride], concurrency)
        return collective_time_s(kind, size, tiers, profiles=profiles)

    g, os_, p = sharding.grads, sharding.optim, sharding.params
    grad_mb = time_s("reduce_scatter", grad_bytes, g, 1) if g > 1 else 0.0
    grad_it = 0.0
    if os_ > g:
        grad_it += time_s("reduce_scatter", grad_bytes / g, os_ // g, g)
    if dp > os_:
        grad_it += time_s("all_reduce", grad_bytes / os_, dp // os_, os_)
    param_it = 0.0
    if os_ > p:
        param_it = time_s("all_gather", params * low / p, os_ // p, p)
    param_mb = 0.0
    if p > 1:
        param_mb = 2 * time_s("all_gather", params * low, p, 1)
    return DPSync(grad_it, grad_mb, param_it, param_mb)


def exposed_s(comm_s: float, window_s: float, num_params: float) -> float:
    """Communication overlapped with `window_s` of compute bucket by bucket (PyTorch DDP,
    Megatron): only what outlasts the window is exposed, and never less than the last
    bucket."""
    buckets = max(1, math.ceil(num_params / BUCKET_PARAMS))
    return max(comm_s / buckets, comm_s - window_s)


@dataclass(frozen=True)
class StageSetup:
    """Everything a stage's cost depends on, without the rest of the plan: which GPUs it
    talks to for each kind of traffic, and what it runs."""

    device_name: str
    shape: WorkloadShape
    num_layers: int
    first: bool
    last: bool
    pp: int
    recompute: str
    tp_group: tuple[int, ...]
    cp_group: tuple[int, ...]
    next_stage: int | None  # a GPU of the stage it sends activations to (None: none)
    dp_group: tuple[int, ...]  # rank position 0 of this stage in every replica
    concurrency: int  # ranks whose data-parallel traffic crosses links at the same time
    sharding: Sharding
    optimizer: str
    layers_in_flight: float


@cache
def _extra_parts(model: ModelSpec, shape: WorkloadShape, device_name: str, tiers_key: tuple,
                 which: str, profiles: Profiles | None) -> tuple[Part, Part]:
    """Forward and backward of the embedding ("embed") or the head ("head")."""
    tiers = dict(tiers_key)
    costs = _compute_costs(device_name, shape.dtype, profiles)
    launch_s = launch_overhead_s(device(device_name))
    fwd, bwd = embedding_work(model, shape) if which == "embed" else head_work(model, shape)[:2]
    return (_part(fwd, costs, tiers, launch_s, profiles=profiles),
            _part(bwd, costs, tiers, launch_s, profiles=profiles))


def _p2p_s(cluster: ClusterSpec, model: ModelSpec, setup: StageSetup,
           profiles: Profiles | None) -> float:
    """Send one activation to the next stage (the last stage sends to the first, which
    interleaving uses). Megatron scatters it over the tp ranks; each sends a slice."""
    if setup.next_stage is None:
        return 0.0
    w = setup.shape
    size = (w.micro_batch_size * w.seq_len // w.cp * model.hidden_size * dtype_bytes(w.dtype)
            / w.tp)
    return collective_time_s("send_recv", size,
                             group_tiers(cluster, (setup.tp_group[0], setup.next_stage)),
                             profiles=profiles)


def stage_cost(model: ModelSpec, cluster: ClusterSpec, setup: StageSetup, *, pipeline: int = 0,
               stage: int = 0, profiles: Profiles | None = None) -> StageCost:
    """The cost of one stage (see StageCost); op and collective times from `profiles`
    where they have them."""
    w = setup.shape
    tiers_key = (("tp", group_tiers(cluster, setup.tp_group)),
                 ("cp", group_tiers(cluster, setup.cp_group)))
    layer_fwd, layer_bwd = layer_parts(model, w, setup.device_name, tiers_key, setup.recompute,
                                       profiles)
    layer_w = layer_weight_grad(model, w, setup.device_name, tiers_key, setup.recompute,
                                profiles)
    zero = Part()
    embed = _extra_parts(model, w, setup.device_name, tiers_key, "embed", profiles) \
        if setup.first else (zero, zero)
    head = _extra_parts(model, w, setup.device_name, tiers_key, "head", profiles) \
        if setup.last else (zero, zero)
    n = setup.num_layers
    params = rank_param_count(model, num_layers=n, first=setup.first, last=setup.last,
                              tp=w.tp, pp=setup.pp)
    sync = dp_sync(cluster, setup.dp_group, params, setup.concurrency, setup.sharding, w.dtype,
                   profiles)
    opt = optimizer_work(params / setup.sharding.optim, dtype=w.dtype,
                         implementation=setup.optimizer, num_tensors=max(1, 6 * n))
    dev = device(setup.device_name)
    memory = stage_memory(model, device=dev, shape=w, num_layers=n, first=setup.first,
                          last=setup.last, pp=setup.pp, recompute=setup.recompute,  # type: ignore[arg-type]
                          sharding=setup.sharding, layers_in_flight=setup.layers_in_flight)
    return StageCost(pipeline=pipeline, stage=stage, device=dev.name, num_layers=n,
                     num_params=params, layer_forward=layer_fwd, layer_backward=layer_bwd,
                     embed_forward=embed[0], embed_backward=embed[1], head_forward=head[0],
                     head_backward=head[1], p2p_s=_p2p_s(cluster, model, setup, profiles),
                     dp=sync, optimizer_s=_compute_costs(dev.name, w.dtype, profiles).time_s(opt),
                     memory=memory, layer_weight_grad=layer_w)


def plan_stage_setup(plan: Plan, pi: int, si: int) -> StageSetup:
    """The StageSetup of stage `si` of pipeline `pi` of a plan."""
    tr = plan.training
    pipe = plan.pipelines[pi]
    stage = pipe.stages[si]
    pp = len(pipe.stages)
    nxt = pipe.stages[(si + 1) % pp]
    in_flight = in_flight_chunks(schedule=tr.schedule, stage=si, pp=pp,
                                 num_microbatches=pipe.num_microbatches,
                                 virtual_stages=tr.virtual_stages)
    group = (tuple(p.stages[si].devices[0] for p in plan.pipelines)
             if plan.dp > 1 and plan.aligned_stages else (stage.devices[0],))
    return StageSetup(
        device_name=stage_device(plan, stage).name, shape=stage_shape(plan, pi, stage),
        num_layers=stage.num_layers, first=si == 0, last=si == pp - 1, pp=pp,
        recompute=stage.recompute, tp_group=stage.devices[:stage.tp],
        cp_group=stage.devices[::stage.tp], next_stage=None if nxt is stage else nxt.devices[0],
        dp_group=group, concurrency=sum(len(s.devices) for s in pipe.stages),
        sharding=plan.sharding_of(si), optimizer=plan.kernels.optimizer,
        layers_in_flight=in_flight * stage.num_layers / tr.virtual_stages)


def clear_cost_caches() -> None:
    """Forget cached op, layer and link costs (after the model's parameters changed)."""
    clear_op_cache()
    group_tiers.cache_clear()
    layer_parts.cache_clear()
    layer_weight_grad.cache_clear()
    _extra_parts.cache_clear()
    dp_sync.cache_clear()


def pipeline_key(plan: Plan, pi: int) -> tuple:
    """Pipelines with equal keys are provably identical: same shape on the same kind of
    hardware, with the same node boundaries between stages."""
    pipe = plan.pipelines[pi]
    slots = plan.cluster.slots
    layout = []
    for si, s in enumerate(pipe.stages):
        nodes = [slots[d].node for d in s.devices]
        nxt = pipe.stages[(si + 1) % len(pipe.stages)].devices[0]
        layout.append((s.layers, s.tp, s.cp, s.recompute,
                       plan.cluster.node_groups[slots[s.devices[0]].group].name,
                       len(set(nodes)), slots[nxt].node == nodes[0]))
    return (pipe.micro_batch_size, pipe.num_microbatches, tuple(layout))


def plan_stage_costs(plan: Plan, profiles: Profiles | None = None) -> list[list[StageCost]]:
    """Costs of every stage of every pipeline; identical pipelines are priced once. Op and
    collective times come from `profiles` where they have them."""
    out: list[list[StageCost]] = []
    seen: dict[tuple, list[StageCost]] = {}
    for pi, pipe in enumerate(plan.pipelines):
        key = pipeline_key(plan, pi)
        if key in seen:
            out.append([replace(c, pipeline=pi) for c in seen[key]])
            continue
        costs = [stage_cost(plan.model, plan.cluster, plan_stage_setup(plan, pi, si),
                            pipeline=pi, stage=si, profiles=profiles)
                 for si in range(len(pipe.stages))]
        seen[key] = costs
        out.append(costs)
    return out


def _optimizer_op(plan: Plan, params: float, num_layers: int, sharding: Sharding) -> Op:
    """The optimizer step over a stage's optimizer-state shard."""
    return optimizer_work(params / sharding.optim, dtype=plan.training.dtype,
                          implementation=plan.kernels.optimizer,
                          num_tensors=max(1, 6 * num_layers))


def _stage_ops(plan: Plan, pi: int, si: int) -> tuple[DeviceSpec, list[Op]]:
    """Every op a stage runs for one micro-batch, and its optimizer step."""
    pipe = plan.pipelines[pi]
    stage = pipe.stages[si]
    shape = stage_shape(plan, pi, stage)
    work = layer_work(plan.model, shape)
    items: list[Work] = [*work.forward, *_recomputed(work, stage.recompute), *work.backward]
    first, last = si == 0, si == len(pipe.stages) - 1
    if first:
        items.extend(w for ws in embedding_work(plan.model, shape) for w in ws)
    if last:
        fwd, bwd, _ = head_work(plan.model, shape)
        items.extend((*fwd, *bwd))
    params = rank_param_count(plan.model, num_layers=stage.num_layers, first=first, last=last,
                              tp=stage.tp, pp=len(pipe.stages))
    items.append(_optimizer_op(plan, params, stage.num_layers, plan.sharding_of(si)))
    return stage_device(plan, stage), [op for op in items if isinstance(op, Op)]


def _plan_groups(plan: Plan) -> set[tuple[int, ...]]:
    """The GPU groups that communicate: tp and cp groups, pipeline neighbours, and the
    data-parallel group of each stage position."""
    groups: set[tuple[int, ...]] = set()
    for pipe in plan.pipelines:
        for si, stage in enumerate(pipe.stages):
            groups.update((stage.devices[:stage.tp], stage.devices[::stage.tp]))
            nxt = pipe.stages[(si + 1) % len(pipe.stages)]
            groups.add((stage.devices[0], nxt.devices[0]))
    if plan.dp > 1 and plan.aligned_stages:
        for si in range(len(plan.pipelines[0].stages)):
            groups.add(tuple(p.stages[si].devices[0] for p in plan.pipelines))
    return {g for g in groups if len(set(g)) > 1}


def _comm_source(plan: Plan, profiles: Profiles) -> str:
    """The collective profiles that answer some of the plan's groups (those inside one
    node of the profiled type, of a size the profile measured)."""
    used: dict[str, set[int]] = {}
    for group in _plan_groups(plan):
        tiers = group_tiers(plan.cluster, group)
        if len(tiers) != 1 or tiers[0].name != "node" or tiers[0].device is None:
            continue
        profile = profiles.get(tiers[0].device)
        if profile is not None and any(r.ranks == tiers[0].fanout
                                       for r in profile.collective_rows):
            used.setdefault(profile.path, set()).add(tiers[0].fanout)
    if not used:
        return COMM_SOURCE
    parts = [f"measured collective profile {path} (groups of {', '.join(map(str, sorted(n)))} "
             "ranks in a node)" for path, n in sorted(used.items())]
    return "; ".join(parts) + f"; {COMM_SOURCE} for the rest"


def cost_sources(plan: Plan, profiles: Profiles | None) -> dict[str, str]:
    """What answered the plan's op and collective times (the `sources` users see)."""
    if profiles is None or not profiles.by_device:
        return {"compute": ANALYTIC_SOURCE, "communication": COMM_SOURCE}
    uses = []
    for pi, pipe in enumerate(plan.pipelines):
        for si in range(len(pipe.stages)):
            dev, ops = _stage_ops(plan, pi, si)
            profile = profiles.get(dev.name)
            uses.extend((profile, op) for op in ops)
    return {"compute": compute_source(uses), "communication": _comm_source(plan, profiles)}
