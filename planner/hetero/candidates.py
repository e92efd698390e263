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

from planner.estimate import pipeline_time
from planner.hetero.placement import Pool, place
from planner.hetero.split import layer_split_fast
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Kernels, Pipeline, Plan, Sharding, Stage, Training
from planner.stage_costs import StageCost, StageSetup, stage_cost
from planner.workload import WorkloadShape
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
                            sequence_parallel=any(tp > 1 for rep in self.template.replicas
                                                  for _, tp in rep))
        plan = Plan(model=model, cluster=cluster, training=training, pipelines=tuple(pipelines),
                    sharding=self.sharding, kernels=kernels)
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

    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if shares(values[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    caps = shares(values[lo])
    assert caps is not None
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


def _setup(ctx: _Context, slot: Slot, *, mbs: int, recompute: str, layers: int, k: int,
           pp: int, devices: Sequence[Sequence[tuple[int, ...]]], r: int, in_flight: int,
           sharding: Sharding) -> StageSetup:
    gpu, tp = slot
    own = devices[r][k]
    return StageSetup(
        device_name=gpu,
        shape=WorkloadShape(micro_batch_size=mbs, seq_len=ctx.seq_len, tp=tp,
                            sequence_parallel=tp > 1, dtype=ctx.dtype, attention=ctx.attention),
        num_layers=layers, first=k == 0, last=k == pp - 1, pp=pp, recompute=recompute,
        tp_group=own, cp_group=(own[0],), next_stage=devices[r][k + 1][0] if k + 1 < pp else None,
        dp_group=tuple(devices[q][k][0] for q in range(len(devices))),
        concurrency=sum(len(d) for d in devices[r]), sharding=sharding, optimizer="fused",
        layers_in_flight=in_flight * layers)


def _stage_costs(ctx: _Context, t: Template, r: int, layers: Sequence[int], *, mbs: int,
                 recompute: str, m: int, devices: Sequence[Sequence[tuple[int, ...]]],
                 sharding: Sharding) -> list[StageCost]:
    return [stage_cost(ctx.model, ctx.cluster,
                       _setup(ctx, slot, mbs=mbs, recompute=recompute, layers=layers[k], k=k,
                              pp=t.pp, devices=devices, r=r, in_flight=min(m, t.pp - k),
                              sharding=sharding), stage=k, profiles=ctx.profiles)
            for k, slot in enumerate(t.replicas[r])]


def _linear(ctx: _Context, t: Template, r: int, *, mbs: int, recompute: str, m: int,
            devices: Sequence[Sequence[tuple[int, ...]]], sharding: Sharding
            ) -> tuple[list[float], list[float], list[int]]:
    """Per stage of replica r: fixed and per-layer time of a micro-batch, and the most
    layers memory allows (time and memory are linear in the layer count)."""
    one = _stage_costs(ctx, t, r, [1] * t.pp, mbs=mbs, recompute=recompute, m=m,
                       devices=devices, sharding=sharding)
    two = _stage_costs(ctx, t, r, [2] * t.pp, mbs=mbs, recompute=recompute, m=m,
                       devices=devices, sharding=sharding)
    fixed, per_layer, most = [], [], []
    for c1, c2 in zip(one, two, strict=True):
        t1 = c1.forward_s + c1.backward_s + 2 * c1.p2p_s
        t2 = c2.forward_s + c2.backward_s + 2 * c2.p2p_s
        per_layer.append(max(t2 - t1, 1e-12))
        fixed.append(t1 - (t2 - t1))
        a, b = c1.memory.total_bytes, c2.memory.total_bytes - c1.memory.total_bytes
        cap = c1.memory.capacity_bytes
        most.append(math.floor((cap - a) / b) + 1 if b > 0 and cap >= a else 0)
    return fixed, per_layer, most


def price(model: ModelSpec, cluster: ClusterSpec, template: Template, *, pools: dict[str, list[Pool]],
          mbs: int, recompute: str, sharding: Sharding, seq_len: int, dtype: str, gbs: int,
          attention: str, layers: Sequence[int] | None = None,
          microbatches: Sequence[int] | None = None,
          profiles: Profiles | None = None) -> Priced | None:
    """Split layers (unless given) and micro-batches (unless given), place the stages, and
    estimate the iteration; None if the template cannot be placed or split."""
    ctx = _Context(model, cluster, seq_len, dtype, gbs, attention, profiles)
    weight = [1.0] * template.pp  # every position's data-parallel traffic alike
    slots = template.replicas[0]
    if template.family == "mixed-stages":
        devices = place(slots, template.dp, pools, weight)
    else:
        devices = _place_replicas(template, pools)
    if devices is None or gbs % mbs:
        return None
    total = gbs // mbs
    m_even = total // template.dp
    if m_even < 1:
        return None
    kinds = _replica_kinds(template)
    if layers is None:
        # The common split must suit every kind of replica: balance the slowest kind,
        # within every kind's memory.
        lin = {r: _linear(ctx, template, r, mbs=mbs, recompute=recompute, m=m_even,
                          devices=devices, sharding=sharding) for r in kinds}
        slow = max(kinds, key=lambda r: sum(lin[r][1]))
        most = [min(lin[r][2][k] for r in kinds) for k in range(template.pp)]
        split = layer_split_fast(model.num_layers, lin[slow][0], lin[slow][1], most,
                                 microbatches=m_even)
        if split is None:
            return None
        layers = split
    costs = {r: _stage_costs(ctx, template, r, layers, mbs=mbs, recompute=recompute, m=m_even,
                             devices=devices, sharding=sharding) for r in kinds}
    if microbatches is None:
        microbatches = _split_batch(template, kinds, costs, total, gbs)
        if microbatches is None:
            return None
    times = [pipeline_time(costs[kinds_of(template, r, kinds)], num_microbatches=microbatches[r],
                           virtual_stages=1)[0] for r in range(template.dp)]
    fits = all(c.memory.fits for cs in costs.values() for c in cs)
    return Priced(template, mbs, recompute, sharding, tuple(layers), tuple(microbatches),
                  tuple(tuple(d) for d in devices), max(times), fits)


def _replica_kinds(t: Template) -> list[int]:
    """One representative replica per distinct slot sequence."""
    seen: dict[tuple[Slot, ...], int] = {}
    for r, rep in enumerate(t.replicas):
        seen.setdefault(rep, r)
    return list(seen.values())


def kinds_of(t: Template, r: int, kinds: list[int]) -> int:
    return next(q for q in kinds if t.replicas[q] == t.replicas[r])


def _split_batch(t: Template, kinds: list[int], costs: dict[int, list[StageCost]], total: int,
                 gbs: int) -> list[int] | None:
    if len(kinds) == 1:
        if total % t.dp:
            return None
        return [total // t.dp] * t.dp
    fill, step = [], []
    for r in range(t.dp):
        cs = costs[kinds_of(t, r, kinds)]
        one = pipeline_time(cs, num_microbatches=1, virtual_stages=1)[0]
        two = pipeline_time(cs, num_microbatches=2, virtual_stages=1)[0]
        step.append(two - one)
        fill.append(one - (two - one))
    return batch_split_fast(total, fill, step)


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

