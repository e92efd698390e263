"""The one builder from a configuration to its costs: what one micro-batch costs on each
stage, the data-parallel and optimizer work at the end of an iteration, and each rank's
memory.

Every consumer reaches costs through here: `plan simulate` and the executor's prediction
(via `plan_costs` of a Plan), the homogeneous search (planner/search/evaluate.py) and the
heterogeneous search (planner/hetero/candidates.py), which place replicas without
building Plans. Each describes its replicas as `PlacedStage`s (GPUs, tp, cp, layers,
recompute) and its training settings as a `RunSettings`; `replica_specs` derives what a
stage talks to (tp / cp groups, the next stage, its data-parallel group), and
`stage_cost` prices it. The closed-form estimate and the event simulator then price the
same `StageCost`s, so the search ranks what `plan simulate` predicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Generic, TypeVar

from planner.costs.comm import (
    COMM_SOURCE,
    Tier,
    Transfer,
    clear_comm_caches,
    collective_time_s,
    group_tiers,
)
from planner.costs.compute import ANALYTIC_SOURCE, ComputeCosts, clear_op_cache, compute_source
from planner.costs.host import (
    dtensor_layer_s,
    dtensor_root_s,
    fsdp_unit_s,
    host_source,
    launch_s,
    shared_host_slowdown,
)
from planner.costs.memory import (
    StageMemory,
    activation_memory,
    in_flight_chunks,
    model_state_bytes,
    rank_param_count,
)
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
from planner.specs.choices import DType, Recompute, Schedule
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Communication, Kernels, Plan, Sharding
from profiler.devices import DeviceSpec, device_efficiency
from profiler.kernels import Attention
from profiler.schema import cached_hash, coerce_choices
from profiler.store import Profile, Profiles

__all__ = ["DPSync", "Part", "PlacedStage", "PlanCosts",
           "RunSettings", "ShardingTerms", "StageCost", "StageSpec", "apply_sharding",
           "bucket_params", "clear_cost_caches", "cost_sources", "dp_sync", "exposed_s",
           "gather_stall_s", "group_signature", "layer_parts", "on_clear_cost_caches",
           "plan_costs", "plan_replicas", "plan_runs", "position_groups", "replica_key",
           "replica_specs", "shard_units", "sharding_terms", "stage_cost", "stage_key",
           "stage_params", "unsharded_cost", "with_sharding", "workload_shape"]

T = TypeVar("T")
# Megatron-Core DistributedDataParallelConfig: bucket_size None -> max(40e6, 1e6 x dp)
# parameters, "larger DP sizes need larger buckets to ensure collectives do not become
# latency-bound" (planner/data/reference/framework_defaults.md, E)
MEGATRON_BUCKET_MIN_PARAMS = 40e6
MEGATRON_BUCKET_PARAMS_PER_DP = 1e6


@dataclass(frozen=True)
class Part:
    """Seconds on a rank's compute stream, by what they are spent on. Tensor- and
    context-parallel collectives block the compute stream (Megatron runs them in line);
    `host_s` is the GPU waiting for the host to issue kernels."""

    compute_s: float = 0.0
    tp_s: float = 0.0
    cp_s: float = 0.0
    host_s: float = 0.0
    dp_s: float = 0.0  # ZeRO-3 / FSDP: waiting for parameter gathers inside the pass

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_s + self.cp_s + self.host_s + self.dp_s

    def __add__(self, other: Part) -> Part:
        return Part(self.compute_s + other.compute_s, self.tp_s + other.tp_s,
                    self.cp_s + other.cp_s, self.host_s + other.host_s, self.dp_s + other.dp_s)

    def __sub__(self, other: Part) -> Part:
        return Part(self.compute_s - other.compute_s, self.tp_s - other.tp_s,
                    self.cp_s - other.cp_s, self.host_s - other.host_s, self.dp_s - other.dp_s)

    def __mul__(self, k: float) -> Part:
        return Part(self.compute_s * k, self.tp_s * k, self.cp_s * k, self.host_s * k,
                    self.dp_s * k)

    def slowed(self, k: float) -> Part:
        """The part with its compute and host time `k` times longer (CPU ranks sharing a
        host's cores), its collectives as they were."""
        return replace(self, compute_s=self.compute_s * k, host_s=self.host_s * k)


@dataclass(frozen=True)
class DPSync:
    """Data-parallel traffic of one rank position of a stage under AMSP sharding."""

    grad_iteration_s: float = 0.0  # once per iteration, after the last backward
    grad_microbatch_s: float = 0.0  # after every backward (sharded gradients)
    param_iteration_s: float = 0.0  # after the optimizer step
    param_microbatch_s: float = 0.0  # before every forward and backward (sharded params)
    buckets: int = 1  # the iteration's gradient reduction and parameter gather, in pieces
    overlap: bool = True  # gradient buckets reduced while the last backward runs
    gather_units: int = 0  # sharded parameters: all-gathers per forward (and per backward)
    prefetch: int = 1  # units gathered ahead of the one computing
    # what each term runs (traces): grad_microbatch, grad_iteration, param_iteration,
    # param_microbatch -> its transfers
    detail: tuple[tuple[str, Transfer], ...] = ()

    def about(self, term: str) -> str:
        """The transfers of one term, as traces describe them."""
        return "; ".join(t.describe() for name, t in self.detail if name == term)

    @property
    def gather_unit_s(self) -> float:
        """One unit's all-gather (sharded parameters)."""
        return self.param_microbatch_s / (2 * self.gather_units) if self.gather_units else 0.0


@cached_hash
@dataclass(frozen=True)
class PlacedStage:
    """One stage of one replica as a placement gives it."""

    devices: tuple[int, ...]  # tp * cp global GPU indices, index = cp_rank * tp + tp_rank
    tp: int
    cp: int
    num_layers: int
    recompute: Recompute
    attention: Attention | None = None  # None: the run's kernels.attention

    def __post_init__(self) -> None:
        coerce_choices(self)


@cached_hash
@dataclass(frozen=True)
class RunSettings:
    """What every stage of one replica runs: its micro-batches and the training settings."""

    micro_batch_size: int
    num_microbatches: int
    seq_len: int
    dtype: str
    sequence_parallel: bool
    schedule: Schedule
    virtual_stages: int
    kernels: Kernels
    comm: Communication = Communication()  # how the framework communicates (Training.comm)

    def __post_init__(self) -> None:
        coerce_choices(self)


@cached_hash
@dataclass(frozen=True)
class StageSpec:
    """Everything a stage's cost depends on besides the model and the run: its GPUs and
    whom it talks to (built by `replica_specs`)."""

    device: DeviceSpec
    placed: PlacedStage
    index: int  # position in its pipeline
    pp: int
    next_device: int | None  # a GPU of the stage it sends activations to (None: none)
    dp_group: tuple[int, ...]  # this stage position's first GPU in every replica it syncs with
    concurrency: int  # GPUs whose data-parallel traffic crosses links at the same time
    sharding: Sharding

    @property
    def device_name(self) -> str:
        return self.device.name

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.pp - 1

    @property
    def tp_group(self) -> tuple[int, ...]:
        return self.placed.devices[:self.placed.tp]

    @property
    def cp_group(self) -> tuple[int, ...]:
        return self.placed.devices[::self.placed.tp]


class _once(Generic[T]):
    """functools.cached_property without the lock Python 3.11 takes on every first access
    (a search computes millions of them): the value is kept in the instance's __dict__,
    which later lookups find first."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj: object, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]  # the descriptor, asked on the class
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


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
    # Pipeline transfers hold the compute of sender and receiver (DeepSpeed's blocking
    # send/recv) instead of running beside it (Megatron's batched isend/irecv).
    p2p_blocking: bool = False
    p2p_transfer: Transfer | None = None  # the send, for traces

    @_once
    def forward(self) -> Part:
        return self.layer_forward * self.num_layers + self.embed_forward + self.head_forward

    @_once
    def backward(self) -> Part:
        return self.layer_backward * self.num_layers + self.embed_backward + self.head_backward

    @_once
    def weight_grad(self) -> Part:
        """The W part of `backward` (its layers' weight gradients)."""
        return self.layer_weight_grad * self.num_layers

    @_once
    def weight_grad_s(self) -> float:
        return self.weight_grad.total_s

    @_once
    def forward_s(self) -> float:
        return self.forward.total_s

    @_once
    def backward_s(self) -> float:
        return self.backward.total_s


# -- from a placement to stage specs -------------------------------------------------------

def position_groups(replicas: Sequence[Sequence[PlacedStage]]) -> list[tuple[int, ...]] | None:
    """The data-parallel group of each stage position (its first GPU in every replica),
    when there are several replicas and every one splits the layers alike (then stage k
    of every replica holds the same parameters and syncs with its peers); else None
    (replicas sync per layer segment, which the simulator prices)."""
    counts = [s.num_layers for s in replicas[0]]
    if len(replicas) == 1 or any([s.num_layers for s in rep] != counts for rep in replicas[1:]):
        return None
    return [tuple(rep[k].devices[0] for rep in replicas) for k in range(len(counts))]


def replica_specs(cluster: ClusterSpec, stages: Sequence[PlacedStage], *,
                  groups: Sequence[tuple[int, ...]] | None,
                  shardings: Sequence[Sharding]) -> tuple[StageSpec, ...]:
    """The stage specs of one replica (a pipeline of placed stages), stage k sharded as
    `shardings[k]` over `groups[k]` (`position_groups`). Stages send to the next one (the
    last to the first, which interleaving uses)."""
    pp = len(stages)
    slots, node_groups = cluster.slots, cluster.node_groups
    concurrency = sum(len(s.devices) for s in stages)
    out = []
    for k, placed in enumerate(stages):
        nxt = stages[(k + 1) % pp]
        out.append(StageSpec(
            device=node_groups[slots[placed.devices[0]].group].device, placed=placed,
            index=k, pp=pp, next_device=None if nxt is placed else nxt.devices[0],
            dp_group=groups[k] if groups is not None else (placed.devices[0],),
            concurrency=concurrency, sharding=shardings[k]))
    return tuple(out)


@cache
def group_signature(cluster: ClusterSpec, group: tuple[int, ...]) -> tuple:
    """What the links of a group of GPUs depend on: each member's node group (its GPU,
    links, NICs and island) and which members share a node. Groups with equal signatures
    cost the same for every collective among them or among any of their sub-groups."""
    slots = cluster.slots
    node0 = slots[group[0]].node
    return tuple((slots[d].group, slots[d].node - node0) for d in group)


def stage_key(cluster: ClusterSpec, spec: StageSpec, *, dp_signature: object = None) -> tuple:
    """Stages with equal keys have equal pass times, transfers and data-parallel traffic
    at any sharding (they differ at most in position, which only memory depends on).
    `dp_signature` stands for `group_signature(cluster, spec.dp_group)` where the caller
    numbered the signatures once (a group of thousands of GPUs is slow to hash)."""
    p = spec.placed
    return (spec.device, p.tp, p.cp, p.num_layers, p.recompute, p.attention, spec.first,
            spec.last, spec.pp, group_tiers(cluster, spec.tp_group),
            group_tiers(cluster, spec.cp_group),
            None if spec.next_device is None
            else group_tiers(cluster, (p.devices[0], spec.next_device)),
            group_signature(cluster, spec.dp_group) if dp_signature is None else dp_signature,
            spec.concurrency)


def replica_key(cluster: ClusterSpec, specs: Sequence[StageSpec], run: RunSettings) -> tuple:
    """Replicas with equal keys cost the same, stage by stage."""
    return (run, tuple((stage_key(cluster, s), s.sharding) for s in specs))


# -- pricing one stage ------------------------------------------------------------------

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


def _compute_costs(dev: DeviceSpec, dtype: str, profiles: Profiles | None) -> ComputeCosts:
    return ComputeCosts(dev, dtype, profiles.get(dev.name) if profiles else None)


def _recomputed(work: LayerWork, recompute: Recompute) -> tuple[Work, ...]:
    """What a layer runs again before its backward."""
    return {Recompute.NONE: (), Recompute.SELECTIVE: work.selective_recompute,
            Recompute.FULL: work.forward}[recompute]


@cache
def layer_parts(model: ModelSpec, shape: WorkloadShape, dev: DeviceSpec, tiers_key: tuple,
                recompute: Recompute, profiles: Profiles | None = None) -> tuple[Part, Part]:
    """Forward and backward (with recomputation first) of one layer for one micro-batch,
    in the steady state of a pass over many layers. `profiles` is part of the cache key,
    so costs with and without a profile never mix."""
    tiers = dict(tiers_key)
    costs = _compute_costs(dev, shape.dtype, profiles)
    profile = profiles.get(dev.name) if profiles else None
    issue_s = launch_s(dev, profile)
    hidden = device_efficiency(dev).tp_comm_overlap
    work = layer_work(model, shape)
    again = _recomputed(work, recompute)
    fwd = _part(work.forward, costs, tiers, issue_s, steady=True, tp_hidden=hidden,
                profiles=profiles)
    bwd = _part((*again, *work.backward), costs, tiers, issue_s, steady=True, tp_hidden=hidden,
                profiles=profiles)
    # DTensor's dispatch of a tp block, on the compute stream (a full recompute runs the
    # forward's again inside the backward)
    dt_fwd, dt_bwd = dtensor_layer_s(dev, profile, shape.tp, shape.sequence_parallel)
    again_s = dt_fwd if recompute == Recompute.FULL else 0.0
    return (fwd + Part(host_s=dt_fwd), bwd + Part(host_s=dt_bwd + again_s))


@cache
def _layer_weight_grad(model: ModelSpec, shape: WorkloadShape, dev: DeviceSpec,
                       tiers_key: tuple, recompute: Recompute,
                       profiles: Profiles | None = None) -> Part:
    """The weight-gradient share of one layer's backward (`layer_parts`): its `.wgrad`
    GEMMs, priced as the backward prices them, with no collectives (Qi et al. 2024 §2:
    W needs only the saved input and the output gradient). Its host wait is at most the
    backward's, so the rest of the backward (B) never goes negative."""
    costs = _compute_costs(dev, shape.dtype, profiles)
    issue_s = launch_s(dev, profiles.get(dev.name) if profiles else None)
    wgrad = tuple(op for op in layer_work(model, shape).backward
                  if isinstance(op, Op) and op.name.endswith(".wgrad"))
    part = _part(wgrad, costs, {}, issue_s, steady=True, profiles=profiles)
    bwd = layer_parts(model, shape, dev, tiers_key, recompute, profiles)[1]
    return replace(part, host_s=min(part.host_s, bwd.host_s))


@cache
def _extra_parts(model: ModelSpec, shape: WorkloadShape, dev: DeviceSpec, tiers_key: tuple,
                 which: str, profiles: Profiles | None) -> tuple[Part, Part]:
    """Forward and backward of the embedding ("embed") or the head ("head")."""
    tiers = dict(tiers_key)
    costs = _compute_costs(dev, shape.dtype, profiles)
    profile = profiles.get(dev.name) if profiles else None
    issue_s = launch_s(dev, profile)
    fwd, bwd = embedding_work(model, shape) if which == "embed" else head_work(model, shape)[:2]
    # DTensor's embedding, head and vocabulary-parallel loss, priced with the head
    dt_fwd, dt_bwd = (dtensor_root_s(dev, profile, shape.tp, shape.sequence_parallel)
                      if which == "head" else (0.0, 0.0))
    return (_part(fwd, costs, tiers, issue_s, profiles=profiles) + Part(host_s=dt_fwd),
            _part(bwd, costs, tiers, issue_s, profiles=profiles) + Part(host_s=dt_bwd))


def bucket_params(comm: Communication, dp: int) -> float:
    """Parameters per gradient bucket: the setting, else Megatron's max(4e7, 1e6 x dp)."""
    if comm.grad_bucket_params is not None:
        return comm.grad_bucket_params
    return max(MEGATRON_BUCKET_MIN_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP * dp)


@cache
def dp_sync(cluster: ClusterSpec, group: tuple[int, ...], params: float, concurrency: int,
            sharding: Sharding, dtype: str, profiles: Profiles | None = None, *,
            comm: Communication, units: int = 1,
            fsdp_host: tuple[float, float] | None = None) -> DPSync:
    """Traffic of the data-parallel group `group` (one GPU per replica, in replica order)
    holding `params` parameters each (Rajbhandari et al. 2020; Chen et al. 2023, AMSP),
    with gradients sharded over g replicas, optimizer states over os and parameters over p
    (p | g | os | dp), as the framework issues it (`comm`): gradients in
    `comm.grad_reduce_dtype`, each collective cut into buckets or units that each pay the
    group's latency:

    * sharded parameters (p > 1, ZeRO-3 / FSDP) are all-gathered unit by unit (one
      transformer layer per unit unless `comm.shard_unit_params` says otherwise; `units`
      is the stage's layer count) before every forward, and again before every backward;
    * sharded gradients (g > 1) are reduce-scattered inside their g-group after every
      micro-batch's backward, unit by unit (p > 1) or bucket by bucket, so only the 1/g
      shard is kept;
    * once per iteration each optimizer shard needs its gradients reduced over all
      replicas, bucket by bucket: a reduce-scatter over the os/g groups sharing an
      optimizer group (of the 1/g shard), then an all-reduce over the dp/os optimizer
      groups (of the 1/os shard). Plain data parallelism is the all-reduce alone; ZeRO-1
      (Megatron's distributed optimizer) the reduce-scatter alone;
    * after the step, parameters are all-gathered from the 1/os shard back to the 1/p
      the model keeps, bucket by bucket.

    `fsdp_host`: FSDP2's measured per-unit cost beyond its collectives (forward,
    backward; planner/costs/host.py). With it the gathers and reduce-scatters block the
    compute thread unit by unit, as FSDP2 runs them on this host: every unit of a pass
    waits for its gather (no prefetch), and each backward's reduce-scatters and hooks are
    held by it too (`param_microbatch_s` then carries all of it, none on a side stream).
    """
    dp = len(group)
    if dp == 1:
        return DPSync()
    low = DType(dtype).element_bytes
    grad_bytes = params * DType(comm.grad_reduce_dtype).element_bytes
    buckets = max(1, math.ceil(params / bucket_params(comm, dp)))

    detail: list[tuple[str, Transfer]] = []

    def time_s(term: str, kind: str, size: float, members: int, stride: int,
               pieces: int = 1) -> float:
        tiers = group_tiers(cluster, group[0:members * stride:stride], concurrency)
        detail.append((term, Transfer(kind, size / pieces, tiers, pieces)))
        return pieces * collective_time_s(kind, size / pieces, tiers, profiles=profiles)

    g, optim, p = sharding.grads, sharding.optim, sharding.params
    gather_units = 0
    if p > 1:
        gather_units = (max(1, math.ceil(params / comm.shard_unit_params))
                        if comm.shard_unit_params else max(1, units))
    grad_pieces = gather_units or buckets
    grad_mb = 0.0
    if g > 1:
        grad_mb = time_s("grad_microbatch", "reduce_scatter", grad_bytes, g, 1, grad_pieces)
    grad_it = 0.0
    if optim > g:
        grad_it += time_s("grad_iteration", "reduce_scatter", grad_bytes / g, optim // g, g,
                          buckets)
    if dp > optim:
        grad_it += time_s("grad_iteration", "all_reduce", grad_bytes / optim, dp // optim,
                          optim, buckets)
    param_it = 0.0
    if optim > p:
        param_it = time_s("param_iteration", "all_gather", params * low / p, optim // p, p,
                          buckets)
    param_mb = 0.0
    if p > 1:
        param_mb = 2 * time_s("param_microbatch", "all_gather", params * low, p, 1,
                              gather_units)
    prefetch = comm.shard_prefetch
    if fsdp_host is not None and gather_units:
        param_mb += grad_mb + gather_units * (fsdp_host[0] + fsdp_host[1])
        grad_mb, prefetch = 0.0, 0
    return DPSync(grad_it, grad_mb, param_it, param_mb, buckets=buckets,
                  overlap=comm.overlap_grad_reduce, gather_units=gather_units,
                  prefetch=prefetch, detail=tuple(detail))


def exposed_s(comm_s: float, window_s: float, sync: DPSync) -> float:
    """Communication overlapped with `window_s` of compute bucket by bucket (PyTorch DDP,
    Megatron): only what outlasts the window is exposed, and never less than the last
    bucket; all of it where the framework reduces after the backward."""
    if not sync.overlap:
        return comm_s
    return max(comm_s / sync.buckets, comm_s - window_s)


def gather_stall_s(sync: DPSync, compute_s: float, units: float) -> float:
    """ZeRO-3 / FSDP: how long a pass of `compute_s` over `units` parameter units waits
    for their all-gathers beyond the first unit's (which the simulator gathers one pass
    ahead). With prefetch each gather runs under the previous unit's compute, so the
    pass is gather-bound only where a unit gathers slower than it computes; without it
    every gather is exposed."""
    if not sync.gather_units or units <= 1:
        return 0.0
    g = sync.gather_unit_s
    if sync.prefetch < 1:
        return (units - 1) * g
    return max(0.0, (units - 1) * (g - compute_s / units))


def workload_shape(spec: StageSpec, run: RunSettings) -> WorkloadShape:
    """The per-rank shape of the stage's work (sequence parallelism only where tp > 1)."""
    p = spec.placed
    return WorkloadShape(micro_batch_size=run.micro_batch_size, seq_len=run.seq_len, tp=p.tp,
                         cp=p.cp, sequence_parallel=run.sequence_parallel and p.tp > 1,
                         dtype=run.dtype, attention=p.attention or run.kernels.attention)


def _p2p(cluster: ClusterSpec, model: ModelSpec, spec: StageSpec, shape: WorkloadShape,
         profiles: Profiles | None) -> tuple[float, Transfer | None]:
    """Send one activation to the next stage over the link joining them. Megatron
    scatters it over the tp ranks; each sends a slice."""
    if spec.next_device is None:
        return 0.0, None
    size = (shape.micro_batch_size * shape.seq_len // shape.cp * model.hidden_size
            * DType(shape.dtype).element_bytes / shape.tp)
    tiers = group_tiers(cluster, (spec.placed.devices[0], spec.next_device))
    return (collective_time_s("send_recv", size, tiers, profiles=profiles),
            Transfer("send_recv", size, tiers))


def shard_units(spec: StageSpec) -> int:
    """ZeRO-3 / FSDP units of a stage, one per transformer layer and one for the
    embedding and for the head (FSDP2's fully_shard per block, the root last)."""
    return spec.placed.num_layers + int(spec.first) + int(spec.last)


@cache
def stage_params(model: ModelSpec, spec: StageSpec) -> float:
    """Parameters one rank of the stage holds, before sharding."""
    return rank_param_count(model, num_layers=spec.placed.num_layers, first=spec.first,
                            last=spec.last, tp=spec.placed.tp, pp=spec.pp)


def unsharded_cost(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, run: RunSettings,
                   *, pipeline: int = 0, profiles: Profiles | None = None) -> StageCost:
    """The stage's cost with its model states replicated (no data-parallel traffic, no
    optimizer step yet): `with_sharding` completes it. Op and collective times come from
    `profiles` where they have them."""
    shape = workload_shape(spec, run)
    passes = _passes(model, cluster, spec, shape, profiles)
    n = spec.placed.num_layers
    in_flight = in_flight_chunks(schedule=run.schedule, stage=spec.index, pp=spec.pp,
                                 num_microbatches=run.num_microbatches,
                                 virtual_stages=run.virtual_stages)
    # the pass times (and their sums) as computed once, with this run's activations and
    # the framework's pipeline sends
    return _clone(passes, pipeline=pipeline, memory=passes.memory.with_layers_in_flight(
        in_flight * n / run.virtual_stages), p2p_blocking=run.comm.pipeline_p2p.blocks_compute)


def _clone(cost: StageCost, **fields: object) -> StageCost:
    """A copy of `cost` with `fields` changed that keeps its computed sums (copy.copy,
    faster: a search makes millions)."""
    out = object.__new__(StageCost)
    out.__dict__.update(cost.__dict__)
    out.__dict__.update(fields)
    return out


@cache
def _passes(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, shape: WorkloadShape,
            profiles: Profiles | None) -> StageCost:
    """What a stage costs that does not depend on the schedule or on how many
    micro-batches it runs (all but the activations in flight: none here), with the pass
    totals computed: candidates that differ only in those share them."""
    tiers_key = (("tp", group_tiers(cluster, spec.tp_group)),
                 ("cp", group_tiers(cluster, spec.cp_group)))
    dev, recompute = spec.device, spec.placed.recompute
    k = _host_slowdown(cluster, spec, profiles)
    layer_fwd, layer_bwd = (p.slowed(k) for p in layer_parts(model, shape, dev, tiers_key,
                                                             recompute, profiles))
    zero = (Part(), Part())
    embed = _extra_parts(model, shape, dev, tiers_key, "embed", profiles) if spec.first else zero
    head = _extra_parts(model, shape, dev, tiers_key, "head", profiles) if spec.last else zero
    embed, head = (embed[0].slowed(k), embed[1].slowed(k)), (head[0].slowed(k), head[1].slowed(k))
    p2p_s, p2p_transfer = _p2p(cluster, model, spec, shape, profiles)
    cost = StageCost(pipeline=0, stage=spec.index, device=dev.name,
                     num_layers=spec.placed.num_layers, num_params=stage_params(model, spec),
                     layer_forward=layer_fwd, layer_backward=layer_bwd, embed_forward=embed[0],
                     embed_backward=embed[1], head_forward=head[0], head_backward=head[1],
                     p2p_s=p2p_s, p2p_transfer=p2p_transfer, dp=DPSync(), optimizer_s=0.0,
                     memory=activation_memory(model, device=dev, shape=shape,
                                              num_layers=spec.placed.num_layers,
                                              last=spec.last, recompute=recompute,
                                              layers_in_flight=0.0),
                     layer_weight_grad=_layer_weight_grad(model, shape, dev, tiers_key,
                                                          recompute, profiles).slowed(k))
    _ = cost.forward_s, cost.backward_s, cost.weight_grad_s
    return cost


def _host_slowdown(cluster: ClusterSpec, spec: StageSpec, profiles: Profiles | None) -> float:
    """CPU ranks: how much slower each computes beside the other ranks of its host
    (planner/costs/host.py `shared_host_slowdown`); 1 elsewhere."""
    if spec.device.vendor != "cpu" or profiles is None:
        return 1.0
    group = cluster.node_groups[cluster.slots[spec.placed.devices[0]].group]
    return shared_host_slowdown(spec.device, profiles.get(spec.device_name),
                                group.gpus_per_node or 1)


@dataclass(frozen=True)
class ShardingTerms:
    """What a sharding adds to a stage (see `with_sharding`)."""

    dp: DPSync
    optimizer_s: float
    states_bytes: tuple[float, float, float, float]  # params, grads, optimizer, gathered


def sharding_terms(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, run: RunSettings,
                   sharding: Sharding, num_params: float, *,
                   profiles: Profiles | None = None) -> ShardingTerms:
    """The data-parallel traffic, optimizer step and model-state bytes of a stage holding
    `num_params` parameters per rank, sharded as `sharding` (none depend on the
    micro-batches: the search computes them once per stage kind)."""
    dtype = run.dtype
    fsdp = None
    if sharding.params == sharding.grads == sharding.optim > 1 and spec.placed.tp == 1:
        # the executor's FSDP2 (executor/fsdp.py `fsdp_applies`), if measured here
        fsdp = fsdp_unit_s(spec.device, profiles.get(spec.device_name) if profiles else None,
                           sharding.params)
    sync = dp_sync(cluster, spec.dp_group, num_params, spec.concurrency, sharding, dtype,
                   profiles, comm=run.comm, units=shard_units(spec), fsdp_host=fsdp)
    opt = optimizer_work(num_params / sharding.optim, dtype=dtype,
                         implementation=run.kernels.optimizer,
                         num_tensors=max(1, 6 * spec.placed.num_layers))
    states = model_state_bytes(model, params=num_params, dtype=dtype, sharding=sharding,
                               tp=spec.placed.tp, pp=spec.pp)
    return ShardingTerms(sync, _compute_costs(spec.device, dtype, profiles).time_s(opt)
                         * _host_slowdown(cluster, spec, profiles), states)


def apply_sharding(cost: StageCost, terms: ShardingTerms) -> StageCost:
    """`cost` (from `unsharded_cost`) with a sharding's terms. (A shallow copy keeps the
    cached pass times, computed first so that every copy shares them.)"""
    _ = cost.forward_s, cost.backward_s, cost.weight_grad_s
    return _clone(cost, dp=terms.dp, optimizer_s=terms.optimizer_s,
                  memory=cost.memory.with_states(*terms.states_bytes))


def with_sharding(cost: StageCost, model: ModelSpec, cluster: ClusterSpec, spec: StageSpec,
                  run: RunSettings, sharding: Sharding, *,
                  profiles: Profiles | None = None) -> StageCost:
    """`cost` (from `unsharded_cost`) with its model states sharded as `sharding`: its
    data-parallel traffic, optimizer step and model-state memory."""
    return apply_sharding(cost, sharding_terms(model, cluster, spec, run, sharding,
                                               cost.num_params, profiles=profiles))


def stage_cost(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, run: RunSettings, *,
               pipeline: int = 0, profiles: Profiles | None = None) -> StageCost:
    """The cost of one stage (see StageCost): `unsharded_cost` at the spec's sharding."""
    base = unsharded_cost(model, cluster, spec, run, pipeline=pipeline, profiles=profiles)
    return with_sharding(base, model, cluster, spec, run, spec.sharding, profiles=profiles)


# -- a whole Plan ---------------------------------------------------------------------------

def plan_replicas(plan: Plan) -> list[list[PlacedStage]]:
    return [[PlacedStage(devices=s.devices, tp=s.tp, cp=s.cp, num_layers=s.num_layers,
                         recompute=s.recompute, attention=plan.attention_of(s))
             for s in pipe.stages] for pipe in plan.pipelines]


def plan_runs(plan: Plan) -> list[RunSettings]:
    tr = plan.training
    return [RunSettings(micro_batch_size=p.micro_batch_size,
                        num_microbatches=p.num_microbatches, seq_len=tr.seq_len, dtype=tr.dtype,
                        sequence_parallel=tr.sequence_parallel, schedule=tr.schedule,
                        virtual_stages=tr.virtual_stages, kernels=plan.kernels, comm=tr.comm)
            for p in plan.pipelines]


@dataclass(frozen=True)
class PlanCosts:
    """Every stage's cost, and for each pipeline the first pipeline that costs the same
    (its representative: identical replicas are priced and simulated once)."""

    costs: list[list[StageCost]]
    representative: list[int]
    specs: list[tuple[StageSpec, ...]]
    runs: list[RunSettings]

    @property
    def representatives(self) -> list[int]:
        return sorted(set(self.representative))

    @classmethod
    def of(cls, costs: PlanCosts | list[list[StageCost]]) -> PlanCosts:
        """`costs` as PlanCosts: stage costs given by hand (tests) price every pipeline."""
        if isinstance(costs, PlanCosts):
            return costs
        return cls(costs, list(range(len(costs))), [], [])


def plan_costs(plan: Plan, profiles: Profiles | None = None) -> PlanCosts:
    """Costs of every stage of every pipeline of `plan`; op and collective times from
    `profiles` where they have them."""
    replicas = plan_replicas(plan)
    groups = position_groups(replicas)
    runs = plan_runs(plan)
    costs: list[list[StageCost]] = []
    representative: list[int] = []
    all_specs: list[tuple[StageSpec, ...]] = []
    seen: dict[tuple, int] = {}
    for pi, stages in enumerate(replicas):
        specs = replica_specs(plan.cluster, stages, groups=groups,
                              shardings=[plan.sharding_of(k) for k in range(len(stages))])
        all_specs.append(specs)
        key = replica_key(plan.cluster, specs, runs[pi])
        rep = seen.setdefault(key, pi)
        representative.append(rep)
        if rep != pi:
            costs.append([replace(c, pipeline=pi) for c in costs[rep]])
            continue
        costs.append([stage_cost(plan.model, plan.cluster, s, runs[pi], pipeline=pi,
                                 profiles=profiles) for s in specs])
    return PlanCosts(costs, representative, all_specs, runs)


_DERIVED_CACHES: list[Callable[[], None]] = []


def on_clear_cost_caches(clear: Callable[[], None]) -> None:
    """Have `clear_cost_caches` also call `clear` (a cache of results built from costs,
    such as the search's evaluations)."""
    _DERIVED_CACHES.append(clear)


def clear_cost_caches() -> None:
    """Forget cached op, layer and link costs (after the model's parameters changed), and
    what was built from them."""
    for clear in _DERIVED_CACHES:
        clear()
    clear_op_cache()
    clear_comm_caches()
    layer_parts.cache_clear()
    _layer_weight_grad.cache_clear()
    _extra_parts.cache_clear()
    dp_sync.cache_clear()
    group_signature.cache_clear()
    stage_params.cache_clear()
    _passes.cache_clear()


# -- where the numbers came from ----------------------------------------------------------

def _stage_ops(model: ModelSpec, spec: StageSpec, run: RunSettings) -> list[Op]:
    """Every op a stage runs for one micro-batch, and its optimizer step."""
    shape = workload_shape(spec, run)
    work = layer_work(model, shape)
    items: list[Work] = [*work.forward, *_recomputed(work, spec.placed.recompute),
                         *work.backward]
    if spec.first:
        items.extend(w for ws in embedding_work(model, shape) for w in ws)
    if spec.last:
        fwd, bwd, _ = head_work(model, shape)
        items.extend((*fwd, *bwd))
    params = stage_params(model, spec)
    items.append(optimizer_work(params / spec.sharding.optim, dtype=run.dtype,
                                implementation=run.kernels.optimizer,
                                num_tensors=max(1, 6 * spec.placed.num_layers)))
    return [op for op in items if isinstance(op, Op)]


def _groups(specs: Sequence[tuple[StageSpec, ...]]) -> set[tuple[int, ...]]:
    """The GPU groups that communicate: tp and cp groups, pipeline neighbours, and the
    data-parallel group of each stage position."""
    groups: set[tuple[int, ...]] = set()
    for replica in specs:
        for s in replica:
            groups.update((s.tp_group, s.cp_group, s.dp_group))
            if s.next_device is not None:
                groups.add((s.placed.devices[0], s.next_device))
    return {g for g in groups if len(set(g)) > 1}


def _comm_source(cluster: ClusterSpec, specs: Sequence[tuple[StageSpec, ...]],
                 profiles: Profiles) -> str:
    """The collective profiles that answer some of the plan's groups (those inside one
    node of the profiled type, of a size the profile measured)."""
    used: dict[str, set[int]] = {}
    for group in _groups(specs):
        tiers = group_tiers(cluster, group)
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
        return {"compute": ANALYTIC_SOURCE, "communication": COMM_SOURCE,
                "host": host_source(profiles, set())}
    priced = plan_costs(plan, profiles)
    uses: list[tuple[Profile | None, Op]] = []
    for pi in priced.representatives:
        for spec in priced.specs[pi]:
            profile = profiles.get(spec.device_name)
            uses.extend((profile, op) for op in _stage_ops(plan.model, spec, priced.runs[pi]))
    return {"compute": compute_source(uses),
            "communication": _comm_source(plan.cluster, priced.specs, profiles),
            "host": host_source(profiles, {s.device_name for specs in priced.specs
                                           for s in specs})}
