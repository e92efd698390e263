"""Planning on clusters of several GPU types (and islands, and datacenters).

Candidates: homogeneous plans on each GPU type alone (planner/search), and heterogeneous
templates on every combination of two or more types: pipelines with unlike stages
(Zorse), replicas of unlike types (mixed data parallelism). Each is split optimally
(planner/hetero/split.py), placed by island (Holmes, planner/hetero/placement.py),
priced with the closed form; the leaders are confirmed by the event simulator.

Baselines, each a planner behind the same interface and rated by the same simulator:
the fastest GPU type alone, the best heterogeneous template with layers (or micro-batches)
split uniformly, and with them split in proportion to throughput (Metis/Zorse heuristic).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from planner.hetero.candidates import Priced, Template, price
from planner.hetero.placement import Pool, pools_by_type
from planner.hetero.split import layer_split_proportional, layer_split_uniform
from planner.kernels import default_kernels
from planner.results import SimResult
from planner.specs.cluster import ClusterSpec
from planner.specs.plan import Plan, Sharding
from profiler.devices import device
from profiler.progress import ProgressBar
from profiler.store import Profiles

__all__ = ["Baseline", "baselines_for", "hetero_candidates", "kernels_for", "templates"]

MICRO = [(mbs, rc) for mbs in (1, 2, 4) for rc in ("none", "selective", "full")]


@dataclass(frozen=True)
class Baseline:
    name: str
    plan: Plan | None
    result: SimResult | None
    note: str = ""


def _speed(gpu: str) -> float:
    d = device(gpu)
    return d.peak_tflops.get("bf16", d.peak_tflops.get("fp16", 0.0))


def _tp_options(model: object, gpus_per_node: int) -> list[int]:
    heads, kv = model.num_heads, model.kv_heads  # type: ignore[attr-defined]
    return [t for t in (1, 2, 4, 8, 16) if t <= gpus_per_node and heads % t == 0
            and (kv % t == 0 or t % kv == 0)]


def templates(model: object, pools: dict[str, list[Pool]], gbs: int) -> Iterator[Template]:
    """Heterogeneous templates over every combination of two or more GPU types."""
    types = sorted(pools, key=lambda g: (-device(g).memory_gib, -_speed(g)))
    layers = model.num_layers  # type: ignore[attr-defined]
    total = {g: sum(len(p.gpus) for p in pools[g]) for g in types}
    tps = {g: _tp_options(model, min(p.gpus_per_node for p in pools[g])) for g in types}
    for size in range(2, len(types) + 1):
        for subset in itertools.combinations(types, size):
            for tp in itertools.product(*(tps[g] for g in subset)):
                units = {g: total[g] // t for g, t in zip(subset, tp, strict=True)}
                yield from _mixed_stages(subset, tp, units, layers, gbs)
                yield from _mixed_replicas(subset, tp, units, layers)


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
                    layers: int) -> Iterator[Template]:
    """Replicas of each type, all with pp stages (so layer boundaries align)."""
    for pp in (1, 2, 4, 8, 16, 32):
        if pp > layers or any(units[g] < pp for g in subset):
            continue
        reps = []
        for g, t in zip(subset, tp, strict=True):
            reps.extend([tuple([(g, t)] * pp)] * (units[g] // pp))
        yield Template("mixed-replicas", tuple(reps))


def _shardings(dp: int) -> list[Sharding]:
    if dp == 1:
        return [Sharding()]
    return [Sharding(), Sharding(optim=dp), Sharding(grads=dp, optim=dp),
            Sharding(params=dp, grads=dp, optim=dp)]


def hetero_candidates(model: object, cluster: ClusterSpec, *, gbs: int, seq_len: int,
                      dtype: str, attention: str, score: Callable[[Priced], float],
                      keep: int, profiles: Profiles | None = None
                      ) -> tuple[list[Priced], int, dict[str, Priced]]:
    """The `keep` best fitting heterogeneous candidates by `score`, how many were priced,
    and the best candidate using each type (for explaining idle GPUs)."""
    pools = pools_by_type(cluster)
    all_templates = list(templates(model, pools, gbs))
    bar = ProgressBar(len(all_templates), title="planning mixed GPU types")
    best: list[Priced] = []
    with_type: dict[str, Priced] = {}
    count = 0
    for done, t in enumerate(all_templates, 1):
        for (mbs, rc), sh in itertools.product(MICRO, _shardings(t.dp)):
            p = price(model, cluster, t, pools=pools, mbs=mbs, recompute=rc, sharding=sh,  # type: ignore[arg-type]
                      seq_len=seq_len, dtype=dtype, gbs=gbs, attention=attention,
                      profiles=profiles)
            count += 1
            if p is None or not p.fits:
                continue
            best.append(p)
            for g in {g for rep in t.replicas for g, _ in rep}:
                if g not in with_type or score(p) < score(with_type[g]):
                    with_type[g] = p
        best = sorted(best, key=score)[:keep]
        bar(done, f"{t.family}, {t.dp} replicas of {t.pp} stages")
    bar.close()
    return best, count, with_type


def baselines_for(best: Priced, model: object, cluster: ClusterSpec, *, gbs: int,
                  seq_len: int, dtype: str, attention: str,
                  profiles: Profiles | None = None) -> list[tuple[str, Priced | None]]:
    """The best template split the naive ways (uniform, proportional to throughput)."""
    pools = pools_by_type(cluster)
    t = best.template
    kw = dict(pools=pools, mbs=best.mbs, recompute=best.recompute, sharding=best.sharding,
              seq_len=seq_len, dtype=dtype, gbs=gbs, attention=attention, profiles=profiles)
    if t.family == "mixed-stages":
        speeds = [1.0 / _speed(g) / tp for g, tp in t.replicas[0]]  # time per layer ~
        uniform = price(model, cluster, t, layers=layer_split_uniform(model.num_layers, t.pp), **kw)  # type: ignore[arg-type, attr-defined]
        proportional = price(model, cluster, t,  # type: ignore[arg-type]
                             layers=layer_split_proportional(model.num_layers, speeds), **kw)  # type: ignore[attr-defined, arg-type]
        return [("uniform layer split", uniform), ("throughput-proportional layer split",
                                                   proportional)]
    total = gbs // best.mbs
    even = [total // t.dp + (1 if r < total % t.dp else 0) for r in range(t.dp)]
    rates = [_speed(rep[0][0]) * rep[0][1] for rep in t.replicas]
    share = [max(1, round(total * x / sum(rates))) for x in rates]
    share[max(range(t.dp), key=lambda r: rates[r])] += total - sum(share)
    uniform = price(model, cluster, t, layers=best.layers, microbatches=even, **kw)  # type: ignore[arg-type]
    proportional = price(model, cluster, t, layers=best.layers, microbatches=share, **kw)  # type: ignore[arg-type]
    return [("uniform batch split", uniform), ("throughput-proportional batch split",
                                               proportional)]


def kernels_for(cluster: ClusterSpec, attention: str | None) -> str:
    return default_kernels([g.device for g in cluster.node_groups], attention=attention).attention

