"""Fast evaluation of homogeneous layouts: the closed-form estimate over the cost builder's
stage costs (planner/costs/stages.py), straight from a layout without building Plans, and
the best sharding of each candidate.

Ranks sit as `layout.megatron_devices` places them (the order `homogeneous_plan` writes).
Per layout, the replicas and stages that cost the same (`stage_key`, `replica_key`) are
found once; per candidate, each distinct stage is priced once. The estimate of a
candidate is therefore exactly `estimate` of the Plan it becomes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from functools import cached_property

from planner.costs.stages import (
    PlacedStage,
    RunSettings,
    ShardingTerms,
    StageCost,
    StageSpec,
    apply_sharding,
    position_groups,
    replica_specs,
    sharding_terms,
    stage_key,
    stage_params,
    unsharded_cost,
)
from planner.export.frameworks import ANY_SHARDING, ShardPattern
from planner.predict.estimate import iteration_time
from planner.search.sharding import (
    ShardingOption,
    allowed_options,
    pareto_options,
    sharding_levels,
)
from planner.search.space import Layout, Micro
from planner.specs.choices import Recompute
from planner.specs.cluster import ClusterSpec
from planner.specs.layout import megatron_devices, split_layers
from planner.specs.model import ModelSpec
from planner.specs.plan import Kernels, Sharding
from profiler.store import Profiles

__all__ = ["Evaluation", "LayoutModel"]


@dataclass(frozen=True)
class Evaluation:
    """One candidate with its best sharding: estimated time and peak memory."""

    layout: Layout
    micro: Micro
    sharding: Sharding
    iteration_s: float
    peak_memory_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes


class LayoutModel:
    """Everything about one layout that does not depend on the candidate run on it: the
    distinct replicas, and for each the distinct stages (a representative spec per kind
    and which kind each stage is)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, layout: Layout, *, dtype: str,
                 seq_len: int, gbs: int, kernels: Kernels, profiles: Profiles | None = None,
                 sharding: tuple[ShardPattern, ...] = (ANY_SHARDING,)):
        self.model, self.layout, self.profiles = model, layout, profiles
        self.cluster = cluster.take(layout.num_gpus, where="search")
        self.dtype, self.seq_len, self.gbs, self.kernels = dtype, seq_len, gbs, kernels
        group = self.cluster.node_groups[0]
        assert group.gpus_per_node is not None
        self.capacity = float(group.device.memory_bytes)
        self.counts = split_layers(model.num_layers, layout.pp)
        lo = layout
        devices = megatron_devices(tp=lo.tp, cp=lo.cp, dp=lo.dp, pp=lo.pp)
        replicas = [[PlacedStage(devices=devices[d][k], tp=lo.tp, cp=lo.cp,
                                 num_layers=self.counts[k], recompute=Recompute.NONE)
                     for k in range(lo.pp)] for d in range(lo.dp)]
        groups = position_groups(replicas)
        unsharded = [Sharding()] * lo.pp
        self.kind_specs: list[StageSpec] = []  # a representative spec of each stage kind
        self.replica_kinds: list[tuple[int, ...]] = []  # each distinct replica's stage kinds
        kind_of: dict[tuple, int] = {}
        for stages in replicas:
            kinds = []
            for spec in replica_specs(self.cluster, stages, groups=groups, shardings=unsharded):
                key = stage_key(self.cluster, spec)
                if key not in kind_of:
                    kind_of[key] = len(self.kind_specs)
                    self.kind_specs.append(spec)
                kinds.append(kind_of[key])
            if tuple(kinds) not in self.replica_kinds:
                self.replica_kinds.append(tuple(kinds))
        self.levels = sharding_levels(lo.dp, max(1, group.gpus_per_node // (lo.tp * lo.cp)))
        # the shardings this layout may take (`sharding`: the framework's patterns)
        self.choices = allowed_options(self.levels, dp=lo.dp, patterns=sharding)

    def run(self, micro: Micro) -> RunSettings:
        return RunSettings(micro_batch_size=micro.mbs,
                           num_microbatches=micro.num_microbatches(self.gbs, self.layout.dp),
                           seq_len=self.seq_len, dtype=self.dtype,
                           sequence_parallel=micro.sequence_parallel,
                           schedule=micro.schedule.for_chunks(micro.vp),
                           virtual_stages=micro.vp, kernels=self.kernels)

    @functools.cache  # noqa: B019 (one LayoutModel per layout, for the search's lifetime)
    def spec(self, kind: int, recompute: Recompute) -> StageSpec:
        s = self.kind_specs[kind]
        return replace(s, placed=replace(s.placed, recompute=recompute))

    @functools.cache  # noqa: B019
    def terms(self, kind: int, sharding: Sharding) -> ShardingTerms:
        """A sharding's terms on a stage kind (the same for every candidate)."""
        spec = self.kind_specs[kind]
        return sharding_terms(self.model, self.cluster, spec, self.run(_ANY_MICRO), sharding,
                              stage_params(self.model, spec), profiles=self.profiles)

    def stage_costs(self, micro: Micro) -> list[StageCost]:
        """Unsharded costs of each stage kind (`sharded` applies a sharding)."""
        run = self.run(micro)
        return [unsharded_cost(self.model, self.cluster, self.spec(k, micro.recompute), run,
                               profiles=self.profiles) for k in range(len(self.kind_specs))]

    @cached_property
    def options(self) -> list[ShardingOption]:
        """Sharding options not dominated in memory or in any time term (per stage kind)."""
        return pareto_options([self.option(sh) for sh in self.choices])

    def option(self, sharding: Sharding) -> ShardingOption:
        """A sharding's model-state bytes and time terms per stage kind (a micro-batch
        setting changes neither)."""
        memory: list[float] = []
        times: list[float] = []
        for k in range(len(self.kind_specs)):
            t = self.terms(k, sharding)
            memory.append(sum(t.states_bytes))
            times.extend((t.dp.grad_iteration_s, t.dp.grad_microbatch_s,
                          t.dp.param_iteration_s, t.dp.param_microbatch_s, t.optimizer_s))
        return ShardingOption(sharding, tuple(memory), tuple(times))

    def sharded(self, base: list[StageCost], sharding: Sharding) -> list[StageCost]:
        """Stage-kind costs `base` (`stage_costs`) under `sharding`."""
        return [apply_sharding(c, self.terms(k, sharding)) for k, c in enumerate(base)]

    def iteration_s(self, costs: list[StageCost], micro: Micro) -> float:
        """The closed-form iteration of the layout's replicas with stage-kind costs
        `costs` (what `estimate` of the Plan gives)."""
        m = micro.num_microbatches(self.gbs, self.layout.dp)
        replicas = [[costs[k] for k in kinds] for kinds in self.replica_kinds]
        return iteration_time(replicas, [m] * len(replicas), virtual_stages=micro.vp,
                              schedule=micro.schedule.for_chunks(micro.vp))[0]

    def evaluate(self, micro: Micro) -> Evaluation:
        """The candidate's best sharding (exact over the undominated options): fastest
        estimated iteration among those whose every stage fits; if none fits, the one
        closest to fitting."""
        base = self.stage_costs(micro)
        rest = [c.memory.total_bytes - c.memory.model_states_bytes - c.memory.gathered_bytes
                for c in base]
        best: Evaluation | None = None
        for opt in self.options:
            peak = max(r + m for r, m in zip(rest, opt.memory_bytes, strict=True))
            if best is not None and best.fits and peak > self.capacity:
                continue
            if best is not None and not best.fits and peak >= best.peak_memory_bytes:
                continue
            time_s = self.iteration_s(self.sharded(base, opt.sharding), micro)
            cand = Evaluation(self.layout, micro, opt.sharding, time_s, peak, self.capacity)
            if best is None or _better(cand, best):
                best = cand
        assert best is not None
        return best


# Model states, data-parallel traffic and the optimizer step do not depend on the
# micro-batch setting: sharding options are compared at this one.
_ANY_MICRO = Micro(vp=1, mbs=1, recompute=Recompute.NONE, sequence_parallel=False)


def _better(a: Evaluation, b: Evaluation) -> bool:
    if a.fits != b.fits:
        return a.fits
    if a.fits:
        return a.iteration_s < b.iteration_s
    return a.peak_memory_bytes < b.peak_memory_bytes
