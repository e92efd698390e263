"""Planning on clusters of several GPU types (and islands, and datacenters).

Candidates: homogeneous plans on each GPU type alone (planner/search), and heterogeneous
templates on every combination of two or more types: pipelines with unlike stages
(Zorse), replicas of unlike types (mixed data parallelism). Each is split optimally
(planner/hetero/split.py), placed by island (Holmes, planner/hetero/placement.py),
priced with the closed form; the leaders are confirmed by the event simulator.

Baselines, each a planner behind the same interface and rated by the same simulator:
the fastest GPU type alone, the best heterogeneous template with layers (or micro-batches)
split uniformly, and with them split in proportion to throughput (Metis/Zorse heuristic).

What is searched is data, `MixedSpace` (template families, tp per type, schedules,
recompute, sharding patterns, per-stage sharding, expert-parallel degrees);
`MixedSpace.for_framework` narrows it to what a training framework runs (none of it, for
a framework that runs one GPU type).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from planner.costs.kernels import attention_for
from planner.costs.stages import PlacedStage, RunSettings, StageSpec, unsharded_cost
from planner.export.frameworks import (
    ANY_SHARDING,
    FrameworkCapabilities,
    ShardPattern,
    matches_pattern,
    mixed_tp_sharding_runs,
)
from planner.hetero.candidates import Priced, Template, price
from planner.hetero.placement import Pool, pools_by_type
from planner.hetero.split import (
    layer_split_proportional,
    layer_split_uniform,
    proportional_split,
)
from planner.predict.results import SimResult
from planner.specs.choices import ModelStates, Recompute, Schedule
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import DEFAULT_COMM, Communication, Kernels, Plan, Sharding
from planner.specs.rules import sp_problem, tp_problem
from profiler.devices import DeviceSpec, device
from profiler.kernels import Attention
from profiler.store import Profiles

__all__ = ["Baseline", "MixedSpace", "baselines_for", "hetero_candidates", "merge_candidates",
           "mixed_templates", "templates"]

MICROBATCH_SIZES = (1, 2, 4)
FAMILIES = ("mixed-stages", "mixed-replicas")


@dataclass(frozen=True)
class MixedSpace:
    """The heterogeneous candidates searched: template families, the tp a type's stages
    may take, whether unlike types may differ in tp (in one pipeline: `per_stage_tp`;
    between replicas: also `unlike_replicas`), the schedules (1F1B is branched on, ZB-H1
    is a variant of the leaders), recompute modes, sharding patterns over (P, G, OS), and
    whether stage positions may shard differently (the leaders' AMSP-per-stage variant),
    and for an MoE model the expert-parallel degrees (ep groups of replicas: ep divides
    the replicas) with the framework's limits on them."""

    families: tuple[str, ...] = FAMILIES
    tp: tuple[int, ...] = (1, 2, 4, 8, 16)
    per_stage_tp: bool = True
    unlike_replicas: bool = True
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.ZB_H1)
    recompute: tuple[Recompute, ...] = tuple(Recompute)
    sharding: tuple[ShardPattern, ...] = (ANY_SHARDING,)
    sharding_with_pp: tuple[ShardPattern, ...] | None = None  # replaces it where pp > 1
    per_stage_sharding: bool = True
    why_none: str = ""  # when `families` is empty: what the framework lacks
    ep: tuple[int, ...] = (1,)  # expert-parallel degrees (MoE models)
    # with ep > 1: the schedules and recompute modes the framework runs (None: any), and
    # whether each sharding degree must be at most ep or a multiple of it
    ep_schedules: tuple[Schedule, ...] | None = None
    ep_recompute: tuple[Recompute, ...] | None = None
    ep_sharding_multiple: bool = False
    # the framework's limits where tp differs (FrameworkCapabilities): tp dividing the
    # key/value heads, one tp at both ends of a tied embedding, model states sharded at
    # a position of unlike tp, full recomputation past the first stage under ZB-H1
    kv_heads_split: bool = False
    tied_ends_any_tp: bool = True
    mixed_tp_sharding: bool = True
    zb_full_recompute: bool = True

    @classmethod
    def for_framework(cls, caps: FrameworkCapabilities,
                      model: ModelSpec | None = None) -> MixedSpace:
        """What of the space `caps` runs (for `model`, where given). Every template mixes
        GPU types, splits layers and micro-batches by speed (uneven stages, unequal
        counts) and places stages by island (not in a fixed rank order), and is branched
        on under 1F1B."""
        lacks = [what for what, ok in (
            ("mixed GPU types in one job", caps.mixed_gpu_types),
            ("uneven stages", caps.uneven_stages),
            ("unequal micro-batch counts", caps.unequal_microbatches),
            ("placement by island (it fixes the rank order)", caps.rank_order is None),
            ("the 1f1b schedule", Schedule.ONE_F_ONE_B in caps.schedules)) if not ok]
        if lacks:
            return cls(families=(), why_none=f"{caps.version} lacks {', '.join(lacks)}")
        # Template.sequence_parallel is on wherever tp > 1, and the experts split like
        # the rest (expert tp = tp): an MoE model splits tensors only where the framework
        # runs both on it
        split_tensors = ("tp" in caps.parallelisms and caps.tp_with_pp
                         and caps.sequence_parallel != "never"
                         and (model is None or not model.is_moe
                              or (caps.moe_sequence_parallel and caps.moe_expert_tp)))
        space = cls(
            families=FAMILIES if "pp" in caps.parallelisms else ("mixed-replicas",),
            tp=cls.tp if split_tensors else (1,), per_stage_tp=caps.per_stage_tp,
            unlike_replicas=caps.unlike_replicas,
            schedules=tuple(s for s in cls.schedules if s in caps.schedules),
            recompute=tuple(r for r in Recompute if r in caps.recompute),
            sharding=caps.sharding, sharding_with_pp=caps.sharding_with_pp,
            per_stage_sharding=caps.per_stage_sharding, kv_heads_split=caps.kv_heads_split,
            tied_ends_any_tp=caps.tied_ends_any_tp, mixed_tp_sharding=caps.mixed_tp_sharding,
            zb_full_recompute=caps.zb_full_recompute)
        if model is None or not model.is_moe or "ep" not in caps.parallelisms:
            return space
        # every power-of-two ep that divides the experts, within the framework's limits
        experts = model.num_experts
        return replace(
            space, ep=tuple(1 << i for i in range(experts.bit_length())
                            if not experts % (1 << i)),
            ep_schedules=None if caps.ep_schedules is None
            else tuple(s for s in Schedule if s in caps.ep_schedules),
            ep_recompute=None if caps.ep_recompute is None
            else tuple(r for r in Recompute if r in caps.ep_recompute),
            ep_sharding_multiple=caps.ep_sharding_multiple)

    def tp_allowed(self, family: str, tps: tuple[int, ...]) -> bool:
        """Whether unlike types may take tps `tps` (one per type) in a `family` template."""
        if len(set(tps)) == 1:
            return True
        return self.per_stage_tp and (family == "mixed-stages" or self.unlike_replicas)

    def ends_allowed(self, model: ModelSpec, t: Template) -> bool:
        """Whether a tied embedding's two ends (first and last stage) may differ in tp."""
        return (self.tied_ends_any_tp or not model.tied_embeddings
                or all(rep[0][1] == rep[-1][1] for rep in t.replicas))

    def shardings(self, dp: int, pp: int, ep: int = 1, *, mixed_tp: bool = False
                  ) -> tuple[list[Sharding], list[Sharding]]:
        """The shardings searched for `dp` replicas of `pp` stages (ep groups of `ep`;
        `mixed_tp`: replicas unlike in tp at a stage position) among replicated, ZeRO-1,
        2, 3 that the patterns allow: the cheap ones (replicated, ZeRO-1) and the rest."""
        patterns = self.sharding_with_pp if pp > 1 and self.sharding_with_pp else self.sharding
        whole = self.ep_sharding_multiple and ep > 1  # expert states in whole ep groups
        unsharded = mixed_tp and not self.mixed_tp_sharding

        def ok(sh: Sharding) -> bool:
            sizes = (sh.params, sh.grads, sh.optim)
            return (any(matches_pattern(sizes, p, dp) for p in patterns)
                    and not (whole and any(n > ep and n % ep for n in sizes))
                    and not (unsharded and not mixed_tp_sharding_runs(sh, dp)))

        options = sharding_options(dp)
        return [sh for sh in options[:2] if ok(sh)], [sh for sh in options[2:] if ok(sh)]

    def recompute_for(self, ep: int) -> tuple[Recompute, ...]:
        """The recompute modes searched with expert-parallel degree `ep`."""
        if ep == 1 or self.ep_recompute is None:
            return self.recompute
        return tuple(r for r in self.recompute if r in self.ep_recompute)

    def schedule_allowed(self, schedule: Schedule, ep: int) -> bool:
        return schedule in self.schedules and (ep == 1 or self.ep_schedules is None
                                               or schedule in self.ep_schedules)


@dataclass(frozen=True)
class Baseline:
    name: str
    plan: Plan | None
    result: SimResult | None
    note: str = ""


def _speed(d: DeviceSpec) -> float:
    return d.peak_tflops.get("bf16", d.peak_tflops.get("fp16", 0.0))


def _type_order(d: DeviceSpec) -> tuple:
    """Where a GPU type's stages go in a pipeline: memory-rich types first (the first stage
    holds the most activations), then the faster (16-bit peak, then memory and in-node
    link bandwidth); the name last, so that the cluster file's order of its node groups
    never changes the plans searched (A100-80GB SXM and PCIe tie on memory and peak)."""
    return (-d.memory_gib, -_speed(d), -d.memory_bandwidth_gb_per_s,
            -d.intra_node_bandwidth_gb_per_s, d.name)


# Every subset of GPU types at every tp per type is sum_k C(T, k) |tp|^k templates (5^T
# with four tp options: 12 s of search at 3 types, 63 s at 5, hours at 8). Up to FULL_TYPES
# types the search takes them all; with more, the subsets a plan most plausibly uses: the
# k fastest types for k = 2..T (a plan leaves the slowest out first), each at one tp for
# all its types (every tp the space allows, capped at what each type allows).
FULL_TYPES = 4


def _tp_options(model: ModelSpec, nvlink_domain_gpus: int, space: MixedSpace,
                seq_len: int) -> list[int]:
    """Tensor-parallel degrees inside one NVLink domain (a node; a GB200 NVL72 rack) that
    split the sequence evenly: a template's tp > 1 runs sequence parallelism."""
    return [t for t in space.tp if t <= nvlink_domain_gpus and tp_problem(model, t) is None
            and not (space.kv_heads_split and model.kv_heads % t)
            and sp_problem(seq_len, t) is None]


def templates(model: ModelSpec, pools: dict[str, list[Pool]], gbs: int,
              space: MixedSpace = MixedSpace(), *,
              spec: Callable[[str], DeviceSpec] = device,
              seq_len: int | None = None) -> Iterator[Template]:
    """Heterogeneous templates of `space` over combinations of two or more GPU types
    (every combination up to FULL_TYPES types; the fastest-k subsets beyond); `spec`: a
    type's numbers (the cluster's own, for types it defines); `seq_len`: the training
    sequence (default: the model's)."""
    types = sorted(pools, key=lambda g: _type_order(spec(g)))
    layers = model.num_layers
    total = {g: sum(len(p.gpus) for p in pools[g]) for g in types}
    tps = {g: _tp_options(model, min(p.nvlink_domain_gpus for p in pools[g]), space,
                          model.seq_len if seq_len is None else seq_len)
           for g in types}
    families = {"mixed-stages": _mixed_stages, "mixed-replicas": _mixed_replicas}
    for subset, tp in _type_choices(types, tps, spec):
        units = {g: total[g] // t for g, t in zip(subset, tp, strict=True)}
        for family in space.families:
            if space.tp_allowed(family, tp):
                for t in families[family](subset, tp, units, layers, gbs):
                    if space.ends_allowed(model, t):
                        yield from _with_ep(t, space.ep, gbs)


def _type_choices(types: list[str], tps: dict[str, list[int]],
                  spec: Callable[[str], DeviceSpec]
                  ) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
    """(GPU types, a tp for each) of the templates, types in `types`' order."""
    if len(types) <= FULL_TYPES:
        for size in range(2, len(types) + 1):
            for subset in itertools.combinations(types, size):
                yield from ((subset, tp) for tp in itertools.product(*(tps[g] for g in subset)))
        return
    fastest = sorted(types, key=lambda g: -_speed(spec(g)))
    for k in range(2, len(types) + 1):
        subset = tuple(g for g in types if g in fastest[:k])
        if any(not tps[g] for g in subset):
            continue
        common = sorted({t for g in subset for t in tps[g]})
        yield from ((subset, tp) for tp in dict.fromkeys(
            tuple(max((x for x in tps[g] if x <= t), default=min(tps[g])) for g in subset)
            for t in common))


def _with_ep(t: Template, degrees: tuple[int, ...], gbs: int) -> Iterator[Template]:
    """`t` at each expert-parallel degree that groups its replicas whole (ep divides the
    replicas: ep groups of data-parallel ranks) and lets every replica run the same
    micro-batches (ep peers trade tokens in every pass)."""
    for ep in degrees:
        if ep == 1:
            yield t
        elif t.dp % ep == 0 and gbs % t.dp == 0:
            yield replace(t, ep=ep)


def _mixed_stages(subset: tuple[str, ...], tp: tuple[int, ...], units: dict[str, int],
                  layers: int, gbs: int) -> Iterator[Template]:
    """R identical pipelines, each with floor(units_T / R) stages of type T (memory-rich
    types first: the first stage holds the most activations); at most 1/8 of the GPUs
    left idle."""
    gpus = sum(units[g] * t for g, t in zip(subset, tp, strict=True))
    for r in range(1, min(units.values()) + 1):
        if gbs % r:
            continue
        counts = [units[g] // r for g in subset]
        used = r * sum(c * t for c, t in zip(counts, tp, strict=True))
        if sum(counts) > layers or used < gpus * 7 / 8:
            continue
        slots = tuple((g, t) for g, t, c in zip(subset, tp, counts, strict=True)
                      for _ in range(c))
        yield Template("mixed-stages", (slots,) * r)


def _mixed_replicas(subset: tuple[str, ...], tp: tuple[int, ...], units: dict[str, int],
                    layers: int, gbs: int) -> Iterator[Template]:
    """Replicas of each type, all with pp stages (so layer boundaries align)."""
    for pp in (1, 2, 4, 8, 16, 32):
        if pp > layers or any(units[g] < pp for g in subset):
            continue
        reps = []
        for g, t in zip(subset, tp, strict=True):
            reps.extend([tuple([(g, t)] * pp)] * (units[g] // pp))
        yield Template("mixed-replicas", tuple(reps))


def sharding_options(dp: int) -> list[Sharding]:
    """The model-state shardings searched for `dp` replicas: replicated, ZeRO-1, 2, 3."""
    if dp == 1:
        return [Sharding()]
    return [Sharding(), Sharding(optim=dp), Sharding(grads=dp, optim=dp),
            Sharding(params=dp, grads=dp, optim=dp)]


def mixed_templates(model: ModelSpec, cluster: ClusterSpec, gbs: int,
                    space: MixedSpace = MixedSpace(), *,
                    seq_len: int | None = None) -> list[Template]:
    """The mixed-type templates of `cluster`, less those whose GPUs come from more than
    one vendor: NCCL (CUDA), RCCL (ROCm) and gloo (CPU ranks) build no communicator
    across one another, so no framework runs a data-parallel group, a pipeline or a
    sharded state over both (each vendor's GPUs are planned apart)."""
    return [t for t in templates(model, pools_by_type(cluster), gbs, space,
                                 spec=cluster.device_of, seq_len=seq_len)
            if len({cluster.device_of(gpu).vendor for rep in t.replicas
                    for gpu, _ in rep}) == 1]


def lower_bound_s(model: ModelSpec, cluster: ClusterSpec, t: Template, *, gbs: int, seq_len: int,
                  dtype: str, kernels: Kernels, profiles: Profiles | None = None,
                  attention: Attention | None = None) -> float:
    """A lower bound on any candidate of template `t` (any micro-batch size, recompute,
    sharding, split). With t_k stage k's time per layer (nothing recomputed, only in-line
    collectives) and layers balanced perfectly (fractionally), replica r's slowest stage
    takes at least b_r = L / sum_k 1/t_k per micro-batch, and its stages together at least
    c_r = L * min_k t_k; a 1F1B pipeline of m_r micro-batches then takes at least
    (m_r - 1) b_r + c_r. Over the M micro-batches of the batch, the replicas finish no
    earlier than the T with sum_r ((T - c_r) / b_r + 1) = M (the continuous relaxation of
    the batch split). The closed form adds only non-negative terms (embedding, head,
    transfers, recompute, synchronisation, imbalance)."""
    layers = model.num_layers
    best = math.inf
    for mbs in MICROBATCH_SIZES:
        if gbs % mbs:
            continue
        inv_b = extra = 0.0  # sum_r 1/b_r and sum_r c_r/b_r
        per_replica: dict[tuple, tuple[float, float]] = {}  # replicas of one shape alike
        for rep in t.replicas:
            if rep not in per_replica:
                times = [_layer_time_s(model, cluster, slot, mbs=mbs, seq_len=seq_len,
                                       dtype=dtype, kernels=kernels, profiles=profiles,
                                       attention=attention, ep=t.ep)
                         for slot in rep]
                b = layers / sum(1.0 / x for x in times)
                per_replica[rep] = (b, min(times))
            b, fastest = per_replica[rep]
            inv_b += 1.0 / b
            extra += layers * fastest / b
        best = min(best, (gbs // mbs - t.dp + extra) / inv_b)
    return best


@functools.cache
def _layer_time_s(model: ModelSpec, cluster: ClusterSpec, slot: tuple[str, int], *, mbs: int,
                  seq_len: int, dtype: str, kernels: Kernels, profiles: Profiles | None,
                  attention: Attention | None, ep: int = 1) -> float:
    """One layer's forward and backward on `slot` (tp ranks inside one NVLink domain of its type,
    nothing recomputed), as the cost builder prices a middle stage's layer; with ep > 1
    its E/ep local experts' GEMMs and no all-to-all (a stage alone: no peers to trade
    with, nor to wait for), which the placed stage only adds to."""
    gpu, tp = slot
    first = next(s.index for s in cluster.slots if cluster.node_groups[s.group].gpu == gpu)
    dev = cluster.group_of(first).device
    placed = PlacedStage(devices=tuple(range(first, first + tp)), tp=tp, cp=1, num_layers=1,
                         recompute=Recompute.NONE,
                         attention=attention_for(dev, dtype, attention,
                                                 dropout=model.drops_attention), ep=ep)
    spec = StageSpec(device=dev,
                     placed=placed, index=1, pp=3, next_device=None, dp_group=(first,),
                     concurrency=tp, sharding=Sharding())
    run = RunSettings(micro_batch_size=mbs, num_microbatches=1, seq_len=seq_len, dtype=dtype,
                      sequence_parallel=True, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1,
                      kernels=kernels)
    c = unsharded_cost(model, cluster, spec, run, profiles=profiles)
    return c.layer_forward.total_s + c.layer_backward.total_s


def hetero_candidates(model: ModelSpec, cluster: ClusterSpec, chosen: Sequence[Template], *,
                      gbs: int, seq_len: int, dtype: str, kernels: Kernels,
                      score: Callable[[Priced], float], keep: int,
                      bound_score: Callable[[Template, float], float],
                      profiles: Profiles | None = None,
                      attention: Attention | None = None, space: MixedSpace = MixedSpace(),
                      progress: Callable[[], None] | None = None,
                      model_states: ModelStates = ModelStates.FP32_GRADS,
                      comm: Communication = DEFAULT_COMM
                      ) -> tuple[list[Priced], int, dict[str, float]]:
    """Of the `chosen` templates' candidates: the `keep` best that fit by `score`, how many
    were priced, and for each GPU type the best score of a plan using it (or a lower bound
    on it, where branch and bound showed none could make the top `keep`).

    Branch and bound: templates are priced in order of `bound_score` (the score of their
    lower bound, `lower_bound_s`); once a template's bound is worse than the `keep`-th best
    score found, so are all the rest, and they are skipped. `progress()` is called once
    per template. Model states are priced as `model_states` keeps them (the framework's
    rule, `Training.model_states`), communication as `comm` issues it (`Training.comm`)."""
    pools = pools_by_type(cluster)
    score = _remembered(score)
    bounded = sorted(((bound_score(t, lower_bound_s(model, cluster, t, gbs=gbs, seq_len=seq_len,
                                                    dtype=dtype, kernels=kernels,
                                                    profiles=profiles, attention=attention)), i, t)
                      for i, t in enumerate(chosen)), key=lambda x: (x[0], x[1]))
    best: list[Priced] = []
    with_type: dict[str, float] = {}
    count = 0
    memo: dict = {}  # placements and stage costs shared by candidates
    for bound, _, t in bounded:
        if progress is not None:
            progress()
        types = {g for g, _ in t.replicas[0]} | {rep[0][0] for rep in t.replicas}
        if len(best) >= keep and bound > score(best[keep - 1]):
            for g in types:  # pruned: no plan with them beats this bound
                with_type[g] = min(with_type.get(g, math.inf), bound)
            continue
        for mbs in MICROBATCH_SIZES:
            for p in _cheapest_fitting(t, mbs, space, functools.partial(
                    _price_one, model, cluster, t, pools=pools, seq_len=seq_len, dtype=dtype,
                    gbs=gbs, kernels=kernels, profiles=profiles, memo=memo,
                    attention=attention, model_states=model_states, comm=comm),
                    every_sharding=not comm.overlap_grad_reduce):
                count += 1
                if p is None or not p.fits:
                    continue
                best.append(p)
                for g in types:
                    with_type[g] = min(with_type.get(g, math.inf), score(p))
        best = sorted(best, key=score)[:keep]
    # Variants of the leaders, with the same layer split (the bound above holds for 1F1B
    # with one sharding, so these are not branched on): ZB-H1, and AMSP per stage, each
    # position at the sharding its memory allows that shortens the iteration most.
    for p in [p for p in best if p.template.pp > 1]:
        for schedule, relax in _variants(space, p.template, p.recompute):
            q = price(model, cluster, p.template, pools=pools, mbs=p.mbs,
                      recompute=p.recompute, sharding=p.sharding, seq_len=seq_len,
                      dtype=dtype, gbs=gbs, kernels=kernels, attention=p.attention,
                      layers=p.layers,
                      schedule=schedule, relax=relax, profiles=profiles, memo=memo,
                      model_states=model_states, comm=comm)
            count += 1
            if q is not None and q.fits:
                best.append(q)
                for g in {g for rep in q.template.replicas for g, _ in rep}:
                    with_type[g] = min(with_type.get(g, math.inf), score(q))
    best = sorted(dict.fromkeys(best), key=score)[:keep]  # two leaders may relax alike
    return best, count, with_type


def _remembered(score: Callable[[Priced], float]) -> Callable[[Priced], float]:
    """`score`, computed once per candidate (the leaders are sorted after every template)."""
    seen: dict[int, tuple[Priced, float]] = {}  # id -> (the candidate, kept alive; score)

    def remembered(p: Priced) -> float:
        hit = seen.get(id(p))
        if hit is None or hit[0] is not p:
            hit = seen[id(p)] = (p, score(p))
        return hit[1]
    return remembered


def merge_candidates(parts: Sequence[tuple[list[Priced], int, dict[str, float]]],
                     score: Callable[[Priced], float], keep: int
                     ) -> tuple[list[Priced], int, dict[str, float]]:
    """Combine `hetero_candidates` over chunks of templates."""
    best = sorted((p for part in parts for p in part[0]), key=score)[:keep]
    with_type: dict[str, float] = {}
    for _, _, found in parts:
        for g, value in found.items():
            with_type[g] = min(with_type.get(g, math.inf), value)
    return best, sum(part[1] for part in parts), with_type


def _price_one(model: ModelSpec, cluster: ClusterSpec, t: Template, mbs: int, rc: Recompute,
               sh: Sharding, **kw: object) -> Priced | None:
    return price(model, cluster, t, mbs=mbs, recompute=rc, sharding=sh, **kw)  # type: ignore[arg-type]  # keyword arguments collected in kw


def _variants(space: MixedSpace, t: Template, recompute: Recompute
              ) -> list[tuple[Schedule, list[Sharding]]]:
    """(schedule, sharding options per stage position) of a leader's variants (recomputing
    `recompute`): ZB-H1 alone, then AMSP per stage position under 1F1B and ZB-H1, as far as
    `space` allows."""
    cheap, rest = space.shardings(t.dp, t.pp, t.ep, mixed_tp=_mixes_tp(t))
    options = cheap + rest if t.dp > 1 and space.per_stage_sharding else []
    zb, one = Schedule.ZB_H1, Schedule.ONE_F_ONE_B
    wanted: list[tuple[Schedule, list[Sharding]]] = [(zb, [])]
    wanted += [(one, options), (zb, options)] * (len(options) > 0)
    zb_ok = space.zb_full_recompute or recompute != Recompute.FULL
    return [(schedule, relax) for schedule, relax in wanted
            if space.schedule_allowed(schedule, t.ep) and (schedule != zb or zb_ok)]


def _mixes_tp(t: Template) -> bool:
    """Whether the replicas of `t` differ in tp at some stage position."""
    return any(len({rep[k][1] for rep in t.replicas}) > 1 for k in range(t.pp))


def _cheapest_fitting(t: Template, mbs: int, space: MixedSpace, price_fn: Callable, *,
                      every_sharding: bool = False) -> Iterator[Priced | None]:
    """Candidates of one template and micro-batch size, in order of what they cost: no
    recompute before selective before full, replicated states before ZeRO-1 before
    ZeRO-2/3 (of those `space` holds). Once one fits, the costlier ones can only be slower
    (they add recomputation or communication to save memory that is not needed), so they
    are skipped; but with `every_sharding` (gradients reduced after the last backward,
    `Communication.overlap_grad_reduce` false) ZeRO-2/3 are priced too: their
    reduce-scatters run during the backward, so they can be faster than ZeRO-1's
    reduction after it (llama2-7b, 32 A100 dp 32: ZeRO-3 1.76 s, ZeRO-1 1.87 s)."""
    for rc in space.recompute_for(t.ep):  # cheapest first
        fitted = False
        for shardings in space.shardings(t.dp, t.pp, t.ep, mixed_tp=_mixes_tp(t)):
            for sh in shardings:
                p = price_fn(mbs, rc, sh)
                fitted = fitted or (p is not None and p.fits)
                yield p
            if fitted and not every_sharding:
                break
        if fitted:
            return


def baselines_for(best: Priced, model: ModelSpec, cluster: ClusterSpec, *, gbs: int,
                  seq_len: int, dtype: str, kernels: Kernels,
                  profiles: Profiles | None = None,
                  model_states: ModelStates = ModelStates.FP32_GRADS,
                  comm: Communication = DEFAULT_COMM
                  ) -> list[tuple[str, Priced | None]]:
    """The best template split the naive ways (uniform, proportional to throughput)."""
    pools = pools_by_type(cluster)
    t = best.template
    kw = dict(pools=pools, mbs=best.mbs, recompute=best.recompute, sharding=best.sharding,
              seq_len=seq_len, dtype=dtype, gbs=gbs, kernels=kernels, profiles=profiles,
              attention=best.attention, model_states=model_states, comm=comm)

    def priced(**split: object) -> Priced | None:
        """The split under the best plan's schedule or 1F1B, the faster of those that fit
        (ZB-H1 holds more activations than 1F1B)."""
        tried = [price(model, cluster, t, schedule=s, **kw, **split)  # type: ignore[arg-type]  # keyword arguments collected in kw and split
                 for s in dict.fromkeys((best.schedule, Schedule.ONE_F_ONE_B))]
        fitting = [p for p in tried if p is not None and p.fits]
        return min(fitting, key=lambda p: p.iteration_s) if fitting else tried[0]

    if t.family == "mixed-stages":
        speeds = [1.0 / _speed(cluster.device_of(g)) / tp
                  for g, tp in t.replicas[0]]  # time per layer ~
        uniform = priced(layers=layer_split_uniform(model.num_layers, t.pp))
        proportional = priced(layers=layer_split_proportional(model.num_layers, speeds))
        return [("uniform layer split", uniform), ("throughput-proportional layer split",
                                                   proportional)]
    total = gbs // best.mbs
    even = [total // t.dp + (1 if r < total % t.dp else 0) for r in range(t.dp)]
    rates = [_speed(cluster.device_of(rep[0][0])) * rep[0][1] for rep in t.replicas]
    share = proportional_split(total, rates) if total >= t.dp else None
    uniform = priced(layers=best.layers, microbatches=even)
    proportional = priced(layers=best.layers, microbatches=share) if share else None
    return [("uniform batch split", uniform), ("throughput-proportional batch split",
                                               proportional)]

