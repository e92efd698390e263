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
import math
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from planner.costs.stages import (
    PlacedStage,
    RunSettings,
    ShardingTerms,
    StageCost,
    StageSpec,
    apply_sharding,
    bucket_params,
    group_signature,
    placement,
    replica_specs,
    sharding_terms,
    stage_key,
    stage_params,
    stage_passes,
    unsharded_cost,
)
from planner.export.frameworks import (
    ANY_SHARDING,
    ShardPattern,
    computes_in_fp32,
    fsdp_dp_problem,
)
from planner.predict.estimate import critical_path_s, iteration_end_s, receives_s
from planner.search.sharding import (
    ShardingOption,
    allowed_options,
    pareto_options,
    sharding_levels,
)
from planner.search.space import Layout, Micro
from planner.specs.choices import ModelStates, Recompute
from planner.specs.cluster import ClusterSpec
from planner.specs.layout import megatron_devices, split_layers, stage_moe_layers
from planner.specs.model import ModelSpec
from planner.specs.plan import DEFAULT_COMM, Communication, Kernels, Sharding
from profiler.store import Profiles

__all__ = ["Evaluation", "LayoutModel"]


@dataclass(frozen=True)
class Evaluation:
    """One candidate with its best sharding: estimated time (infinite when no sharding
    fits: such a candidate is never ranked) and peak memory."""

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
                 sharding: tuple[ShardPattern, ...] = (ANY_SHARDING,),
                 ep_sharding_multiple: bool = False,
                 amp_needs_sharding_with_tp_pp: bool = False,
                 fsdp_data_parallel: bool = False,
                 model_states: ModelStates = ModelStates.FP32_GRADS,
                 comm: Communication = DEFAULT_COMM):
        self.model, self.layout, self.profiles = model, layout, profiles
        self.model_states = model_states  # the framework's rule (Training.model_states)
        self.comm = comm  # how the framework communicates (Training.comm)
        self.cluster = cluster.take(layout.num_gpus, where="search")
        self.dtype, self.seq_len, self.gbs, self.kernels = dtype, seq_len, gbs, kernels
        group = self.cluster.node_groups[0]
        assert group.gpus_per_node is not None
        self.capacity = float(group.device.memory_bytes)
        self.counts = split_layers(model.num_layers, layout.pp)
        lo = layout
        devices = megatron_devices(tp=lo.tp, cp=lo.cp, dp=lo.dp, pp=lo.pp)
        # position k's data-parallel group (`position_groups`: replicas split alike)
        groups = ([tuple(devices[d][k][0] for d in range(lo.dp)) for k in range(lo.pp)]
                  if lo.dp > 1 else None)
        unsharded = [Sharding()] * lo.pp
        self.kind_specs: list[StageSpec] = []  # a representative spec of each stage kind
        self.replica_kinds: list[tuple[int, ...]] = []  # each distinct replica's stage kinds
        kind_of: dict[tuple, int] = {}
        # Every replica's stage k syncs over the same group (up to thousands of GPUs): its
        # signature is found once per position and stands in the keys as a small number.
        signatures: dict[tuple, int] = {}
        dp_token = [signatures.setdefault(group_signature(self.cluster, g), len(signatures))
                    for g in (groups or [])]
        # the MoE layers each stage holds without interleaving (a plan with vp > 1 holds
        # others: its simulation, which confirms the leaders, counts them)
        moe = stage_moe_layers(model, tuple(self.counts))
        for d in self._representatives(devices):
            stages = [PlacedStage(devices=devices[d][k], tp=lo.tp, cp=lo.cp,
                                  num_layers=self.counts[k], recompute=Recompute.NONE,
                                  ep=lo.ep, etp=lo.etp, ep_layout=lo.ep_layout,
                                  moe_layers=moe[k])
                      for k in range(lo.pp)]
            kinds = []
            for spec in replica_specs(self.cluster, stages, groups=groups, shardings=unsharded):
                key = stage_key(self.cluster, spec,
                                dp_signature=dp_token[spec.index] if groups else None)
                if key not in kind_of:
                    kind_of[key] = len(self.kind_specs)
                    self.kind_specs.append(spec)
                kinds.append(kind_of[key])
            if tuple(kinds) not in self.replica_kinds:
                self.replica_kinds.append(tuple(kinds))
        self.memo: dict[tuple, object] = {}  # what later steps work out for this layout
        self._pass_memo: dict[tuple, list[StageCost]] = {}  # `_passes`
        # sizes count the dp x cp ranks holding the same parameters (`Sharding`), of
        # which an NVLink domain holds nvlink_domain_gpus / tp
        assert group.nvlink_domain_gpus is not None
        self.levels = sharding_levels(lo.dp * lo.cp, max(1, group.nvlink_domain_gpus // lo.tp))
        # the shardings this layout may take (`sharding`: the framework's patterns)
        self.choices = allowed_options(self.levels, dp=lo.dp * lo.cp, patterns=sharding)
        if ep_sharding_multiple and lo.ep > 1:  # expert states in whole ep groups
            self.choices = [sh for sh in self.choices
                            if all(n <= lo.ep or n % lo.ep == 0
                                   for n in (sh.params, sh.grads, sh.optim))]
        self.choices = [sh for sh in self.choices  # not those it would compute in fp32
                        if not computes_in_fp32(amp_needs_sharding_with_tp_pp, dtype, tp=lo.tp,
                                                pp=lo.pp, cp=lo.cp, params=sh.params)
                        # nor those it would not run as priced (torchtitan's DDP / cp)
                        and not fsdp_dp_problem(fsdp_data_parallel, tp=lo.tp, pp=lo.pp,
                                                cp=lo.cp, dp=lo.dp, params=sh.params)]

    def _representatives(self, devices: list[list[tuple[int, ...]]]) -> list[int]:
        """The first replica of each placement pattern: the node group of every GPU, which
        node and NVLink domain it is in and its local index, counted from the replica's
        first GPU. Replicas of one pattern have the same stage keys (links are found from
        node groups, shared nodes and domains and rails, `group_signature`, and every
        replica's stage k syncs over the same group), so the rest are skipped."""
        seen: dict[tuple, int] = {}
        for d, replica in enumerate(devices):
            gpus = [g for stage in replica for g in stage]
            seen.setdefault(placement(self.cluster, gpus, gpus[0]), d)
        return sorted(seen.values())

    def run(self, micro: Micro) -> RunSettings:
        return RunSettings(micro_batch_size=micro.mbs,
                           num_microbatches=micro.num_microbatches(self.gbs, self.layout.dp),
                           seq_len=self.seq_len, dtype=self.dtype,
                           sequence_parallel=micro.sequence_parallel,
                           schedule=micro.schedule.for_chunks(micro.vp),
                           virtual_stages=micro.vp, kernels=self.kernels,
                           model_states=self.model_states, comm=self.comm)

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
        passes = self._passes(micro, run)
        return [unsharded_cost(self.model, self.cluster, self.spec(k, micro.recompute), run,
                               profiles=self.profiles, passes=passes[k])
                for k in range(len(self.kind_specs))]

    def _passes(self, micro: Micro, run: RunSettings) -> list[StageCost]:
        """`stage_passes` of each stage kind, shared by the candidates whose work has one
        shape (`workload_shape`: their micro-batch size, recomputation and sequence
        parallelism; the rest of `run` is the layout's)."""
        key = (micro.mbs, micro.recompute, micro.sequence_parallel)
        if key not in self._pass_memo:
            self._pass_memo[key] = [stage_passes(self.model, self.cluster,
                                                 self.spec(k, micro.recompute), run,
                                                 profiles=self.profiles)
                                    for k in range(len(self.kind_specs))]
        return self._pass_memo[key]

    def __getstate__(self) -> dict:
        """Pickled (from a search's worker) without the passes, which are quick to find
        again and many."""
        return {**self.__dict__, "_pass_memo": {}}

    @cached_property
    def options(self) -> list[ShardingOption]:
        """Sharding options not dominated in memory or in any time term (per stage kind)."""
        return pareto_options([self.option(sh) for sh in self.choices])

    @cached_property
    def _option_table(self) -> tuple[np.ndarray, np.ndarray]:
        """The options' model-state bytes per stage kind [options, kinds] and their time
        terms [options, kinds, (gradients per iteration, per micro-batch, parameters per
        iteration, per micro-batch, optimizer)] (`option`)."""
        memory = np.array([o.memory_bytes for o in self.options], dtype=float)
        terms = np.array([o.costs_s for o in self.options], dtype=float)
        return memory, terms.reshape(len(self.options), len(self.kind_specs), 5)

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
        return iteration_end_s(replicas, [m] * len(replicas), virtual_stages=micro.vp,
                               schedule=micro.schedule.for_chunks(micro.vp))

    def evaluate(self, micro: Micro) -> Evaluation:
        """The candidate's best sharding (exact over the undominated options): fastest
        estimated iteration among those whose every stage fits, the first of equals; if
        none fits, the first closest to fitting (not timed). Options that fit are priced in order of a
        lower bound on their iteration (`_lower_bounds`) until the bound exceeds the best
        found: those left cannot be as fast."""
        base = self.stage_costs(micro)
        rest = [c.memory.total_bytes - c.memory.model_states_bytes - c.memory.gathered_bytes
                for c in base]
        memory, _ = self._option_table
        peaks = (memory + np.array(rest)).max(axis=1)  # [options]
        fitting = np.flatnonzero(peaks <= self.capacity)
        if not len(fitting):  # only its memory explains anything (`search._explain`)
            i = int(np.argmin(peaks))
            return Evaluation(self.layout, micro, self.options[i].sharding, math.inf,
                              float(peaks[i]), self.capacity)
        bounds = self._lower_bounds(base, micro)[fitting] * (1 - 1e-9)  # rounding to spare
        best: Evaluation | None = None
        best_index = 0
        for j in np.argsort(bounds, kind="stable"):
            if best is not None and bounds[j] > best.iteration_s:
                break
            i = int(fitting[j])
            cand = self._evaluation(base, micro, i, float(peaks[i]))
            if (best is None or cand.iteration_s < best.iteration_s
                    or (cand.iteration_s == best.iteration_s and i < best_index)):
                best, best_index = cand, i
        assert best is not None
        return best

    def _lower_bounds(self, base: list[StageCost], micro: Micro) -> np.ndarray:
        """A lower bound on each option's iteration (`iteration_s`) of the first replica:
        its first stage ends no earlier than the pipeline's critical path with each
        micro-batch lengthened by what the option adds to the slowest stage's
        (`estimate._work_s`, `estimate.sends_s`), plus the first stage's exposed gradient
        reduction, optimizer step and parameter gather (`estimate.pipeline_time`'s tail,
        by `exposed_s`). The iteration time only grows with these terms."""
        kinds = self.replica_kinds[0]
        schedule = micro.schedule.for_chunks(micro.vp)
        m = micro.num_microbatches(self.gbs, self.layout.dp)
        stages = [base[k] for k in kinds]
        path_s, slow = critical_path_s(stages, num_microbatches=m, virtual_stages=micro.vp,
                                       schedule=schedule)
        _, terms = self._option_table
        grad_it, grad_mb, param_it, param_mb, optimizer = (terms[:, :, j] for j in range(5))
        s, f = kinds[slow], kinds[0]
        c, first = base[s], base[f]
        # what the slowest stage waits for its pipeline transfers at most (`estimate.
        # sends_s`): a micro-batch that computes longer waits less, by up to that; the
        # path's fill and drain steps (half of each stage's waits) by up to one of each
        # link's transfers per chunk
        absorbed = 0.0
        if len(stages) > 1:
            absorbed = micro.vp * (c.p2p_s + stages[slow - 1].p2p_s)
            path_s -= micro.vp * sum(st.p2p_s for st in stages)
        # ZeRO-3 gathers add at least nothing (what they add depends on how the units'
        # gathers and computes interleave: `estimate._work_s`)
        if not self.comm.overlap_grad_reduce:
            # every micro-batch's reduce-scatter but the last in line, the last and the
            # rest after the backward, all exposed (`exposed_s`, `estimate.grad_paced_s`);
            # under ZB-H1 those of the W's the stage defers go with them into the drain
            # (`estimate._zb_paths`)
            kept = m - (min(slow + 1, m) if schedule.splits_backward else 1)
            return (path_s + kept * np.maximum(0.0, grad_mb[:, s] - absorbed)
                    + grad_mb[:, f] + grad_it[:, f] + optimizer[:, f] + param_it[:, f])
        # overlapped reduce-scatters that outlast the micro-batch add at least their
        # excess over it, between micro-batches (the last one's is in the tail:
        # `estimate.grad_paced_s`); a micro-batch lasts at most its passes, its receives
        # and all its parameter gathers
        span = (c.forward_s + c.backward_s + param_mb[:, s]
                + receives_s(stages, slow, micro.vp))
        extra = np.maximum(0.0, grad_mb[:, s] - span - absorbed)
        # the framework's buckets (RunSettings.comm)
        buckets = max(1, math.ceil(first.num_params / bucket_params(self.comm,
                                                                   self.layout.dp)))
        # the backward the last reduce-scatter hides under, with at most half the gathers
        window = (first.weight_grad_s if schedule.splits_backward
                  else first.backward_s + param_mb[:, f] / 2)
        grads = grad_mb[:, f] + grad_it[:, f]
        # interleaved, chunk 0's share after its own last backward at least
        # (`estimate._tail_grads_s`)
        tail = (np.maximum(grads / buckets, (grads - window) / micro.vp) + optimizer[:, f]
                + np.maximum(param_it[:, f] / buckets, param_it[:, f] - first.forward_s))
        return path_s + (m - 1) * extra + tail

    def _evaluation(self, base: list[StageCost], micro: Micro, index: int,
                    peak: float) -> Evaluation:
        sharding = self.options[index].sharding
        time_s = self.iteration_s(self.sharded(base, sharding), micro)
        return Evaluation(self.layout, micro, sharding, time_s, peak, self.capacity)


# Model states, data-parallel traffic and the optimizer step do not depend on the
# micro-batch setting: sharding options are compared at this one.
_ANY_MICRO = Micro(vp=1, mbs=1, recompute=Recompute.NONE, sequence_parallel=False)

