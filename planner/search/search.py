"""`plan search`: the best homogeneous plans for a model, a cluster and a batch.

1. Enumerate layouts and candidates (planner/search/space.py) for each GPU count the
   objective allows.
2. Price every candidate with the closed-form estimate and its best AMSP sharding among
   the undominated options (planner/search/evaluate.py); drop those that do not fit.
3. Rank by the objective; for the leaders, re-solve the sharding choice over all options
   as an integer program (pulp) and confirm with the event simulator, which decides the
   final order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.errors import InfeasiblePlan
from planner.kernels import default_kernels
from planner.layout import ParallelConfig, homogeneous_plan
from planner.progress import Progress
from planner.results import SimResult
from planner.search.evaluate import Evaluation, LayoutModel
from planner.search.sharding import sharding_options, solve_ilp
from planner.search.space import Layout, Micro, SearchSpace, candidates, default_space, layouts
from planner.simulator import simulate
from planner.specs.cluster import ClusterSpec
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Sharding
from profiler.schema import fail

__all__ = ["Ranked", "SearchRequest", "SearchResult", "search"]

GIB = 1024**3
SOLVER_SOURCE = "sharding chosen by integer program (pulp/CBC) over all AMSP options"


@dataclass(frozen=True)
class SearchRequest:
    model: ModelSpec
    cluster: ClusterSpec
    gbs: int
    seq_len: int
    dtype: str = "bf16"
    objective: str = "throughput"  # throughput | cost | time-to-train
    tokens: float | None = None
    max_budget_usd: float | None = None
    top: int = 5
    attention: str | None = None
    confirm: int = 8  # leaders confirmed by the event simulator
    space: SearchSpace | None = None


@dataclass(frozen=True)
class Ranked:
    plan: Plan
    result: SimResult
    estimate_s: float
    price_per_gpu_hour_usd: float | None

    @property
    def usd_per_million_tokens(self) -> float | None:
        if self.price_per_gpu_hour_usd is None:
            return None
        per_s = self.price_per_gpu_hour_usd * self.result.num_gpus / 3600
        return per_s / self.result.tokens_per_s * 1e6

    def time_to_train_s(self, tokens: float | None) -> float | None:
        return None if tokens is None else tokens / self.result.tokens_per_s

    def run_cost_usd(self, tokens: float | None) -> float | None:
        ttt = self.time_to_train_s(tokens)
        if ttt is None or self.price_per_gpu_hour_usd is None:
            return None
        return ttt * self.price_per_gpu_hour_usd * self.result.num_gpus / 3600


@dataclass(frozen=True)
class SearchResult:
    ranked: list[Ranked]
    num_candidates: int
    num_fitting: int
    num_layouts: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)


def _subclusters(cluster: ClusterSpec) -> list[ClusterSpec]:
    """One homogeneous cluster per GPU type (this search plans one type at a time)."""
    out = []
    for gpu in dict.fromkeys(g.gpu for g in cluster.node_groups):
        groups = tuple(g for g in cluster.node_groups if g.gpu == gpu)
        islands = {g.island for g in groups}
        links = tuple(k for k in cluster.island_links if set(k.islands) <= islands)
        out.append(cluster if len(groups) == len(cluster.node_groups) else
                   replace(cluster, name=f"{cluster.name} [{gpu}]", node_groups=groups,
                           island_links=links))
    return out


def _gpu_counts(cluster: ClusterSpec, objective: str) -> tuple[int, ...]:
    """All GPUs for throughput; for cost or time to train also 1/2, 1/4, ... of them
    (in whole nodes), since fewer GPUs may be cheaper or fit a budget."""
    n = cluster.num_gpus
    if objective == "throughput":
        return (n,)
    per_node = cluster.node_groups[0].gpus_per_node or 1
    counts, k = [], n
    while k >= 1 and (k % per_node == 0 or k < per_node):
        counts.append(k)
        if k % 2:
            break
        k //= 2
    return tuple(counts)


def _price(cluster: ClusterSpec) -> float | None:
    prices = {g.price_per_gpu_hour_usd for g in cluster.node_groups}
    return None if None in prices else max(prices)  # type: ignore[type-var]


def _score(req: SearchRequest, iteration_s: float, num_gpus: int, price: float | None) -> float:
    """Lower is better: seconds per token (throughput, time to train) or $ per token."""
    per_token = iteration_s / (req.gbs * req.seq_len)
    if req.objective == "cost":
        assert price is not None
        return per_token * num_gpus * price / 3600
    return per_token


def _within_budget(req: SearchRequest, iteration_s: float, num_gpus: int,
                   price: float | None) -> bool:
    if req.max_budget_usd is None:
        return True
    assert req.tokens is not None and price is not None
    run_s = req.tokens / (req.gbs * req.seq_len) * iteration_s
    return run_s * num_gpus * price / 3600 <= req.max_budget_usd


def _check(req: SearchRequest, cluster: ClusterSpec) -> None:
    if req.objective not in ("throughput", "cost", "time-to-train"):
        fail("--objective", req.objective, "allowed: throughput, cost, time-to-train")
    if req.objective == "time-to-train" and req.tokens is None:
        fail("--objective", req.objective, "needs --tokens (the token budget to train on)")
    if req.max_budget_usd is not None and req.tokens is None:
        fail("--max-budget", req.max_budget_usd, "needs --tokens (what the budget buys)")
    if (req.objective == "cost" or req.max_budget_usd is not None) and _price(cluster) is None:
        fail("--objective" if req.objective == "cost" else "--max-budget", req.objective,
             "needs prices: a --cluster spec with price_per_gpu_hour_usd on every node group")


def _evaluate_all(req: SearchRequest, cluster: ClusterSpec, space: SearchSpace,
                  attention: str) -> tuple[list[Evaluation], dict[Layout, LayoutModel], int]:
    models: dict[Layout, LayoutModel] = {}
    evaluations: list[Evaluation] = []
    work = [(lo, mi) for lo in layouts(space, req.model, gbs=req.gbs, seq_len=req.seq_len)
            for mi in candidates(space, req.model, lo, gbs=req.gbs)]
    bar = Progress(f"searching {cluster.name}", len(work))
    for lo, mi in work:
        if lo not in models:
            models[lo] = LayoutModel(req.model, cluster, lo, dtype=req.dtype,
                                     seq_len=req.seq_len, gbs=req.gbs, attention=attention,
                                     optimizer="fused")
        evaluations.append(models[lo].evaluate(mi))
        bar.advance()
    bar.close()
    return evaluations, models, len(work)


def _ilp_sharding(lm: LayoutModel, micro: Micro) -> Sharding:
    """The sharding of one candidate re-chosen over every AMSP option as an integer
    program (the search loop scanned only the undominated ones)."""
    base = lm.stage_costs(micro)
    kinds = sorted(base)
    m = micro.num_microbatches(lm.gbs, lm.layout.dp)
    rest = {s: base[s].memory.total_bytes - base[s].memory.model_states_bytes for s in kinds}
    options = [lm.option(sh) for sh in sharding_options(lm.levels)]
    times = [lm.time_with(base, o, m, micro.vp) for o in options]
    memory = [[rest[s] + o.memory_bytes[i] for i, s in enumerate(kinds)] for o in options]
    chosen = solve_ilp(times, memory, [lm.capacity] * len(kinds))
    return options[chosen].sharding if chosen is not None else Sharding()


def _plan(req: SearchRequest, cluster: ClusterSpec, ev: Evaluation, sharding: Sharding,
          attention: str) -> Plan:
    lo, mi = ev.layout, ev.micro
    cfg = ParallelConfig(tp=lo.tp, pp=lo.pp, dp=lo.dp, cp=lo.cp, vp=mi.vp, mbs=mi.mbs,
                         gbs=req.gbs, seq_len=req.seq_len, recompute=mi.recompute,  # type: ignore[arg-type]
                         sequence_parallel=mi.sequence_parallel, sharding=sharding,
                         dtype=req.dtype)  # type: ignore[arg-type]
    sub = cluster.take(lo.num_gpus, where="search")
    kernels = default_kernels([g.device for g in sub.node_groups], attention=attention)
    return homogeneous_plan(req.model, sub, cfg, kernels=kernels)


def search(req: SearchRequest, *, simulate_fn: Callable[[Plan], SimResult] = simulate
           ) -> SearchResult:
    """Search every GPU type of `req.cluster`; raise InfeasiblePlan if nothing fits."""
    start = time.perf_counter()
    ranked: list[tuple[float, Ranked]] = []
    notes: list[str] = []
    total = fitting = n_layouts = 0
    closest: list[Evaluation] = []
    for cluster in _subclusters(req.cluster):
        _check(req, cluster)
        kernels = default_kernels([g.device for g in cluster.node_groups],
                                  attention=req.attention)
        space = req.space or default_space(
            req.model, num_gpus=_gpu_counts(cluster, req.objective),
            gpus_per_node=cluster.node_groups[0].gpus_per_node or 1, seq_len=req.seq_len)
        evals, models, count = _evaluate_all(req, cluster, space, kernels.attention)
        total, n_layouts = total + count, n_layouts + len(models)
        price = _price(cluster)
        ok = [e for e in evals if e.fits and
              _within_budget(req, e.iteration_s, e.layout.num_gpus, price)]
        fitting += len(ok)
        closest.extend(sorted((e for e in evals if not e.fits),
                              key=lambda e: e.peak_memory_bytes / e.capacity_bytes)[:1])
        ok.sort(key=lambda e: _score(req, e.iteration_s, e.layout.num_gpus, price))
        for ev in ok[:max(req.confirm, req.top)]:
            sharding = _ilp_sharding(models[ev.layout], ev.micro)
            plan = _plan(req, cluster, ev, sharding, kernels.attention)
            result = simulate_fn(plan)
            result = replace(result, sources={**result.sources, "sharding": SOLVER_SOURCE})
            score = _score(req, result.iteration_time_s, ev.layout.num_gpus, price)
            if _within_budget(req, result.iteration_time_s, ev.layout.num_gpus, price):
                ranked.append((score, Ranked(plan, result, ev.iteration_s, price)))
        if cluster is not req.cluster:
            notes.append(f"{cluster.name}: searched on its own; the other GPU types stay "
                         "idle in these plans (mixing them is planned separately)")
    if not ranked:
        raise InfeasiblePlan(_explain(req, closest, total))
    ranked.sort(key=lambda sr: sr[0])
    return SearchResult([r for _, r in ranked[:req.top]], total, fitting, n_layouts,
                        time.perf_counter() - start, notes)


def _explain(req: SearchRequest, closest: list[Evaluation], total: int) -> str:
    """Why nothing fits, how close the nearest candidate came, what would help."""
    if not closest:
        if total == 0:
            return (f"no configuration divides gbs {req.gbs} over these GPUs "
                    "(try a gbs that is a multiple of the GPU count)")
        return (f"every configuration that fits in memory exceeds the budget of "
                f"${req.max_budget_usd:,.0f} for {req.tokens:.3g} tokens")
    e = min(closest, key=lambda e: e.peak_memory_bytes / e.capacity_bytes)
    lo, mi, sh = e.layout, e.micro, e.sharding
    short = (e.peak_memory_bytes - e.capacity_bytes) / GIB
    need = e.peak_memory_bytes / GIB
    return (
        f"nothing fits in memory among {total} candidates. Closest: tp {lo.tp}, pp {lo.pp}, "
        f"dp {lo.dp}, cp {lo.cp}, mbs {mi.mbs}, {mi.recompute} recompute, sharding P/G/OS "
        f"{sh.params}/{sh.grads}/{sh.optim}: {need:.1f} GiB per GPU, {short:.1f} GiB over "
        f"the {e.capacity_bytes / GIB:.1f} GiB available. Recompute and sharding up to the "
        f"whole data-parallel group were already tried; it would fit with GPUs of at least "
        f"{need:.0f} GiB, or with more GPUs (about {need / (e.capacity_bytes / GIB):.1f}x as "
        f"many, so deeper pipelines or more sharding spread the model states)")

