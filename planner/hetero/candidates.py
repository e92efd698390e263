"""Heterogeneous plan candidates and their price (closed form over stage costs).

Two families, both with every replica splitting the layers at the same boundaries (so a
stage position's data-parallel group holds the same parameters):

* **mixed stages** (Zorse, asymmetric pipelines): R identical replicas, each a pipeline
  whose stages are GPUs of different types (tp per type); layers split unevenly for the
  shortest 1F1B iteration memory allows (`split.layer_split_fast`, exact).
* **mixed replicas** (Zorse's mixed-GPU data parallelism): replicas of different types,
  each a homogeneous pipeline of pp stages; the global batch's micro-batches are split
  across the unlike replicas so they finish together (`split.batch_split_fast`).

An MoE model's template may split its routed experts over ep replicas (`Template.ep`):
each stage position's replicas, in GPU order, form groups of ep that trade tokens
(`StageSpec.ep_group`). Ep peers run the same passes (every replica the same
micro-batches) and each waits for its slowest peer (`ep_paced`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from planner.costs.kernels import attention_for
from planner.costs.memory import StageMemory, in_flight_chunks
from planner.costs.stages import (
    PlacedStage,
    RunSettings,
    StageCost,
    StageSpec,
    apply_sharding,
    dp_paced,
    ep_paced,
    group_signature,
    island_concurrency,
    pass_key,
    placement,
    replica_specs,
    sharding_states,
    sharding_terms,
    unsharded_cost,
)
from planner.hetero.placement import Pool, place
from planner.hetero.split import layer_split_fast, least_feasible
from planner.predict.estimate import iteration_end_s, sends_s
from planner.specs.choices import ModelStates, Recompute, Schedule
from planner.specs.cluster import ClusterSpec
from planner.specs.layout import stage_moe_layers
from planner.specs.model import ModelSpec
from planner.specs.plan import (
    DEFAULT_COMM,
    Communication,
    Kernels,
    Pipeline,
    Plan,
    Sharding,
    Stage,
    Training,
)
from profiler.kernels import Attention
from profiler.store import Profiles

__all__ = ["Priced", "Template", "batch_split_fast", "price"]

Slot = tuple[str, int]  # (GPU type, tp) of one stage position


@dataclass(frozen=True)
class Template:
    """The shape of a heterogeneous plan before layers and batch are split.

    `replicas[r]` lists the (GPU type, tp) of each stage of replica r; all replicas have
    the same number of stages."""

    family: str  # mixed-stages | mixed-replicas | homogeneous
    replicas: tuple[tuple[Slot, ...], ...]
    ep: int = 1  # MoE: routed experts split over groups of ep replicas (expert tp = tp)

    @property
    def pp(self) -> int:
        return len(self.replicas[0])

    @property
    def dp(self) -> int:
        return len(self.replicas)

    @property
    def num_gpus(self) -> int:
        return sum(tp for rep in self.replicas for _, tp in rep)

    def gpus_of(self, gpu: str) -> int:
        return sum(tp for rep in self.replicas for t, tp in rep if t == gpu)

    @property
    def sequence_parallel(self) -> bool:
        """Megatron-style sequence parallelism wherever a stage splits tensors, unless a
        replica's tp changes from one stage to the next (a stage's sequence-split
        activations go to a tp group of its own size: `frameworks.sp_tp_change`)."""
        return (any(tp > 1 for rep in self.replicas for _, tp in rep)
                and all(len({tp for _, tp in rep}) == 1 for rep in self.replicas))


@dataclass(frozen=True)
class Priced:
    template: Template
    mbs: int
    recompute: Recompute
    sharding: Sharding
    layers: tuple[int, ...]  # per stage position
    microbatches: tuple[int, ...]  # per replica
    devices: tuple[tuple[tuple[int, ...], ...], ...]  # [replica][stage] -> GPUs
    iteration_s: float
    fits: bool
    schedule: Schedule = Schedule.ONE_F_ONE_B  # or zb-h1 (every replica runs the same one)
    stage_sharding: tuple[Sharding, ...] | None = None  # per position, where they differ
    attention: Attention | None = None  # asked for everywhere; else each GPU type's own
    model_states: ModelStates = ModelStates.FP32_GRADS  # as priced (Training.model_states)
    comm: Communication = Communication()  # as priced (Training.comm)

    def plan(self, model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, dtype: str,
             kernels: Kernels) -> Plan:
        """The Plan; a stage whose GPU type runs another attention kernel than
        `kernels.attention` names its own."""
        bounds = [0]
        for n in self.layers:
            bounds.append(bounds[-1] + n)
        pipelines = []
        for r, rep in enumerate(self.template.replicas):
            own = [attention_for(cluster.device_of(gpu), dtype, self.attention,
                                 dropout=model.drops_attention) for gpu, _ in rep]
            stages = tuple(Stage(layers=(bounds[k], bounds[k + 1]), devices=self.devices[r][k],
                                 tp=tp, recompute=self.recompute,
                                 attention=None if own[k] == kernels.attention else own[k])
                           for k, (_, tp) in enumerate(rep))
            pipelines.append(Pipeline(stages=stages, micro_batch_size=self.mbs,
                                      num_microbatches=self.microbatches[r]))
        training = Training(global_batch_size=self.mbs * sum(self.microbatches),
                            seq_len=seq_len, dtype=dtype,  # type: ignore[arg-type]  # dtype checked by the search request
                            schedule=self.schedule,
                            sequence_parallel=self.template.sequence_parallel,
                            ep=self.template.ep, model_states=self.model_states,
                            comm=self.comm)
        plan = Plan(model=model, cluster=cluster, training=training, pipelines=tuple(pipelines),
                    sharding=self.sharding, stage_sharding=self.stage_sharding, kernels=kernels)
        plan.check("plan")
        return plan


def batch_split_fast(total: int, fill: Sequence[float], step: Sequence[float]
                     ) -> list[int] | None:
    """Micro-batches per replica minimising the latest finish (the ILP of
    `split.batch_split_ilp`, solved by searching the finish time): the smallest T with
    sum_r floor((T - fill_r) / step_r) >= total, every replica at least one."""
    if total < len(step):
        return None
    values = sorted({f + s * m for f, s in set(zip(fill, step, strict=True))
                     for m in range(1, total + 1)})

    def shares(t: float) -> list[int] | None:
        out = [math.floor((t - f) / s + 1e-9) if t >= f else 0 for f, s in zip(fill, step, strict=True)]
        return out if min(out) >= 1 and sum(out) >= total else None

    found = least_feasible(values, shares)
    assert found is not None  # at the largest value every replica takes all `total`
    caps = found[1]
    split, left = [1] * len(step), total - len(step)
    for r in sorted(range(len(step)), key=lambda r: step[r]):  # fastest replicas first
        add = min(caps[r] - 1, left)
        split[r] += add
        left -= add
    return split


@dataclass(frozen=True)
class _Context:
    model: ModelSpec
    cluster: ClusterSpec
    seq_len: int
    dtype: str
    gbs: int
    kernels: Kernels
    profiles: Profiles | None
    attention: Attention | None = None  # asked for everywhere; else each GPU type's own
    model_states: ModelStates = ModelStates.FP32_GRADS  # the framework's rule
    comm: Communication = Communication()  # how the framework communicates


@dataclass(frozen=True)
class _Layout:
    """A placed template, reduced to what prices its stages. A stage kind is everything a
    stage's cost depends on but its layer count (`stage_key` at one layer); replicas whose
    stages are of the same kinds cost the same for any layer split (they split alike)."""

    devices: tuple[tuple[tuple[int, ...], ...], ...]  # [replica][stage] -> GPUs
    replica_kinds: tuple[int, ...]  # representative replica of each distinct replica
    kind_of_replica: tuple[int, ...]  # per replica, its representative
    positions: dict[int, tuple[int, ...]]  # representative replica -> stage kind per position
    # ep > 1: [replica][position] -> the replicas of its ep group there (`_ep_peers`)
    ep_peers: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    @property
    def kinds(self) -> set[int]:
        return {k for row in self.positions.values() for k in row}


def _layout(ctx: _Context, t: Template, devices: Sequence[Sequence[tuple[int, ...]]],
            memo: dict) -> _Layout:
    """Stage kinds are numbered across every template priced with `memo` (like stages of
    different templates share their costs), and their specs kept in memo["kind_specs"].
    A kind is a pass kind (`_pass_row`) with the data-parallel group it syncs over."""
    # every replica splits the layers alike (one layer per stage here): stage k of each
    # syncs over the same group (`position_groups`), found once per position and named by
    # a small number (a group of thousands of GPUs is slow to hash)
    cluster = ctx.cluster
    groups = ([tuple(devices[r][k][0] for r in range(t.dp)) for k in range(t.pp)]
              if t.dp > 1 else None)
    peers = _ep_peers(t, groups)
    signatures: dict[tuple, int] = memo.setdefault("dp_signatures", {})
    dp_token = ([signatures.setdefault(group_signature(cluster, g), len(signatures))
                 for g in groups] if groups is not None else None)
    kind_of: dict[tuple, int] = memo.setdefault("kind_ids", {})
    specs: list[StageSpec] = memo.setdefault("kind_specs", [])
    pass_kind: list[int] = memo.setdefault("pass_kind", [])
    seen: dict[tuple[int, ...], int] = {}
    positions: dict[int, tuple[int, ...]] = {}
    representative = []
    rows: dict[tuple, tuple[int, ...]] = {}  # placement pattern -> stage kinds
    for r, rep_slots in enumerate(t.replicas):
        # where its ep peers are, stage by stage, counted from each stage's first GPU
        ep_places = (None if peers is None or groups is None else
                     tuple(placement(cluster, [groups[k][q] for q in peers[r][k]],
                                     devices[r][k][0]) for k in range(t.pp)))
        pattern = (_pattern(cluster, devices[r]), ep_places)
        if pattern not in rows:
            passes = _pass_row(ctx, rep_slots, pattern, devices[r], groups, memo, ep=t.ep)
            concurrency = island_concurrency(cluster, devices[r], groups)
            tokens = (dp_token if dp_token is not None else
                      [signatures.setdefault(group_signature(cluster, (stage[0],)),
                                             len(signatures)) for stage in devices[r]])
            keys = [(pk, tokens[k], concurrency[k]) for k, pk in enumerate(passes)]
            if any(key not in kind_of for key in keys):
                new = replica_specs(cluster, _placed_stages(ctx, rep_slots, devices[r], memo,
                                                            ep=t.ep),
                                    groups=groups, shardings=[Sharding()] * t.pp)
                for key, spec in zip(keys, new, strict=True):
                    if key not in kind_of:
                        kind_of[key] = len(specs)
                        specs.append(spec)
                        pass_kind.append(key[0])
            rows[pattern] = tuple(kind_of[key] for key in keys)
        rep = seen.setdefault(rows[pattern], r)
        representative.append(rep)
        positions.setdefault(rep, rows[pattern])
    return _Layout(tuple(tuple(d) for d in devices), tuple(positions), tuple(representative),
                   positions, peers)


def _ep_peers(t: Template, groups: Sequence[tuple[int, ...]] | None
              ) -> tuple[tuple[tuple[int, ...], ...], ...] | None:
    """[replica][position] -> the replicas of its ep group there: the position's replicas
    in GPU order of their first GPU, in consecutive groups of ep (`StageSpec.ep_group`,
    `ep_peers`; a template's stages hold one expert rank each: cp 1, expert tp = tp)."""
    if t.ep == 1 or groups is None:
        return None
    rows: list[list[tuple[int, ...]]] = [[] for _ in range(t.dp)]
    for group in groups:
        order = sorted(range(t.dp), key=lambda r: group[r])
        for i, r in enumerate(order):
            start = i // t.ep * t.ep
            rows[r].append(tuple(sorted(order[start:start + t.ep])))
    return tuple(tuple(row) for row in rows)


def _placed_stages(ctx: _Context, rep_slots: Sequence[Slot],
                   replica: Sequence[tuple[int, ...]], memo: dict, *, ep: int
                   ) -> list[PlacedStage]:
    """A replica's stages at one layer each, with each GPU type's attention kernel."""
    kernel: dict[str, Attention] = memo.setdefault("attention", {})
    for gpu, _ in rep_slots:
        if gpu not in kernel:
            kernel[gpu] = attention_for(ctx.cluster.device_of(gpu), ctx.dtype, ctx.attention,
                                        dropout=ctx.model.drops_attention)
    return [PlacedStage(devices=replica[k], tp=tp, cp=1, num_layers=1,
                        recompute=Recompute.NONE, attention=kernel[gpu], ep=ep)
            for k, (gpu, tp) in enumerate(rep_slots)]


def _pass_row(ctx: _Context, rep_slots: Sequence[Slot], pattern: tuple,
              replica: Sequence[tuple[int, ...]], groups: Sequence[tuple[int, ...]] | None,
              memo: dict, *, ep: int) -> tuple[int, ...]:
    """The pass kind (`pass_key`, numbered) of each stage of a replica. A stage's pass key
    follows from its slot, its position (first, last, of how many), where its own GPUs
    are counted from its first, where the next stage's first GPU is and, with ep > 1,
    where its ep peers are (the links of its groups: `group_signature`), so stages of
    any replica and template that agree in these share it."""
    pass_of: dict[tuple, int] = memo.setdefault("pass_ids", {})
    stage_ids: dict[tuple, int] = memo.setdefault("stage_pass_ids", {})
    own, ep_places = pattern
    pp = len(rep_slots)
    row: list[int] = []
    specs: tuple[StageSpec, ...] | None = None
    for k, slot in enumerate(rep_slots):
        (_, n0, d0, l0), nxt = own[k][0], own[(k + 1) % pp][0]
        key = (slot, k == 0, k == pp - 1, pp,
               tuple((g, n - n0, d - d0, loc - l0) for g, n, d, loc in own[k]),
               None if pp == 1 else (nxt[0], nxt[1] - n0, nxt[2] - d0, nxt[3] - l0),
               ep, None if ep_places is None else ep_places[k])
        if key not in stage_ids:
            if specs is None:
                specs = replica_specs(ctx.cluster, _placed_stages(ctx, rep_slots, replica,
                                                                  memo, ep=ep),
                                      groups=groups, shardings=[Sharding()] * pp)
            stage_ids[key] = pass_of.setdefault(pass_key(ctx.cluster, specs[k]), len(pass_of))
        row.append(stage_ids[key])
    return tuple(row)


def _pattern(cluster: ClusterSpec, replica: Sequence[tuple[int, ...]]) -> tuple:
    """Where a replica's GPUs are: each one's node group, node, NVLink domain and local
    index, counted from the replica's first GPU. Replicas of one pattern have the same
    stage keys (links are found from node groups, shared nodes and domains and rails:
    `group_signature`; every replica's stage k syncs over one group)."""
    return tuple(placement(cluster, stage, replica[0][0]) for stage in replica)


def _run(ctx: _Context, t: Template, *, mbs: int, microbatches: int,
         schedule: Schedule) -> RunSettings:
    return RunSettings(micro_batch_size=mbs, num_microbatches=microbatches,
                       seq_len=ctx.seq_len, dtype=ctx.dtype,
                       sequence_parallel=t.sequence_parallel, schedule=schedule,
                       virtual_stages=1, kernels=ctx.kernels,
                       model_states=ctx.model_states, comm=ctx.comm)


@dataclass(frozen=True)
class _Linear:
    """A stage kind's per-micro-batch time and memory as functions of its layer count
    n and micro-batches in flight f: time = fixed + per_layer * n;
    memory = base + states * n + activations * n * f (stage memory is exactly this)."""

    fixed_s: float
    per_layer_s: float
    base_bytes: float
    states_bytes: float  # per layer
    activations_bytes: float  # per layer and micro-batch in flight
    capacity_bytes: float

    def most_layers(self, in_flight: int) -> int:
        per = self.states_bytes + self.activations_bytes * in_flight
        room = self.capacity_bytes - self.base_bytes
        return math.floor(room / per) if per > 0 and room > 0 else 0

    def fits(self, layers: int, in_flight: int) -> bool:
        return (self.base_bytes + layers * (self.states_bytes + self.activations_bytes * in_flight)
                <= self.capacity_bytes)


@dataclass(frozen=True)
class _Pricing:
    """What prices one candidate of a placed template: the context, the layout and the
    run settings every stage shares (`run.num_microbatches`: the even split, which the
    stages' memory is checked at)."""

    ctx: _Context
    lay: _Layout
    run: RunSettings
    memo: dict

    @cached_property
    def stage_run(self) -> RunSettings:
        """The run as a stage's cost sees it: a stage's per-micro-batch times and per-layer
        memory do not depend on how many micro-batches the pipeline runs (only the
        activations in flight do, which `_Linear` keeps apart), so candidates that
        differ only in that share their stage costs."""
        key = ("stage_run", self.run)
        if key not in self.memo:
            self.memo[key] = replace(self.run, num_microbatches=1)
        return self.memo[key]


def _linear(pr: _Pricing, kind: int, recompute: Recompute, sharding: Sharding) -> _Linear:
    """Times from the passes alone (the data-parallel group does not change them) and
    memory at `sharding`'s model states: kinds of one pass kind share it."""
    key = ("linear", pr.memo["pass_kind"][kind], pr.stage_run, recompute, sharding)
    if key not in pr.memo:
        pp = pr.memo["kind_specs"][kind].pp
        (c1, m1), (c2, m2) = (_passes_at(pr, kind, recompute=recompute, layers=n,
                                         sharding=sharding) for n in (1, 2))
        t1 = c1.forward_s + c1.backward_s + sends_s(c1, pp, 1)
        t2 = c2.forward_s + c2.backward_s + sends_s(c2, pp, 1)
        states = m2.model_states_bytes - m1.model_states_bytes
        pr.memo[key] = _Linear(t1 - (t2 - t1), max(t2 - t1, 1e-12),
                               m1.total_bytes - m1.activations_bytes - states, states,
                               m1.activations_per_layer_bytes, m1.capacity_bytes)
    return pr.memo[key]


def _unsharded(pr: _Pricing, kind: int, *, recompute: Recompute, layers: int,
               moe: int | None = None) -> tuple[StageSpec, StageCost]:
    """The spec of a stage kind holding `layers` (`moe` of them MoE, where the split is
    known: `_moe_counts`) and its cost before sharding (shared by the kinds of one pass
    kind)."""
    run = pr.stage_run
    spec_key = ("spec", kind, recompute, layers, moe)
    spec = pr.memo.get(spec_key)
    if spec is None:
        spec = pr.memo["kind_specs"][kind]
        spec = pr.memo[spec_key] = replace(spec, placed=replace(
            spec.placed, num_layers=layers, recompute=recompute, moe_layers=moe))
    key = ("unsharded", pr.memo["pass_kind"][kind], run, recompute, layers, moe)
    if key not in pr.memo:
        pr.memo[key] = unsharded_cost(pr.ctx.model, pr.ctx.cluster, spec, run,
                                      profiles=pr.ctx.profiles)
    return spec, pr.memo[key]


def _passes_at(pr: _Pricing, kind: int, *, recompute: Recompute, layers: int,
               sharding: Sharding, moe: int | None = None) -> tuple[StageCost, StageMemory]:
    """A stage kind's passes and its memory at `sharding` (no data-parallel traffic)."""
    spec, base = _unsharded(pr, kind, recompute=recompute, layers=layers, moe=moe)
    run = pr.run
    # the states do not depend on recomputation or micro-batches: one per kind and layers
    key = ("states", kind, layers, moe, sharding, run.master_weights, run.model_states,
           run.fp8_params, run.comm.grad_reduce_dtype)
    states = pr.memo.get(key)
    if states is None:
        states = pr.memo[key] = sharding_states(
            pr.ctx.model, spec, pr.ctx.dtype, sharding, base.num_params,
            master_weights=run.master_weights, states=run.model_states,
            fp8_params=run.fp8_params, grad_dtype=run.comm.grad_reduce_dtype)
    return base, base.memory.with_states(*states)


def _cost(pr: _Pricing, kind: int, *, recompute: Recompute, layers: int,
          sharding: Sharding, moe: int | None = None) -> StageCost:
    """The cost of a stage kind holding `layers`, `moe` of them MoE (the cost builder's)."""
    key = ("cost", kind, pr.stage_run, recompute, sharding, layers, moe)
    if key not in pr.memo:
        spec, base = _unsharded(pr, kind, recompute=recompute, layers=layers, moe=moe)
        # a sharding's terms depend on the stage (not its recomputation) and the run's
        # dtype and optimizer kernel, which every call with this memo shares (`price`),
        # not on micro-batches
        terms_key = ("terms", kind, layers, moe, sharding)
        if terms_key not in pr.memo:
            pr.memo[terms_key] = sharding_terms(pr.ctx.model, pr.ctx.cluster, spec,
                                                pr.stage_run, sharding, base.num_params,
                                                profiles=pr.ctx.profiles)
        pr.memo[key] = apply_sharding(base, pr.memo[terms_key])
    return pr.memo[key]


def price(model: ModelSpec, cluster: ClusterSpec, template: Template, *,
          pools: dict[str, list[Pool]], mbs: int, recompute: Recompute, sharding: Sharding,
          seq_len: int, dtype: str, gbs: int, kernels: Kernels,
          attention: Attention | None = None,
          layers: Sequence[int] | None = None, microbatches: Sequence[int] | None = None,
          schedule: Schedule = Schedule.ONE_F_ONE_B, relax: Sequence[Sharding] = (),
          stage_sharding: Sequence[Sharding] | None = None, profiles: Profiles | None = None,
          memo: dict | None = None, model_states: ModelStates = ModelStates.FP32_GRADS,
          comm: Communication = DEFAULT_COMM) -> Priced | None:
    """Split layers (unless given) and micro-batches (unless given), place the stages, and
    estimate the iteration under `schedule` (1f1b, or zb-h1 when pp > 1); None if the
    template cannot be placed or split. AMSP per stage: `stage_sharding` gives each stage
    position its own sharding; with `relax` (other sharding options) each position in turn
    takes the option, among those its memory allows, that shortens the iteration most
    (layers as split under `sharding`). `memo` keeps placements and stage costs across
    calls on the same model, cluster, dtype, kernels, profiles, `model_states` (the
    framework's rule, `Training.model_states`) and `comm` (how it communicates,
    `Training.comm`), both of which the Priced plan keeps."""
    ctx = _Context(model, cluster, seq_len, dtype, gbs, kernels, profiles, attention,
                   model_states, comm)
    schedule, recompute = Schedule(schedule), Recompute(recompute)
    memo = {} if memo is None else memo
    lay = _placed(ctx, template, pools, memo)
    if lay is None or gbs % mbs:
        return None
    total = gbs // mbs
    m_even = total // template.dp
    if m_even < 1 or template.pp < schedule.min_stages:
        return None
    pr = _Pricing(ctx, lay, _run(ctx, template, mbs=mbs, microbatches=m_even,
                                 schedule=schedule), memo)
    in_flight = [in_flight_chunks(schedule=schedule, stage=k, pp=template.pp,
                                  num_microbatches=m_even, virtual_stages=1)
                 for k in range(template.pp)]
    if layers is None:
        layers = _split_layers(pr, template, recompute, sharding, in_flight)
        if layers is None:
            return None
    per_stage = list(stage_sharding or [sharding] * template.pp)
    if relax:
        per_stage = _relaxed(pr, template, per_stage, [*relax, sharding], recompute=recompute,
                             layers=layers, in_flight=in_flight)
    if len(set(per_stage)) > 1:  # the overall sharding: the most sharded stage's
        sharding = max(per_stage, key=lambda sh: (sh.optim, sh.grads, sh.params))
    else:
        sharding = per_stage[0]
    costs = _dp_paced(_replica_costs(pr, recompute, layers, per_stage))
    fits = all(_fits_at(pr, k, per_stage[k], recompute=recompute, layers=layers,
                        in_flight=in_flight) for k in range(template.pp))
    if microbatches is None:
        microbatches = _split_batch(template, lay, costs, total, schedule)
        if microbatches is None:
            return None
    rows, row_of = _paced(lay, costs)
    # each distinct replica once: alike ones end alike (`iteration_end_s`)
    distinct = list(dict.fromkeys(zip(row_of, microbatches, strict=True)))
    time_s = iteration_end_s([rows[q] for q, _ in distinct], [mb for _, mb in distinct],
                             virtual_stages=1, schedule=schedule)
    return Priced(template, mbs, recompute, sharding, tuple(layers), tuple(microbatches),
                  lay.devices, time_s, fits, schedule,
                  tuple(per_stage) if len(set(per_stage)) > 1 else None, attention,
                  model_states, comm)


def _paced(lay: _Layout, costs: dict[int, list[StageCost]]
           ) -> tuple[dict, Sequence[object]]:
    """Each replica's stage costs as it runs them, by key, and each replica's key: its
    representative's (`costs`), or with ep > 1 waiting at each position for the slowest
    of its ep peers (`ep_paced`), keyed by its representative and its peers'."""
    if lay.ep_peers is None:
        return costs, lay.kind_of_replica
    keys = [(lay.kind_of_replica[r], tuple(tuple(sorted({lay.kind_of_replica[q] for q in group}))
                                           for group in row))
            for r, row in enumerate(lay.ep_peers)]
    rows = {key: [ep_paced(c, [costs[q][k] for q in key[1][k]])
                  for k, c in enumerate(costs[key[0]])] for key in set(keys)}
    return rows, keys


def _dp_paced(costs: dict[int, list[StageCost]]) -> dict[int, list[StageCost]]:
    """Each kind of replica's stages with its gradient reduction as long as the slowest
    kind's at that position (`dp_paced`: the replicas split the layers alike and reduce
    together)."""
    if len(costs) == 1:
        return costs
    kinds = list(costs)
    rows = zip(*(dp_paced(at) for at in zip(*costs.values(), strict=True)), strict=True)
    return {q: list(row) for q, row in zip(kinds, rows, strict=True)}


def _split_layers(pr: _Pricing, t: Template, recompute: Recompute, sharding: Sharding,
                  in_flight: Sequence[int]) -> list[int] | None:
    """The common split must suit every kind of replica: balance the slowest kind,
    within every kind's memory."""
    lay = pr.lay
    lin = {q: _linear(pr, q, recompute, sharding) for q in lay.kinds}
    slow = max(lay.replica_kinds, key=lambda r: sum(lin[q].per_layer_s for q in lay.positions[r]))
    most = [min(lin[lay.positions[r][k]].most_layers(in_flight[k]) for r in lay.replica_kinds)
            for k in range(t.pp)]
    row = lay.positions[slow]
    return layer_split_fast(pr.ctx.model.num_layers, [lin[q].fixed_s for q in row],
                            [lin[q].per_layer_s for q in row], most,
                            microbatches=pr.run.num_microbatches)


def _replica_costs(pr: _Pricing, recompute: Recompute, layers: Sequence[int],
                   shardings: Sequence[Sharding]) -> dict[int, list[StageCost]]:
    """Stage costs of each distinct replica (by its representative), each stage with the
    MoE layers it holds."""
    moe = stage_moe_layers(pr.ctx.model, tuple(layers))
    return {r: [_cost(pr, q, recompute=recompute, layers=layers[k], sharding=shardings[k],
                      moe=moe[k])
                for k, q in enumerate(pr.lay.positions[r])] for r in pr.lay.replica_kinds}


def _fits_at(pr: _Pricing, k: int, sharding: Sharding, *, recompute: Recompute,
             layers: Sequence[int], in_flight: Sequence[int]) -> bool:
    """Whether stage position `k` fits at `sharding` on every kind of replica (a model
    with dense and MoE layers: at the MoE layers the stage holds, not their average)."""
    moe = stage_moe_layers(pr.ctx.model, tuple(layers))[k]
    if moe is None:
        return all(_linear(pr, pr.lay.positions[r][k], recompute, sharding).fits(
            layers[k], in_flight[k]) for r in pr.lay.replica_kinds)
    return all(_passes_at(pr, pr.lay.positions[r][k], recompute=recompute, layers=layers[k],
                          sharding=sharding, moe=moe)[1]
               .with_layers_in_flight(layers[k] * in_flight[k]).fits
               for r in pr.lay.replica_kinds)


def _relaxed(pr: _Pricing, t: Template, per_stage: list[Sharding],
             options: Sequence[Sharding], *, recompute: Recompute, layers: Sequence[int],
             in_flight: Sequence[int]) -> list[Sharding]:
    """Coordinate descent over stage positions: each takes, among the options its memory
    allows, the one that shortens the slowest replica's estimated iteration most. With tied
    embeddings the first and last position move together (the twins shard alike)."""
    tied = pr.ctx.model.tied_embeddings and t.pp > 1

    def together(k: int) -> tuple[int, ...]:
        return (0, t.pp - 1) if tied and k in (0, t.pp - 1) else (k,)

    def fits(k: int, sh: Sharding) -> bool:
        return all(_fits_at(pr, j, sh, recompute=recompute, layers=layers, in_flight=in_flight)
                   for j in together(k))

    def iteration_s(shardings: list[Sharding]) -> float:
        rows, _ = _paced(pr.lay, _dp_paced(_replica_costs(pr, recompute, layers, shardings)))
        return iteration_end_s(list(rows.values()), [pr.run.num_microbatches] * len(rows),
                               virtual_stages=1, schedule=pr.run.schedule)

    best, improved = iteration_s(per_stage), True
    while improved:  # until no position alone can do better (each pass shortens it)
        improved = False
        for k in range(t.pp):
            for sh in options:
                if sh == per_stage[k] or not fits(k, sh):
                    continue
                trial = [sh if j in together(k) else old for j, old in enumerate(per_stage)]
                time_s = iteration_s(trial)
                if time_s < best * (1 - 1e-12):
                    per_stage, best, improved = trial, time_s, True
    return per_stage


def _placed(ctx: _Context, t: Template, pools: dict[str, list[Pool]], memo: dict
            ) -> _Layout | None:
    key = ("layout", t)
    if key not in memo:
        if t.family == "mixed-stages":
            devices = place(t.replicas[0], t.dp, pools, [1.0] * t.pp)
        else:
            devices = _place_replicas(t, pools)
        memo[key] = None if devices is None else _layout(ctx, t, devices, memo)
    return memo[key]


def _split_batch(t: Template, lay: _Layout, costs: dict[int, list[StageCost]],
                 total: int, schedule: Schedule) -> list[int] | None:
    """Micro-batches per replica: so that unlike replicas finish together, or evenly
    where they are alike or, with ep > 1, trade tokens in every pass (ep peers run the
    same passes: Megatron-Core's and the executor's ep groups pair their all-to-alls
    micro-batch by micro-batch)."""
    if len(lay.replica_kinds) == 1 or t.ep > 1:
        if total % t.dp:
            return None
        return [total // t.dp] * t.dp
    line = {}  # per replica kind: (fill, step) of finishing m micro-batches
    for q in lay.replica_kinds:
        one, two = (iteration_end_s([costs[q]], [m], virtual_stages=1, schedule=schedule)
                    for m in (1, 2))
        line[q] = (one - (two - one), two - one)
    per_replica = [line[q] for q in lay.kind_of_replica]
    return batch_split_fast(total, [f for f, _ in per_replica], [s for _, s in per_replica])


def _place_replicas(t: Template, pools: dict[str, list[Pool]]
                    ) -> list[list[tuple[int, ...]]] | None:
    """Mixed replicas: each replica's stages on consecutive GPUs of its type, pool by pool
    (so a replica's pipeline stays inside an island when it can)."""
    cursor = {gpu: (0, 0) for gpu in pools}
    out = []
    for rep in t.replicas:
        gpu = rep[0][0]
        devices = []
        for _, tp in rep:
            p, i = cursor[gpu]
            while p < len(pools[gpu]) and i + tp > len(pools[gpu][p].gpus):
                p, i = p + 1, 0
            if p >= len(pools[gpu]):
                return None
            devices.append(pools[gpu][p].gpus[i:i + tp])
            cursor[gpu] = (p, i + tp)
        out.append(devices)
    return out

