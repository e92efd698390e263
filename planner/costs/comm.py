"""Collective times over the real path: a hierarchical alpha-beta model.

A group of ranks is seen as tiers: ranks inside a node (NVLink / NVSwitch / PCIe), nodes
inside an island (the NICs), and islands (the links between them, e.g. two datacenters).
Collectives run hierarchically, as NCCL does across nodes: a reduce-scatter inside each
tier, then the next tier works on the shard, so slow tiers carry the least data
(Thakur et al. 2005 for the per-phase costs; hierarchical NCCL rings and trees).
Each phase over f participants costs (f-1)/f * bytes / bandwidth plus its latency
steps (a ring's f-1 or a tree's 2*log2 f, whichever is fewer).

A measured collective profile of a device type (`plan profile --collectives`, N processes
on one host) answers the collectives of groups of N ranks inside one node of that type;
the model answers the rest.

Bandwidth per rank is the achievable fraction of the nominal one (profiler/data/links.yaml).
Across nodes every GPU of a node is assumed to communicate at once, so a rank gets the
node's NIC bandwidth divided by its GPUs; an island link is shared by every rank of every
group that crosses it at the same time (`concurrency` groups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from planner.specs.cluster import ClusterSpec, GpuSlot
from profiler.devices import link_kind
from profiler.store import Profiles

__all__ = ["COMM_SOURCE", "Tier", "collective_time_s", "group_tiers", "measured_collective_s"]

COMM_SOURCE = "alpha-beta collective model over the cluster's links (profiler/data/links.yaml)"


@dataclass(frozen=True)
class Tier:
    """One level of a group's hierarchy: `fanout` members joined at per-rank bandwidth."""

    name: str  # node | network | islands
    fanout: int
    bandwidth_bytes_per_s: float
    latency_s: float
    device: str | None = None  # the GPU type of a node tier whose nodes are all alike


def _nic_share_bytes_per_s(cluster: ClusterSpec, group_index: int) -> float:
    g = cluster.node_groups[group_index]
    assert g.nic is not None and g.gpus_per_node is not None
    return g.node_nic_bandwidth_bytes_per_s * link_kind(g.nic).bandwidth_efficiency / g.gpus_per_node


@cache
def group_tiers(cluster: ClusterSpec, devices: tuple[int, ...], concurrency: int = 1
                ) -> tuple[Tier, ...]:
    """Tiers of the group of GPUs `devices` (global indices), innermost first."""
    slots = cluster.slots
    members = [slots[d] for d in devices]
    by_node: dict[int, list[GpuSlot]] = {}
    for s in members:
        by_node.setdefault(s.node, []).append(s)
    tiers = []
    per_node = max(len(v) for v in by_node.values())
    if per_node > 1:
        bw, lat = math.inf, 0.0
        gpus = set()
        for node_members in by_node.values():
            g = cluster.node_groups[node_members[0].group]
            assert g.intra_node_link is not None
            kind = link_kind(g.intra_node_link)
            bw = min(bw, g.intra_node_bandwidth_bytes_per_s * kind.bandwidth_efficiency)
            lat = max(lat, kind.latency_s)
            gpus.add(g.device.name)
        tiers.append(Tier("node", per_node, bw, lat, gpus.pop() if len(gpus) == 1 else None))
    island_of = {s.node: cluster.node_groups[s.group].island for s in members}
    nodes_by_island: dict[str, set[int]] = {}
    for node, island in island_of.items():
        nodes_by_island.setdefault(island, set()).add(node)
    nodes_per_island = max(len(v) for v in nodes_by_island.values())
    nic_bw = min(_nic_share_bytes_per_s(cluster, s.group) for s in members)
    nic_lat = max(link_kind(cluster.node_groups[s.group].nic).latency_s  # type: ignore[arg-type]  # nic is set once the cluster is resolved
                  for s in members)
    if nodes_per_island > 1:
        tiers.append(Tier("network", nodes_per_island, nic_bw, nic_lat))
    islands = sorted(nodes_by_island)
    if len(islands) > 1:
        bw, lat = nic_bw, 0.0
        ranks_per_island = max(per_node * len(v) for v in nodes_by_island.values())
        for i, a in enumerate(islands):
            for b in islands[i + 1:]:
                link = cluster.island_link(a, b)
                assert link is not None, "ClusterSpec.check guarantees island links"
                share = (link.bandwidth_bytes_per_s * link_kind(link.kind).bandwidth_efficiency
                         / (concurrency * ranks_per_island))
                bw = min(bw, share)
                lat = max(lat, link.latency_s + nic_lat)
        tiers.append(Tier("islands", len(islands), bw, lat))
    return tuple(tiers)


def _steps(fanout: int) -> int:
    return min(fanout - 1, 2 * math.ceil(math.log2(fanout))) if fanout > 1 else 0


def _phase_s(size: float, tiers: Sequence[Tier]) -> float:
    """One reduce-scatter (or all-gather) pass through the tiers, innermost first."""
    total = 0.0
    for tier in tiers:
        f = tier.fanout
        total += (f - 1) / f * size / tier.bandwidth_bytes_per_s + _steps(f) * tier.latency_s
        size /= f
    return total


def measured_collective_s(kind: str, size_bytes: float, tiers: Sequence[Tier],
                          profiles: Profiles | None) -> float | None:
    """The profile's time of a collective of a group inside one node, if it has it."""
    if profiles is None or len(tiers) != 1 or tiers[0].name != "node" or not tiers[0].device:
        return None
    profile = profiles.get(tiers[0].device)
    if profile is None:
        return None
    return profile.collective_time_s(kind, size_bytes, tiers[0].fanout)


def collective_time_s(kind: str, size_bytes: float, tiers: Sequence[Tier], *,
                      profiles: Profiles | None = None) -> float:
    """Time of one collective whose per-rank buffer is `size_bytes`: measured where a
    profile of the group's device type has it, else the hierarchical alpha-beta model."""
    if not tiers or size_bytes <= 0:
        return 0.0
    measured = measured_collective_s(kind, size_bytes, tiers, profiles)
    if measured is not None:
        return measured
    if kind == "all_reduce":
        return 2.0 * _phase_s(size_bytes, tiers)
    if kind in ("all_gather", "reduce_scatter"):
        return _phase_s(size_bytes, tiers)
    slowest = min(t.bandwidth_bytes_per_s for t in tiers)
    latency = sum(t.latency_s for t in tiers)
    if kind == "send_recv":
        return size_bytes / slowest + latency
    if kind == "all_to_all":
        n = math.prod(t.fanout for t in tiers)
        return (n - 1) / n * size_bytes / slowest + sum(_steps(t.fanout) * t.latency_s for t in tiers)
    raise ValueError(f"unknown collective {kind!r}")
