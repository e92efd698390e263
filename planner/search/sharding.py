"""AMSP's sharding space and the choice within it (Chen et al. 2023).

Parameters, gradients and optimizer states each get a sharding group size from the
levels of the data-parallel group: replicated (1), the replicas inside a node (an NVLink
domain: NVL72's rack), those on 2, 4, … nodes, and the whole group. ZeRO-1/2/3 and MiCS are points of this space; a
framework runs only some of them (`allowed_options`, its patterns over (P, G, OS)).

The choice under a memory cap is a small integer program: one binary per option, exactly
one chosen, every stage within its memory, minimal iteration time. `solve_ilp` solves it
with pulp (CBC) or scipy's milp (HiGHS); `choose` gives the same optimum by scanning the
options that are not dominated (used inside the search loop, where the solver's start-up
would dominate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.export.frameworks import ShardPattern, matches_pattern
from planner.hetero.split import EXACT_MILP
from planner.specs.plan import Sharding

__all__ = ["ShardingOption", "allowed_options", "choose", "pareto_options", "sharding_levels",
           "sharding_options", "solve_ilp"]


def sharding_levels(dp: int, replicas_per_node: int) -> tuple[int, ...]:
    """Group sizes a model state may be sharded over: 1, within a node (`replicas_per_node`:
    those of one NVLink domain), across 2, 4, … of them, and all of the data-parallel
    group."""
    levels = {1, dp}
    unit = replicas_per_node if replicas_per_node > 1 and dp % replicas_per_node == 0 else 1
    size = unit
    while size <= dp:
        if dp % size == 0:
            levels.add(size)
        size *= 2
    return tuple(sorted(levels))


def sharding_options(levels: Sequence[int]) -> list[Sharding]:
    """Every nested (params | grads | optim) choice of levels."""
    out = []
    for i, p in enumerate(levels):
        for j, g in enumerate(levels[i:], start=i):
            if g % p:
                continue
            for os_ in levels[j:]:
                if os_ % g == 0:
                    out.append(Sharding(params=p, grads=g, optim=os_))
    return out


def allowed_options(levels: Sequence[int], *, dp: int,
                    patterns: Sequence[ShardPattern]) -> list[Sharding]:
    """The nested choices of `levels` that are an instance of one of `patterns` at `dp`
    replicas (a framework's sharding: ZeRO-1 only, MiCS, ...)."""
    return [sh for sh in sharding_options(levels)
            if any(matches_pattern((sh.params, sh.grads, sh.optim), p, dp) for p in patterns)]


@dataclass(frozen=True)
class ShardingOption:
    """One sharding with what it costs: per-stage memory and the time terms it adds."""

    sharding: Sharding
    memory_bytes: tuple[float, ...]  # per stage class, model states + sharding buffers
    costs_s: tuple[float, ...]  # time terms (each iteration time is non-decreasing in them)


def pareto_options(options: Sequence[ShardingOption]) -> list[ShardingOption]:
    """Drop options another one beats in every memory and every time term (they can never
    be optimal, whatever the activations and the cap)."""
    import numpy as np

    if not options:
        return []
    values = np.array([(*o.memory_bytes, *o.costs_s) for o in options], dtype=float)
    no_worse = (values[:, None, :] <= values[None, :, :]).all(axis=2)  # [a, b]: a <= b
    same = (values[:, None, :] == values[None, :, :]).all(axis=2)
    beaten = (no_worse & ~same).any(axis=0)
    return [o for o, out in zip(options, beaten, strict=True) if not out]


def choose(times_s: Sequence[float], memory_bytes: Sequence[Sequence[float]],
           caps_bytes: Sequence[float]) -> int | None:
    """Index of the fastest option whose every stage fits its cap (None: none fits)."""
    best, best_t = None, float("inf")
    for i, (t, mem) in enumerate(zip(times_s, memory_bytes, strict=True)):
        if t < best_t and all(m <= c for m, c in zip(mem, caps_bytes, strict=True)):
            best, best_t = i, t
    return best


def solve_ilp(times_s: Sequence[float], memory_bytes: Sequence[Sequence[float]],
              caps_bytes: Sequence[float], *, solver: str = "pulp") -> int | None:
    """The same choice as an integer program: min sum_i t_i x_i subject to sum_i x_i = 1,
    sum_i m_is x_i <= cap_s for every stage class s, x binary."""
    n, stages = len(times_s), len(caps_bytes)
    if n == 0:
        return None
    scale = max(max(caps_bytes), 1.0)  # keep coefficients near 1 for the solvers
    if solver == "scipy":
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        a = np.vstack([np.ones(n)] + [[memory_bytes[i][s] / scale for i in range(n)]
                                      for s in range(stages)])
        lo = np.concatenate([[1.0], np.full(stages, -np.inf)])
        hi = np.concatenate([[1.0], np.asarray(caps_bytes) / scale])
        res = milp(c=np.asarray(times_s), constraints=LinearConstraint(a, lo, hi),
                   integrality=np.ones(n), bounds=Bounds(0, 1), options=EXACT_MILP)
        return int(np.argmax(res.x)) if res.success else None
    import warnings

    import pulp

    prob = pulp.LpProblem("sharding", pulp.LpMinimize)
    x = [prob.add_variable(f"x{i}", 0, 1, cat="Binary") for i in range(n)]
    prob += pulp.lpSum(t * v for t, v in zip(times_s, x, strict=True))
    prob += pulp.lpSum(x) == 1
    for s in range(stages):
        prob += pulp.lpSum(memory_bytes[i][s] / scale * x[i] for i in range(n)) \
            <= caps_bytes[s] / scale
    with warnings.catch_warnings():  # pulp 3.3 deprecates its bundled CBC; it still ships it
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if pulp.LpStatus[status] != "Optimal":
        return None
    return max(range(n), key=lambda i: x[i].value() or 0.0)
