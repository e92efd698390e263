"""`plan search`: the best homogeneous plans for a model, a cluster and a batch.

1. Enumerate layouts and candidates (planner/search/space.py) for each GPU count the
   objective allows, within what the request's framework runs (`for_framework`, from its
   FrameworkCapabilities; mixed-type templates likewise, `MixedSpace.for_framework`).
2. Price every candidate with the closed-form estimate and its best AMSP sharding among
   the undominated options (planner/search/evaluate.py); drop those that do not fit.
3. Rank by the objective; for the leaders, re-solve the sharding choice over all options
   as an integer program (pulp) and confirm with the event simulator, which decides the
   final order.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from planner.costs.egress import egress_usd_per_iteration
from planner.costs.kernels import default_kernels, fastest_kernels, supported_attention
from planner.costs.stages import on_clear_cost_caches
from planner.describe import layout_cell, recompute_words, shape_key, sharding_cell
from planner.errors import InfeasiblePlan
from planner.export.frameworks import CAPABILITIES, FRAMEWORKS, FrameworkCapabilities
from planner.gc_pause import gc_paused
from planner.hetero.candidates import Priced, Template, price
from planner.hetero.placement import pools_by_type
from planner.hetero.search import (
    FULL_TYPES,
    Baseline,
    MixedSpace,
    baselines_for,
    hetero_candidates,
    merge_candidates,
    mixed_templates,
)
from planner.predict.results import SimResult
from planner.search.evaluate import Evaluation, LayoutModel
from planner.search.parallel import cores, parallel_map, tick
from planner.search.sharding import solve_ilp
from planner.search.space import (
    Layout,
    Micro,
    SearchSpace,
    candidates,
    default_space,
    for_framework,
    layouts,
    missing_for,
)
from planner.simulator import simulate
from planner.specs.choices import DType, ModelStates
from planner.specs.cluster import (
    ClusterSpec,
    NodeGroup,
    check_train_dtype,
    runs_dtype,
    train_dtype,
)
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import ModelSpec
from planner.specs.plan import Communication, Kernels, Plan, Sharding
from planner.specs.rules import seq_problem
from profiler.devices import DeviceSpec
from profiler.kernels import Attention
from profiler.progress import ProgressBar
from profiler.schema import SpecError, fail
from profiler.store import Profiles

__all__ = ["DEFAULT_HEADROOM_BYTES", "OBJECTIVES", "Ranked", "SearchRequest", "SearchResult",
           "check_framework", "check_headroom", "prepare", "priced_plan", "search", "search_dtype"]

GIB = 1024**3
# beyond the memory model's own runtime reserve (planner/costs/memory.py): PyTorch's
# caching allocator fragments memory as a run goes on, and the peak varies by a few GiB
DEFAULT_HEADROOM_BYTES = 2 * GIB
OBJECTIVES = ("throughput", "cost", "time-to-train")
SOLVER_SOURCE = ("sharding chosen by integer program (pulp/CBC) over every AMSP option the "
                 "framework runs")
MIXED_SOURCE = ("mixed GPU types: layers split by exact min-bottleneck search, micro-batches "
                "split so replicas finish together, stages placed by island (planner/hetero)")


@dataclass(frozen=True)
class SearchRequest:
    model: ModelSpec
    cluster: ClusterSpec
    gbs: int
    seq_len: int
    dtype: DType = DType.BF16
    objective: str = "throughput"  # throughput | cost | time-to-train
    tokens: float | None = None
    max_budget_usd: float | None = None
    top: int = 5
    attention: str | None = None
    confirm: int = 8  # leaders confirmed by the event simulator
    space: SearchSpace | None = None
    profiles: Profiles | None = None  # measured op/collective times (plan profile)
    # what runs the plan (planner/export/frameworks.py): the search keeps to what it can
    # run; "trainplan" is this project's executor
    framework: str = "trainplan"
    # GPU memory a plan should leave free at its peak (allocator fragmentation, other
    # processes); plans with less are flagged (`plan search --memory-headroom`)
    memory_headroom_bytes: float = DEFAULT_HEADROOM_BYTES

    @property
    def capabilities(self) -> FrameworkCapabilities:
        return CAPABILITIES[self.framework]

    @property
    def model_states(self) -> ModelStates:
        """What the framework keeps of the model states: every candidate is priced, and
        every plan written (`Training.model_states`), with it."""
        return self.capabilities.model_states

    @property
    def comm(self) -> Communication:
        """How the framework communicates (its `Communication.preset` in the request's
        dtype): every candidate is priced, and every plan written (`Training.comm`), so."""
        return self.capabilities.communication(self.dtype)


@dataclass(frozen=True)
class Ranked:
    plan: Plan
    result: SimResult
    estimate_s: float
    usd_per_hour: float | None  # the GPUs the plan uses, at the cluster's prices
    egress_usd_per_iteration: float = 0.0  # traffic over priced island links

    @property
    def usd_per_million_tokens(self) -> float | None:
        """GPU time and egress per million tokens (a rate: any whole batch's share)."""
        return self._cost_usd(1e6 / self._tokens_per_iteration)

    @property
    def egress_usd_per_million_tokens(self) -> float:
        """Egress per million tokens (a rate, as `usd_per_million_tokens`)."""
        return self.egress_usd_per_iteration * 1e6 / self._tokens_per_iteration

    @property
    def _tokens_per_iteration(self) -> int:
        return self.plan.training.global_batch_size * self.plan.training.seq_len

    def iterations(self, tokens: float) -> int:
        """Whole iterations to train on `tokens`: a run ends on a whole batch (1 token
        took 7e-7 s where one iteration takes 0.36 s, what-if sweep 2026-12-04)."""
        return max(1, math.ceil(tokens / self._tokens_per_iteration))

    def time_to_train_s(self, tokens: float | None) -> float | None:
        return (None if tokens is None
                else self.iterations(tokens) * self.result.iteration_time_s)

    def gpu_cost_usd(self, tokens: float | None) -> float | None:
        return None if tokens is None else self._gpu_usd(self.iterations(tokens))

    def egress_usd(self, tokens: float | None) -> float | None:
        return None if tokens is None else self.egress_usd_per_iteration * self.iterations(tokens)

    def run_cost_usd(self, tokens: float | None) -> float | None:
        """GPU-hours at the cluster's prices plus egress, for `tokens`."""
        return None if tokens is None else self._cost_usd(self.iterations(tokens))

    def _gpu_usd(self, iterations: float) -> float | None:
        if self.usd_per_hour is None:
            return None
        return iterations * self.result.iteration_time_s * self.usd_per_hour / 3600

    def _cost_usd(self, iterations: float) -> float | None:
        gpu = self._gpu_usd(iterations)
        return None if gpu is None else gpu + self.egress_usd_per_iteration * iterations


@dataclass(frozen=True)
class SearchResult:
    ranked: list[Ranked]
    num_candidates: int
    num_fitting: int
    num_layouts: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    baselines: list[Baseline] = field(default_factory=list)  # mixed clusters only


def _planned(req: SearchRequest) -> tuple[list[ClusterSpec], list[str]]:
    """The GPU types' clusters the search plans (`_subclusters`), and the types it leaves
    out: a framework that plans each type alone (no mixed plans) leaves out the types
    that do not train in the request's dtype, where another type does (a V100 beside
    H100s under torchtitan's bf16); a framework that mixes them plans all or refuses."""
    every = _subclusters(req.cluster, objective=req.objective)
    if len(every) == 1 or MixedSpace.for_framework(req.capabilities, req.model).families:
        return every, []
    kept = [c for c in every if runs_dtype(c.node_groups[0].device, req.dtype)]
    if not kept:
        return every, []  # `_check` names the first type that lacks it
    return kept, [c.node_groups[0].gpu for c in every if c not in kept]


def _subclusters(cluster: ClusterSpec, *, objective: str = "throughput"
                 ) -> list[ClusterSpec]:
    """One homogeneous cluster per GPU type (this search plans one type at a time). Its
    plans of fewer GPUs than the type has take the first groups (`ClusterSpec.take`), so
    where fewer are tried (cost, time to train) the type's groups go cheapest first for
    cost and best-connected first for time, not in the file's order: 32 H100 at $1 beside
    32 at $3 listed first were priced at $3, and two slow-NIC A100 nodes listed first ran
    a time-to-train plan 1.95x slower than the same file in the other order."""
    def price(g: NodeGroup) -> float:
        return math.inf if g.price_per_gpu_hour_usd is None else g.price_per_gpu_hour_usd

    def order(g: NodeGroup) -> tuple[float, float]:
        nic = -g.node_nic_bandwidth_bytes_per_s
        return (price(g), nic) if objective == "cost" else (nic, price(g))

    out = []
    for gpu in dict.fromkeys(g.gpu for g in cluster.node_groups):
        groups = tuple(g for g in cluster.node_groups if g.gpu == gpu)
        if objective != "throughput":
            groups = tuple(sorted(groups, key=order))
        islands = {g.island for g in groups}
        links = tuple(k for k in cluster.island_links if set(k.islands) <= islands)
        one_type = all(g.gpu == gpu for g in cluster.node_groups)
        out.append(cluster if groups == cluster.node_groups else
                   replace(cluster, name=cluster.name if one_type else f"{cluster.name} [{gpu}]",
                           node_groups=groups, island_links=links))
    return out


def _gpu_counts(n: int, per_node: int, objective: str, groups: tuple[int, ...] = (),
                gbs: int = 0) -> tuple[int, ...]:
    """All `n` GPUs for throughput; for cost or time to train also fewer, since fewer may
    be cheaper, fit a budget or split the batch better (40 GPUs take a gbs of 64 only with
    pipelines, 32 with dp 32): the GPUs of the first node groups (`groups`: each group's
    GPUs, in the cluster's order; a cluster grown by a group can still run on what it had
    before: 72 GPUs of a rack and 4 more were planned on 76, 64 or 32), whole nodes in
    powers of two below `n`, the whole nodes between them whose GPUs take more data
    parallelism of `gbs` than any fewer nodes (dp divides both the GPUs and gbs: 3 nodes
    of 8 run gbs 24 as dp 24, 4 nodes at most as dp 8, and ran gpt3-1.3b 8% faster on 25%
    fewer GPUs), then halves of a node while they divide evenly."""
    if objective == "throughput":
        return (n,)
    counts = [n, *(c for c in itertools.accumulate(groups) if c < n)]
    nodes = n // per_node
    if nodes >= 1:
        p = 1 << (nodes.bit_length() - 1)  # the largest power of two <= nodes
        powers = [p >> i for i in range(p.bit_length())]
        counts += [k * per_node for k in powers if k * per_node < n]
        most = 0  # the most data parallelism of gbs on fewer nodes
        for k in range(1, nodes if gbs > 0 else 0):
            dp = math.gcd(gbs, k * per_node)
            if k & (k - 1) and dp > most:
                counts.append(k * per_node)
            most = max(most, dp)
    k = min(n, per_node)
    while k % 2 == 0 and k // 2 >= 1:
        k //= 2
        counts.append(k)
    return tuple(dict.fromkeys(counts))


def usd_per_hour(cluster: ClusterSpec, devices: list[int]) -> float | None:
    """What the GPUs `devices` cost per hour (None if any has no price)."""
    total = 0.0
    for d in devices:
        price = cluster.group_of(d).price_per_gpu_hour_usd
        if price is None:
            return None
        total += price
    return total


def _score(req: SearchRequest, iteration_s: float, usd_hour: float | None,
           egress_usd: float = 0.0) -> float:
    """Lower is better: seconds per token (throughput, time to train) or $ per token
    (GPU time, plus `egress_usd` per iteration once a leader's plan is known)."""
    tokens = req.gbs * req.seq_len
    if req.objective == "cost":
        assert usd_hour is not None
        return (iteration_s * usd_hour / 3600 + egress_usd) / tokens
    return iteration_s / tokens


# How far the closed-form estimate a candidate is ranked by may sit from the simulated
# time that confirms it (tests/planner/simulator/test_simulator.py holds them within 3%):
# a candidate that breaks the budget by less, by its estimate, is still simulated, and the
# simulation decides (a plan that cost $12,446 simulated was dropped at a budget of
# $12,460 for its estimate's $12,476, sweep of 2026-12-03).
ESTIMATE_SLACK = 0.03

# The leaders confirmed by simulation are the first `SearchRequest.confirm` by estimate and
# every further one within this much of the best estimate (at most CONFIRM_MOST times as
# many): where transfers are slow the estimate sits up to 16% from the simulation, most
# often within 5% either way (benchmarks/estimate_vs_simulation.py), so a plan priced 5%
# high can be slower, by its estimate, than one priced 5% low that it beats. Against a
# search that simulates every candidate, on 40 random clusters of 16-32 GPUs joined by
# InfiniBand or 10-100 Gb/s Ethernet: 7 searches found a slower plan (by up to 8.3%) with
# the first 8 alone, 2 (by up to 3.4%) with the window, in 15.6 s instead of 12.5 s; on
# 40 others (held out) 9 -> 2 (2026-12-06). GPT-3 175B on 1,024 A100: 1.0 -> 1.8 s.
# With the estimate's cycles over slow links (`estimate._cycle_paths`, later that day):
# 3 and 3 of those 80 searches miss the best plan (by up to 2.2%) without the window,
# none with it.
CONFIRM_WINDOW = 0.10
CONFIRM_MOST = 4


def _within_budget(req: SearchRequest, iteration_s: float, usd_hour: float | None,
                   egress_usd: float = 0.0, *, slack: float = 0.0) -> bool:
    if req.max_budget_usd is None:
        return True
    assert req.tokens is not None and usd_hour is not None
    iterations = req.tokens / (req.gbs * req.seq_len)
    return (iterations * (iteration_s * usd_hour / 3600 + egress_usd)
            <= req.max_budget_usd * (1 + slack))


def check_headroom(headroom_bytes: float, cluster: ClusterSpec,
                   where: str = "--memory-headroom") -> None:
    """Refuse a headroom no GPU of `cluster` has: every plan would be flagged."""
    largest = max(g.device.memory_bytes for g in cluster.node_groups)
    if headroom_bytes >= largest:
        fail(where, headroom_bytes / GIB, f"less than the cluster's largest GPU "
             f"memory, {largest / GIB:g} GiB: the GiB a plan should leave free at its peak, "
             f"{DEFAULT_HEADROOM_BYTES / GIB:g} by default")


def search_dtype(framework: str, model: ModelSpec, devices: Iterable[DeviceSpec],
                 asked: str | None, *, where: str = "--dtype") -> DType:
    """The dtype a search of `devices` runs in for `framework` (`train_dtype`): where the
    framework plans each GPU type alone, one that some type trains in (the others are left
    out, `_planned`); the default among the framework's own dtypes."""
    caps = CAPABILITIES.get(framework)
    if caps is None:
        fail("--framework", framework, "allowed: " + ", ".join(FRAMEWORKS))
    each_alone = not MixedSpace.for_framework(caps, model).families
    devices = list(devices)
    allowed = caps.dtypes_for(model)
    dtype = train_dtype(devices, asked, where=where, each_alone=each_alone, allowed=allowed)
    if asked is None and dtype not in allowed:  # no dtype of the framework's on these GPUs
        others = []
        for c in CAPABILITIES.values():
            theirs = train_dtype(devices, None, where=where, each_alone=each_alone,
                                 allowed=c.dtypes_for(model))
            if theirs in c.dtypes_for(model):
                others.append(f"--framework {c.name} plans it in {theirs}")
        what = "an MoE model " if model.is_moe and caps.moe_dtypes is not None else ""
        fail("--framework", framework, f"{caps.version} trains {what}in "
             f"{', '.join(sorted(allowed))}, which "
             f"{', '.join(sorted({d.name for d in devices}))} lack"
             + (f"; {', '.join(others)}" if others else ""))
    return dtype


def check_framework(framework: str, model: ModelSpec, dtype: str) -> FrameworkCapabilities:
    """The framework's capabilities, after refusing in one line what it cannot run on any
    cluster: the training dtype, a model with multi-head latent attention or an activation
    it lacks (each refusal names the frameworks that can)."""
    if framework not in CAPABILITIES:
        fail("--framework", framework, "allowed: " + ", ".join(FRAMEWORKS))
    caps = CAPABILITIES[framework]
    allowed = caps.dtypes_for(model)
    if dtype not in allowed:
        others = [c.name for c in CAPABILITIES.values() if dtype in c.dtypes_for(model)]
        what = " an MoE model" if dtype in caps.dtypes else ""
        fail("--dtype", dtype, f"{caps.version} trains{what} in {', '.join(sorted(allowed))}"
             + (f"; --framework {' or '.join(others)} plans {dtype}" if others else ""))
    if model.is_mla and not caps.latent_attention:
        fail("--model", model.name, f"it uses multi-head latent attention, which "
             f"{caps.version} does not run; --framework "
             f"{_who(lambda c: c.latent_attention)} plans it")
    for what, ok, has in (
            (f"its MoE capacity factor {model.capacity_factor}", "moe_capacity_factor",
             model.capacity_factor is not None),
            ("its experts' inputs padded to capacity (pad_to_capacity)", "moe_pad_to_capacity",
             model.pad_to_capacity)):
        if has and not getattr(caps, ok):
            fail("--model", model.name, f"{what} is not in {caps.version}'s MoE; "
                 f"--framework {_who(attrgetter(ok))} plans it")
    if model.position_embedding not in caps.positions:
        fail("--model", model.name, f"its {model.position_embedding} positions are not among "
             f"{caps.version}'s ({', '.join(sorted(caps.positions))}); --framework "
             f"{_who(lambda c: model.position_embedding in c.positions)} plans it")
    if not model.lm_head and not caps.headless:
        fail("--model", model.name, f"it has no output projection (lm_head: false), and "
             f"{caps.version}'s models end in one; --framework {_who(lambda c: c.headless)} "
             "plans it")
    if model.activation not in caps.activations:
        fail("--model", model.name, f"its activation {model.activation} is not among "
             f"{caps.version}'s ({', '.join(sorted(caps.activations))}); --framework "
             f"{_who(lambda c: model.activation in c.activations)} plans it")
    return caps


def _who(takes: Callable[[FrameworkCapabilities], bool]) -> str:
    """The frameworks that take what a refusal names ('megatron or deepspeed')."""
    return " or ".join(c.name for c in CAPABILITIES.values() if takes(c))


def _check(req: SearchRequest, cluster: ClusterSpec) -> None:
    caps = check_framework(req.framework, req.model, req.dtype)
    if req.attention is not None and req.attention not in caps.attention:
        fail("--attention", req.attention,
             f"{caps.version} has {', '.join(sorted(caps.attention))}")
    if req.objective not in OBJECTIVES:
        fail("--objective", req.objective, "allowed: " + ", ".join(OBJECTIVES))
    if req.objective == "time-to-train" and req.tokens is None:
        fail("--objective", req.objective, "needs --tokens (the token budget to train on)")
    if req.max_budget_usd is not None and req.tokens is None:
        fail("--max-budget", req.max_budget_usd, "needs --tokens (what the budget buys)")
    if (req.objective == "cost" or req.max_budget_usd is not None) and any(
            g.price_per_gpu_hour_usd is None for g in cluster.node_groups):
        field, value = (("--objective", req.objective) if req.objective == "cost"
                        else ("--max-budget", req.max_budget_usd))
        fail(field, value,
             "needs prices: a --cluster spec with price_per_gpu_hour_usd on every node group")
    check_train_dtype((g.device for g in cluster.node_groups), req.dtype, where="--dtype")
    if seq_problem(req.model, req.seq_len) and not caps.positions_past_the_table:
        fail("--seq", req.seq_len, f"at most {req.model.seq_len}, the positions "
             f"{req.model.name} learns: {caps.version} has no embedding past its model's "
             f"table; --framework {_who(lambda c: c.positions_past_the_table)} plans a "
             "longer one")


def _kernels(req: SearchRequest, cluster: ClusterSpec) -> Kernels:
    """The kernels every candidate on `cluster` is priced with and its Plan records: the
    calibrated default where the framework has it, else the first it has that the GPUs run."""
    devices = [g.device for g in cluster.node_groups]
    dropout = req.model.drops_attention
    kernels = default_kernels(devices, dtype=req.dtype, attention=req.attention,
                              dropout=dropout)
    allowed = req.capabilities.attention
    if kernels.attention in allowed:
        return kernels
    runnable = [k for k in Attention if k in allowed
                and all(k in supported_attention(d, req.dtype, dropout=dropout)
                        for d in devices)]
    if not runnable:
        fail("--framework", req.framework, f"{req.capabilities.version} has no attention "
             f"kernel these GPUs run in {req.dtype} ({', '.join(sorted(allowed))})")
    return default_kernels(devices, dtype=req.dtype, attention=runnable[0], dropout=dropout)


def _evaluate_all(req: SearchRequest, cluster: ClusterSpec, space: SearchSpace, *,
                  shard: int = 0, shards: int = 1
                  ) -> tuple[list[tuple[int, list[Evaluation]]], dict[Layout, LayoutModel], int]:
    """The candidates of every `shards`-th layout from the `shard`-th, evaluated: per
    layout its index among all and its evaluations; the layouts' models; the count."""
    models: dict[Layout, LayoutModel] = {}
    evaluations: list[tuple[int, list[Evaluation]]] = []
    kernels = _kernels(req, cluster)
    count = 0
    for i, lo in enumerate(layouts(space, req.model, gbs=req.gbs, seq_len=req.seq_len)):
        if i % shards != shard:
            continue
        micros = list(candidates(space, req.model, lo, gbs=req.gbs, seq_len=req.seq_len))
        if micros:
            models[lo] = LayoutModel(req.model, cluster, lo, dtype=req.dtype,
                                     seq_len=req.seq_len, gbs=req.gbs, kernels=kernels,
                                     profiles=req.profiles,
                                     sharding=space.sharding_patterns(lo.pp),
                                     ep_sharding_multiple=space.ep_sharding_multiple,
                                     amp_needs_sharding_with_tp_pp=(
                                         space.amp_needs_sharding_with_tp_pp),
                                     fsdp_data_parallel=space.fsdp_data_parallel,
                                     model_states=req.model_states, comm=req.comm)
            if not models[lo].choices:  # no sharding the framework runs this layout with
                del models[lo]
                tick()
                continue
            evaluations.append((i, [models[lo].evaluate(mi) for mi in micros]))
            count += len(micros)
        tick()  # progress: one layout
    # The exact sharding of this shard's leaders, worked out here (in parallel with the
    # other shards): a type's leaders are among its shards' leaders, and their LayoutModels
    # carry it back (`_ilp_sharding`'s memo).
    for ev in _leading(req, cluster, [e for _, evs in evaluations for e in evs])[0]:
        _ilp_sharding(models[ev.layout], ev.micro)
    return evaluations, models, count


def _merged(parts: Sequence[tuple[list[tuple[int, list[Evaluation]]], dict[Layout, LayoutModel],
                                  int]]
            ) -> tuple[list[Evaluation], dict[Layout, LayoutModel], int]:
    """The shards of one GPU type's evaluation as one, in layout order (as one process
    would have made it)."""
    per_layout = sorted((item for part in parts for item in part[0]), key=lambda it: it[0])
    models: dict[Layout, LayoutModel] = {}
    for part in parts:
        models.update(part[1])
    return ([e for _, evs in per_layout for e in evs], models, sum(part[2] for part in parts))


def _ilp_sharding(lm: LayoutModel, micro: Micro) -> tuple[Sharding, float]:
    """The sharding of one candidate re-chosen over every AMSP option as an integer
    program (the search loop scanned only the undominated ones), and its estimate
    (remembered with the layout: searches of this process that share it share this)."""
    if ("ilp", micro) not in lm.memo:
        lm.memo[("ilp", micro)] = _solve_sharding(lm, micro)
    return lm.memo[("ilp", micro)]  # type: ignore[return-value]  # stored just above


def _solve_sharding(lm: LayoutModel, micro: Micro) -> tuple[Sharding, float]:
    base = lm.stage_costs(micro)
    rest = [c.memory.total_bytes for c in base]  # no model states in the unsharded costs
    options = [lm.option(sh) for sh in lm.choices]
    times = [lm.iteration_s(lm.sharded(base, o.sharding), micro) for o in options]
    memory = [[r + m for r, m in zip(rest, o.memory_bytes, strict=True)] for o in options]
    chosen = solve_ilp(times, memory, [lm.capacity] * len(rest))
    if chosen is None:  # nothing fits: the scan's choice stands
        return Sharding(), lm.iteration_s(lm.sharded(base, Sharding()), micro)
    return options[chosen].sharding, times[chosen]


def _plan(req: SearchRequest, cluster: ClusterSpec, ev: Evaluation, sharding: Sharding) -> Plan:
    lo, mi = ev.layout, ev.micro
    cfg = ParallelConfig(tp=lo.tp, pp=lo.pp, dp=lo.dp, cp=lo.cp, vp=mi.vp, mbs=mi.mbs,
                         gbs=req.gbs, seq_len=req.seq_len, recompute=mi.recompute,
                         sequence_parallel=mi.sequence_parallel, sharding=sharding,
                         dtype=req.dtype, schedule=mi.schedule, ep=lo.ep, etp=lo.etp,
                         ep_layout=lo.ep_layout, model_states=req.model_states,
                         comm=req.comm)
    sub = cluster.take(lo.num_gpus, where="search")
    return homogeneous_plan(req.model, sub, cfg, kernels=_kernels(req, cluster))


def _egress_of(req: SearchRequest, cluster: ClusterSpec) -> Callable[[Evaluation], float]:
    """Egress $ per iteration of a candidate, where it can change the answer (a priced
    island link, and the cost objective or a budget); cached by what it depends on."""
    if (not any(k.price_per_gb_usd > 0 for k in cluster.island_links)
            or (req.objective != "cost" and req.max_budget_usd is None)):
        return lambda e: 0.0
    cache: dict[tuple, float] = {}

    def egress(e: Evaluation) -> float:
        key = (e.layout, e.micro.mbs, e.sharding.params)
        if key not in cache:
            cache[key] = egress_usd_per_iteration(_plan(req, cluster, e, e.sharding))
        return cache[key]
    return egress


def _space(req: SearchRequest, cluster: ClusterSpec) -> tuple[SearchSpace, str | None]:
    """The request's space (or the default one) within what its framework runs. Where
    the framework has no layout of all the GPUs that the full space has (the cluster
    needs what it lacks: uneven stages, tp with pp, ...), the default space of the most
    whole nodes it can use, and a note saying so."""
    caps = req.capabilities
    if req.space is not None:
        return for_framework(req.space, caps), None
    per_node = cluster.node_groups[0].gpus_per_node or 1
    domain = cluster.node_groups[0].nvlink_domain_gpus or per_node

    def space_of(n: int) -> SearchSpace:
        groups = tuple(g.num_gpus for g in cluster.node_groups)
        return default_space(req.model, num_gpus=_gpu_counts(n, per_node, req.objective,
                                                             groups, req.gbs),
                             nvlink_domain_gpus=domain, seq_len=req.seq_len)

    def first_layout(space: SearchSpace) -> Layout | None:
        return next(layouts(space, req.model, gbs=req.gbs, seq_len=req.seq_len), None)

    n = cluster.num_gpus
    full, space = space_of(n), for_framework(space_of(n), caps)
    if first_layout(space) is not None:
        return space, None
    gpu = cluster.node_groups[0].gpu
    if first_layout(full) is not None:
        missing = sorted({what for lo in layouts(full, req.model, gbs=req.gbs,
                                                 seq_len=req.seq_len)
                          for what in missing_for(space, req.model, lo)})
        why = (f"{caps.version} cannot use all {n} {gpu} GPUs at gbs {req.gbs} (that needs "
               f"{' or '.join(missing)})")
    else:  # 1,000 GPUs and gbs 1,024: no dp divides both (after a node was lost)
        why = f"no layout of all {n} {gpu} GPUs divides gbs {req.gbs}"
    for fewer in range(n - per_node, 0, -per_node):
        space = for_framework(space_of(fewer), caps)
        if first_layout(space) is not None:
            return space, f"{why}: planned on {fewer}"
    return for_framework(full, caps), None


def _homogeneous(req: SearchRequest, simulate_fn: Callable,
                 found: tuple[list[tuple[Plan, float]], int, int, int, list[Evaluation]],
                 ) -> tuple[list[tuple[float, Ranked]], int, int, int, list[Evaluation]]:
    """Ranked confirmed plans of one GPU type's cluster from its leaders
    (`_homogeneous_leaders`); counts; the closest misfit."""
    leaders, count, ok, n_layouts, closest = found
    ranked = [_confirm(req, plan, estimate_s, simulate_fn, SOLVER_SOURCE)
              for plan, estimate_s in leaders]
    return [r for r in ranked if r is not None], count, ok, n_layouts, closest


def _homogeneous_leaders(req: SearchRequest, cluster: ClusterSpec,
                         evaluated: tuple[list[Evaluation], dict[Layout, LayoutModel], int],
                         slack: float = ESTIMATE_SLACK,
                         ) -> tuple[list[tuple[Plan, float]], int, int, int, list[Evaluation]]:
    """The plans to confirm of one GPU type's cluster, best first, with their estimates
    (sharding re-chosen exactly); counts; the closest misfit."""
    evals, models, count = evaluated
    leading, ok, closest = _leading(req, cluster, evals, slack)
    leaders = []
    for ev in leading:
        sharding, estimate_s = _ilp_sharding(models[ev.layout], ev.micro)
        leaders.append((_plan(req, cluster, ev, sharding), estimate_s))
    return leaders, count, ok, len(models), closest


def _leading(req: SearchRequest, cluster: ClusterSpec, evals: list[Evaluation],
             slack: float = ESTIMATE_SLACK) -> tuple[list[Evaluation], int, list[Evaluation]]:
    """The candidates to confirm among `evals`, best first; how many fit the memory and
    the budget; the closest misfit (explaining an empty answer, unless it is the budget
    that excluded all)."""
    @functools.cache
    def priced(num_gpus: int) -> float | None:  # the GPUs a plan of that many runs on
        sub = cluster.take(num_gpus, where="search")
        return usd_per_hour(sub, list(range(sub.num_gpus)))

    def usd_hour(e: Evaluation) -> float | None:
        return priced(e.layout.num_gpus)

    egress = _egress_of(req, cluster)
    fitting = [e for e in evals if e.fits]
    ok = [e for e in fitting if _within_budget(req, e.iteration_s, usd_hour(e), egress(e))]
    near = [e for e in fitting if _within_budget(req, e.iteration_s, usd_hour(e), egress(e),
                                                 slack=slack)]
    closest = [] if fitting else sorted(
        evals, key=lambda e: e.peak_memory_bytes / e.capacity_bytes)[:1]
    ranked = sorted(((_score(req, e.iteration_s, usd_hour(e), egress(e)), e) for e in near),
                    key=lambda se: se[0])
    scores, near = [sc for sc, _ in ranked], [e for _, e in ranked]
    confirm = max(req.confirm, req.top)
    # and every candidate the estimate puts within CONFIRM_WINDOW of the best, up to
    # CONFIRM_MOST times as many
    window = sum(1 for s in scores[:CONFIRM_MOST * confirm]
                 if s <= scores[0] * (1 + CONFIRM_WINDOW))
    return (_leaders(near, confirm=max(confirm, window), shapes=req.top,
                     by_gpus=req.max_budget_usd is not None), len(ok), closest)


def _leaders(ranked: list[Evaluation], *, confirm: int, shapes: int,
             by_gpus: bool = False) -> list[Evaluation]:
    """The first `confirm` candidates, and after them the best of each further layout
    shape (tp, cp, pp: what `describe.shape_key` compares) until `shapes` shapes are in:
    the list shows different layouts, not one at several micro-batch settings. `by_gpus`
    (a budget the simulation may find a leader over): the best of each shape at each GPU
    count, so that a shape's smaller run is still there when its larger one is over (tp 4
    pp 2 on 128 GPUs within $1.9M was left out behind the same layout on 256 at $2.5M)."""
    out: list[Evaluation] = []
    seen: set[tuple[int, int, int, int]] = set()
    kept: set[tuple[int, ...]] = set()
    for i, ev in enumerate(ranked):
        shape = (ev.layout.tp, ev.layout.cp, ev.layout.pp, ev.layout.ep)
        key = (*shape, ev.layout.num_gpus) if by_gpus else shape
        if i < confirm or key not in kept:
            out.append(ev)
            seen.add(shape)
            kept.add(key)
        if i + 1 >= confirm and len(seen) >= shapes:
            break
    return out


def _evaluate_task(req: SearchRequest, task: tuple) -> object:
    """One unit of the search's pure work (run in a worker process): the homogeneous
    candidates of one GPU type, or a chunk of mixed-type templates."""
    kind, payload = task
    if kind == "homogeneous":
        cluster, shard, shards = payload
        return _evaluate_all(req, cluster, _space(req, cluster)[0], shard=shard, shards=shards)
    return hetero_candidates(req.model, req.cluster, payload, gbs=req.gbs,
                             seq_len=req.seq_len, dtype=req.dtype,
                             kernels=_kernels(req, req.cluster),
                             model_states=req.model_states, comm=req.comm,
                             score=functools.partial(_priced_score, req),
                             bound_score=functools.partial(_bound_score, req),
                             keep=max(req.confirm, req.top), profiles=req.profiles,
                             attention=Attention(req.attention) if req.attention else None,
                             space=MixedSpace.for_framework(req.capabilities, req.model), progress=tick)


def _units(req: SearchRequest, task: tuple) -> int:
    """The progress units of a task: layouts, or templates (`tick`)."""
    kind, payload = task
    if kind == "homogeneous":
        cluster, shard, shards = payload
        return len(range(shard, sum(1 for _ in layouts(_space(req, cluster)[0], req.model,
                                                       gbs=req.gbs, seq_len=req.seq_len)),
                         shards))
    return len(payload)


def _bound_score(req: SearchRequest, t: Template, bound_s: float) -> float:
    """The score a template's lower-bound time would have."""
    prices: dict[str, float] = {}  # a bound: the cheapest group of each type
    for g in req.cluster.node_groups:
        prices[g.gpu] = min(prices.get(g.gpu, math.inf), g.price_per_gpu_hour_usd or 0.0)
    usd = None if req.objective != "cost" else sum(
        prices[gpu] * tp for rep in t.replicas for gpu, tp in rep)
    return _score(req, bound_s, usd)


def _priced_score(req: SearchRequest, p: Priced) -> float:
    devices = [d for rep in p.devices for stage in rep for d in stage]
    return _score(req, p.iteration_s, usd_per_hour(req.cluster, devices))


def _confirm(req: SearchRequest, plan: Plan, estimate_s: float, simulate_fn: Callable,
             how: str) -> tuple[float, Ranked] | None:
    """Simulate a leader (with the fastest kernels a profile measured); None if its
    simulated run breaks the budget or memory."""
    plan = _with_measured_kernels(req, plan)
    result = simulate_fn(plan)
    ranked = priced_plan(plan, replace(result, sources={**result.sources, "choice": how}),
                         estimate_s)
    cost, egress = ranked.usd_per_hour, ranked.egress_usd_per_iteration
    if not result.fits or not _within_budget(req, result.iteration_time_s, cost, egress):
        return None
    return _score(req, result.iteration_time_s, cost, egress), ranked


def priced_plan(plan: Plan, result: SimResult, estimate_s: float = 0.0) -> Ranked:
    """`plan` and its simulated `result` with what its GPUs cost an hour at the cluster's
    prices and its egress per iteration."""
    devices = [d for p in plan.pipelines for s in p.stages for d in s.devices]
    return Ranked(plan, result, estimate_s, usd_per_hour(plan.cluster, devices),
                  egress_usd_per_iteration(plan))


def _with_measured_kernels(req: SearchRequest, plan: Plan) -> Plan:
    """`plan` with the fastest kernels its profile measured (among the framework's)."""
    if req.profiles is None:
        return plan
    kernels = fastest_kernels(plan, req.profiles)
    if kernels.attention not in req.capabilities.attention:  # not the framework's
        kernels = fastest_kernels(plan, req.profiles, keep_attention=True)
    return replace(plan, kernels=kernels)


# The mixed templates are searched in this many tasks (branch and bound in each), a fixed
# number so that the answer does not depend on the machine: each keeps at least the
# leaders one task would, and their variants, so the merged answer is at least as good.
MIXED_CHUNKS = 2

# What searches in this process already worked out, by what it depends on: a what-if
# report plans scenarios that share GPU types, models and batches (and a leader of one
# scenario is often another's). Cleared with the cost caches (`clear_cost_caches`).
_KEPT = 64
_evaluated: OrderedDict[tuple, object] = OrderedDict()
_simulated: OrderedDict[tuple, SimResult] = OrderedDict()


def _forget() -> None:
    _evaluated.clear()
    _simulated.clear()


on_clear_cost_caches(_forget)


def _keep(cache: OrderedDict, key: tuple, value: object) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _KEPT:
        cache.popitem(last=False)


def _cost_view(cluster: ClusterSpec, *, prices: bool) -> ClusterSpec:
    """The cluster as costs see it: no name, and prices only where the answer depends on
    them (`prices`)."""
    if prices:
        return replace(cluster, name="", description=None)
    return replace(cluster, name="", description=None,
                   node_groups=tuple(replace(g, price_per_gpu_hour_usd=None)
                                     for g in cluster.node_groups),
                   island_links=tuple(replace(k, price_per_gb_usd=0.0)
                                      for k in cluster.island_links))


def _task_key(req: SearchRequest, task: tuple) -> tuple:
    """What one unit of the search's pure work (`_evaluate_task`) depends on."""
    kind, payload = task
    common = (kind, req.model, req.gbs, req.seq_len, req.dtype, req.attention, req.profiles,
              req.framework, req.model_states, req.comm)
    if kind == "homogeneous":
        cluster, shard, shards = payload
        return (*common, _cost_view(cluster, prices=False), _space(req, cluster), shard, shards)
    # mixed candidates are ranked by time, or by GPU cost for the cost objective
    return (*common, _cost_view(req.cluster, prices=req.objective == "cost"), req.objective,
            max(req.confirm, req.top), tuple(payload))


def _evaluate_tasks(req: SearchRequest, tasks: list[tuple]) -> list[object]:
    """`_evaluate_task` of each task, over all cores; work an earlier search of this
    process already did is taken from it."""
    keys = [_task_key(req, t) for t in tasks]
    # taken out first: keeping this search's new work may evict what it found kept
    found = {k: _evaluated[k] for k in keys if k in _evaluated}
    todo = [i for i, k in enumerate(keys) if k not in found]
    done = parallel_map(functools.partial(_evaluate_task, req), [tasks[i] for i in todo],
                        title=f"searching {req.model.name} on {req.cluster.name}",
                        units=[_units(req, tasks[i]) for i in todo], unit="layout")
    for i, out in zip(todo, done, strict=True):
        found[keys[i]] = out
        _keep(_evaluated, keys[i], out)
    return [found[k] for k in keys]


def _tasks(req: SearchRequest) -> list[tuple]:
    """The search's pure work: each GPU type's homogeneous space, and on a mixed cluster
    the mixed templates dealt over MIXED_CHUNKS tasks (branch and bound prunes each
    against the best it found so far), first (the longest start first). Where there are
    fewer tasks than cores, each GPU type's layouts are dealt out over several tasks
    (`_outputs` merges them back)."""
    subclusters, _ = _planned(req)
    for cluster in subclusters:
        _check(req, cluster)
    mixes = _mixes(req, subclusters)
    shards = max(1, cores() // (len(subclusters) + int(mixes)))
    tasks: list[tuple] = [("homogeneous", (c, i, shards)) for c in subclusters
                          for i in range(shards)]
    if mixes:
        templates = mixed_templates(req.model, req.cluster, req.gbs,
                                    MixedSpace.for_framework(req.capabilities, req.model),
                                    seq_len=req.seq_len)
        tasks[:0] = [("mixed", templates[i::MIXED_CHUNKS]) for i in range(MIXED_CHUNKS)
                     if templates[i::MIXED_CHUNKS]]
    return tasks


def _outputs(tasks: list[tuple], done: list[object]) -> list[object]:
    """The evaluated tasks as `_confirmed` takes them: per GPU type its homogeneous
    evaluation (shards merged), then the mixed templates' candidates if any."""
    homogeneous: dict[int, list] = {}
    mixed = []
    for (kind, payload), out in zip(tasks, done, strict=True):
        if kind == "homogeneous":
            homogeneous.setdefault(id(payload[0]), []).append(out)
        else:
            mixed.append(out)
    return [_merged(parts) for parts in homogeneous.values()] + mixed


def _mixes(req: SearchRequest, subclusters: list[ClusterSpec]) -> bool:
    """Whether the search plans mixed GPU types: a cluster of several and a framework
    that runs them."""
    return len(subclusters) > 1 and bool(MixedSpace.for_framework(req.capabilities, req.model).families)


def _evaluate_item(item: tuple[SearchRequest, tuple]) -> object:
    return _evaluate_task(*item)


@gc_paused()  # as `search`: planner/gc_pause.py
def prepare(requests: Sequence[SearchRequest], *, title: str) -> None:
    """Do the pure work of several searches together, over all cores, for their `search`
    calls to take from this process's memory: a what-if report's scenarios share GPU
    types and models, and together their tasks keep the cores busier than one search's
    few. Requests `search` would refuse are left to it."""
    work: dict[tuple, tuple[SearchRequest, tuple]] = {}
    for req in requests:
        try:
            tasks = _tasks(req)
        except SpecError:
            continue
        for task in tasks:
            key = _task_key(req, task)
            if key not in _evaluated:
                work.setdefault(key, (req, task))
    # the mixed searches first, then the larger clusters: the longest tasks start first
    keys = sorted(work, key=lambda k: (work[k][1][0] != "mixed",
                                       -work[k][0].cluster.num_gpus))[:_KEPT]
    done = parallel_map(_evaluate_item, [work[k] for k in keys], title=title,
                        units=[_units(*work[k]) for k in keys], unit="layout")
    for key, out in zip(keys, done, strict=True):
        _keep(_evaluated, key, out)


def _simulator(profiles: Profiles | None) -> Callable[[Plan], SimResult]:
    """The event simulator, remembering each plan's result (by the plan as costs see it)."""
    def simulate_once(plan: Plan) -> SimResult:
        key = _simulation_key(plan, profiles)
        if key not in _simulated:
            _keep(_simulated, key, simulate(plan, profiles=profiles))
        return _simulated[key]
    return simulate_once


def _simulation_key(plan: Plan, profiles: Profiles | None) -> tuple:
    return (replace(plan, cluster=_cost_view(plan.cluster, prices=False)), profiles)


def _simulate_item(item: tuple[Plan, Profiles | None]) -> SimResult:
    return simulate(item[0], profiles=item[1])


def _simulate_ahead(plans: Sequence[Plan], profiles: Profiles | None) -> None:
    """Simulate `plans` over all cores for `_simulator`'s calls to take from this
    process's memory (the leaders of a search are known before they are confirmed one by
    one; a plan of thousands of GPUs takes a good part of a second)."""
    keys: dict[tuple, Plan] = {}
    for plan in plans:
        key = _simulation_key(plan, profiles)
        if key not in _simulated:
            keys.setdefault(key, plan)
    if len(keys) < 2 or cores() < 2:
        return
    done = parallel_map(_simulate_item, [(plan, profiles) for plan in keys.values()],
                        title="simulating the leaders", unit="plan")
    for key, result in zip(keys, done, strict=True):
        _keep(_simulated, key, result)


def _counted(simulate_fn: Callable[[Plan], SimResult], bar: ProgressBar
             ) -> Callable[[Plan], SimResult]:
    def counted(plan: Plan) -> SimResult:
        result = simulate_fn(plan)
        bar.advance()
        return result
    return counted


@gc_paused()  # millions of memo entries and candidates: planner/gc_pause.py
def search(req: SearchRequest, *, simulate_fn: Callable[[Plan], SimResult] | None = None
           ) -> SearchResult:
    """The best plans on `req.cluster`; raise InfeasiblePlan if nothing fits.

    A cluster of one GPU type is searched as a homogeneous space. A mixed one is searched
    per GPU type and, where the framework runs them, with heterogeneous templates
    (planner/hetero), and the answer is compared with the baselines. Every plan is one
    the request's framework runs (`unsupported(plan, req.capabilities)` is empty)."""
    start = time.perf_counter()
    subclusters, left_out = _planned(req)
    mixes = _mixes(req, subclusters)
    tasks = _tasks(req)
    outputs = _outputs(tasks, _evaluate_tasks(req, tasks))
    leaders = [_homogeneous_leaders(req, cluster, evaluated)  # type: ignore[arg-type]  # outputs of homogeneous tasks
               for cluster, evaluated in zip(subclusters, outputs, strict=False)]
    if simulate_fn is None:
        simulate_fn = _simulator(req.profiles)
        _simulate_ahead([_with_measured_kernels(req, plan)
                         for found in leaders for plan, _ in found[0]], req.profiles)
    with ProgressBar(None, title="simulating the leaders", unit="plans") as bar:
        ranked, counts, closest, per_type, with_type, baselines = _confirmed(
            req, subclusters, leaders, outputs[len(subclusters):],
            _counted(simulate_fn, bar), mixes)
    slack = _budget_slack(req, subclusters, outputs, simulate_fn)
    if slack > ESTIMATE_SLACK:  # the estimate priced these leaders high: look again
        leaders = [_homogeneous_leaders(req, cluster, evaluated, slack)  # type: ignore[arg-type]  # outputs of homogeneous tasks
                   for cluster, evaluated in zip(subclusters, outputs, strict=False)]
        with ProgressBar(None, title="simulating the leaders within the budget",
                         unit="plans") as bar:
            ranked, counts, closest, per_type, with_type, baselines = _confirmed(
                req, subclusters, leaders, outputs[len(subclusters):],
                _counted(simulate_fn, bar), mixes)
    total, fitting, n_layouts = counts
    if not ranked:
        why = _explain(req, closest, total)
        if req.max_budget_usd is not None and not closest and total:
            why += _cheapest_words(req)
        raise InfeasiblePlan(why)
    ranked.sort(key=lambda sr: sr[0])
    notes = []  # what the framework could not do here, then which GPUs idle and why
    if left_out:
        notes.append(f"{', '.join(left_out)} not planned: no {req.dtype} there "
                     f"({req.capabilities.version} plans each GPU type alone; another "
                     "--dtype plans them)")
    if len(per_type) > 1 and not mixes:
        why = MixedSpace.for_framework(req.capabilities, req.model).why_none
        notes.append(f"mixed GPU types not planned: {why}; each of {', '.join(per_type)} "
                     "planned alone (--framework trainplan mixes them)")
    notes += [note for c in subclusters if (note := _space(req, c)[1])]
    if mixes and len(per_type) > FULL_TYPES:
        notes.append(f"{len(per_type)} GPU types: the mixed plans tried use the k fastest "
                     f"types (k = 2..{len(per_type)}) at one tp each; every combination is "
                     f"searched up to {FULL_TYPES} types (it grows as 5^types)")
    if len(per_type) > 1:
        notes += _idle_notes(req, ranked, per_type, with_type, mixes)
    return SearchResult(_distinct(ranked, req.top), total, fitting, n_layouts,
                        time.perf_counter() - start, notes, baselines)


def _confirmed(req: SearchRequest, subclusters: list[ClusterSpec], leaders: list[tuple],
               mixed_outputs: list[object], simulate_fn: Callable[[Plan], SimResult],
               mixes: bool) -> tuple:
    """The leaders of each GPU type (`_homogeneous_leaders`) and of the mixed templates
    confirmed by simulation: (scored plans, (candidates, fitting, layouts), closest
    misfits, per type's plans, best score with each type, baselines)."""
    ranked: list[tuple[float, Ranked]] = []
    total = fitting = n_layouts = 0
    closest: list[Evaluation] = []
    per_type: dict[str, list[tuple[float, Ranked]]] = {}
    for cluster, found_leaders in zip(subclusters, leaders, strict=True):
        found, count, ok, layouts_n, near = _homogeneous(req, simulate_fn, found_leaders)
        per_type[cluster.node_groups[0].gpu] = sorted(found, key=lambda sr: sr[0])
        ranked += found
        total, fitting, n_layouts = total + count, fitting + ok, n_layouts + layouts_n
        closest += near
    baselines: list[Baseline] = []
    with_type: dict[str, float] = {}
    if mixes:
        merged = merge_candidates(mixed_outputs,  # type: ignore[arg-type]  # outputs of mixed tasks
                                  functools.partial(_priced_score, req),
                                  max(req.confirm, req.top))
        mixed, baselines = _mixed(req, per_type, merged, simulate_fn)
        ranked += mixed
        total, fitting = total + merged[1], fitting + len(mixed)
        with_type = merged[2]
    return ranked, (total, fitting, n_layouts), closest, per_type, with_type, baselines


def _distinct(ranked: list[tuple[float, Ranked]], top: int) -> list[Ranked]:
    """The best `top` plans of different layouts (`describe.shape_key`: a plan at another
    GPU count, micro-batch size, recompute, schedule or sharding of a layout above it is
    left out)."""
    out: list[Ranked] = []
    seen: set[tuple] = set()
    for _, r in ranked:
        shape = shape_key(r.plan)
        if shape not in seen:
            seen.add(shape)
            out.append(r)
        if len(out) == top:
            break
    return out


def _mixed(req: SearchRequest, per_type: dict[str, list[tuple[float, Ranked]]],
           merged: tuple[list[Priced], int, dict[str, float]], simulate_fn: Callable
           ) -> tuple[list[tuple[float, Ranked]], list[Baseline]]:
    """The best mixed-type candidates confirmed (the leaders' splits refined on the
    simulator), and the three baselines."""
    cluster = req.cluster
    leaders = merged[0]
    kernels = _kernels(req, cluster)
    confirmed = []
    for i, p in enumerate(leaders):
        if i < REFINED and p.template.family == "mixed-stages":
            p = _refine(req, p, kernels, simulate_fn)
        plan = p.plan(req.model, cluster, seq_len=req.seq_len, dtype=req.dtype, kernels=kernels)
        item = _confirm(req, plan, p.iteration_s, simulate_fn, MIXED_SOURCE)
        if item is not None:
            confirmed.append(item)
    baselines = [_fastest_type_baseline(per_type, cluster)]
    if leaders:
        for name, naive in baselines_for(leaders[0], req.model, cluster, gbs=req.gbs,
                                         seq_len=req.seq_len, dtype=req.dtype,
                                         kernels=kernels, profiles=req.profiles,
                                         model_states=req.model_states, comm=req.comm):
            baselines.append(_rate_baseline(req, name, naive, kernels, simulate_fn))
    return confirmed, baselines


REFINED = 2  # leaders whose layer split is refined on the event simulator


def _refine(req: SearchRequest, p: Priced, kernels: Kernels, simulate_fn: Callable) -> Priced:
    """Refine a mixed-stage template's layer split on the event simulator: start from the
    best of the closed form's optimum and the naive splits, then move one layer at a time
    across the boundaries between GPU types while the simulated iteration gets shorter.
    (The closed form prices unequal stages approximately; the simulator decides.)"""
    pools = pools_by_type(req.cluster)

    def rated(layers: tuple[int, ...]) -> tuple[float, Priced | None]:
        q = price(req.model, req.cluster, p.template, pools=pools, mbs=p.mbs,
                  recompute=p.recompute, sharding=p.sharding, seq_len=req.seq_len,
                  dtype=req.dtype, gbs=req.gbs, kernels=kernels, attention=p.attention,
                  layers=layers,
                  microbatches=p.microbatches, schedule=p.schedule, profiles=req.profiles,
                  stage_sharding=p.stage_sharding, model_states=req.model_states,
                  comm=req.comm)
        if q is None or not q.fits:
            return float("inf"), None
        plan = q.plan(req.model, req.cluster, seq_len=req.seq_len, dtype=req.dtype,
                      kernels=kernels)
        return simulate_fn(plan).iteration_time_s, q

    seen: dict[tuple[int, ...], tuple[float, Priced | None]] = {}
    starts = [p.layers] + [naive.layers for _, naive in baselines_for(
        p, req.model, req.cluster, gbs=req.gbs, seq_len=req.seq_len, dtype=req.dtype,
        kernels=kernels, profiles=req.profiles, model_states=req.model_states,
        comm=req.comm) if naive is not None]
    for layers in starts:
        seen.setdefault(tuple(layers), rated(tuple(layers)))
    best = min(seen, key=lambda k: seen[k][0])
    slots = p.template.replicas[0]
    edges = [k for k in range(len(slots) - 1) if slots[k] != slots[k + 1]] or \
        list(range(len(slots) - 1))
    for _ in range(8):  # hill-climb: one layer across a boundary between unlike stages
        moves = []
        for k in edges:
            for src, dst in ((k, k + 1), (k + 1, k)):
                if best[src] > 1:
                    moved = list(best)
                    moved[src] -= 1
                    moved[dst] += 1
                    moves.append(tuple(moved))
        for layers in moves:
            if layers not in seen:
                seen[layers] = rated(layers)
        step = min(moves, key=lambda k: seen[k][0], default=best)
        if seen[step][0] >= seen[best][0]:
            break
        best = step
    return seen[best][1] or p


def _fastest_type_baseline(per_type: dict[str, list[tuple[float, Ranked]]],
                           cluster: ClusterSpec) -> Baseline:
    """The best plan of one GPU type alone (by the objective's score): what a user without
    mixed plans would run. Where no type's plan fits, the type of the highest 16-bit peak
    (the name breaks ties: the cluster file's order of its groups changes nothing)."""
    def peak(gpu: str) -> float:
        tflops = cluster.device_of(gpu).peak_tflops  # the cluster's own types too
        return tflops.get("bf16", tflops.get("fp16", 0.0))

    fitting = sorted(g for g in per_type if per_type[g])
    if not fitting:
        fastest = min(per_type, key=lambda g: (-peak(g), g))
        return Baseline(f"only {fastest}", None, None, "does not fit in memory")
    fastest = min(fitting, key=lambda g: per_type[g][0][0])
    r = per_type[fastest][0][1]
    return Baseline(f"only {fastest}", r.plan, r.result)


def _rate_baseline(req: SearchRequest, name: str, naive: Priced | None, kernels: Kernels,
                   simulate_fn: Callable) -> Baseline:
    if naive is None:
        return Baseline(name, None, None, "cannot be split that way")
    plan = naive.plan(req.model, req.cluster, seq_len=req.seq_len, dtype=req.dtype,
                      kernels=kernels)
    result = simulate_fn(plan)
    return Baseline(name, plan, result, "" if result.fits else "does not fit in memory")


def _idle_notes(req: SearchRequest, ranked: list[tuple[float, Ranked]],
                per_type: dict[str, list], with_type: dict[str, float], mixed: bool
                ) -> list[str]:
    """Which GPUs the best plan (`ranked[0]`) leaves idle, and why."""
    slots, groups = req.cluster.slots, req.cluster.node_groups
    best = ranked[0][1]
    # GPUs of each type the plan uses (a plan of one type numbers its own cluster's GPUs)
    used: dict[str, int] = {}
    for d in {d for p in best.plan.pipelines for s in p.stages for d in s.devices}:
        gpu = best.plan.cluster.group_of(d).gpu
        used[gpu] = used.get(gpu, 0) + 1
    best_s = best.result.iteration_time_s
    notes = []
    for gpu in dict.fromkeys(g.gpu for g in groups):
        mine = [s.index for s in slots if groups[s.group].gpu == gpu]
        idle = len(mine) - used.get(gpu, 0)
        if not idle or gpu not in per_type:  # a type not planned has its own note
            continue
        if idle < len(mine) and req.objective == "cost":
            why = "a plan on more of them costs more"
        elif idle < len(mine):
            why = "they do not divide evenly into the plan's replicas and stages"
        elif req.objective == "cost" and gpu in with_type:
            why = "every plan that uses them costs more"
        elif (simulated := [r for _, r in ranked if gpu in r.plan.gpu_types]):
            why = ("every plan that uses them is slower: the best simulates at "
                   f"{simulated[0].result.iteration_time_s:.3g} s/iteration, vs {best_s:.3g} s")
        elif gpu in with_type:
            why = ("every plan that uses them is slower: at best "
                   f"{with_type[gpu] * req.gbs * req.seq_len:.3g} s/iteration by the closed "
                   f"form (a lower bound where pruned), not among the leaders simulated; "
                   f"the best plan simulates at {best_s:.3g} s")
        elif per_type.get(gpu):
            why = "plans on them alone are slower" + (
                ", and no mixed plan with them fits" if mixed else "")
        else:
            why = "no plan using them fits in memory (or divides the batch)"
        if req.max_budget_usd is not None and why.startswith("every plan"):
            why += f" (of the plans within the --max-budget of {_dollars(req.max_budget_usd)})"
        vendor = req.cluster.device_of(gpu).vendor
        others = [t for t in used if req.cluster.device_of(t).vendor != vendor]
        if mixed and idle == len(mine) and others:  # `hetero.search.mixed_templates`
            why += (f"; no plan mixes them with {', '.join(others)}: no communicator spans "
                    f"GPUs of two vendors (NCCL, RCCL, gloo)")
        notes.append(f"{idle} of {len(mine)} {gpu} GPUs idle: {why}")
    return notes


# The most the budget's prefilter widens to (2: a candidate whose estimate is 3x the
# budget is still simulated).
MAX_BUDGET_SLACK = 2.0


def _dollars(amount: float) -> str:
    """$1,234 from $100 on, three significant digits below ($0.01 was printed as $0)."""
    return f"${amount:,.0f}" if amount >= 100 else f"${amount:,.3g}"


def _budget_slack(req: SearchRequest, subclusters: list[ClusterSpec], outputs: list[object],
                  simulate_fn: Callable) -> float:
    """How far over the budget a candidate's estimate may be and still be simulated: 3%
    (`ESTIMATE_SLACK`), or, where the simulation puts the leaders the budget does not
    limit faster than their estimates by more than that (a pipeline across a 100 Gb/s
    island link: 20.2 s simulated, 25.7 s estimated on 2026-12-03, so a plan within a
    budget $46 above its simulated $26,654 was left out for a 64-GPU plan twice as slow),
    the largest such overestimate."""
    if req.max_budget_usd is None:
        return ESTIMATE_SLACK
    free = replace(req, max_budget_usd=None)
    leaders = [_homogeneous_leaders(free, cluster, evaluated)  # type: ignore[arg-type]  # outputs of homogeneous tasks
               for cluster, evaluated in zip(subclusters, outputs, strict=False)]
    ratios = [simulate_fn(_with_measured_kernels(req, plan)).iteration_time_s / estimate_s
              for found in leaders for plan, estimate_s in found[0]
              if estimate_s > 0]
    low = min(ratios, default=1.0)
    return min(MAX_BUDGET_SLACK, max(ESTIMATE_SLACK, (1 + ESTIMATE_SLACK) / low - 1))


def _cheapest_words(req: SearchRequest) -> str:
    """How close the budget came: the cheapest plan without it (a search for cost)."""
    try:
        cheapest = search(replace(req, max_budget_usd=None, objective="cost", top=1,
                                  confirm=1)).ranked[0]
    except InfeasiblePlan:
        return ""
    usd = cheapest.run_cost_usd(req.tokens)
    return ("" if usd is None else f"; the cheapest plan costs ${usd:,.0f} "
            f"({cheapest.result.num_gpus} GPUs, {layout_cell(cheapest.plan)})")


def _explain(req: SearchRequest, closest: list[Evaluation], total: int) -> str:
    """Why nothing fits, how close the nearest candidate came, what would help."""
    if not closest:
        if total == 0:
            m = req.model
            kv = (f" and its {m.kv_heads} key/value head{'s' * (m.kv_heads > 1)}"
                  if req.capabilities.kv_heads_split and m.kv_heads != m.num_heads else "")
            return (f"no configuration of these GPUs runs gbs {req.gbs}{_within(req)}: the "
                    f"data-parallel degree divides the batch, and tensor x pipeline "
                    f"parallelism takes the rest of the GPUs, tp dividing {m.name}'s "
                    f"{m.num_heads} heads{kv} and pp at most its {m.num_layers} layers (try a "
                    f"gbs that is a multiple of the GPU count)")
        if req.max_budget_usd is not None:
            return (f"every configuration that fits in memory exceeds the budget of "
                    f"{_dollars(req.max_budget_usd)} for {req.tokens:.3g} tokens")
        return (f"none of the {total} mixed-cluster candidates fits in memory with a "
                f"micro-batch for every replica of gbs {req.gbs} (try a larger gbs, or "
                f"--gpus of one type)")
    e = min(closest, key=lambda e: e.peak_memory_bytes / e.capacity_bytes)
    lo, mi, sh = e.layout, e.micro, e.sharding
    short = (e.peak_memory_bytes - e.capacity_bytes) / GIB
    need = e.peak_memory_bytes / GIB
    schedule = mi.schedule.for_chunks(mi.vp)
    return (
        f"nothing fits in memory among {total} candidates. Closest: tp {lo.tp}, pp {lo.pp}, "
        f"dp {lo.dp}, cp {lo.cp}, micro-batches of {mi.mbs}, {recompute_words(mi.recompute)}, "
        f"{schedule.described}, sharding {sharding_cell(sh, lo.dp)}: {need:.1f} GiB per GPU, "
        f"{short:.1f} GiB over "
        f"the {e.capacity_bytes / GIB:.1f} GiB available. Recompute and sharding up to the "
        f"whole data-parallel group were already tried{_within(req)}; it would fit with GPUs "
        f"of at least {need:.0f} GiB, or with more GPUs (about "
        f"{need / (e.capacity_bytes / GIB):.1f}x as many, so deeper pipelines or more "
        f"sharding spread the model states)")


def _within(req: SearchRequest) -> str:
    """What the search was limited to, for a framework other than trainplan's executor."""
    caps = req.capabilities
    if caps.name == "trainplan":
        return ""
    return (f" (within what {caps.version} runs; --framework trainplan searches every "
            "AMSP sharding, schedule and stage split)")

