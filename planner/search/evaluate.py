"""Fast evaluation of homogeneous layouts: the closed-form estimate (planner/predict/estimate.py)
over stage costs (planner/costs/stages.py) built straight from a layout, without building
Plans, and the best sharding of each candidate.

Ranks sit as `layout.homogeneous_plan` places them (tp fastest, then cp, dp, pp), so the
GPUs a stage talks to follow from its index. Stages come in a few kinds (first, last,
middle with the base or one extra layer); each is priced once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

from planner.costs.compute import ComputeCosts
from planner.costs.memory import in_flight_chunks, model_state_bytes, rank_param_count
from planner.costs.stages import DPSync, StageCost, StageSetup, dp_sync, stage_cost
from planner.costs.workload import WorkloadShape, optimizer_work
from planner.predict.estimate import pipeline_time
from planner.search.sharding import (
    ShardingOption,
    pareto_options,
    sharding_levels,
    sharding_options,
)
from planner.search.space import Layout, Micro
from planner.specs.cluster import ClusterSpec
from planner.specs.layout import split_layers
from planner.specs.model import ModelSpec
from planner.specs.plan import Sharding
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
    """Everything about one layout that does not depend on the candidate run on it."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, layout: Layout, *, dtype: str,
                 seq_len: int, gbs: int, attention: str, optimizer: str,
                 profiles: Profiles | None = None):
        self.model, self.cluster, self.layout = model, cluster, layout
        self.profiles = profiles
        self.dtype, self.seq_len, self.gbs = dtype, seq_len, gbs
        self.attention, self.optimizer = attention, optimizer
        group = cluster.node_groups[0]
        assert group.gpus_per_node is not None
        self.device_name = group.gpu
        self.capacity = float(group.device.memory_bytes)
        self.counts = split_layers(model.num_layers, layout.pp)
        width = layout.tp * layout.cp
        self.kinds = self._stage_kinds()
        self.levels = sharding_levels(layout.dp, max(1, group.gpus_per_node // width))

    def _stage_kinds(self) -> list[int]:
        """Index of a representative stage for each stage (first, last and middle stages
        with the same layer count cost the same per micro-batch)."""
        rep: dict[tuple, int] = {}
        pp = self.layout.pp
        return [rep.setdefault((s == 0, s == pp - 1, self.counts[s]), s) for s in range(pp)]

    @functools.cache  # noqa: B019 (one LayoutModel per layout, for the search's lifetime)
    def devices(self, stage: int) -> tuple[tuple[int, ...], tuple[int, ...], int | None,
                                            tuple[int, ...]]:
        """(tp group, cp group, next stage's GPU, data-parallel group) of pipeline 0."""
        lo = self.layout
        width = lo.tp * lo.cp
        start = stage * width * lo.dp
        nxt = ((stage + 1) % lo.pp) * width * lo.dp if lo.pp > 1 else None
        return (tuple(range(start, start + lo.tp)),
                tuple(range(start, start + width, lo.tp)), nxt,
                tuple(start + d * width for d in range(lo.dp)))

    @functools.cache  # noqa: B019
    def params(self, stage: int) -> float:
        lo = self.layout
        return rank_param_count(self.model, num_layers=self.counts[stage], first=stage == 0,
                                last=stage == lo.pp - 1, tp=lo.tp, pp=lo.pp)

    @cached_property
    def options(self) -> list[ShardingOption]:
        """Sharding options not dominated in memory or in any time term (per stage kind)."""
        return pareto_options([self.option(sh) for sh in sharding_options(self.levels)])

    def option(self, sharding: Sharding) -> ShardingOption:
        memory, costs = [], []
        for s in sorted(set(self.kinds)):
            sync = self.sync(s, sharding)
            states = model_state_bytes(self.model, params=self.params(s), dtype=self.dtype,
                                       sharding=sharding, tp=self.layout.tp, pp=self.layout.pp)
            memory.append(sum(states))
            costs.extend((sync.grad_iteration_s, sync.grad_microbatch_s, sync.param_iteration_s,
                          sync.param_microbatch_s, self.optimizer_s(s, sharding)))
        return ShardingOption(sharding, tuple(memory), tuple(costs))

    @functools.cache  # noqa: B019
    def sync(self, stage: int, sharding: Sharding) -> DPSync:
        group = self.devices(stage)[3]
        return dp_sync(self.cluster, group, self.params(stage),
                       self.layout.num_gpus // self.layout.dp, sharding, self.dtype, self.profiles)

    @functools.cache  # noqa: B019
    def optimizer_s(self, stage: int, sharding: Sharding) -> float:
        op = optimizer_work(self.params(stage) / sharding.optim, dtype=self.dtype,
                            implementation=self.optimizer,
                            num_tensors=max(1, 6 * self.counts[stage]))
        profile = self.profiles.get(self.device_name) if self.profiles else None
        return ComputeCosts(self.device_name, self.dtype, profile).time_s(op)

    def shape(self, micro: Micro) -> WorkloadShape:
        return WorkloadShape(micro_batch_size=micro.mbs, seq_len=self.seq_len, tp=self.layout.tp,
                             cp=self.layout.cp,
                             sequence_parallel=micro.sequence_parallel and self.layout.tp > 1,
                             dtype=self.dtype, attention=self.attention)

    def stage_costs(self, micro: Micro) -> dict[int, StageCost]:
        """Unsharded costs of each stage kind (sharding is applied by `evaluate`)."""
        lo, shape = self.layout, self.shape(micro)
        m = micro.num_microbatches(self.gbs, lo.dp)
        schedule = "interleaved-1f1b" if micro.vp > 1 else micro.schedule
        out = {}
        for s in sorted(set(self.kinds)):
            tp_group, cp_group, nxt, dp_group = self.devices(s)
            flight = in_flight_chunks(schedule=schedule, stage=s, pp=lo.pp, num_microbatches=m,
                                      virtual_stages=micro.vp)
            setup = StageSetup(
                device_name=self.device_name, shape=shape, num_layers=self.counts[s],
                first=s == 0, last=s == lo.pp - 1, pp=lo.pp, recompute=micro.recompute,
                tp_group=tp_group, cp_group=cp_group, next_stage=nxt, dp_group=dp_group,
                concurrency=lo.num_gpus // lo.dp, sharding=Sharding(), optimizer=self.optimizer,
                layers_in_flight=flight * self.counts[s] / micro.vp)
            out[s] = stage_cost(self.model, self.cluster, setup, stage=s, profiles=self.profiles)
        return out

    def evaluate(self, micro: Micro) -> Evaluation:
        """The candidate's best sharding (exact over the undominated options): fastest
        estimated iteration among those whose every stage fits; if none fits, the one
        closest to fitting."""
        base = self.stage_costs(micro)
        kinds = sorted(base)
        m = micro.num_microbatches(self.gbs, self.layout.dp)
        # Peak memory of a stage kind: activations and buffers from the unsharded costs,
        # plus the option's model states. The first stage of a kind holds the most.
        rest = {s: base[s].memory.total_bytes - base[s].memory.model_states_bytes
                for s in kinds}
        best: Evaluation | None = None
        for opt in self.options:
            peak = max(rest[s] + opt.memory_bytes[i] for i, s in enumerate(kinds))
            if best is not None and best.fits and peak > self.capacity:
                continue
            if best is not None and not best.fits and peak >= best.peak_memory_bytes:
                continue
            time_s = self.time_with(base, opt, m, micro.vp, micro.schedule)
            cand = Evaluation(self.layout, micro, opt.sharding, time_s, peak, self.capacity)
            if best is None or _better(cand, best):
                best = cand
        assert best is not None
        return best

    def time_with(self, base: dict[int, StageCost], opt: ShardingOption, m: int,
                  vp: int, schedule: str = "1f1b") -> float:
        costs_by_kind = {}
        for s in base:
            costs_by_kind[s] = base[s].with_sync(self.sync(s, opt.sharding),
                                                 self.optimizer_s(s, opt.sharding))
        stages = [costs_by_kind[k] for k in self.kinds]
        return pipeline_time(stages, num_microbatches=m, virtual_stages=vp,
                             schedule=schedule)[0]


def _better(a: Evaluation, b: Evaluation) -> bool:
    if a.fits != b.fits:
        return a.fits
    if a.fits:
        return a.iteration_s < b.iteration_s
    return a.peak_memory_bytes < b.peak_memory_bytes
