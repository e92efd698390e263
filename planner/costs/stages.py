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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Generic, TypeVar

from planner.costs.comm import (
    Tier,
    Transfer,
    clear_comm_caches,
    collective_time_s,
    comm_source,
    dispatch_time_s,
    group_ranks,
    group_tiers,
    measured_crowd,
)
from planner.costs.compute import (
    ANALYTIC_SOURCE,
    TRITON_FLASH_SOURCE,
    ComputeCosts,
    calibration_source,
    clear_op_cache,
    compute_source,
)
from planner.costs.host import (
    BlockHostCost,
    collective_cpu_share,
    dtensor_cpu_share,
    dtensor_layer_s,
    dtensor_root_s,
    fsdp_root_s,
    fsdp_unit_s,
    host_families,
    host_source,
    launch_s,
    p2p_host_s,
    runner_microbatch_s,
)
from planner.costs.kernels import attention_for, supported_attention
from planner.costs.memory import (
    StageMemory,
    activation_memory,
    layers_in_flight,
    model_state_bytes,
    rank_expert_param_count,
    rank_param_count,
    rank_te_weight_count,
)
from planner.costs.workload import (
    Comm,
    HostSync,
    LayerWork,
    Op,
    Work,
    WorkloadShape,
    embedding_work,
    head_work,
    layer_work,
    optimizer_work,
)
from planner.specs.choices import (
    DEFAULT_RECOMPUTE_MODULES,
    DType,
    EpLayout,
    ModelStates,
    Recompute,
    RecomputeModule,
    Schedule,
)
from planner.specs.cluster import ClusterSpec
from planner.specs.layout import chunk_sizes, pipeline_moe_layers
from planner.specs.model import ModelSpec
from planner.specs.plan import Communication, Kernels, Plan, Sharding, Stage
from profiler.devices import DeviceSpec, device_efficiency
from profiler.kernels import Attention
from profiler.schema import cached_hash, coerce_choices
from profiler.store import Profile, Profiles

__all__ = ["DPSync", "Part", "PlacedStage", "PlanCosts",
           "RunSettings", "ShardingTerms", "StageCost", "StageSpec", "apply_sharding",
           "bucket_params", "clear_cost_caches", "cost_sources", "dp_paced", "dp_sync", "ep_paced", "ep_peers", "exposed_s",
           "gather_stall_s", "group_signature", "host_crowd", "island_concurrency", "layer_parts", "on_clear_cost_caches",
           "placement", "plan_costs", "plan_replicas", "plan_runs", "position_groups", "replica_key",
           "pass_key", "replica_specs", "shard_units", "sharding_states", "sharding_terms",
           "stage_cost", "stage_key", "stage_passes",
           "stage_params", "stage_work", "unsharded_cost", "with_sharding", "workload_shape"]

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
    ep_s: float = 0.0  # MoE token dispatch and combine (all-to-all over the ep group)
    # Of host_s: seconds a profile measured with the stage's ranks running at once (the
    # DTensor rows, timed on every tp rank together), so the slowdown of CPU ranks
    # sharing a host is in them already (planner/simulator/build.py `_cpu_share`)
    measured_shared_s: float = 0.0
    # Of host_s and tp_s: seconds the rank's process was measured off the CPU beyond what
    # the tp collectives' own CPU share leaves it (a DTensor block waiting for its peer:
    # `host.dtensor_cpu_share`); they load no core in the shared-core simulation
    off_cpu_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_s + self.cp_s + self.host_s + self.dp_s + self.ep_s

    def __add__(self, other: Part) -> Part:
        return Part(self.compute_s + other.compute_s, self.tp_s + other.tp_s,
                    self.cp_s + other.cp_s, self.host_s + other.host_s, self.dp_s + other.dp_s,
                    self.ep_s + other.ep_s, self.measured_shared_s + other.measured_shared_s,
                    self.off_cpu_s + other.off_cpu_s)

    def __sub__(self, other: Part) -> Part:
        return Part(self.compute_s - other.compute_s, self.tp_s - other.tp_s,
                    self.cp_s - other.cp_s, self.host_s - other.host_s, self.dp_s - other.dp_s,
                    self.ep_s - other.ep_s, self.measured_shared_s - other.measured_shared_s,
                    self.off_cpu_s - other.off_cpu_s)

    def __mul__(self, k: float) -> Part:
        return Part(self.compute_s * k, self.tp_s * k, self.cp_s * k, self.host_s * k,
                    self.dp_s * k, self.ep_s * k, self.measured_shared_s * k,
                    self.off_cpu_s * k)


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

    def _per_term(self, memo: str, term: str, work: Callable[[], T]) -> T:
        """`work()` for `term`, worked out once per DPSync (every pass of every replica
        that shares this traffic asks) under the memo `memo`."""
        known: dict[str, T] = self.__dict__.setdefault(memo, {})
        if term not in known:
            known[term] = work()
        return known[term]

    def about(self, term: str) -> str:
        """The transfers of one term, as traces describe them (worked out once)."""
        return self._per_term("_about", term, lambda: "; ".join(
            t.describe() for name, t in self.detail if name == term))

    def group_ranks(self, term: str) -> int:
        """The largest group one of the term's transfers spans (0 where it has none;
        worked out once)."""
        return self._per_term("_ranks", term, lambda: max(
            (group_ranks(x.tiers) for name, x in self.detail if name == term), default=0))

    def crowd(self, term: str) -> int:
        """The most of the host's processes at once that measured one of the term's
        transfers (`Transfer.crowd`; 0: all priced alone; worked out once)."""
        return self._per_term("_crowd", term, lambda: max(
            (x.crowd for name, x in self.detail if name == term), default=0))

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
    ep: int = 1  # MoE: routed experts split over ep data-parallel replicas
    etp: int | None = None  # MoE: expert tensor parallel, 1 or tp (None: tp)
    ep_layout: EpLayout = EpLayout.FOLDED  # which ranks an ep group is (Training.ep_layout)
    # MoE layers among its layers where the placement knows which layers it holds
    # (`layout.stage_moe_layers`); None: the model's share of them (exact unless a model
    # mixes dense and MoE layers)
    moe_layers: int | None = None

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

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
    # what selective recomputation re-runs (Training.recompute_modules)
    recompute_modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES
    # schedules the micro-batches run as, each with its fill and drain (Training.
    # pipeline_flushes): a stage holds at most one schedule's micro-batches
    pipeline_flushes: int = 1
    # fp32 master weights, gradients and Adam moments beside 16-bit weights (Training.
    # master_weights); false: the optimizer updates the 16-bit weights, states alike
    master_weights: bool = True
    # which framework's rule keeps the model states (Training.model_states)
    model_states: ModelStates = ModelStates.FP32_GRADS
    # FP8 training with FP8 primary weights (Training.fp8_params)
    fp8_params: bool = False

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
    # replicas whose stage at this position sends to their next stage over the same island
    # link at the same time as this one (`p2p_sharing`; 1: none besides it)
    p2p_replicas: int = 1

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

    @property
    def dp_cp_group(self) -> tuple[int, ...]:
        """The ranks holding this stage's parameters at its first GPU's tp rank: its cp
        ranks in every replica of `dp_group`, context ranks fastest (Megatron-Core's
        tp-cp-dp order). They reduce the same gradients, and ZeRO shards over them
        (Megatron-Core's `get_data_parallel_group(with_context_parallel=True)`); the other
        replicas' GPUs at the offsets of this stage's, as `ep_group` places them."""
        p = self.placed
        if p.cp == 1:
            return self.dp_group
        offsets = [d - p.devices[0] for d in p.devices[::p.tp]]
        return tuple(first + o for first in self.dp_group for o in offsets)

    @property
    def ep_group(self) -> tuple[int, ...]:
        """The ranks this stage's first GPU exchanges tokens with. Megatron-Core orders an
        MoE layer's ranks etp-ep-dp-pp over the attention's tp x cp x dp (MoE Parallel
        Folding, parallel_state.py): every etp-th GPU of the stage and the same positions
        of the other replicas (their GPUs at the offsets of this stage's), in rank order,
        cut into consecutive groups of ep; this stage's is the one holding its first GPU.
        Laid out over data-parallel replicas (`EpLayout.DATA_PARALLEL`, trainplan's
        executor) only the first GPU of each replica's stage is a member: its tp rank 0
        in ep replicas. Rank order is GPU order (Megatron's rank order lists replicas by
        their first GPU; trainplan's executor numbers ranks by GPU and cuts its
        rank-ordered data-parallel group the same way, executor/topology.py `ep_group`),
        which a mixed plan's placement need not follow: replicas are sorted here."""
        p = self.placed
        if p.ep == 1:
            return (p.devices[0],)
        stride = p.expert_tp if p.ep_layout == EpLayout.FOLDED else len(p.devices)
        offsets = [d - p.devices[0] for d in p.devices[::stride]]
        members = [first + o for first in sorted(self.dp_group) for o in offsets]
        start = members.index(p.devices[0]) // p.ep * p.ep
        return tuple(members[start:start + p.ep])


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
    # the framework's runner around each micro-batch's pass of a model chunk, beyond the
    # model's own work (measured on CPU hosts: `host.runner_microbatch_s`), on the forward
    runner: Part = Part()
    # the compute thread's part of one batched pipeline send and of one receive (issuing
    # and waiting; measured on CPU hosts: `host.p2p_host_s`), in line with the pass that
    # sends or receives (`simulator.build._chunk_parts`); 0 without a pipeline
    p2p_send_host: Part = Part()
    p2p_recv_host: Part = Part()

    @_once
    def forward(self) -> Part:
        return (self.layer_forward * self.num_layers + self.embed_forward + self.head_forward
                + self.runner)

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


@cache
def _group_islands(cluster: ClusterSpec, group: tuple[int, ...]) -> frozenset[str]:
    """The islands a data-parallel group's GPUs sit in (a replica of 1,024 asked each of
    its stages' groups anew: quadratic in the GPUs)."""
    return frozenset(cluster.group_of(d).island for d in group)


def island_concurrency(cluster: ClusterSpec, stage_devices: Sequence[Sequence[int]],
                       groups: Sequence[tuple[int, ...]] | None) -> list[int]:
    """Per stage of one replica: how many of the replica's GPUs send data-parallel
    traffic over island links at the same time as this stage does. Every GPU of a stage
    whose data-parallel (x context) group spans islands syncs its own shard over the
    island link, all at the end of the step, so the link is shared by the GPUs of every
    such stage; a stage whose group stays inside one island crosses no island link (1).
    `groups`: each stage position's first GPU in every replica (None: one replica)."""
    if len({g.island for g in cluster.node_groups}) == 1:  # no island link to share
        return [1] * len(stage_devices)

    def islands(gpus: Iterable[int]) -> set[str]:
        return {cluster.group_of(d).island for d in gpus}

    # every replica asks about the same position groups: their islands once per cluster
    crossing = [len(islands(devs) | (_group_islands(cluster, groups[k]) if groups is not None
                                     else set())) > 1
                for k, devs in enumerate(stage_devices)]
    n = sum(len(devs) for devs, c in zip(stage_devices, crossing, strict=True) if c)
    return [n if c else 1 for c in crossing]


@cache
def _crossings(cluster: ClusterSpec, here: tuple[int, ...], there: tuple[int, ...]
               ) -> dict[frozenset[str], int]:
    """How many replicas' sends from one stage position (`here`: its first GPU in every
    replica) to the next (`there`, replica by replica) cross each pair of islands."""
    out: dict[frozenset[str], int] = {}
    for a, b in zip(here, there, strict=True):
        ia, ib = cluster.group_of(a).island, cluster.group_of(b).island
        if ia != ib:
            pair = frozenset((ia, ib))
            out[pair] = out.get(pair, 0) + 1
    return out


def p2p_sharing(cluster: ClusterSpec, groups: Sequence[tuple[int, ...]] | None, k: int,
                first: int, nxt: int | None) -> int:
    """How many replicas send from stage position `k` to the next over the island link
    this replica's stage (first GPU `first`, next stage's `nxt`) crosses, itself included:
    replicas run the same schedule, so their sends of a micro-batch leave together and
    share the link (`IslandLink`: its bandwidth is shared by all traffic on it). 1 where
    the send stays inside an island, and where the replicas are not aligned (`groups`
    None: their stages differ)."""
    if groups is None or nxt is None:
        return 1
    ia, ib = cluster.group_of(first).island, cluster.group_of(nxt).island
    if ia == ib:
        return 1
    there = groups[(k + 1) % len(groups)]
    return max(1, _crossings(cluster, groups[k], there).get(frozenset((ia, ib)), 1))


def replica_specs(cluster: ClusterSpec, stages: Sequence[PlacedStage], *,
                  groups: Sequence[tuple[int, ...]] | None,
                  shardings: Sequence[Sharding]) -> tuple[StageSpec, ...]:
    """The stage specs of one replica (a pipeline of placed stages), stage k sharded as
    `shardings[k]` over `groups[k]` (`position_groups`). Stages send to the next one (the
    last to the first, which interleaving uses)."""
    pp = len(stages)
    concurrency = island_concurrency(cluster, [s.devices for s in stages], groups)
    out = []
    for k, placed in enumerate(stages):
        nxt = stages[(k + 1) % pp]
        next_device = None if nxt is placed else nxt.devices[0]
        out.append(StageSpec(
            device=cluster.group_of(placed.devices[0]).device, placed=placed,
            index=k, pp=pp, next_device=next_device,
            dp_group=groups[k] if groups is not None else (placed.devices[0],),
            concurrency=concurrency[k], sharding=shardings[k],
            p2p_replicas=p2p_sharing(cluster, groups, k, placed.devices[0], next_device)))
    return tuple(out)


@cache
def group_signature(cluster: ClusterSpec, group: tuple[int, ...]) -> tuple:
    """What the links of a group of GPUs depend on: each member's node group (its GPU,
    links, NICs and island), which members share a node and which an NVLink domain, and
    which sit on the same rails (local index, counted from the first member's:
    `comm._network_tier` compares the nodes' local indices, which a common shift keeps
    equal). Groups with equal signatures cost the same for every collective among them or
    among any of their sub-groups."""
    return placement(cluster, group, group[0])


def placement(cluster: ClusterSpec, gpus: Sequence[int], origin: int) -> tuple:
    """Where the GPUs `gpus` sit, counted from the GPU `origin`: each one's node group,
    node, NVLink domain and local index (rail) as offsets from origin's. Two sets of GPUs
    with equal placements have the same links among them (`group_signature`)."""
    slots = cluster.slots
    node0, domain0, local0 = slots[origin].node, slots[origin].domain, slots[origin].local
    return tuple((slots[d].group, slots[d].node - node0, slots[d].domain - domain0,
                  slots[d].local - local0) for d in gpus)


def _link_tiers(cluster: ClusterSpec, spec: StageSpec
                ) -> tuple[tuple, tuple[Tier, ...] | None]:
    """The links a stage's passes use: the tiers of its tp, cp and ep groups (by axis),
    and of the link to the next stage (None: it sends nothing), which its tp and cp ranks
    cross at once, each sending a slice (`_p2p`), beside the other replicas' sends over the
    same island link (`StageSpec.p2p_replicas`)."""
    p = spec.placed
    tiers_key = (("tp", group_tiers(cluster, spec.tp_group)),
                 ("cp", group_tiers(cluster, spec.cp_group)),
                 ("ep", group_tiers(cluster, spec.ep_group)))
    p2p = (None if spec.next_device is None
           else group_tiers(cluster, (p.devices[0], spec.next_device),
                            concurrency=p.tp * p.cp * spec.p2p_replicas))
    return tiers_key, p2p


def pass_key(cluster: ClusterSpec, spec: StageSpec) -> tuple:
    """Stages with equal keys have equal pass times, transfers and memory before
    sharding (`unsharded_cost`): everything but their data-parallel group."""
    p = spec.placed
    return (spec.device, p.tp, p.cp, p.ep, p.etp, p.ep_layout, p.num_layers, p.moe_layers,
            p.recompute,
            p.attention, spec.first, spec.last, spec.pp, *_link_tiers(cluster, spec),
            # where its context ranks sit, which with the data-parallel group gives the
            # dp x cp group its model states sync over
            group_signature(cluster, spec.cp_group) if p.cp > 1 else None)


def stage_key(cluster: ClusterSpec, spec: StageSpec, *, dp_signature: object = None,
              passes: tuple | None = None) -> tuple:
    """Stages with equal keys have equal pass times, transfers and data-parallel traffic
    at any sharding (they differ at most in position, which only memory depends on).
    `dp_signature` stands for `group_signature(cluster, spec.dp_group)` where the caller
    numbered the signatures once (a group of thousands of GPUs is slow to hash); `passes`
    for `pass_key(cluster, spec)` where the caller has it."""
    return (pass_key(cluster, spec) if passes is None else passes,
            group_signature(cluster, spec.dp_group) if dp_signature is None else dp_signature,
            spec.concurrency)


def replica_key(cluster: ClusterSpec, specs: Sequence[StageSpec], run: RunSettings, *,
                dp_signatures: Sequence[object] | None = None) -> tuple:
    """Replicas with equal keys cost the same, stage by stage. `dp_signatures` stand for
    the stages' `group_signature`s by position (as in `stage_key`), where the caller
    numbered them once."""
    return (run, tuple((stage_key(cluster, s, dp_signature=None if dp_signatures is None
                                  else dp_signatures[s.index]), s.sharding) for s in specs))


# -- pricing one stage ------------------------------------------------------------------

def _issue_queue_s(items: list[tuple[float, int]], launch_s: float, repeats: int) -> float:
    """Wall time of `repeats` passes over `items` = (GPU seconds, kernel launches) when a
    host issues the kernels one by one (`launch_s` each) and the GPU runs them in order:
    an item starts once the GPU is free and the host has issued its first kernel, and
    lasts at least as long as the host takes to issue the rest. A host sync
    (`workload.HostSync`) comes as (share, -1) where the GPU's progress is recorded and
    (share, -2) where the host waits for it: the host issues nothing more until the GPU
    has got there (for `share` of the layers)."""
    host = gpu = mark = 0.0
    for _ in range(repeats):
        for busy, launches in items:
            if launches == -1:
                mark = gpu
            elif launches == -2:
                host += busy * max(0.0, mark - host)
            else:
                gpu = max(gpu, host + launch_s) + max(busy, (launches - 1) * launch_s)
                host += launches * launch_s
    return gpu


def _part(items: tuple[Work, ...], costs: ComputeCosts, tiers: dict[str, tuple[Tier, ...]],
          launch_s: float, *, steady: bool = False, tp_hidden: float = 0.0,
          profiles: Profiles | None = None) -> Part:
    """Time of a sequence of ops and in-line collectives on one rank. With `steady`, the
    per-repetition time once the host-GPU queue has settled (a layer among many).
    `tp_hidden` of each sequence-parallel tp collective runs under the GEMMs beside it."""
    compute = 0.0
    comm = {"tp": 0.0, "cp": 0.0, "ep": 0.0}
    timeline: list[tuple[float, int]] = []
    for item in items:
        if isinstance(item, HostSync):
            timeline.append((item.share, -1 if item.point == "record" else -2))
        elif isinstance(item, Comm):
            if item.top_k:
                t = dispatch_time_s(item.bytes, tiers[item.axis], top_k=item.top_k,
                                    experts=item.experts, consecutive=item.consecutive)
            else:
                t = collective_time_s(item.kind, item.bytes, tiers.get(item.axis, ()),
                                      profiles=profiles)
            if item.axis == "tp" and item.kind in ("all_gather", "reduce_scatter"):
                t *= 1.0 - tp_hidden
            comm[item.axis] += t
            timeline.append((t, 1))
        else:
            t = costs.time_s(item)
            compute += t
            timeline.append((t, item.kernels))
    wall = _issue_queue_s(timeline, launch_s, 1)
    if steady:
        wall = _issue_queue_s(timeline, launch_s, 2) - wall
    return Part(compute, comm["tp"], comm["cp"], max(0.0, wall - compute - sum(comm.values())),
                ep_s=comm["ep"])


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
    # the share of sequence-parallel tp collectives under the GEMMs, where the framework
    # overlaps them (`Communication.tp_comm_overlap`)
    hidden = device_efficiency(dev).tp_comm_overlap if shape.tp_comm_overlap else 0.0
    work = layer_work(model, shape)
    again = _recomputed(work, recompute)
    fwd = _part(work.forward, costs, tiers, issue_s, steady=True, tp_hidden=hidden,
                profiles=profiles)
    bwd = _part((*again, *work.backward), costs, tiers, issue_s, steady=True, tp_hidden=hidden,
                profiles=profiles)
    # DTensor's dispatch of a tp block, on the compute stream (a full recompute runs the
    # forward's again inside the backward); measured with its two tp collectives a pass
    # in, those are taken out at the price `_part` gives them at the measured size
    dt = dtensor_layer_s(dev, profile, shape.tp, shape.sequence_parallel,
                         _activation_bytes(model, shape))
    dt_fwd, dt_bwd = dt.forward_s, dt.backward_s
    if dt.comm_bytes:
        kinds = ("all_gather", "reduce_scatter") if shape.sequence_parallel else ("all_reduce",)
        comm = 2 * sum(collective_time_s(k, dt.comm_bytes, tiers.get("tp", ()),
                                         profiles=profiles) for k in kinds)
        dt_fwd, dt_bwd = max(0.0, dt_fwd - comm), max(0.0, dt_bwd - comm)
    again_s = dt_fwd if recompute == Recompute.FULL else 0.0
    share = _dtensor_share(model, shape, dev, profile)
    return (_off_cpu(fwd + Part(host_s=dt_fwd, measured_shared_s=dt_fwd), dt_fwd, *share),
            _off_cpu(bwd + Part(host_s=dt_bwd + again_s, measured_shared_s=dt_bwd + again_s),
                     dt_bwd + again_s, *share))


def _dtensor_share(model: ModelSpec, shape: WorkloadShape, dev: DeviceSpec,
                   profile: Profile | None) -> tuple[float | None, float]:
    """(the measured CPU share of a tp block's DTensor time, or None; the CPU share of
    its tp collectives as the simulation prices them, `collective_cpu_share`)."""
    share = dtensor_cpu_share(dev, profile, shape.tp, shape.sequence_parallel,
                              _activation_bytes(model, shape))
    if share is None:
        return None, 0.0
    return share, collective_cpu_share(dev, profile, shape.tp) or 0.0


def _off_cpu(part: Part, dtensor_s: float, share: float | None, tp_share: float) -> Part:
    """`part` with the seconds of its DTensor time (`dtensor_s` of its host time, with
    its tp collectives) that the profile measured off the CPU marked (`Part.off_cpu_s`):
    the simulation counts the collectives busy at `tp_share` and the rest as CPU work, the
    profile measured the two together busy at `share`. Never negative: a measurement
    busier than that leaves the part as it was."""
    if share is None:
        return part
    busy = dtensor_s + part.tp_s * tp_share
    off = max(0.0, busy - share * (dtensor_s + part.tp_s))
    return replace(part, off_cpu_s=part.off_cpu_s + off)


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
    # DTensor's embedding, head and vocabulary-parallel loss, priced with the head (busy
    # on the CPU at the share the blocks measured)
    dt_fwd, dt_bwd = (_dtensor_root(model, shape, dev, profile, tiers, profiles)
                      if which == "head" else (0.0, 0.0))
    share = _dtensor_share(model, shape, dev, profile) if which == "head" else (None, 0.0)
    return (_off_cpu(_part(fwd, costs, tiers, issue_s, profiles=profiles)
                     + Part(host_s=dt_fwd, measured_shared_s=dt_fwd), dt_fwd, *share),
            _off_cpu(_part(bwd, costs, tiers, issue_s, profiles=profiles)
                     + Part(host_s=dt_bwd, measured_shared_s=dt_bwd), dt_bwd, *share))


def _activation_bytes(model: ModelSpec, shape: WorkloadShape) -> float:
    """One micro-batch's activation [b, s, h] on a rank (its tp collectives' size)."""
    return (shape.micro_batch_size * shape.seq_len // shape.cp * model.hidden_size
            * DType(shape.dtype).element_bytes)


def _dtensor_root(model: ModelSpec, shape: WorkloadShape, dev: DeviceSpec,
                  profile: Profile | None, tiers: dict[str, tuple[Tier, ...]],
                  profiles: Profiles | None) -> tuple[float, float]:
    """DTensor's embedding, head and loss beyond their tp collectives (the embedding's
    and head's own `Comm`s, which `_part` prices at the plan's size): the measured root,
    less those collectives at the size it was measured at (`dtensor_root_s`)."""
    dt = dtensor_root_s(dev, profile, shape.tp, shape.sequence_parallel,
                        _activation_bytes(model, shape))
    if not dt.comm_bytes:
        return dt.forward_s, dt.backward_s
    scale = dt.comm_bytes / _activation_bytes(model, shape)
    embed, head = embedding_work(model, shape), head_work(model, shape)

    def comm_s(*items: tuple[Work, ...]) -> float:
        return sum(collective_time_s(c.kind, c.bytes * scale, tiers.get(c.axis, ()),
                                     profiles=profiles)
                   for work in items for c in work if isinstance(c, Comm))

    return (max(0.0, dt.forward_s - comm_s(embed[0], head[0])),
            max(0.0, dt.backward_s - comm_s(embed[1], head[1])))


def bucket_params(comm: Communication, dp: int) -> float:
    """Parameters per gradient bucket: the setting, else Megatron's max(4e7, 1e6 x dp)."""
    if comm.grad_bucket_params is not None:
        return comm.grad_bucket_params
    return max(MEGATRON_BUCKET_MIN_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP * dp)


def host_crowd(cluster: ClusterSpec, spec: StageSpec) -> int:
    """The ranks of the stage's first host that reduce gradients at once with its first
    rank: the members of its data-parallel (x context) group on that host, each with its
    tp ranks (every tp rank reduces its own slice: the groups of all of them meet after
    the same backward)."""
    slots = cluster.slots
    node = slots[spec.dp_cp_group[0]].node
    return sum(slots[d].node == node for d in spec.dp_cp_group) * spec.placed.tp


@cache
def dp_sync(cluster: ClusterSpec, group: tuple[int, ...], params: float, concurrency: int,
            sharding: Sharding, dtype: str, profiles: Profiles | None = None, *,
            comm: Communication, units: int = 1,
            fsdp_host: BlockHostCost | None = None,
            fsdp_root: BlockHostCost | None = None, crowd: int = 0) -> DPSync:
    """Traffic of the data-parallel group `group` (the ranks holding the same parameters:
    one GPU per replica and context-parallel rank, `StageSpec.dp_cp_group`) holding
    `params` parameters each (Rajbhandari et al. 2020; Chen et al. 2023, AMSP), with
    gradients sharded over g of its ranks, optimizer states over os and parameters over p
    (p | g | os | len(group)), as the framework issues it (`comm`): gradients in
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

    `fsdp_host`: FSDP2's measured per-unit cost (planner/costs/host.py `BlockHostCost`)
    beyond its collectives; where it was measured with them in, less this group's price
    of them at the measured unit's size (the curve that prices the plan's collectives, so
    its noise cancels where the sizes agree). With it the gathers and reduce-scatters
    block the compute thread unit by unit, as FSDP2 runs them on this host: every unit of
    a pass waits for its gather (no prefetch), and each backward's reduce-scatters and
    hooks are held by it too (`param_microbatch_s` then carries all of it, none on a side
    stream). `fsdp_root`: the same for the root unit (one of the `units`), where measured.

    `crowd`: the host's ranks that run these collectives at once (CPU ranks: `host_crowd`),
    which prices them from a CPU profile's measurement of groups of their size reducing all
    at once (`comm.measured_crowd`; on oversubscribed cores several times the group alone).
    FSDP2's collectives inside the passes (with `fsdp_host`) alternate with the other
    groups' compute and stay priced alone, slowed by the host's load as the passes are.
    """
    dp = len(group)
    if dp == 1:
        return DPSync()
    low = DType(dtype).element_bytes
    grad_bytes = params * DType(comm.grad_reduce_dtype).element_bytes
    buckets = max(1, math.ceil(params / bucket_params(comm, dp)))

    detail: list[tuple[str, Transfer]] = []

    g, optim, p = sharding.grads, sharding.optim, sharding.params
    gather_units = 0
    if p > 1:
        gather_units = (max(1, math.ceil(params / comm.shard_unit_params))
                        if comm.shard_unit_params else max(1, units))
    in_pass = fsdp_host is not None and gather_units > 0  # FSDP2's, inside the passes

    def time_s(term: str, kind: str, size: float, members: int, stride: int,
               pieces: int = 1) -> float:
        tiers = group_tiers(cluster, group[0:members * stride:stride], concurrency)
        at_once = 0 if in_pass and term.endswith("microbatch") else crowd
        measured = measured_crowd(kind, tiers, profiles, at_once)
        detail.append((term, Transfer(kind, size / pieces, tiers, pieces, measured)))
        return pieces * collective_time_s(kind, size / pieces, tiers, profiles=profiles,
                                          crowd=at_once)

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
    if in_pass:
        assert fsdp_host is not None
        tiers = group_tiers(cluster, group[0:p], concurrency)

        def beyond(cost: BlockHostCost, gathers: int) -> float:
            """A unit's forward + backward less its collectives at our price of them
            (`gathers` all-gathers and a reduce-scatter, where measured with them in)."""
            fwd, bwd = cost.forward_s, cost.backward_s
            if cost.comm_bytes:
                gather = collective_time_s("all_gather", cost.comm_bytes, tiers,
                                           profiles=profiles)
                scatter = collective_time_s("reduce_scatter", cost.comm_bytes, tiers,
                                            profiles=profiles)
                fwd, bwd = max(0.0, fwd - gather), max(0.0, bwd - (gathers - 1) * gather
                                                       - scatter)
            return fwd + bwd

        unit = beyond(fsdp_host, 2)
        host = gather_units * unit
        if fsdp_root is not None:
            # FSDP2 keeps the root's parameters from forward to backward: one gather fewer
            host += beyond(fsdp_root, 1) - unit
            param_mb -= param_mb / (2 * gather_units)
        param_mb += grad_mb + host
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
                         dtype=run.dtype, attention=p.attention or run.kernels.attention,
                         ep=p.ep, etp=p.etp, dispatcher=run.comm.moe_dispatcher,
                         routing=run.comm.moe_routing,
                         recompute_modules=tuple(run.recompute_modules
                                                 if p.recompute == Recompute.SELECTIVE
                                                 else DEFAULT_RECOMPUTE_MODULES),
                         moe_layers_share=(p.moe_layers / p.num_layers
                                           if p.moe_layers is not None and p.num_layers
                                           else None),
                         tp_comm_overlap=run.comm.tp_comm_overlap)


def _p2p(model: ModelSpec, shape: WorkloadShape, tiers: tuple[Tier, ...] | None,
         profiles: Profiles | None) -> tuple[float, Transfer | None]:
    """Send one activation to the next stage over `tiers` (None: no next stage). Megatron
    (scatter-gather) and DeepSpeed (`is_pipe_partitioned` under tp) scatter it over the
    tp ranks; each sends a slice, all at once, so the tp slices share an island link
    (`_link_tiers` prices the link at tp concurrent sends; the NICs' share per GPU
    already assumes every GPU of a node sends)."""
    if tiers is None:
        return 0.0, None
    size = _p2p_bytes(model, shape)
    return (collective_time_s("send_recv", size, tiers, profiles=profiles),
            Transfer("send_recv", size, tiers))


def _p2p_bytes(model: ModelSpec, shape: WorkloadShape) -> float:
    """Bytes of one pipeline message: a micro-batch's activation (or its gradient), the
    slice of one tp and cp rank."""
    return (shape.micro_batch_size * shape.seq_len // shape.cp * model.hidden_size
            * DType(shape.dtype).element_bytes / shape.tp)


def shard_units(spec: StageSpec) -> int:
    """ZeRO-3 / FSDP units of a stage, one per transformer layer and one for the
    embedding and for the head (FSDP2's fully_shard per block, the root last)."""
    return spec.placed.num_layers + int(spec.first) + int(spec.last)


@cache
def stage_params(model: ModelSpec, spec: StageSpec) -> float:
    """Parameters one rank of the stage holds, before sharding."""
    return rank_param_count(model, num_layers=spec.placed.num_layers, first=spec.first,
                            last=spec.last, tp=spec.placed.tp, pp=spec.pp, ep=spec.placed.ep,
                            etp=spec.placed.expert_tp, moe_layers=spec.placed.moe_layers)


def unsharded_cost(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, run: RunSettings,
                   *, pipeline: int = 0, profiles: Profiles | None = None,
                   passes: StageCost | None = None) -> StageCost:
    """The stage's cost with its model states replicated (no data-parallel traffic, no
    optimizer step yet): `with_sharding` completes it. Op and collective times come from
    `profiles` where they have them. `passes`: `stage_passes(...)` of this stage and run
    where the caller kept it (candidates that differ only in their schedule or number of
    micro-batches share it)."""
    if passes is None:
        passes = stage_passes(model, cluster, spec, run, profiles=profiles)
    n = spec.placed.num_layers
    in_flight = layers_in_flight(run.schedule, stage=spec.index, pp=spec.pp,
                                 num_microbatches=run.num_microbatches,
                                 chunk_layers=tuple(chunk_sizes(n, run.virtual_stages)),
                                 flushes=run.pipeline_flushes)
    # the pass times (and their sums) as computed once, with this run's activations and
    # the framework's pipeline sends
    memory = passes.memory.with_layers_in_flight(in_flight)
    return _clone(passes, pipeline=pipeline, stage=spec.index, memory=memory,
                  p2p_blocking=run.comm.pipeline_p2p.blocks_compute)


def _clone(cost: StageCost, **fields: object) -> StageCost:
    """A copy of `cost` with `fields` changed that keeps its computed sums (copy.copy,
    faster: a search makes millions)."""
    out = object.__new__(StageCost)
    out.__dict__.update(cost.__dict__)
    out.__dict__.update(fields)
    return out


def stage_passes(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, run: RunSettings, *,
                 profiles: Profiles | None = None) -> StageCost:
    """What a stage costs that does not depend on the schedule or on how many
    micro-batches it runs (all but the activations in flight: none here), with the pass
    totals computed: it depends on the run only through the shape of the work
    (`workload_shape`: micro-batch size, sequence parallelism and the run's constants).
    Keyed by what it depends on (the links of its groups, not which GPUs they are; not
    its data-parallel group or sharding, which `sharding_terms` prices): stages of
    different placements and candidates share it."""
    return _pass_costs(model, workload_shape(spec, run), _stage_links(model, cluster, spec),
                       profiles)


@cached_hash
@dataclass(frozen=True)
class _StageLinks:
    """What a stage's passes depend on besides the model, the shape of its work and the
    profiles: its GPU, the tiers of its tp / cp / ep groups and of the link to the next
    stage, its layers and where it sits."""

    device: DeviceSpec
    tiers_key: tuple
    p2p_tiers: tuple[Tier, ...] | None
    num_layers: int
    recompute: Recompute
    first: bool
    last: bool
    num_params: float


@cache
def _stage_links(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec) -> _StageLinks:
    """`spec`'s links (one object per spec: the pass cache finds it by identity)."""
    p = spec.placed
    tiers_key, p2p = _link_tiers(cluster, spec)
    return _StageLinks(spec.device, tiers_key, p2p, p.num_layers, p.recompute, spec.first,
                       spec.last, stage_params(model, spec))


@cache
def _pass_costs(model: ModelSpec, shape: WorkloadShape, links: _StageLinks,
                profiles: Profiles | None) -> StageCost:
    """`stage_passes` once per key (its `stage` is 0: `unsharded_cost` sets the position)."""
    dev, tiers_key, recompute = links.device, links.tiers_key, links.recompute
    layer_fwd, layer_bwd = layer_parts(model, shape, dev, tiers_key, recompute, profiles)
    zero = (Part(), Part())
    embed = (_extra_parts(model, shape, dev, tiers_key, "embed", profiles) if links.first
             else zero)
    head = _extra_parts(model, shape, dev, tiers_key, "head", profiles) if links.last else zero
    p2p_s, p2p_transfer = _p2p(model, shape, links.p2p_tiers, profiles)
    profile = profiles.get(dev.name) if profiles else None
    runner = Part(host_s=runner_microbatch_s(dev, profile))
    send_s, recv_s = (p2p_host_s(dev, profile, _p2p_bytes(model, shape))
                      if not (links.first and links.last) else (0.0, 0.0))
    cost = StageCost(pipeline=0, stage=0, device=dev.name, num_layers=links.num_layers,
                     num_params=links.num_params, layer_forward=layer_fwd,
                     layer_backward=layer_bwd, embed_forward=embed[0], embed_backward=embed[1],
                     head_forward=head[0], head_backward=head[1], p2p_s=p2p_s,
                     p2p_transfer=p2p_transfer, dp=DPSync(), optimizer_s=0.0,
                     memory=activation_memory(model, device=dev, shape=shape,
                                              num_layers=links.num_layers, last=links.last,
                                              recompute=recompute, layers_in_flight=0.0),
                     layer_weight_grad=_layer_weight_grad(model, shape, dev, tiers_key,
                                                          recompute, profiles),
                     runner=runner, p2p_send_host=Part(host_s=send_s),
                     p2p_recv_host=Part(host_s=recv_s))
    _ = cost.forward_s, cost.backward_s, cost.weight_grad_s
    return cost


@dataclass(frozen=True)
class ShardingTerms:
    """What a sharding adds to a stage (see `with_sharding`)."""

    dp: DPSync
    optimizer_s: float
    states_bytes: tuple[float, float, float, float]  # params, grads, optimizer, gathered


def sharding_states(model: ModelSpec, spec: StageSpec, dtype: str, sharding: Sharding,
                    num_params: float, *, master_weights: bool = True,
                    states: ModelStates = ModelStates.FP32_GRADS, fp8_params: bool = False,
                    grad_dtype: str | None = None) -> tuple[float, float, float, float]:
    """Model-state bytes (params, grads, optimizer, gathered) of a stage holding
    `num_params` parameters per rank, sharded as `sharding` (`master_weights`, `states`,
    `fp8_params`: as `RunSettings.master_weights`, `.model_states`, `.fp8_params`;
    `grad_dtype`: the run's `comm.grad_reduce_dtype`, the dtype Megatron-Core keeps its
    gradient buffer in, `memory.state_bytes_per_param`)."""
    p = spec.placed
    experts = rank_expert_param_count(model, num_layers=p.num_layers, etp=p.expert_tp, ep=p.ep,
                                      moe_layers=p.moe_layers)
    te = rank_te_weight_count(model, num_layers=p.num_layers, tp=p.tp, ep=p.ep,
                              etp=p.expert_tp, moe_layers=p.moe_layers)
    return model_state_bytes(model, params=num_params, dtype=dtype, sharding=sharding,
                             tp=p.tp, pp=spec.pp, expert_params=experts, ep=p.ep,
                             etp=p.expert_tp, master_weights=master_weights,
                             ep_layout=p.ep_layout, states=states, te_weights=te,
                             fp8_params=fp8_params, grad_dtype=grad_dtype)


def sharding_terms(model: ModelSpec, cluster: ClusterSpec, spec: StageSpec, run: RunSettings,
                   sharding: Sharding, num_params: float, *,
                   profiles: Profiles | None = None) -> ShardingTerms:
    """The data-parallel traffic, optimizer step and model-state bytes of a stage holding
    `num_params` parameters per rank, sharded as `sharding` (none depend on the
    micro-batches: the search computes them once per stage kind)."""
    dtype = run.dtype
    fsdp = root = None
    units = shard_units(spec)
    if sharding.params == sharding.grads == sharding.optim > 1 and spec.placed.tp == 1:
        # the executor's FSDP2 (executor/fsdp.py `fsdp_applies`), if measured here: a unit
        # per block, and the root holding the rest (embedding, final norm, head)
        profile = profiles.get(spec.device_name) if profiles else None
        low = DType(dtype).element_bytes
        layers = spec.placed.num_layers
        block = model.params_per_layer()
        fsdp = fsdp_unit_s(spec.device, profile, sharding.params, low * block)
        if fsdp is not None:
            ends = spec.first or spec.last
            units = layers + int(ends)
            root = (fsdp_root_s(spec.device, profile, sharding.params,
                                low * max(0.0, num_params - layers * block))
                    if ends else None)
    sync = dp_sync(cluster, spec.dp_cp_group, num_params, spec.concurrency, sharding, dtype,
                   profiles, comm=run.comm, units=units, fsdp_host=fsdp, fsdp_root=root,
                   crowd=host_crowd(cluster, spec) if spec.device.vendor == "cpu" else 0)
    opt = optimizer_work(num_params / sharding.optim, dtype=dtype,
                         implementation=run.kernels.optimizer,
                         num_tensors=max(1, 6 * spec.placed.num_layers),
                         master_weights=run.master_weights)
    return ShardingTerms(sync, _compute_costs(spec.device, dtype, profiles).time_s(opt),
                         sharding_states(model, spec, dtype, sharding, num_params,
                                         master_weights=run.master_weights,
                                         states=run.model_states,
                                         fp8_params=run.fp8_params,
                                         grad_dtype=run.comm.grad_reduce_dtype))


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

def stage_attention(plan: Plan, stage: Stage) -> Attention:
    """The attention kernel a stage runs: its own where set; else the plan's, where the
    stage's GPU type runs it in the plan's dtype, and otherwise that GPU type's own (a
    plan on mixed GPU types names the first type's default: V100s, say, run no flash
    attention in fp16; `planner/costs/kernels.py`)."""
    asked = plan.attention_of(stage)
    if stage.attention is not None:
        return asked
    dev = plan.group_of(stage).device
    dropout = plan.model.drops_attention
    if asked in supported_attention(dev, plan.training.dtype, dropout=dropout):
        return asked
    return attention_for(dev, plan.training.dtype, dropout=dropout)


def with_stage_attention(plan: Plan) -> Plan:
    """`plan` with each stage's attention kernel written where its GPU type runs another
    than the plan's (`stage_attention`), so that the plan file and its description say
    what each stage runs."""
    def own(s: Stage) -> Stage:
        runs = stage_attention(plan, s)
        return s if runs == plan.attention_of(s) else replace(s, attention=runs)

    pipes = tuple(replace(p, stages=tuple(own(s) for s in p.stages)) for p in plan.pipelines)
    return plan if pipes == plan.pipelines else replace(plan, pipelines=pipes)


def plan_replicas(plan: Plan) -> list[list[PlacedStage]]:
    """Each replica's stages as placed, each with the MoE layers it holds."""
    tr = plan.training
    out = []
    for pipe in plan.pipelines:
        moe = pipeline_moe_layers(plan, pipe)
        out.append([PlacedStage(devices=s.devices, tp=s.tp, cp=s.cp, num_layers=s.num_layers,
                                recompute=s.recompute, attention=stage_attention(plan, s),
                                ep=tr.ep, etp=tr.etp, ep_layout=tr.ep_layout, moe_layers=m)
                    for s, m in zip(pipe.stages, moe, strict=True)])
    return out


def plan_runs(plan: Plan) -> list[RunSettings]:
    tr = plan.training
    return [RunSettings(micro_batch_size=p.micro_batch_size,
                        num_microbatches=p.num_microbatches, seq_len=tr.seq_len, dtype=tr.dtype,
                        sequence_parallel=tr.sequence_parallel, schedule=tr.schedule,
                        virtual_stages=tr.virtual_stages, kernels=plan.kernels, comm=tr.comm,
                        recompute_modules=tr.recompute_modules,
                        pipeline_flushes=tr.pipeline_flushes,
                        master_weights=tr.master_weights, model_states=tr.model_states,
                        fp8_params=tr.fp8_params)
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
    # every replica's stage k syncs over groups[k] (thousands of GPUs, slow to hash): its
    # signature found once and named by a small number
    numbered: dict[tuple, int] = {}
    signatures = (None if groups is None else
                  [numbered.setdefault(group_signature(plan.cluster, g), len(numbered))
                   for g in groups])
    for pi, stages in enumerate(replicas):
        specs = replica_specs(plan.cluster, stages, groups=groups,
                              shardings=[plan.sharding_of(k) for k in range(len(stages))])
        all_specs.append(specs)
        key = replica_key(plan.cluster, specs, runs[pi], dp_signatures=signatures)
        rep = seen.setdefault(key, pi)
        representative.append(rep)
        if rep != pi:  # copies that keep the computed pass sums
            costs.append([_clone(c, pipeline=pi) for c in costs[rep]])
            continue
        costs.append([stage_cost(plan.model, plan.cluster, s, runs[pi], pipeline=pi,
                                 profiles=profiles) for s in specs])
    costs, representative = _paced_plan(costs, representative, all_specs)
    if groups is not None:  # replicas that split the layers alike reduce together
        costs = _dp_paced_plan(costs, representative)
    return PlanCosts(costs, representative, all_specs, runs)


# -- expert parallelism across unlike replicas ----------------------------------------------

def ep_peers(specs: Sequence[Sequence[StageSpec]]) -> list[tuple[tuple[int, ...], ...]] | None:
    """[replica][position] -> the replicas (indices into `specs`) whose stage at that
    position is in this replica's ep group there, itself included: the replicas holding
    the GPUs of its `StageSpec.ep_group` (which knows the ep layout); None without expert
    parallelism across replicas. Mixed plans place replicas out of GPU order, and each
    position's order may differ."""
    pp = len(specs[0])
    if (specs[0][0].placed.ep == 1 or len(specs) == 1
            or any(len(rep) != pp for rep in specs)):
        return None
    rows: list[list[tuple[int, ...]]] = [[] for _ in specs]
    for k in range(pp):
        holder = {d: r for r, rep in enumerate(specs) for d in rep[k].placed.devices}
        for r, rep in enumerate(specs):
            # a GPU no replica holds here (replicas of unlike tp, which the executor
            # refuses with ep) pairs with nobody
            rows[r].append(tuple(sorted({r, *(holder[d] for d in rep[k].ep_group
                                              if d in holder)})))
    return [tuple(row) for row in rows]


# StageCost's sums of its parts (`_once`), dropped from a copy whose parts change
_PASS_SUMS = ("forward", "backward", "weight_grad", "weight_grad_s", "forward_s", "backward_s")


def ep_paced(cost: StageCost, peers: Sequence[StageCost]) -> StageCost:
    """`cost` with its forward and backward passes waiting for its slowest ep peer
    (`peers`, the stages of the ep group at this position, itself included, holding the
    same layers).

    An all-to-all is a synchronizing collective: NCCL runs it as grouped point-to-point
    sends and receives with every peer (ncclGroupStart, ncclSend / ncclRecv per peer,
    ncclGroupEnd: NCCL docs "Point-to-point communication", all-to-all), so a rank's
    all-to-all ends only once every peer has reached it and sent its part. Megatron-Core's
    MoEAlltoAllTokenDispatcher (and the executor, executor/moe.py) runs two per MoE layer
    and pass (dispatch before the expert GEMMs, combine after; their gradients in the
    backward), and the peers run the same passes in the same order, so from one
    all-to-all to the next every peer waits for the slowest: a faster GPU's pass takes as
    long as the slowest peer's (its embedding and head too, which run between one pass's
    last all-to-all and the next's first), the difference spent waiting in the
    all-to-alls (`ep_s` of its layers: exposed expert-parallel communication). Peers of
    one GPU type and placement cost alike and wait for nothing."""
    n = cost.num_layers
    fwd = max(c.forward.total_s for c in peers) - cost.forward.total_s
    bwd = max(c.backward.total_s for c in peers) - cost.backward.total_s
    if n == 0 or fwd <= 0 and bwd <= 0:
        return cost
    paced = object.__new__(StageCost)
    paced.__dict__.update({k: v for k, v in cost.__dict__.items() if k not in _PASS_SUMS})
    paced.__dict__.update(layer_forward=cost.layer_forward + Part(ep_s=max(0.0, fwd) / n),
                          layer_backward=cost.layer_backward + Part(ep_s=max(0.0, bwd) / n))
    _ = paced.forward_s, paced.backward_s, paced.weight_grad_s
    return paced


def _paced_plan(costs: list[list[StageCost]], representative: list[int],
                specs: Sequence[Sequence[StageSpec]]) -> tuple[list[list[StageCost]], list[int]]:
    """Every replica's stages waiting for their slowest ep peers (`ep_paced`), and each
    replica's representative again (replicas that cost alike but wait for unlike peers
    differ now). Identical replicas wait for nothing: skipped."""
    peers = ep_peers(specs) if len(set(representative)) > 1 else None
    if peers is None:
        return costs, representative
    seen: dict[tuple, int] = {}
    paced: list[list[StageCost]] = []
    again: list[int] = []
    for pi, row in enumerate(peers):
        # who it waits for: its own kind and its peers' kinds, position by position
        key = (representative[pi], tuple(tuple(sorted({representative[q] for q in group}))
                                         for group in row))
        rep = seen.setdefault(key, pi)
        again.append(rep)
        if rep != pi:
            paced.append([_clone(c, pipeline=pi) for c in paced[rep]])
            continue
        paced.append([ep_paced(c, [costs[q][k] for q in row[k]])
                      for k, c in enumerate(costs[pi])])
    return paced, again


def dp_paced(costs: Sequence[StageCost]) -> list[StageCost]:
    """The stages at one position of replicas that reduce their gradients together (one
    data-parallel group: replicas that split the layers alike), each with its
    iteration's gradient reduction as long as the slowest member's share.

    A reduction is one collective over every replica's ranks: NCCL's ring (or tree)
    moves each rank's share in lockstep steps, so no rank finishes before the one
    holding most bytes over the slowest link has sent them (NCCL docs, "Collective
    Operations"; the simulator's reduction, `simulator.build`). Replicas of unlike tp
    hold unlike shares of the same layers: an H100 rank at tp 1 holds twice the
    gradients of an A100 rank at tp 2, and both wait for it. Only the iteration's
    reduction (`DPSync.grad_iteration_s`, with the last micro-batch's reduce-scatter)
    changes: each micro-batch's own reduce-scatter paces its own stream."""
    total = max(c.dp.grad_iteration_s + c.dp.grad_microbatch_s for c in costs)
    return [c if c.dp.grad_iteration_s + c.dp.grad_microbatch_s >= total else
            _clone(c, dp=_dp_with(c.dp, grad_iteration_s=total - c.dp.grad_microbatch_s))
            for c in costs]


def _dp_with(sync: DPSync, **fields: float) -> DPSync:
    """A copy of `sync` with `fields` changed, keeping what it worked out from its
    transfers (`DPSync._per_term`; a search makes many: dataclasses.replace was slower)."""
    out = object.__new__(DPSync)
    out.__dict__.update(sync.__dict__)
    out.__dict__.update(fields)
    return out


def _dp_paced_plan(costs: list[list[StageCost]], representative: list[int]
                   ) -> list[list[StageCost]]:
    """Every replica's stages with their gradient reduction as long as the slowest
    replica's at that position (`dp_paced`); replicas that cost alike stay alike."""
    reps = sorted(set(representative))
    if len(reps) == 1:
        return costs
    paced: dict[int, list[StageCost]] = {r: [] for r in reps}
    for k in range(len(costs[reps[0]])):
        for r, c in zip(reps, dp_paced([costs[r][k] for r in reps]), strict=True):
            paced[r].append(c)
    return [paced[pi] if rep == pi else [_clone(c, pipeline=pi) for c in paced[rep]]
            for pi, rep in enumerate(representative)]


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
    _pass_costs.cache_clear()
    _stage_links.cache_clear()
    _group_islands.cache_clear()


# -- where the numbers came from ----------------------------------------------------------

def stage_work(model: ModelSpec, spec: StageSpec, run: RunSettings
               ) -> tuple[tuple[Work, ...], tuple[Work, ...]]:
    """What one micro-batch runs on a stage: a layer's forward, recomputation and backward
    (each of the stage's layers runs them), and the embedding's and the head's forward
    and backward where the stage holds them."""
    shape = workload_shape(spec, run)
    work = layer_work(model, shape)
    layer = (*work.forward, *_recomputed(work, spec.placed.recompute), *work.backward)
    extra: list[Work] = []
    if spec.first:
        extra.extend(w for ws in embedding_work(model, shape) for w in ws)
    if spec.last:
        fwd, bwd, _ = head_work(model, shape)
        extra.extend((*fwd, *bwd))
    return layer, tuple(extra)


def _stage_ops(model: ModelSpec, spec: StageSpec, run: RunSettings) -> list[Op]:
    """Every op a stage runs for one micro-batch, and its optimizer step."""
    layer, extra = stage_work(model, spec, run)
    items: list[Work] = [*layer, *extra]
    params = stage_params(model, spec)
    items.append(optimizer_work(params / spec.sharding.optim, dtype=run.dtype,
                                implementation=run.kernels.optimizer,
                                num_tensors=max(1, 6 * spec.placed.num_layers),
                                master_weights=run.master_weights))
    return [op for op in items if isinstance(op, Op)]


def _groups(specs: Sequence[tuple[StageSpec, ...]]) -> set[tuple[int, ...]]:
    """The GPU groups that communicate: tp and cp groups, pipeline neighbours, and the
    data-parallel (x context-parallel) group of each stage position."""
    groups: set[tuple[int, ...]] = set()
    for replica in specs:
        for s in replica:
            groups.update((s.tp_group, s.cp_group, s.dp_cp_group))
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
            used.setdefault(profile.collective_path or profile.path, set()).add(
                tiers[0].fanout)
    rest = comm_source(any(g.device.vendor == "cpu" for g in cluster.node_groups))
    if not used:
        return rest
    parts = [f"measured collective profile {path} (groups of {', '.join(map(str, sorted(n)))} "
             "ranks in a node; at sizes it did not measure, the model scaled by its nearest "
             "measurement)" for path, n in sorted(used.items())]
    return "; ".join(parts) + f"; {rest} for the rest"


_PRECISION = {
    DType.FP8: "FP8 GEMMs in the layers' linear layers (Transformer Engine: e4m3 forward, e5m2 "
               "gradients, per-tensor scales) at the GPU's fp8 peak, attention GEMMs, logits "
               "and the rest in bf16",
    DType.TF32: "fp32 storage; GEMMs on TF32 tensor cores where the GPU has them (allow_tf32, "
                "NVIDIA containers' default), fp32 elsewhere",
    DType.FP32: "fp32 GEMMs without TF32 (PyTorch's default since 1.12, pytorch/pytorch#77114)",
}


def cost_sources(plan: Plan, profiles: Profiles | None) -> dict[str, str]:
    """What answered the plan's op and collective times (the `sources` users see), and
    how its dtype runs where that is not plain (fp8, tf32, fp32)."""
    precision = _PRECISION.get(DType(plan.training.dtype))
    extra = {"precision": precision} if precision else {}
    on_cpu = any(g.device.vendor == "cpu" for g in plan.cluster.node_groups)
    calibration = calibration_source(g.device for g in plan.cluster.node_groups
                                     if profiles is None or profiles.get(g.device.name) is None)
    if calibration:
        extra = {"calibration": calibration, **extra}
    if profiles is None or not profiles.by_device:
        triton = any(stage_attention(plan, s) == Attention.FLASH_TRITON
                     for p in plan.pipelines for s in p.stages)
        compute = ANALYTIC_SOURCE + (f"; {TRITON_FLASH_SOURCE}" if triton else "")
        return {"compute": compute, **extra, "communication": comm_source(on_cpu),
                "host": host_source(profiles, set(), on_cpu=on_cpu)}
    priced = plan_costs(plan, profiles)
    uses: list[tuple[Profile | None, Op]] = []
    for pi in priced.representatives:
        for spec in priced.specs[pi]:
            profile = profiles.get(spec.device_name)
            uses.extend((profile, op) for op in _stage_ops(plan.model, spec, priced.runs[pi]))
    return {"compute": compute_source(uses), **extra,
            "communication": _comm_source(plan.cluster, priced.specs, profiles),
            "host": host_source(profiles, {s.device_name for specs in priced.specs
                                           for s in specs}, on_cpu=on_cpu,
                                families=_plan_host_families(plan))}


def _plan_host_families(plan: Plan) -> frozenset[str]:
    """The host-row families that price `plan` (`host.host_families`); FSDP2 as
    `sharding_terms` applies it: P = G = OS > 1 on a stage without tp."""
    stages = [(i, s) for p in plan.pipelines for i, s in enumerate(p.stages)]
    on_cpu = [plan.group_of(s).device.vendor == "cpu" for _, s in stages]
    fsdp = [(sh := plan.sharding_of(i)).params == sh.grads == sh.optim > 1 and s.tp == 1
            for i, s in stages]
    # CPU ranks sending to another stage with batched sends (their calls: `p2p_host_s`)
    cpu_pipeline = not plan.training.comm.pipeline_p2p.blocks_compute and any(
        len(p.stages) > 1 and any(plan.group_of(s).device.vendor == "cpu" for s in p.stages)
        for p in plan.pipelines)
    return host_families(gpus=not all(on_cpu), fsdp=any(fsdp),
                         cpu_ranks=sum(len(s.devices) for (_, s), c in zip(stages, on_cpu,
                                                                            strict=True) if c),
                         tp=any(s.tp > 1 for _, s in stages), cpu_pipeline=cpu_pipeline)
