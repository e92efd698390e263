"""Where the stages of heterogeneous pipelines run: pools of like GPUs and Holmes-style
placement by network island (Yang et al. 2024, Holmes).

A *pool* is the GPUs of one type in one island (one RDMA fabric, or one datacenter).
Data-parallel traffic (all replicas of a stage position) is heavy; pipeline traffic (one
activation per micro-batch) is light. So the replicas of a stage position should share an
island, and a pipeline may cross islands between positions. How many replicas of each
position go to each island is an assignment problem: an ILP that keeps each position in as
few islands as capacity allows, weighted by that position's data-parallel traffic.
Within an island, a position's replicas take consecutive GPUs, so tensor-parallel groups
stay inside a node (an NVLink domain) and data-parallel peers share nodes where they fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.hetero.split import EXACT_MILP
from planner.specs.cluster import ClusterSpec

__all__ = ["Pool", "assign_islands", "place", "pools_by_type"]


@dataclass(frozen=True)
class Pool:
    """The GPUs of one type in one island, node by node (global indices)."""

    gpu: str
    island: str
    gpus: tuple[int, ...]
    nvlink_domain_gpus: int  # the GPUs one tensor-parallel group may span over NVLink


def pools_by_type(cluster: ClusterSpec) -> dict[str, list[Pool]]:
    """GPU type -> its pools (one per island), in cluster order."""
    found: dict[tuple[str, str], list[int]] = {}
    per_domain: dict[tuple[str, str], int] = {}
    for slot in cluster.slots:
        g = cluster.node_groups[slot.group]
        key = (g.gpu, g.island)
        found.setdefault(key, []).append(slot.index)
        per_domain[key] = g.nvlink_domain_gpus or g.gpus_per_node or 1
    out: dict[str, list[Pool]] = {}
    for (gpu, island), gpus in found.items():
        out.setdefault(gpu, []).append(Pool(gpu, island, tuple(gpus), per_domain[(gpu, island)]))
    return out


def assign_islands(demand: Sequence[int], weight: Sequence[float], replicas: int,
                   capacity: Sequence[int], *, solver: str = "scipy") -> list[list[int]] | None:
    """Replicas of each stage position per island: x[k][i] >= 0 integers with
    sum_i x[k][i] = replicas and sum_k demand_k x[k][i] <= capacity_i (GPUs), minimising
    sum_k weight_k * (islands position k uses). `demand_k` is GPUs per replica."""
    positions, islands = len(demand), len(capacity)
    if islands == 1:
        return [[replicas] for _ in range(positions)] \
            if sum(demand) * replicas <= capacity[0] else None
    if solver == "pulp":
        return _assign_pulp(demand, weight, replicas, capacity)
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    nx = positions * islands  # x variables, then y (island used) variables
    c = np.concatenate([np.zeros(nx), np.repeat(np.asarray(weight, float), islands)])
    rows: list = []
    lo: list[float] = []
    hi: list[float] = []
    for k in range(positions):  # every replica of k placed
        row = np.zeros(2 * nx)
        row[k * islands:(k + 1) * islands] = 1
        rows.append(row)
        lo.append(replicas)
        hi.append(replicas)
    for i in range(islands):  # island capacity
        row = np.zeros(2 * nx)
        for k in range(positions):
            row[k * islands + i] = demand[k]
        rows.append(row)
        lo.append(-np.inf)
        hi.append(capacity[i])
    for j in range(nx):  # x <= replicas * y
        row = np.zeros(2 * nx)
        row[j], row[nx + j] = 1, -replicas
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0)
    res = milp(c=c, constraints=LinearConstraint(np.vstack(rows), lo, hi),
               integrality=np.ones(2 * nx),
               bounds=Bounds(0, np.concatenate([np.full(nx, replicas), np.ones(nx)])),
               options=EXACT_MILP)
    if not res.success:
        return None
    x = np.round(res.x[:nx]).astype(int)
    return [list(x[k * islands:(k + 1) * islands]) for k in range(positions)]


def _assign_pulp(demand: Sequence[int], weight: Sequence[float], replicas: int,
                 capacity: Sequence[int]) -> list[list[int]] | None:
    import warnings

    import pulp

    positions, islands = len(demand), len(capacity)
    prob = pulp.LpProblem("islands", pulp.LpMinimize)
    x = [[prob.add_variable(f"x{k}_{i}", 0, replicas, cat="Integer") for i in range(islands)]
         for k in range(positions)]
    y = [[prob.add_variable(f"y{k}_{i}", 0, 1, cat="Binary") for i in range(islands)]
         for k in range(positions)]
    prob += pulp.lpSum(weight[k] * y[k][i] for k in range(positions) for i in range(islands))
    for k in range(positions):
        prob += pulp.lpSum(x[k]) == replicas
        for i in range(islands):
            prob += x[k][i] <= replicas * y[k][i]
    for i in range(islands):
        prob += pulp.lpSum(demand[k] * x[k][i] for k in range(positions)) <= capacity[i]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if pulp.LpStatus[status] != "Optimal":
        return None
    return [[round(v.value()) for v in row] for row in x]


def place(slots: Sequence[tuple[str, int]], replicas: int, pools: dict[str, list[Pool]],
          weight: Sequence[float]) -> list[list[tuple[int, ...]]] | None:
    """GPUs for every (replica, stage position): `slots` are (GPU type, tp) per position.
    Positions of one type are assigned to that type's islands by `assign_islands`; returns
    devices[replica][position] (tp GPUs each), or None when they do not fit."""
    devices: list[list[tuple[int, ...]]] = [[() for _ in slots] for _ in range(replicas)]
    for gpu in dict.fromkeys(t for t, _ in slots):
        positions = [k for k, (t, _) in enumerate(slots) if t == gpu]
        type_pools = pools.get(gpu, [])
        demand = [slots[k][1] for k in positions]
        counts = assign_islands(demand, [weight[k] for k in positions], replicas,
                                [len(p.gpus) for p in type_pools])
        if counts is None:
            return None
        for i, pool in enumerate(type_pools):
            cursor = 0
            for row, k in zip(counts, positions, strict=True):
                tp = slots[k][1]
                placed = sum(1 for r in range(replicas) if devices[r][k])
                for r in range(placed, placed + row[i]):
                    devices[r][k] = pool.gpus[cursor:cursor + tp]
                    cursor += tp
    return devices
