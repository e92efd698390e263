"""Heterogeneous plan candidates and their price (closed form over stage costs).

Two families, both with every replica splitting the layers at the same boundaries (so a
stage position's data-parallel group holds the same parameters):

* **mixed stages** (Zorse, asymmetric pipelines): R identical replicas, each a pipeline
  whose stages are GPUs of different types (tp per type); layers split unevenly for the
  shortest 1F1B iteration memory allows (`split.layer_split_fast`, exact).
* **mixed replicas** (Zorse's mixed-GPU data parallelism): replicas of different types,
  each a homogeneous pipeline of pp stages; the global batch's micro-batches are split
  across the unlike replicas so they finish together (`split.batch_split_fast`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.costs.comm import group_tiers
from planner.costs.memory import in_flight_chunks, stage_memory
from planner.costs.stages import StageCost, StageSetup, stage_cost
from planner.costs.workload import WorkloadShape
from planner.hetero.placement import Pool, place
from planner.hetero.split import layer_split_fast, least_feasible
from planner.predict.estimate import pipeline_time
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Kernels, Pipeline, Plan, Sharding, Stage, Training
from profiler.devices import device
from profiler.store import Profiles

__all__ = ["Priced", "Template", "batch_split_fast", "kinds_of", "price"]

Slot = tuple[str, int]  # (GPU type, tp) of one stage position


@dataclass(frozen=True)
class Template:
    """The shape of a heterogeneous plan before layers and batch are split.

    `replicas[r]` lists the (GPU type, tp) of each stage of replica r; all replicas have
    the same number of stages."""

    family: str  # mixed-stages | mixed-replicas | homogeneous
    replicas: tuple[tuple[Slot, ...], ...]

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


@dataclass(frozen=True)
class Priced:
    template: Template
    mbs: int
    recompute: str
    sharding: Sharding
    layers: tuple[int, ...]  # per stage position
    microbatches: tuple[int, ...]  # per replica
    devices: tuple[tuple[tuple[int, ...], ...], ...]  # [replica][stage] -> GPUs
    iteration_s: float
    fits: bool
    schedule: str = "1f1b"  # or zb-h1 (every replica runs the same schedule)
    stage_sharding: tuple[Sharding, ...] | None = None  # per position, where they differ

    def plan(self, model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, dtype: str,
             kernels: Kernels) -> Plan:
        bounds = [0]
        for n in self.layers:
            bounds.append(bounds[-1] + n)
        pipelines = []
        for r, rep in enumerate(self.template.replicas):
            stages = tuple(Stage(layers=(bounds[k], bounds[k + 1]), devices=self.devices[r][k],
                                 tp=tp, recompute=self.recompute)  # type: ignore[arg-type]
                           for k, (_, tp) in enumerate(rep))
            pipelines.append(Pipeline(stages=stages, micro_batch_size=self.mbs,
                                      num_microbatches=self.microbatches[r]))
        training = Training(global_batch_size=self.mbs * sum(self.microbatches),
                            seq_len=seq_len, dtype=dtype,  # type: ignore[arg-type]
                            schedule=self.schedule,  # type: ignore[arg-type]
                            sequence_parallel=any(tp > 1 for rep in self.template.replicas
                                                  for _, tp in rep))
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
    values = sorted({f + s * m for f, s in zip(fill, step, strict=True)
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
    attention: str
    profiles: Profiles | None


@dataclass(frozen=True)
class _Layout:
    """A placed template, reduced to what prices its stages: for each replica kind, the
    kind of each of its stage positions. A position kind is everything a stage's cost
    depends on except its layer count and the micro-batches in flight: the slot, its
    role (first, last), and the links of its tp, pipeline and data-parallel groups."""

    devices: tuple[tuple[tuple[int, ...], ...], ...]
    replica_kinds: tuple[int, ...]  # representative replica of each kind
    positions: dict[int, tuple[int, ...]]  # replica kind -> position kind per stage
    examples: tuple[tuple[int, int], ...]  # position kind -> (replica, stage) example
    signatures: tuple[tuple, ...]  # position kind -> what its cost depends on
    dp_groups: tuple[tuple[int, ...], ...]  # position kind -> its data-parallel group


def _layout(ctx: _Context, t: Template, devices: Sequence[Sequence[tuple[int, ...]]]) -> _Layout:
    kinds = _replica_kinds(t)
    signature: dict[tuple, int] = {}
    examples: list[tuple[int, int]] = []
    groups: list[tuple[int, ...]] = []
    positions = {}
    for r in kinds:
        row = []
        for k, slot in enumerate(t.replicas[r]):
            own = devices[r][k]
            nxt = devices[r][k + 1][0] if k + 1 < t.pp else None
            dp_group = tuple(devices[q][k][0] for q in range(t.dp))
            width = sum(len(d) for d in devices[r])
            key = (slot, k == 0, k == t.pp - 1, t.pp, width, group_tiers(ctx.cluster, own),
                   None if nxt is None else group_tiers(ctx.cluster, (own[0], nxt)),
                   group_tiers(ctx.cluster, dp_group, width))
            if key not in signature:
                signature[key] = len(examples)
                examples.append((r, k))
                groups.append(dp_group)
            row.append(signature[key])
        positions[r] = tuple(row)
    return _Layout(tuple(tuple(d) for d in devices), tuple(kinds), positions, tuple(examples),
                   tuple(signature), tuple(groups))


def _setup(ctx: _Context, t: Template, lay: _Layout, kind: int, *, mbs: int, recompute: str,
           layers: int, in_flight: int, sharding: Sharding) -> StageSetup:
    r, k = lay.examples[kind]
    gpu, tp = t.replicas[r][k]
    devices = lay.devices
    own = devices[r][k]
    return StageSetup(
        device_name=gpu,
        shape=WorkloadShape(micro_batch_size=mbs, seq_len=ctx.seq_len, tp=tp,
                            sequence_parallel=tp > 1, dtype=ctx.dtype, attention=ctx.attention),
        num_layers=layers, first=k == 0, last=k == t.pp - 1, pp=t.pp, recompute=recompute,
        tp_group=own, cp_group=(own[0],),
        next_stage=devices[r][k + 1][0] if k + 1 < t.pp else None,
        dp_group=lay.dp_groups[kind],
        concurrency=sum(len(d) for d in devices[r]), sharding=sharding, optimizer="fused",
        layers_in_flight=in_flight * layers)


@dataclass(frozen=True)
class _Linear:
    """A position kind's per-micro-batch time and memory as functions of its layer count
    n and micro-batches in flight f: time = fixed + per_layer * n;
    memory = base + states * n + activations * n * f (stage_memory is exactly this)."""

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


def _linear(ctx: _Context, t: Template, lay: _Layout, kind: int, *, mbs: int, recompute: str,
            sharding: Sharding, memo: dict) -> _Linear:
    key = ("linear", lay.signatures[kind], mbs, recompute, sharding)
    if key not in memo:
        c1, c2 = (_cost(ctx, t, lay, kind, mbs=mbs, recompute=recompute, layers=n,
                        sharding=sharding, memo=memo) for n in (1, 2))
        t1 = c1.forward_s + c1.backward_s + 2 * c1.p2p_s
        t2 = c2.forward_s + c2.backward_s + 2 * c2.p2p_s
        f1 = _memory(ctx, t, lay, kind, mbs=mbs, recompute=recompute, layers=1, in_flight=2,
                     sharding=sharding)
        m11, m21 = c1.memory.total_bytes, c2.memory.total_bytes  # (n, f) = (1, 1), (2, 1)
        act = f1 - m11
        states = m21 - m11 - act
        memo[key] = _Linear(t1 - (t2 - t1), max(t2 - t1, 1e-12), m11 - states - act, states,
                            act, c1.memory.capacity_bytes)
    return memo[key]


def _cost(ctx: _Context, t: Template, lay: _Layout, kind: int, *, mbs: int, recompute: str,
          layers: int, sharding: Sharding, memo: dict) -> StageCost:
    """The cost of a position kind holding `layers` (one micro-batch in flight)."""
    key = ("cost", lay.signatures[kind], mbs, recompute, sharding, layers)
    if key not in memo:
        setup = _setup(ctx, t, lay, kind, mbs=mbs, recompute=recompute, layers=layers,
                       in_flight=1, sharding=sharding)
        memo[key] = stage_cost(ctx.model, ctx.cluster, setup, stage=lay.examples[kind][1],
                               profiles=ctx.profiles)
    return memo[key]


def _memory(ctx: _Context, t: Template, lay: _Layout, kind: int, *, mbs: int, recompute: str,
            layers: int, in_flight: int, sharding: Sharding) -> float:
    setup = _setup(ctx, t, lay, kind, mbs=mbs, recompute=recompute, layers=layers,
                   in_flight=in_flight, sharding=sharding)
    return stage_memory(ctx.model, device=device(setup.device_name), shape=setup.shape,
                        num_layers=layers, first=setup.first, last=setup.last, pp=t.pp,
                        recompute=recompute, sharding=sharding,  # type: ignore[arg-type]
                        layers_in_flight=setup.layers_in_flight).total_bytes


def price(model: ModelSpec, cluster: ClusterSpec, template: Template, *, pools: dict[str, list[Pool]],
          mbs: int, recompute: str, sharding: Sharding, seq_len: int, dtype: str, gbs: int,
          attention: str, layers: Sequence[int] | None = None,
          microbatches: Sequence[int] | None = None, schedule: str = "1f1b",
          relax: Sequence[Sharding] = (), stage_sharding: Sequence[Sharding] | None = None,
          profiles: Profiles | None = None,
          memo: dict | None = None) -> Priced | None:
    """Split layers (unless given) and micro-batches (unless given), place the stages, and
    estimate the iteration under `schedule` (1f1b, or zb-h1 when pp > 1); None if the
    template cannot be placed or split. AMSP per stage: `stage_sharding` gives each stage
    position its own sharding; with `relax` (other sharding options) each position in turn
    takes the option, among those its memory allows, that shortens the iteration most
    (layers as split under `sharding`). `memo` keeps placements and stage costs across
    calls on the same model, cluster, dtype, profiles."""
    ctx = _Context(model, cluster, seq_len, dtype, gbs, attention, profiles)
    memo = {} if memo is None else memo
    lay = _placed(ctx, template, pools, memo)
    if lay is None or gbs % mbs:
        return None
    total = gbs // mbs
    m_even = total // template.dp
    if m_even < 1:
        return None
    if schedule == "zb-h1" and template.pp == 1:
        return None
    in_flight = [in_flight_chunks(schedule=schedule, stage=k, pp=template.pp,
                                  num_microbatches=m_even, virtual_stages=1)
                 for k in range(template.pp)]
    lin = {kind: _linear(ctx, template, lay, kind, mbs=mbs, recompute=recompute,
                         sharding=sharding, memo=memo) for kind in range(len(lay.examples))}
    if layers is None:
        # The common split must suit every kind of replica: balance the slowest kind,
        # within every kind's memory.
        slow = max(lay.replica_kinds, key=lambda r: sum(lin[q].per_layer_s
                                                         for q in lay.positions[r]))
        most = [min(lin[lay.positions[r][k]].most_layers(in_flight[k])
                    for r in lay.replica_kinds) for k in range(template.pp)]
        row = lay.positions[slow]
        layers = layer_split_fast(model.num_layers, [lin[q].fixed_s for q in row],
                                  [lin[q].per_layer_s for q in row], most,
                                  microbatches=m_even)
        if layers is None:
            return None
    per_stage = list(stage_sharding or [sharding] * template.pp)
    if relax:
        per_stage = _relaxed(ctx, template, lay, per_stage, [*relax, sharding], mbs=mbs,
                             recompute=recompute, layers=layers, in_flight=in_flight,
                             microbatches=m_even, schedule=schedule, memo=memo)
    if len(set(per_stage)) > 1:  # the overall sharding: the most sharded stage's
        sharding = max(per_stage, key=lambda sh: (sh.optim, sh.grads, sh.params))
    else:
        sharding = per_stage[0]
    costs = {r: [_cost(ctx, template, lay, q, mbs=mbs, recompute=recompute, layers=layers[k],
                       sharding=per_stage[k], memo=memo) for k, q in enumerate(lay.positions[r])]
             for r in lay.replica_kinds}
    fits = all(_fits_at(ctx, template, lay, k, per_stage[k], mbs=mbs, recompute=recompute,
                        layers=layers, in_flight=in_flight, memo=memo)
               for k in range(template.pp))
    if microbatches is None:
        microbatches = _split_batch(template, lay.replica_kinds, costs, total, schedule)
        if microbatches is None:
            return None
    kind_of = [kinds_of(template, r, list(lay.replica_kinds)) for r in range(template.dp)]
    finish = {(q, mb): pipeline_time(costs[q], num_microbatches=mb, virtual_stages=1,
                                     schedule=schedule)[0]
              for q, mb in set(zip(kind_of, microbatches, strict=True))}
    times = [finish[(q, mb)] for q, mb in zip(kind_of, microbatches, strict=True)]
    return Priced(template, mbs, recompute, sharding, tuple(layers), tuple(microbatches),
                  lay.devices, max(times), fits, schedule,
                  tuple(per_stage) if len(set(per_stage)) > 1 else None)


def _fits_at(ctx: _Context, t: Template, lay: _Layout, k: int, sharding: Sharding, *,
             mbs: int, recompute: str, layers: Sequence[int], in_flight: Sequence[int],
             memo: dict) -> bool:
    """Whether stage position `k` fits at `sharding` on every kind of replica."""
    return all(_linear(ctx, t, lay, lay.positions[r][k], mbs=mbs, recompute=recompute,
                       sharding=sharding, memo=memo).fits(layers[k], in_flight[k])
               for r in lay.replica_kinds)


def _relaxed(ctx: _Context, t: Template, lay: _Layout, per_stage: list[Sharding],
             options: Sequence[Sharding], *, mbs: int, recompute: str, layers: Sequence[int],
             in_flight: Sequence[int], microbatches: int, schedule: str, memo: dict
             ) -> list[Sharding]:
    """Coordinate descent over stage positions: each takes, among the options its memory
    allows, the one that shortens the slowest replica's estimated iteration most. With tied
    embeddings the first and last position move together (the twins shard alike)."""
    tied = ctx.model.tied_embeddings and t.pp > 1

    def together(k: int) -> tuple[int, ...]:
        return (0, t.pp - 1) if tied and k in (0, t.pp - 1) else (k,)

    def fits(k: int, sh: Sharding) -> bool:
        return all(_fits_at(ctx, t, lay, j, sh, mbs=mbs, recompute=recompute, layers=layers,
                            in_flight=in_flight, memo=memo) for j in together(k))

    def iteration_s(shardings: list[Sharding]) -> float:
        return max(pipeline_time([_cost(ctx, t, lay, q, mbs=mbs, recompute=recompute,
                                        layers=layers[k], sharding=shardings[k], memo=memo)
                                  for k, q in enumerate(lay.positions[r])],
                                 num_microbatches=microbatches, virtual_stages=1,
                                 schedule=schedule)[0] for r in lay.replica_kinds)

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
        memo[key] = None if devices is None else _layout(ctx, t, devices)
    return memo[key]


def _replica_kinds(t: Template) -> list[int]:
    """One representative replica per distinct slot sequence."""
    seen: dict[tuple[Slot, ...], int] = {}
    for r, rep in enumerate(t.replicas):
        seen.setdefault(rep, r)
    return list(seen.values())


def kinds_of(t: Template, r: int, kinds: list[int]) -> int:
    return next(q for q in kinds if t.replicas[q] == t.replicas[r])


def _split_batch(t: Template, kinds: Sequence[int], costs: dict[int, list[StageCost]],
                 total: int, schedule: str) -> list[int] | None:
    if len(kinds) == 1:
        if total % t.dp:
            return None
        return [total // t.dp] * t.dp
    line = {}  # per replica kind: (fill, step) of finishing m micro-batches
    for q in kinds:
        one, two = (pipeline_time(costs[q], num_microbatches=m, virtual_stages=1,
                                  schedule=schedule)[0] for m in (1, 2))
        line[q] = (one - (two - one), two - one)
    per_replica = [line[kinds_of(t, r, list(kinds))] for r in range(t.dp)]
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

