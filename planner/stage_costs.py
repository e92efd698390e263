"""Per-stage costs of a Plan: what one micro-batch costs on each stage, and the
data-parallel and optimizer work at the end of an iteration.

The analytic estimate and the event simulator both build on these numbers, so they
price the same work the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

from planner.costs.comm import COMM_SOURCE, Tier, collective_time_s, group_tiers
from planner.costs.compute import ComputeCosts, clear_op_cache, compute_source
from planner.memory import StageMemory, in_flight_chunks, rank_param_count, stage_memory
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Stage
from planner.workload import (
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
from profiler.analytic import launch_overhead_s
from profiler.devices import DeviceSpec, arch_efficiency, device, dtype_bytes
from profiler.store import Profiles

__all__ = ["BUCKET_PARAMS", "DPSync", "Part", "StageCost", "aligned_stages", "clear_cost_caches",
           "cost_sources", "dp_sync", "exposed_s", "layer_parts",
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

    @property
    def forward(self) -> Part:
        return self.layer_forward * self.num_layers + self.embed_forward + self.head_forward

    @property
    def backward(self) -> Part:
        return self.layer_backward * self.num_layers + self.embed_backward + self.head_backward

    @property
    def forward_s(self) -> float:
        return self.forward.total_s

    @property
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


@dataclass(frozen=True)
class DPSync:
    """Data-parallel traffic of one rank position of a stage under AMSP sharding."""

    grad_iteration_s: float = 0.0  # once per iteration, after the last backward
    grad_microbatch_s: float = 0.0  # after every backward (sharded gradients)
    param_iteration_s: float = 0.0  # after the optimizer step
    param_microbatch_s: float = 0.0  # before every forward and backward (sharded params)


def dp_sync(plan: Plan, group: tuple[int, ...], params: float, concurrency: int,
            profiles: Profiles | None = None) -> DPSync:
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
    sh = plan.sharding
    low = dtype_bytes(plan.training.dtype)
    grad_bytes = params * GRAD_BYTES

    def tiers(size: int, stride: int) -> tuple[Tier, ...]:
        return group_tiers(plan.cluster, group[0:size * stride:stride], concurrency)

    def time_s(kind: str, size: float, group_tiers_: tuple[Tier, ...]) -> float:
        return collective_time_s(kind, size, group_tiers_, profiles=profiles)

    g, os_, p = sh.grads, sh.optim, sh.params
    grad_mb = time_s("reduce_scatter", grad_bytes, tiers(g, 1)) if g > 1 else 0.0
    grad_it = 0.0
    if os_ > g:
        grad_it += time_s("reduce_scatter", grad_bytes / g, tiers(os_ // g, g))
    if dp > os_:
        grad_it += time_s("all_reduce", grad_bytes / os_, tiers(dp // os_, os_))
    param_it = 0.0
    if os_ > p:
        param_it = time_s("all_gather", params * low / p, tiers(os_ // p, p))
    param_mb = 0.0
    if p > 1:
        param_mb = 2 * time_s("all_gather", params * low, tiers(p, 1))
    return DPSync(grad_it, grad_mb, param_it, param_mb)


def exposed_s(comm_s: float, window_s: float, num_params: float) -> float:
    """Communication overlapped with `window_s` of compute bucket by bucket (PyTorch DDP,
    Megatron): only what outlasts the window is exposed, and never less than the last
    bucket."""
    buckets = max(1, math.ceil(num_params / BUCKET_PARAMS))
    return max(comm_s / buckets, comm_s - window_s)


def _p2p_s(plan: Plan, pi: int, si: int, profiles: Profiles | None = None) -> float:
    """Send one activation from stage `si` to the next (the last stage sends to the first,
    which interleaving uses). Megatron scatters it over the tp ranks; each sends a slice."""
    pipe = plan.pipelines[pi]
    stage, nxt = pipe.stages[si], pipe.stages[(si + 1) % len(pipe.stages)]
    if stage is nxt:
        return 0.0
    size = (pipe.micro_batch_size * plan.training.seq_len // stage.cp * plan.model.hidden_size
            * dtype_bytes(plan.training.dtype) / stage.tp)
    return collective_time_s("send_recv", size,
                             group_tiers(plan.cluster, (stage.devices[0], nxt.devices[0])),
                             profiles=profiles)


def _stage_cost(plan: Plan, pi: int, si: int, profiles: Profiles | None) -> StageCost:
    model, tr = plan.model, plan.training
    pipe = plan.pipelines[pi]
    stage = pipe.stages[si]
    pp = len(pipe.stages)
    dev = stage_device(plan, stage)
    shape = stage_shape(plan, pi, stage)
    tiers_key = (("tp", group_tiers(plan.cluster, stage.devices[:stage.tp])),
                 ("cp", group_tiers(plan.cluster, stage.devices[::stage.tp])))
    tiers = dict(tiers_key)
    layer_fwd, layer_bwd = layer_parts(model, shape, dev.name, tiers_key, stage.recompute,
                                       profiles)
    costs = _compute_costs(dev.name, tr.dtype, profiles)
    launch_s = launch_overhead_s(dev)
    first, last = si == 0, si == pp - 1

    def part(items: tuple[Work, ...]) -> Part:
        return _part(items, costs, tiers, launch_s, profiles=profiles)

    zero = Part()
    embed_fwd = embed_bwd = head_fwd = head_bwd = zero
    if first:
        fwd, bwd = embedding_work(model, shape)
        embed_fwd, embed_bwd = part(fwd), part(bwd)
    if last:
        fwd, bwd, _ = head_work(model, shape)
        head_fwd, head_bwd = part(fwd), part(bwd)
    n = stage.num_layers
    params = rank_param_count(model, num_layers=n, first=first, last=last, tp=stage.tp, pp=pp)
    concurrency = sum(len(s.devices) for s in pipe.stages)
    sync = DPSync()
    if plan.dp > 1 and aligned_stages(plan):
        group = tuple(p.stages[si].devices[0] for p in plan.pipelines)
        sync = dp_sync(plan, group, params, concurrency, profiles)
    opt = _optimizer_op(plan, params, n)
    in_flight = in_flight_chunks(schedule=tr.schedule, stage=si, pp=pp,
                                 num_microbatches=pipe.num_microbatches,
                                 virtual_stages=tr.virtual_stages)
    memory = stage_memory(model, device=dev, shape=shape, num_layers=n, first=first, last=last,
                          pp=pp, recompute=stage.recompute, sharding=plan.sharding,
                          layers_in_flight=in_flight * n / tr.virtual_stages)
    return StageCost(pipeline=pi, stage=si, device=dev.name, num_layers=n, num_params=params,
                     layer_forward=layer_fwd, layer_backward=layer_bwd, embed_forward=embed_fwd,
                     embed_backward=embed_bwd, head_forward=head_fwd, head_backward=head_bwd,
                     p2p_s=_p2p_s(plan, pi, si, profiles), dp=sync, optimizer_s=costs.time_s(opt),
                     memory=memory)


def clear_cost_caches() -> None:
    """Forget cached op, layer and link costs (after the model's parameters changed)."""
    clear_op_cache()
    group_tiers.cache_clear()
    layer_parts.cache_clear()


def aligned_stages(plan: Plan) -> bool:
    """Whether every replica splits the layers into the same stages (then stage s of every
    pipeline holds the same parameters and syncs with its peers)."""
    first = [s.layers for s in plan.pipelines[0].stages]
    return all([s.layers for s in p.stages] == first for p in plan.pipelines[1:])


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
        costs = [_stage_cost(plan, pi, si, profiles) for si in range(len(pipe.stages))]
        seen[key] = costs
        out.append(costs)
    return out


def _optimizer_op(plan: Plan, params: float, num_layers: int) -> Op:
    """The optimizer step over a stage's optimizer-state shard."""
    return optimizer_work(params / plan.sharding.optim, dtype=plan.training.dtype,
                          implementation=plan.kernels.optimizer,
                          num_tensors=max(1, 6 * num_layers))


def _recomputed(work: LayerWork, recompute: str) -> tuple[Work, ...]:
    """What a layer runs again before its backward."""
    return {"none": (), "selective": work.selective_recompute, "full": work.forward}[recompute]


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
    items.append(_optimizer_op(plan, params, stage.num_layers))
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
    if plan.dp > 1 and aligned_stages(plan):
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
    from planner.costs.compute import ANALYTIC_SOURCE

    if profiles is None or not profiles.by_device:
        return {"compute": ANALYTIC_SOURCE, "communication": COMM_SOURCE}
    uses = []
    for pi, pipe in enumerate(plan.pipelines):
        for si in range(len(pipe.stages)):
            dev, ops = _stage_ops(plan, pi, si)
            profile = profiles.get(dev.name)
            uses.extend((profile, op) for op in ops)
    return {"compute": compute_source(uses), "communication": _comm_source(plan, profiles)}
