"""Collective and point-to-point times as NCCL runs them.

A group of ranks is seen as tiers: ranks inside an NVLink domain (NVLink / NVSwitch /
PCIe: a node, or the consecutive nodes of a GB200 NVL72 rack, `GpuSlot.domain`), domains
inside an island (the NICs: RDMA, or TCP sockets on Ethernet), and islands (the links
between them, e.g. two datacenters). Every "node" below reads "NVLink domain" where the
domain spans nodes: NCCL runs a multi-node NVLink (MNNVL) clique over the P2P transport as
it runs one node (NVIDIA/nccl#1159; NCCL 2.20.3 ncclTopoTuneModel: "MNNVL support - treat
as a single NVLink connected node", nNodes = 1), NVLS aside (2.20.3: "MNNVL: NVLS not yet
supported"), so NVLS stays inside one node.

Collectives follow NCCL's own cost model (NCCL 2.20.3 src/graph/tuning.cc, constants in
profiler/data/nccl.yaml, formulas in planner/data/reference/nccl_tuner.md): for every
enabled (algorithm, protocol) pair NCCL predicts latency + bytes / bandwidth and runs the
fastest (getAlgoInfo in src/enqueue.cc); so does `collective_time_s`.

* Algorithms: ring (every collective; a ring crosses each node boundary once per
  channel, so it is hierarchical in bandwidth), tree (all-reduce only: a chain inside
  each node, a binary tree across nodes) and, inside one Hopper-or-later NVSwitch node,
  NVLS (all-reduce in the switch).
* Protocols: LL (lowest latency, a quarter of the bandwidth, capped per architecture),
  LL128 (NVLink inside nodes and RDMA between them only; 92% of the bandwidth, capped
  per channel) and Simple (all the bandwidth, the highest latency).
* Latency grows with the steps: a ring all-reduce takes 2(n-1) steps, each one hop
  over NVLink, PCIe or the network (NCCL's hwLat, plus the NIC's or socket's own
  latency, links.yaml); a tree 2((ranks per node - 1) + log2 nodes) hops.
* Bus bandwidth is the slowest tier a ring crosses: a rank's achievable NVLink/PCIe
  bandwidth inside a node, the node's NICs shared by all its GPUs across nodes (every
  GPU of a node communicates at once in data-parallel sync), an island link shared by
  every group crossing it (`concurrency`). On Ethernet NCCL moves data through TCP
  sockets, which reach a measured fraction of the line rate and no more than a socket
  stream carries per NIC.
* Members on different rails (local GPU index) need an NVLink hop to the right NIC
  (NCCL's PXN) on every network step.

Point-to-point sends (pipeline activations, ring attention) take one Simple step over
the link joining the two ranks at its point-to-point bandwidth.

A measured collective profile of a device type (`plan profile --collectives`, N processes
on one host) answers the collectives of groups of N ranks inside one node of that type;
the model answers the rest.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

from planner.specs.cluster import ClusterSpec, GpuSlot, NodeGroup
from profiler.devices import LinkKind, NcclTuning, link_kind, nccl_tuning
from profiler.schema import cached_hash
from profiler.store import Profiles, crowd_variant

__all__ = ["ALGORITHMS", "COMM_SOURCE", "CPU_COMM_SOURCE", "PROTOCOLS", "Choice", "Tier",
           "Transfer", "clear_comm_caches", "collective_choices", "collective_time_s",
           "comm_source", "dispatch_time_s", "group_domains", "group_ranks", "group_tiers",
           "holders_reached", "measured_collective_s", "measured_crowd"]

COMM_SOURCE = ("NCCL's cost model (2.20.3: ring/tree, LL/LL128/Simple) over the cluster's links "
               "(profiler/data/nccl.yaml, links.yaml)")
# CPU ranks talk over gloo on their host: the same ring model over the loopback link
CPU_COMM_SOURCE = ("gloo between CPU ranks on one host, as a ring over the loopback link "
                   "(profiler/data/links.yaml: 300 us a step; the CPU entry's 2 GB/s, "
                   "profiler/data/devices.yaml)")

ALGORITHMS = ("ring", "tree", "nvls")
PROTOCOLS = ("ll", "ll128", "simple")
_US = 1e-6
_GB = 1e9


def comm_source(on_cpu: bool) -> str:
    """What prices collectives that no profile measured: NCCL's model, or gloo's on CPU
    ranks."""
    return CPU_COMM_SOURCE if on_cpu else COMM_SOURCE


@cached_hash
@dataclass(frozen=True)
class Tier:
    """One level of a group's hierarchy: `fanout` members of the level below, joined by
    one kind of link."""

    name: str  # node | network | islands
    fanout: int
    bandwidth_bytes_per_s: float  # bus bandwidth a ring of the group gets across this tier
    latency_s: float  # the transport's own latency per step (NIC, socket, island link)
    hw: str = "net"  # NCCL's hop-latency row: nvlink | pci | net
    p2p_bandwidth_bytes_per_s: float = math.inf  # one rank's send to a peer across it
    channels: int = 2  # NCCL channels over the tier
    rdma: bool = True  # false: NCCL's socket transport (or host-staged PCIe)
    device: str | None = None  # the GPU type of a node tier whose nodes are all alike
    arch: str | None = None  # the group's GPU architecture when all alike
    aligned: bool = True  # network tier: every node's members sit on the same rails
    nvls_bytes_per_s: float = 0.0  # node tier: all-reduce in the NVSwitch (0: none)
    # the outermost tier of a group split unevenly over its NVLink domains (2 + 1 ranks):
    # the group's ranks and domains, which the fanouts' product (3 x 2) overcounts; 0:
    # the product (`group_ranks`, `group_domains`)
    ranks: int = 0
    domains: int = 0


def group_ranks(tiers: Sequence[Tier]) -> int:
    """The ranks of the group `tiers` describe (of its inner tiers alone, where a slice)."""
    return tiers[-1].ranks or math.prod(t.fanout for t in tiers)


def group_domains(tiers: Sequence[Tier]) -> int:
    """The NVLink domains (nodes) the group spans."""
    return tiers[-1].domains or math.prod(t.fanout for t in tiers if t.name != "node")


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) NCCL could run, and its predicted time."""

    algorithm: str
    protocol: str
    latency_s: float
    bandwidth_bytes_per_s: float  # algorithm bandwidth: bytes / (time - latency)
    time_s: float


# -- the group's tiers ----------------------------------------------------------------------

def _transport(g: NodeGroup, sockets: bool) -> LinkKind:
    """How NCCL drives the NICs of group `g`: their own kind, or TCP sockets (Ethernet's
    kind) for a group crossing an island link without RDMA."""
    assert g.nic is not None
    return link_kind("ethernet" if sockets else g.nic)


def _nic_rank_share(g: NodeGroup, ranks_on_node: int, sockets: bool = False) -> float:
    """What one GPU of a node of group `g` gets of its node's NICs when every GPU of the
    node communicates at once: RDMA reaches `bandwidth_efficiency` of the line rate
    (`single_rank_efficiency` where the group has one rank on the node); TCP sockets
    their measured fraction (lower when several GPUs share them) and at most one socket
    stream per NIC."""
    assert g.nic is not None and g.gpus_per_node is not None and g.nics_per_node is not None
    nic = _transport(g, sockets)
    node = g.node_nic_bandwidth_bytes_per_s
    if nic.rdma:
        alone = ranks_on_node == 1 and nic.single_rank_efficiency is not None
        eff = nic.single_rank_efficiency if alone else nic.bandwidth_efficiency
        assert eff is not None
        return node * eff / g.gpus_per_node
    shared = g.gpus_per_node > 1 and nic.shared_efficiency is not None
    eff = nic.shared_efficiency if shared else nic.bandwidth_efficiency
    assert eff is not None
    node *= eff
    if nic.socket_stream_gbit_per_s is not None:
        node = min(node, g.nics_per_node * nic.socket_stream_gbit_per_s * 1e9 / 8)
    return node / g.gpus_per_node


def _node_tier(cluster: ClusterSpec, by_domain: dict[int, list[GpuSlot]], arch: str | None
               ) -> Tier:
    """The members inside each NVLink domain, over the domain's link."""
    per_node = max(len(v) for v in by_domain.values())
    bw = p2p = nvls = math.inf
    lat, channels, hw, rdma = 0.0, 1 << 30, "nvlink", True
    gpus = set()
    # NVLink SHARP: sm_90 and later, members of one node (NCCL 2.20.3 turns NVLS off on MNNVL)
    sharp_arch = (nccl_tuning().arch_row(arch) == "hopper"
                  and all(len({s.node for s in v}) == 1 for v in by_domain.values()))
    for node_members in by_domain.values():
        g = cluster.node_groups[node_members[0].group]
        assert g.intra_node_link is not None and g.gpus_per_node is not None
        kind = link_kind(g.intra_node_link)
        nominal = g.intra_node_bandwidth_bytes_per_s
        # a full mesh gives the group its links to the other members (`peer_share`):
        # a pair one peer's, an all-to-all of k every member's k - 1 at once
        share = kind.peer_share(max(collections.Counter(s.node for s in node_members)
                                    .values()), g.gpus_per_node)
        bw = min(bw, nominal * share * kind.bandwidth_efficiency)
        p2p = min(p2p, nominal * share * kind.send_efficiency)
        nvls = min(nvls, nominal * (kind.nvls_efficiency or 0.0) if sharp_arch else 0.0)
        lat = max(lat, kind.latency_s)
        channels = min(channels, kind.channels)
        hw = "pci" if kind.nccl_hw != "nvlink" else hw
        rdma = rdma and kind.rdma
        gpus.add(g.device.name)
    return Tier("node", per_node, bw, lat, hw, p2p, channels, rdma,
                gpus.pop() if len(gpus) == 1 else None, arch, nvls_bytes_per_s=nvls)


def _network_tier(cluster: ClusterSpec, by_domain: dict[int, list[GpuSlot]], fanout: int,
                  arch: str | None, sockets: bool = False) -> Tier:
    """The NVLink domains of the group joined by their nodes' NICs: a domain's members
    send through the NICs of the nodes they sit on, each its share of its own node's
    (over TCP sockets where `sockets`)."""
    bus = p2p = math.inf
    lat, channels, rdma = 0.0, 1 << 30, True
    for domain_members in by_domain.values():
        g = cluster.node_groups[domain_members[0].group]
        on_node = collections.Counter(s.node for s in domain_members).values()
        shares = [(_nic_rank_share(g, ranks, sockets), ranks) for ranks in on_node]
        bus = min(bus, sum(share * ranks for share, ranks in shares))
        p2p = min(p2p, min(share for share, _ in shares))
        nic = _transport(g, sockets)
        lat = max(lat, nic.latency_s)
        channels = min(channels, len(on_node) * (g.nics_per_node or 1) * nic.channels)
        rdma = rdma and nic.rdma
    rails = {tuple(sorted(s.local for s in v)) for v in by_domain.values()}
    return Tier("network", fanout, bus, lat, "net", p2p, channels, rdma, None, arch,
                aligned=len(rails) == 1)


@cache
def group_tiers(cluster: ClusterSpec, devices: tuple[int, ...], concurrency: int = 1
                ) -> tuple[Tier, ...]:
    """Tiers of the group of GPUs `devices` (global indices), innermost first;
    `concurrency` groups cross the island links at the same time. Members of one NVLink
    domain (`GpuSlot.domain`) share the inner tier; domains are joined by the NICs."""
    slots = cluster.slots
    members = [slots[d] for d in devices]
    by_domain: dict[int, list[GpuSlot]] = {}
    for s in members:
        by_domain.setdefault(s.domain, []).append(s)
    archs = {cluster.node_groups[s.group].device.arch for s in members}
    arch = archs.pop() if len(archs) == 1 else None
    tiers = []
    if max(len(v) for v in by_domain.values()) > 1:
        tiers.append(_node_tier(cluster, by_domain, arch))
    domains_by_island: dict[str, set[int]] = {}
    for s in members:
        domains_by_island.setdefault(cluster.node_groups[s.group].island, set()).add(s.domain)
    domains_per_island = max(len(v) for v in domains_by_island.values())
    islands = sorted(domains_by_island)
    # NCCL drives every connection of a communicator with one network transport: a group
    # across an island link without RDMA (InfiniBand and RoCE islands joined by Ethernet,
    # Holmes, Yang et al. 2023) runs over TCP sockets on every NIC, its own island's too
    sockets = any(not link_kind(link.kind).rdma
                  for i, a in enumerate(islands) for b in islands[i + 1:]
                  if (link := cluster.island_link(a, b)) is not None)
    network = _network_tier(cluster, by_domain, domains_per_island, arch, sockets)
    if domains_per_island > 1:
        tiers.append(network)
    if len(islands) > 1:
        per_node = max(len(v) for v in by_domain.values())
        ranks_per_island = max(per_node * len(v) for v in domains_by_island.values())
        # a ring's bus bandwidth across the islands: the NICs its members send through
        # (every channel's crossing leaves by another NIC), at most the island links'
        bus, lat, channels, rdma = network.bandwidth_bytes_per_s, 0.0, 1 << 30, True
        p2p = network.p2p_bandwidth_bytes_per_s
        for i, a in enumerate(islands):
            for b in islands[i + 1:]:
                link = cluster.island_link(a, b)
                assert link is not None, "ClusterSpec.check guarantees island links"
                kind = link_kind(link.kind)
                usable = link.bandwidth_bytes_per_s * kind.bandwidth_efficiency / concurrency
                bus = min(bus, usable)
                p2p = min(p2p, usable / ranks_per_island)
                lat = max(lat, link.latency_s + network.latency_s)
                channels = min(channels, kind.channels)
                rdma = rdma and kind.rdma
        tiers.append(Tier("islands", len(islands), bus, lat, "net", p2p, channels, rdma,
                          None, arch))
    if math.prod(t.fanout for t in tiers) != len(members):  # split unevenly
        tiers[-1] = replace(tiers[-1], ranks=len(members), domains=len(by_domain))
    return tuple(tiers)


# -- NCCL's model -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Shape:
    """What NCCL's model reads from a group: ranks, ranks per node, nodes, islands, the
    bus bandwidth and channels, the hop kinds and whether LL128 is enabled."""

    ranks: int
    per_node: int
    nodes: int
    islands: int
    bus_bytes_per_s: float
    channels: int
    intra_hw: str
    net_latency_s: float  # the NIC's own latency per network step
    island_latency_s: float
    pxn_hops: int  # extra NVLink hops per network step (members off their rails)
    row: str  # NCCL's architecture row
    ll128: bool
    nvls_bytes_per_s: float  # all-reduce algorithm bandwidth in the NVSwitch (0: none)

    @property
    def node_class(self) -> int:
        """Index into NCCL's per-node-count tables: 1 node, 2 nodes, 3 or more."""
        return 0 if self.nodes == 1 else 1 if self.nodes == 2 else 2


def _shape(tiers: Sequence[Tier], nccl: NcclTuning) -> _Shape:
    by_name = {t.name: t for t in tiers}
    node, network, islands = by_name.get("node"), by_name.get("network"), by_name.get("islands")
    per_node = node.fanout if node else 1
    nodes = group_domains(tiers)
    arch = tiers[0].arch
    ll128 = (arch in nccl.ll128_architectures and (node is None or node.hw == "nvlink")
             and all(t.rdma for t in tiers))
    return _Shape(ranks=group_ranks(tiers), per_node=per_node, nodes=nodes,
                  islands=islands.fanout if islands else 1,
                  bus_bytes_per_s=min(t.bandwidth_bytes_per_s for t in tiers),
                  channels=min(t.channels for t in tiers),
                  intra_hw=node.hw if node else "nvlink",
                  net_latency_s=network.latency_s if network else 0.0,
                  island_latency_s=islands.latency_s if islands else 0.0,
                  pxn_hops=0 if network is None or network.aligned else 1,
                  row=nccl.arch_row(arch), ll128=ll128,
                  nvls_bytes_per_s=node.nvls_bytes_per_s if node and nodes == 1 else 0.0)


def _hop_s(nccl: NcclTuning, hw: str, algorithm: str, protocol: str) -> float:
    return nccl.hop_latency_us[hw][algorithm][protocol] * _US  # type: ignore[index]  # names checked by the loader


def _net_hop_s(nccl: NcclTuning, s: _Shape, algorithm: str, protocol: str,
               transport_s: float) -> float:
    """One network step: NCCL's NET hop, the transport's latency (twice for Simple: the
    flush), and the NVLink hop to the right rail where members are off their rails."""
    flush = 2 if protocol == "simple" else 1
    return (_hop_s(nccl, "net", algorithm, protocol) + flush * transport_s
            + s.pxn_hops * _hop_s(nccl, "nvlink", algorithm, protocol))


def _ring_latency_s(nccl: NcclTuning, s: _Shape, kind: str, protocol: str,
                    size: float) -> float:
    reduce_twice = kind == "all_reduce"
    steps = (2 if reduce_twice else 1) * (s.ranks - 1)
    inter = (2 if reduce_twice else 1) * (s.nodes - 1)
    crossing = (2 if reduce_twice else 1) * (s.islands - 1)
    intra = _hop_s(nccl, s.intra_hw, "ring", protocol)
    if s.nodes > 1:
        factor = nccl.net_overhead_simple_factor if protocol == "simple" else 1.0
        intra = max(intra, nccl.net_overhead_us * factor * _US)
    net = _net_hop_s(nccl, s, "ring", protocol, s.net_latency_s)
    far = _net_hop_s(nccl, s, "ring", protocol, s.island_latency_s)
    lat = (nccl.base_latency_us["ring"][protocol] * _US  # type: ignore[index]
           + (steps - inter) * intra + (inter - crossing) * net + crossing * far)
    if (reduce_twice and s.nodes > 1 and protocol == "simple"
            and size / (s.channels * s.ranks) >= nccl.ring_plateau_min_bytes):
        lat *= (nccl.ring_plateau_factor_pre_ampere if s.row == "volta"
                else nccl.ring_plateau_factor)
    return lat


def _tree_latency_s(nccl: NcclTuning, s: _Shape, protocol: str) -> float:
    depth = int(math.log2(s.nodes)) if s.nodes > 1 else 0
    crossing = min(depth, math.ceil(math.log2(s.islands))) if s.islands > 1 else 0
    hops = ((s.per_node - 1) * _hop_s(nccl, s.intra_hw, "tree", protocol)
            + (depth - crossing) * _net_hop_s(nccl, s, "tree", protocol, s.net_latency_s)
            + crossing * _net_hop_s(nccl, s, "tree", protocol, s.island_latency_s))
    return nccl.base_latency_us["tree"][protocol] * _US + 2 * hops  # type: ignore[index]


def _ring_bandwidth(nccl: NcclTuning, s: _Shape, kind: str, protocol: str) -> float:
    """Ring bus bandwidth under `protocol` (bytes/s)."""
    bus = s.bus_bytes_per_s
    if protocol == "simple":
        return bus
    if protocol == "ll128":
        factor = nccl.ll128_factor if s.per_node > 1 else nccl.ll128_factor_one_rank_per_node
        cap = s.channels * nccl.ll128_max_bw_per_channel_gb_per_s[s.row][s.node_class] * _GB
        return min(bus * factor, cap)
    factor = (nccl.ring_ll_factor if s.nodes > 1 or kind == "all_reduce"
              else nccl.ring_ll_factor_single_node)
    return min(bus * factor, nccl.ll_max_bw_gb_per_s[s.row][s.node_class] * _GB)


def _tree_bandwidth(nccl: NcclTuning, s: _Shape, protocol: str, size: float) -> float:
    """Tree bus bandwidth under `protocol` (bytes/s)."""
    bus = min(s.bus_bytes_per_s * nccl.tree_factor,
              s.channels * nccl.tree_max_bw_per_channel_gb_per_s[s.row][s.node_class] * _GB)
    if protocol == "simple":
        log_size = int(math.log2(max(size, 64) / 64))
        table = nccl.tree_simple_correction
        return bus * table[log_size] if log_size < len(table) else bus
    if protocol == "ll":
        return min(bus * nccl.tree_ll_factor,
                   nccl.ll_max_bw_gb_per_s[s.row][s.node_class] * _GB)
    factor = (nccl.tree_ll128_factor_single_node if s.nodes == 1
              else nccl.tree_ll128_factor_multi_node)
    cap = s.channels * nccl.tree_ll128_max_bw_per_channel_gb_per_s[s.row][s.node_class] * _GB
    return min(bus * factor, cap)


def collective_choices(kind: str, size_bytes: float, tiers: Sequence[Tier]) -> list[Choice]:
    """Every (algorithm, protocol) NCCL would weigh for this collective, with its predicted
    time (NCCL 2.20.3 ncclTopoGetAlgoTime); NCCL runs the fastest."""
    nccl = nccl_tuning()
    s = _shape(tiers, nccl)
    out = []
    for algorithm in ("ring", "tree") if kind == "all_reduce" else ("ring",):
        for protocol in PROTOCOLS:
            if protocol == "ll128" and not s.ll128:
                continue
            if algorithm == "ring":
                bus = _ring_bandwidth(nccl, s, kind, protocol)
                steps = 2 * (s.ranks - 1) if kind == "all_reduce" else s.ranks - 1
                algbw = bus * s.ranks / steps
                lat = _ring_latency_s(nccl, s, kind, protocol, size_bytes)
            else:
                algbw = _tree_bandwidth(nccl, s, protocol, size_bytes) * nccl.tree_algbw_factor
                lat = _tree_latency_s(nccl, s, protocol)
            out.append(Choice(algorithm, protocol, lat, algbw, lat + size_bytes / algbw))
    if kind == "all_reduce" and s.nvls_bytes_per_s > 0:
        lat = nccl.nvls_latency_us * _US
        out.append(Choice("nvls", "simple", lat, s.nvls_bytes_per_s,
                          lat + size_bytes / s.nvls_bytes_per_s))
    return out


def _send_s(size: float, tiers: Sequence[Tier]) -> float:
    """One point-to-point transfer (NCCL p2p: Simple protocol, one step over the link
    joining the two ranks, at the link's point-to-point bandwidth)."""
    nccl = nccl_tuning()
    s = _shape(tiers, nccl)
    if s.islands > 1:
        hop = _net_hop_s(nccl, s, "ring", "simple", s.island_latency_s)
    elif s.nodes > 1:
        hop = _net_hop_s(nccl, s, "ring", "simple", s.net_latency_s)
    else:
        hop = _hop_s(nccl, s.intra_hw, "ring", "simple") + tiers[0].latency_s
    bandwidth = min(t.p2p_bandwidth_bytes_per_s for t in tiers)
    return nccl.base_latency_us["ring"]["simple"] * _US + hop + size / bandwidth


def measured_crowd(kind: str, tiers: Sequence[Tier], profiles: Profiles | None,
                   crowd: int) -> int:
    """How many of the host's processes were in the collective at once in the measurement
    that prices `kind` for a group inside one node (`tiers`) while `crowd` of the host's
    ranks run such collectives at once (every data-parallel group of a host reducing
    after the backward): the measured crowd nearest `crowd` (`crowd<N>` rows of a CPU
    profile, profiler/collectives.py), the group alone counting as its own size (the
    smaller of two as near); 0 where the group is priced alone (GPUs, no such rows)."""
    if (crowd <= 0 or profiles is None or len(tiers) != 1 or tiers[0].name != "node"
            or not tiers[0].device):
        return 0
    profile = profiles.get(tiers[0].device)
    n = tiers[0].fanout
    measured = profile.crowds.get((kind, n)) if profile is not None else None
    if not measured or crowd <= n:
        return 0
    nearest = min({n, *measured}, key=lambda p: (abs(p - crowd), p))
    return 0 if nearest == n else nearest


def measured_collective_s(kind: str, size_bytes: float, tiers: Sequence[Tier],
                          profiles: Profiles | None, crowd: int = 0) -> float | None:
    """The profile's time of a collective of a group inside one node, if it measured
    that collective at that group size: interpolated inside the sizes it measured, and
    outside them the model's time scaled by the profile's measured / model time at the
    nearest size it measured (as op times are, planner/costs/compute.py). `crowd`: the
    host's ranks in such collectives at once (`measured_crowd`)."""
    if profiles is None or len(tiers) != 1 or tiers[0].name != "node" or not tiers[0].device:
        return None
    profile = profiles.get(tiers[0].device)
    if profile is None:
        return None
    at_once = measured_crowd(kind, tiers, profiles, crowd)
    variant = crowd_variant(at_once) if at_once else None
    measured = profile.collective_time_s(kind, size_bytes, tiers[0].fanout, variant)
    if measured is not None:
        return measured
    return profile.scaled_s(
        kind="collective", name=kind, variant=variant, size=size_bytes, ranks=tiers[0].fanout,
        model_s=lambda row: _model_time_s(kind, size_bytes if row is None else row.bytes,
                                          tuple(tiers)))


def collective_time_s(kind: str, size_bytes: float, tiers: Sequence[Tier], *,
                      profiles: Profiles | None = None, crowd: int = 0) -> float:
    """Time of one collective whose per-rank buffer is `size_bytes` (all-gather and
    reduce-scatter: the whole gathered buffer): measured where a profile of the group's
    device type has it (with `crowd` of the host's ranks in such collectives at once:
    `measured_crowd`), else NCCL's fastest choice."""
    if not tiers or size_bytes <= 0:
        return 0.0
    measured = measured_collective_s(kind, size_bytes, tiers, profiles, crowd)
    if measured is not None:
        return measured
    return _model_time_s(kind, size_bytes, tuple(tiers))


@cache
def _model_time_s(kind: str, size_bytes: float, tiers: tuple[Tier, ...]) -> float:
    if kind in ("all_reduce", "all_gather", "reduce_scatter"):
        return min(c.time_s for c in collective_choices(kind, size_bytes, tiers))
    if kind == "send_recv":
        return _send_s(size_bytes, tiers)
    if kind == "all_to_all":
        # each rank sends (n-1)/n of its buffer, one peer after another on its own link
        # (alltoall cannot aggregate a node's NICs: sjeaugey, NVIDIA/nccl-tests#267); the
        # sends to peers in its own node go over NVLink/PCIe at the same time as those to
        # other nodes go through its NIC (NCCL runs alltoall as one group of p2p sends),
        # so a group over several nodes takes the slower of the two shares
        n = group_ranks(tiers)
        local = tiers[0].fanout if tiers[0].name == "node" and len(tiers) > 1 else 1
        if local == 1:
            return _send_s((n - 1) / n * size_bytes, tiers)
        return max(_send_s((local - 1) / n * size_bytes, tiers[:1]),
                   _send_s((n - local) / n * size_bytes, tiers))
    raise ValueError(f"unknown collective {kind!r}")


def holders_reached(experts: int, holders: int, top_k: int, *, consecutive: bool = False
                    ) -> float:
    """The expected number of `holders` (ranks or nodes, E/holders experts each, in order)
    holding at least one of a token's `top_k` of `experts` experts. Experts drawn as at
    random (a learned router's spread; Megatron's --moe-router-force-load-balancing draws
    random scores): holders x (1 - C(E - E/holders, k) / C(E, k)), a holder missing all k
    with that probability. `consecutive` (NeMo AutoModel's FakeBalancedGate,
    components/moe/layers.py: `arange(tokens * k).view(-1, k) % E`, token i takes experts
    ik .. ik+k-1 mod E): a window of k experts starting at offset ik mod E/holders in its
    first holder spans ceil((offset + k) / (E/holders)) holders; the offsets run over the
    multiples of gcd(k, E/holders), equally often."""
    if holders <= 1:
        return float(holders)
    per = experts // holders
    if consecutive:
        step = math.gcd(top_k, per)
        spans = [min(holders, -(-(offset + top_k) // per)) for offset in range(0, per, step)]
        return sum(spans) / len(spans)
    return holders * (1 - math.comb(experts - per, top_k) / math.comb(experts, top_k))


@cache
def dispatch_time_s(size_bytes: float, tiers: tuple[Tier, ...], *, top_k: int,
                    experts: int, consecutive: bool = False) -> float:
    """MoE token dispatch (or combine) as DeepEP runs it (deepseek-ai/DeepEP
    deep_ep/buffer.py `dispatch`: `is_token_in_rank [num_tokens, num_ranks]`,
    `num_tokens_per_rdma_rank`; `combine` reduces a rank's expert outputs of a token before
    sending it back; DeepSeek-V3 report §3.2.2). `size_bytes` = a rank's token copies
    (tokens x top_k x hidden), as Megatron's all-to-all dispatcher sends them, one per
    routed expert; DeepEP sends a token once to each rank holding one or more of its
    experts (`holders_reached` of the group's ranks), not once per expert. Within one node
    that is all NVLink, to the other ranks reached (n-1)/n of them. Across nodes a token
    crosses the network once per other node holding one of its experts, to the GPU of its
    own local index there, which forwards it over NVLink to the ranks of that node it is
    for (the source GPU does so for its own node): NVLink carries each rank reached but
    the forwarder, (local-1)/local of them. The two run at once."""
    n = group_ranks(tiers)
    if n <= 1:
        return 0.0
    local = tiers[0].fanout if tiers[0].name == "node" and len(tiers) > 1 else n
    nodes = group_domains(tiers) if len(tiers) > 1 else 1
    token_bytes = size_bytes / top_k
    ranks = holders_reached(experts, n, top_k, consecutive=consecutive)
    nvlink = token_bytes * ranks * (local - 1) / local
    if nodes == 1:
        return _send_s(nvlink, tiers)
    network = (token_bytes * holders_reached(experts, nodes, top_k, consecutive=consecutive)
               * (nodes - 1) / nodes)
    return max(_send_s(nvlink, tiers[:1]), _send_s(network, tiers))


@cached_hash
@dataclass(frozen=True)
class Transfer:
    """One collective or send as a framework issues it (`pieces` equal ones, e.g. buckets),
    kept so that traces can say what a transfer was (`describe`) without pricing it twice."""

    kind: str
    size_bytes: float  # one piece
    tiers: tuple[Tier, ...]
    pieces: int = 1
    # the host's processes in collectives at once in the measurement that priced it
    # (`measured_crowd`; 0: the group alone)
    crowd: int = 0

    def describe(self) -> str:
        """"4 x all_gather 396 MB, 64 ranks (8 per node/8 nodes): ring/simple"; on CPU
        ranks priced in a crowd, ", measured with 4 of the host's ranks at once"."""
        n = group_ranks(self.tiers)
        even = n == math.prod(t.fanout for t in self.tiers)
        where = "/".join(f"{'' if even or t.name != 'node' else 'up to '}{t.fanout} "
                         f"{_TIER_WORDS[t.name]}" for t in self.tiers)
        text = f"{self.kind} {self.size_bytes / 1e6:.3g} MB, {n} ranks ({where})"
        if self.kind in ("all_reduce", "all_gather", "reduce_scatter"):
            c = min(collective_choices(self.kind, self.size_bytes, self.tiers),
                    key=lambda c: c.time_s)
            text += f": {c.algorithm}/{c.protocol}"
        if self.crowd:
            text += f", measured with {self.crowd} of the host's ranks at once"
        return f"{self.pieces} x {text}" if self.pieces > 1 else text


_TIER_WORDS = {"node": "per node", "network": "nodes", "islands": "islands"}


def clear_comm_caches() -> None:
    """Forget cached groups and collective times (after link parameters changed)."""
    group_tiers.cache_clear()
    _model_time_s.cache_clear()
    dispatch_time_s.cache_clear()

