"""ClusterSpec: node groups of GPUs, their networks, islands and datacenters.

A node group is a set of identical nodes. Nodes of one *island* share a non-blocking
network fabric (an InfiniBand or RoCE island, or an Ethernet segment); islands are
joined by explicit links with a bandwidth and a latency (the link between two
datacenters is one of these). GPUs are numbered group by group, node by node.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Literal

from profiler.devices import NIC_KINDS, DeviceSpec, device
from profiler.schema import SpecError, at, cached_hash, fail, load_yaml, parse, spec_field

__all__ = ["ClusterSpec", "GpuSlot", "IslandLink", "NodeGroup", "homogeneous_cluster",
           "load_cluster", "parse_gpus_arg"]

LinkName = Literal["nvlink", "nvswitch", "xgmi", "pcie", "pcie-host", "loopback"]
NicName = Literal["infiniband", "roce", "ethernet"]


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """Identical nodes; fields left out take the GPU type's standard node from the catalog."""

    name: str
    gpu: str
    num_nodes: int = spec_field(min=1)
    gpus_per_node: int | None = spec_field(default=None, min=1)
    intra_node_link: LinkName | None = None
    intra_node_bandwidth_gb_per_s: float | None = spec_field(default=None, gt=0,
                                                             help="per GPU, per direction")
    nic: NicName | None = None
    nics_per_node: int | None = spec_field(default=None, min=1)
    nic_bandwidth_gbit_per_s: float | None = spec_field(default=None, gt=0, help="per NIC")
    island: str = "island0"
    datacenter: str = "dc0"
    price_per_gpu_hour_usd: float | None = spec_field(default=None, min=0)

    def check(self, where: str) -> None:
        try:
            device(self.gpu)
        except SpecError as err:
            raise SpecError(f"{at(where, 'gpu')}: {str(err).split(': ', 1)[1]}") from None

    @property
    def device(self) -> DeviceSpec:
        return device(self.gpu)

    @property
    def num_gpus(self) -> int:
        assert self.gpus_per_node is not None, "resolve the cluster first"
        return self.num_nodes * self.gpus_per_node

    @property
    def intra_node_bandwidth_bytes_per_s(self) -> float:
        assert self.intra_node_bandwidth_gb_per_s is not None
        return self.intra_node_bandwidth_gb_per_s * 1e9

    @property
    def node_nic_bandwidth_bytes_per_s(self) -> float:
        """All NICs of one node together, one direction."""
        assert self.nics_per_node is not None and self.nic_bandwidth_gbit_per_s is not None
        return self.nics_per_node * self.nic_bandwidth_gbit_per_s * 1e9 / 8

    def resolved(self) -> NodeGroup:
        """This group with every default taken from the catalog's standard node."""
        dev = self.device
        node = dev.node
        return replace(
            self,
            gpu=dev.name,
            gpus_per_node=self.gpus_per_node or node.gpus_per_node,
            intra_node_link=self.intra_node_link or dev.intra_node_link,  # type: ignore[arg-type]  # resolved from the catalog's link name
            intra_node_bandwidth_gb_per_s=(self.intra_node_bandwidth_gb_per_s
                                           or dev.intra_node_bandwidth_gb_per_s),
            nic=self.nic or node.nic,
            nics_per_node=self.nics_per_node or node.nics_per_node,
            nic_bandwidth_gbit_per_s=self.nic_bandwidth_gbit_per_s or node.nic_bandwidth_gbit_per_s,
        )


@dataclass(frozen=True, kw_only=True)
class IslandLink:
    """The link joining two islands (e.g. two datacenters); shared by all traffic on it."""

    islands: tuple[str, ...]
    bandwidth_gbit_per_s: float = spec_field(gt=0, help="aggregate, per direction")
    latency_ms: float = spec_field(default=0.01, min=0)
    kind: NicName = "ethernet"
    price_per_gb_usd: float = spec_field(default=0.0, min=0, help="egress price of traffic")

    def check(self, where: str) -> None:
        if len(self.islands) != 2 or self.islands[0] == self.islands[1]:
            fail(at(where, "islands"), list(self.islands), "two different island names")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbit_per_s * 1e9 / 8

    @property
    def latency_s(self) -> float:
        return self.latency_ms * 1e-3


@dataclass(frozen=True)
class GpuSlot:
    """Where one GPU sits: its global index, node group, global node index and local slot."""

    index: int
    group: int
    node: int
    local: int


@cached_hash
@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    description: str | None = None
    node_groups: tuple[NodeGroup, ...]
    island_links: tuple[IslandLink, ...] = ()

    def check(self, where: str) -> None:
        if not self.node_groups:
            fail(at(where, "node_groups"), [], "at least one node group")
        names = [g.name for g in self.node_groups]
        for i, name in enumerate(names):
            if name in names[:i]:
                fail(at(where, f"node_groups[{i}].name"), name, "names must be unique")
        dc_of: dict[str, str] = {}
        for i, g in enumerate(self.node_groups):
            if dc_of.setdefault(g.island, g.datacenter) != g.datacenter:
                fail(at(where, f"node_groups[{i}].datacenter"), g.datacenter,
                     f"island {g.island!r} is already in datacenter {dc_of[g.island]!r}")
        islands = set(dc_of)
        for i, link in enumerate(self.island_links):
            for name in link.islands:
                if name not in islands:
                    fail(at(where, f"island_links[{i}].islands"), name,
                         "known islands: " + ", ".join(sorted(islands)))
        for a, b in itertools.combinations(sorted(islands), 2):
            if self.island_link(a, b) is None:
                raise SpecError(f"{at(where, 'island_links')}: islands {a!r} and {b!r} "
                                "have no link (add one with their bandwidth and latency)")

    def island_link(self, a: str, b: str) -> IslandLink | None:
        for link in self.island_links:
            if set(link.islands) == {a, b}:
                return link
        return None

    def resolved(self) -> ClusterSpec:
        return replace(self, node_groups=tuple(g.resolved() for g in self.node_groups))

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.num_nodes for g in self.node_groups)

    @property
    def is_homogeneous(self) -> bool:
        return len({(g.gpu, g.island) for g in self.node_groups}) == 1

    def take(self, num_gpus: int, *, where: str = "--cluster") -> ClusterSpec:
        """The first `num_gpus` GPUs, in whole nodes (or part of the first node), as a
        cluster of their own."""
        if num_gpus > self.num_gpus:
            fail(where, self.name, f"has {self.num_gpus} GPUs; the configuration needs {num_gpus}")
        first = self.node_groups[0]
        assert first.gpus_per_node is not None, "resolve the cluster first"
        if num_gpus < first.gpus_per_node:
            part = replace(first, num_nodes=1, gpus_per_node=num_gpus)
            return replace(self, name=f"{self.name} (first {num_gpus} GPUs)",
                           node_groups=(part,), island_links=())
        groups, left = [], num_gpus
        for g in self.node_groups:
            if left == 0:
                break
            assert g.gpus_per_node is not None, "resolve the cluster first"
            nodes, rest = divmod(min(left, g.num_gpus), g.gpus_per_node)
            if rest:
                fail(where, self.name, f"{num_gpus} GPUs do not fill whole nodes of "
                     f"{g.gpus_per_node} GPUs in group {g.name!r}")
            groups.append(replace(g, num_nodes=nodes))
            left -= nodes * g.gpus_per_node
        if num_gpus == self.num_gpus:
            return self
        islands = {g.island for g in groups}
        links = tuple(k for k in self.island_links if set(k.islands) <= islands)
        return replace(self, name=f"{self.name} (first {num_gpus} GPUs)",
                       node_groups=tuple(groups), island_links=links)

    @functools.cached_property
    def slots(self) -> tuple[GpuSlot, ...]:
        """Every GPU in global order (computed once per cluster)."""
        out: list[GpuSlot] = []
        node = 0
        for gi, g in enumerate(self.node_groups):
            assert g.gpus_per_node is not None, "resolve the cluster first"
            for _n in range(g.num_nodes):
                out.extend(GpuSlot(len(out), gi, node, k) for k in range(g.gpus_per_node))
                node += 1
        return tuple(out)


def load_cluster(path: str) -> ClusterSpec:
    """A ClusterSpec from YAML, with the catalog's defaults filled in."""
    return parse(ClusterSpec, load_yaml(path), where=f"{path}:").resolved()


def homogeneous_cluster(gpu: str, count: int, *, where: str = "--gpus") -> ClusterSpec:
    """`count` GPUs of one type in the type's standard nodes (one partial node if fewer)."""
    dev = device(gpu)
    per_node = dev.node.gpus_per_node
    if count < 1:
        fail(where, f"{gpu}:{count}", "the GPU count must be ≥ 1")
    if count > per_node and count % per_node:
        fail(where, f"{gpu}:{count}",
             f"more than one {dev.node.name} node needs a multiple of {per_node} GPUs")
    nodes, per = (1, count) if count <= per_node else (count // per_node, per_node)
    group = NodeGroup(name=dev.name.lower(), gpu=dev.name, num_nodes=nodes, gpus_per_node=per)
    return ClusterSpec(name=f"{count}x {dev.name}", node_groups=(group,)).resolved()


def parse_gpus_arg(text: str) -> ClusterSpec:
    """`TYPE:COUNT` (the CLI's --gpus) to a homogeneous cluster."""
    gpu, sep, count = text.rpartition(":")
    if not sep or not gpu or not count.strip().lstrip("-").isdigit():
        fail("--gpus", text, "expected TYPE:COUNT, e.g. A100-80GB-SXM:64")
    return homogeneous_cluster(gpu, int(count))


assert set(NIC_KINDS) == set(NicName.__args__)  # type: ignore[attr-defined]  # Literal's args at runtime
