"""The optimisation problems of heterogeneous pipelines, solved exactly.

Layer split (Zorse, HexiScale): stage k costs t_k = `fixed_k + per_layer_k * n_k` per
micro-batch for n_k layers and can hold at most `max_k` layers in memory; choose n_k >= 1
with sum n_k = L. A 1F1B pipeline of m micro-batches takes (m - 1) * max_k t_k + sum_k t_k
(Narayanan et al. 2021), so that is the objective (`microbatches=m`); with many
micro-batches it is the slowest stage (`microbatches=None`: min max_k t_k). Solved as an
ILP (pulp, or scipy's milp), by an exact dynamic program, and (in the search loop) by
an exact parametric search; all agree.

Batch split (Metis, Zorse): replica r finishes m_r micro-batches in `fill_r + m_r * step_r`
seconds; choose integers m_r >= 1 with sum m_r = M so the replicas finish together (min of
the latest). An ILP; with two replicas the continuous optimum is analytic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["EXACT_MILP", "batch_split_analytic", "batch_split_ilp", "bottleneck", "layer_split_dp",
           "layer_split_fast", "layer_split_ilp", "layer_split_proportional", "proportional_split",
           "layer_split_uniform", "pipeline_cost"]

# scipy.optimize.milp's HiGHS stops at a 1e-4 relative gap by default (`mip_rel_gap`): a
# layer split 2e-5 slower than the optimum passed as optimal. The ILPs here are the exact
# answers the heuristics are checked against (pulp's CBC found this case's optimum).
EXACT_MILP = {"mip_rel_gap": 1e-9}


def bottleneck(split: Sequence[int], fixed: Sequence[float], per_layer: Sequence[float]) -> float:
    return max(f + p * n for n, f, p in zip(split, fixed, per_layer, strict=True))


def pipeline_cost(split: Sequence[int], fixed: Sequence[float], per_layer: Sequence[float],
                  microbatches: int | None) -> float:
    """The objective: (m - 1) * slowest + sum of stages, or the slowest if m is None."""
    times = [f + p * n for n, f, p in zip(split, fixed, per_layer, strict=True)]
    return max(times) if microbatches is None else (microbatches - 1) * max(times) + sum(times)


def _fill_cheapest(num_layers: int, per_layer: Sequence[float], caps: Sequence[int]) -> list[int]:
    """With every stage below its cap, the layers beyond one each go to the stages that
    add the least time per layer (this minimises the sum)."""
    split, extra = [1] * len(caps), num_layers - len(caps)
    for k in sorted(range(len(caps)), key=lambda k: per_layer[k]):
        add = min(caps[k] - 1, extra)
        split[k] += add
        extra -= add
    return split


def _feasible(num_layers: int, max_layers: Sequence[int]) -> bool:
    return len(max_layers) <= num_layers <= sum(max_layers) and min(max_layers) >= 1


def layer_split_dp(num_layers: int, fixed: Sequence[float], per_layer: Sequence[float],
                   max_layers: Sequence[int], *, microbatches: int | None = None
                   ) -> list[int] | None:
    """Exact split by dynamic programming. Slowest stage: best[k][l] is the smallest
    bottleneck of stages k.. holding l layers, O(stages * layers^2). Pipeline objective:
    for every cap z on the slowest stage, the same recursion minimising the sum of stages
    under that cap; the best (m - 1) * z + sum."""
    if microbatches is not None:
        return _dp_pipeline(num_layers, fixed, per_layer, max_layers, microbatches)
    stages = len(fixed)
    if not _feasible(num_layers, max_layers):
        return None
    inf = math.inf
    best = [[inf] * (num_layers + 1) for _ in range(stages + 1)]
    choice = [[0] * (num_layers + 1) for _ in range(stages + 1)]
    best[stages][0] = 0.0
    for k in range(stages - 1, -1, -1):
        for left in range(1, num_layers + 1):
            for n in range(1, min(max_layers[k], left) + 1):
                value = max(fixed[k] + per_layer[k] * n, best[k + 1][left - n])
                if value < best[k][left]:
                    best[k][left], choice[k][left] = value, n
    if best[0][num_layers] == inf:
        return None
    split, left = [], num_layers
    for k in range(stages):
        split.append(choice[k][left])
        left -= choice[k][left]
    return split


def _dp_pipeline(num_layers: int, fixed: Sequence[float], per_layer: Sequence[float],
                 max_layers: Sequence[int], microbatches: int) -> list[int] | None:
    stages = len(fixed)
    if not _feasible(num_layers, max_layers):
        return None
    caps_z = sorted({f + p * n for f, p, u in zip(fixed, per_layer, max_layers, strict=True)
                     for n in range(1, min(u, num_layers) + 1)})
    best, best_cost = None, math.inf
    for z in caps_z:
        inf = math.inf
        cost = [[inf] * (num_layers + 1) for _ in range(stages + 1)]
        choice = [[0] * (num_layers + 1) for _ in range(stages + 1)]
        cost[stages][0] = 0.0
        for k in range(stages - 1, -1, -1):
            for left in range(1, num_layers + 1):
                for n in range(1, min(max_layers[k], left) + 1):
                    t = fixed[k] + per_layer[k] * n
                    if t > z + 1e-12:
                        break
                    value = t + cost[k + 1][left - n]
                    if value < cost[k][left]:
                        cost[k][left], choice[k][left] = value, n
        if cost[0][num_layers] == inf:
            continue
        split, left = [], num_layers
        for k in range(stages):
            split.append(choice[k][left])
            left -= choice[k][left]
        total = pipeline_cost(split, fixed, per_layer, microbatches)
        if total < best_cost:
            best, best_cost = split, total
    return best


def least_feasible(values: Sequence[float], capacity: Callable[[float], list[int] | None]
                   ) -> tuple[int, list[int]] | None:
    """Binary search of sorted `values` for the first whose `capacity` is not None, with
    `capacity` monotone (once feasible, feasible for every larger value): (its index, its
    capacity), or None when even the largest is infeasible."""
    lo, hi = 0, len(values) - 1
    if hi < 0 or capacity(values[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if capacity(values[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    caps = capacity(values[lo])
    assert caps is not None
    return lo, caps


def layer_split_fast(num_layers: int, fixed: Sequence[float], per_layer: Sequence[float],
                     max_layers: Sequence[int], *, microbatches: int | None = None
                     ) -> list[int] | None:
    """The optimum by parametric search over the slowest stage's time z (one of the values
    fixed_k + per_layer_k * n): for a given z each stage can hold some layers; z is
    reachable when together they hold L. The smallest reachable z minimises the slowest
    stage (binary search). For the pipeline objective, every reachable z from there up is
    tried with the layers placed where they cost least (which minimises the sum), until
    (m - 1) * z alone exceeds the best total."""
    stages = len(fixed)
    if not _feasible(num_layers, max_layers):
        return None

    def capacity(z: float) -> list[int] | None:
        caps = []
        for f, p, u in zip(fixed, per_layer, max_layers, strict=True):
            n = min(u, math.floor((z - f) / p + 1e-9)) if z >= f else 0
            if n < 1:
                return None
            caps.append(n)
        return caps if sum(caps) >= num_layers else None

    values = sorted({f + p * n for f, p, u in zip(fixed, per_layer, max_layers, strict=True)
                     for n in range(1, min(u, num_layers - stages + 1) + 1)})
    found = least_feasible(values, capacity)
    if found is None:
        return None
    lo, caps = found
    first = _fill_cheapest(num_layers, per_layer, caps)
    if microbatches is None or first is None:
        return first
    best = first
    best_cost = pipeline_cost(best, fixed, per_layer, microbatches)
    # no split's sum of stage times is below this
    floor = sum(fixed) + sum(per_layer) + (num_layers - stages) * min(per_layer)
    for z in values[lo + 1:]:
        if (microbatches - 1) * z + floor >= best_cost:
            break
        grown = capacity(z)
        assert grown is not None  # capacity grows with z
        candidate = _fill_cheapest(num_layers, per_layer, grown)
        assert candidate is not None  # the capacity grew
        cost = pipeline_cost(candidate, fixed, per_layer, microbatches)
        if cost < best_cost - 1e-15:
            best, best_cost = candidate, cost
    return best


def layer_split_ilp(num_layers: int, fixed: Sequence[float], per_layer: Sequence[float],
                    max_layers: Sequence[int], *, solver: str = "pulp",
                    microbatches: int | None = None) -> list[int] | None:
    """min w_z z + sum_k w_n per_layer_k n_k s.t. z >= fixed_k + per_layer_k n_k,
    sum n_k = L, 1 <= n_k <= max_k, integer; (w_z, w_n) = (m - 1, 1), or (1, 0) for the
    slowest stage alone."""
    stages = len(fixed)
    if not _feasible(num_layers, max_layers):
        return None
    wz, wn = (1.0, 0.0) if microbatches is None else (float(microbatches - 1), 1.0)
    scale = max(max(fixed), max(per_layer), 1e-12)  # coefficients near 1 for the solvers
    if solver == "scipy":
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        # variables: n_0..n_{S-1}, z
        c = np.concatenate([wn * np.asarray(per_layer) / scale, [wz]])
        rows = [np.concatenate([np.eye(stages)[k] * per_layer[k] / scale, [-1.0]])
                for k in range(stages)]
        a = np.vstack(rows + [np.concatenate([np.ones(stages), [0.0]])])
        lo = np.concatenate([np.full(stages, -np.inf), [num_layers]])
        hi = np.concatenate([-np.asarray(fixed) / scale, [num_layers]])
        res = milp(c=c, constraints=LinearConstraint(a, lo, hi),
                   integrality=np.concatenate([np.ones(stages), [0]]),
                   bounds=Bounds(np.concatenate([np.ones(stages), [0]]),
                                 np.concatenate([np.asarray(max_layers, float), [np.inf]])),
                   options=EXACT_MILP)
        return [round(v) for v in res.x[:stages]] if res.success else None
    import warnings

    import pulp

    prob = pulp.LpProblem("layer_split", pulp.LpMinimize)
    n = [prob.add_variable(f"n{k}", 1, max_layers[k], cat="Integer") for k in range(stages)]
    z = prob.add_variable("z", 0, None)
    prob += wz * z + pulp.lpSum(wn * per_layer[k] / scale * n[k] for k in range(stages))
    prob += pulp.lpSum(n) == num_layers
    for k in range(stages):
        prob += z >= fixed[k] / scale + per_layer[k] / scale * n[k]
    with warnings.catch_warnings():  # pulp 3.3 deprecates its bundled CBC; it still ships it
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if pulp.LpStatus[status] != "Optimal":
        return None
    return [round(v.value()) for v in n]


def layer_split_uniform(num_layers: int, stages: int) -> list[int]:
    """The baseline that ignores the devices: layers as even as possible."""
    base, extra = divmod(num_layers, stages)
    return [base + (1 if k < extra else 0) for k in range(stages)]


def proportional_split(total: int, weights: Sequence[float]) -> list[int]:
    """`total` whole units in proportion to `weights`, at least one each: the largest
    remainders round up, and where the one-each floor overshoots, those furthest above
    their share give one back. Needs total >= len(weights)."""
    assert total >= len(weights) > 0 and all(w > 0 for w in weights)
    raw = [total * w / sum(weights) for w in weights]
    split = [max(1, math.floor(r)) for r in raw]
    order = sorted(range(len(raw)), key=lambda k: raw[k] - math.floor(raw[k]), reverse=True)
    i = 0
    while sum(split) < total:
        split[order[i % len(order)]] += 1
        i += 1
    while sum(split) > total:
        k = max((k for k in range(len(split)) if split[k] > 1), key=lambda k: split[k] - raw[k])
        split[k] -= 1
    return split


def layer_split_proportional(num_layers: int, per_layer: Sequence[float]) -> list[int]:
    """The Metis/Zorse heuristic: layers in proportion to each stage's speed (the inverse
    of its time per layer), at least one each."""
    return proportional_split(num_layers, [1.0 / p for p in per_layer])


def batch_split_ilp(total: int, fill: Sequence[float], step: Sequence[float], *,
                    solver: str = "pulp") -> list[int] | None:
    """Micro-batches per replica: min T s.t. T >= fill_r + step_r m_r, sum m_r = total,
    m_r >= 1 integer."""
    reps = len(step)
    if total < reps:
        return None
    scale = max(max(step), max(fill), 1e-12)
    if solver == "scipy":
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        c = np.zeros(reps + 1)
        c[-1] = 1.0
        rows = [np.concatenate([np.eye(reps)[r] * step[r] / scale, [-1.0]]) for r in range(reps)]
        a = np.vstack(rows + [np.concatenate([np.ones(reps), [0.0]])])
        lo = np.concatenate([np.full(reps, -np.inf), [total]])
        hi = np.concatenate([-np.asarray(fill) / scale, [total]])
        res = milp(c=c, constraints=LinearConstraint(a, lo, hi),
                   integrality=np.concatenate([np.ones(reps), [0]]),
                   bounds=Bounds(np.concatenate([np.ones(reps), [0]]),
                                 np.concatenate([np.full(reps, float(total)), [np.inf]])),
                   options=EXACT_MILP)
        return [round(v) for v in res.x[:reps]] if res.success else None
    import warnings

    import pulp

    prob = pulp.LpProblem("batch_split", pulp.LpMinimize)
    m = [prob.add_variable(f"m{r}", 1, total, cat="Integer") for r in range(reps)]
    t = prob.add_variable("t", 0, None)
    prob += t
    prob += pulp.lpSum(m) == total
    for r in range(reps):
        prob += t >= fill[r] / scale + step[r] / scale * m[r]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if pulp.LpStatus[status] != "Optimal":
        return None
    return [round(v.value()) for v in m]


def batch_split_analytic(total: float, fill: Sequence[float], step: Sequence[float]) -> float:
    """Two replicas, continuous: they finish together when
    fill_0 + step_0 m = fill_1 + step_1 (total - m); returns m (replica 0's share)."""
    (f0, f1), (s0, s1) = fill, step
    return (f1 - f0 + s1 * total) / (s0 + s1)
