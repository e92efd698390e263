"""ClusterSpec: node groups of GPUs, their networks, islands and datacenters.

A node group is a set of identical nodes. Consecutive nodes of a group may share one
NVLink domain (`nvlink_domain_gpus`: a GB200 NVL72 rack is 18 nodes of 4 GPUs whose NVLink
reaches all 72); elsewhere the domain is the node. Nodes of one *island* share a
non-blocking network fabric (an InfiniBand or RoCE island, or an Ethernet segment); islands are
joined by explicit links with a bandwidth and a latency (the link between two
datacenters is one of these). GPUs are numbered group by group, node by node.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from planner.specs.choices import DType, values
from planner.specs.files import refuse_other_kind
from planner.specs.limits import MAX_GPUS
from profiler.devices import DeviceSpec, IntraLinkName, NicName, device
from profiler.schema import SpecError, at, cached_hash, dump, fail, load_yaml, parse, spec_field

__all__ = ["NIC_GBIT_RANGE", "TRAIN_DTYPES", "ClusterSpec", "GpuSlot", "IslandLink",
           "NodeGroup", "by_name", "check_train_dtype", "homogeneous_cluster", "runs_dtype",
           "train_dtype", "load_cluster", "parse_gpus_arg"]

TRAIN_DTYPES = values(DType)  # what a model trains in (Plan.training.dtype)
NIC_GBIT_RANGE = (0.1, 100_000.0)  # a NIC's bandwidth, Gb/s (NodeGroup.nic_bandwidth_gbit_per_s)


def _check_domain(where: str, domain: int, per_node: int, why: str = "") -> None:
    """An NVLink domain is whole nodes (`NodeGroup.nvlink_domain_gpus`)."""
    if domain % per_node:
        fail(at(where, "nvlink_domain_gpus"), domain,
             f"a multiple of gpus_per_node ({per_node}): whole nodes share an NVLink domain"
             + why)


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """Identical nodes; fields left out take the GPU type's standard node from the catalog."""

    name: str
    gpu: str
    # Bounds: generous physical limits, so every derived time and price stays finite.
    num_nodes: int = spec_field(min=1, max=65_536)
    gpus_per_node: int | None = spec_field(default=None, min=1, max=256)
    intra_node_link: IntraLinkName | None = None
    intra_node_bandwidth_gb_per_s: float | None = spec_field(
        default=None, min=0.1, max=100_000, help="per GPU, per direction; 0.1 to 100,000")
    nic: NicName | None = None
    nics_per_node: int | None = spec_field(default=None, min=1, max=64)
    nic_bandwidth_gbit_per_s: float | None = spec_field(default=None, min=NIC_GBIT_RANGE[0],
                                                        max=NIC_GBIT_RANGE[1],
                                                        help="per NIC; 0.1 to 100,000")
    nvlink_domain_gpus: int | None = spec_field(
        default=None, min=1, max=65_536, help="GPUs of consecutive nodes sharing one NVLink "
        "domain, a multiple of gpus_per_node (GB200 NVL72: 72); default: the GPU type's "
        "standard node's, else the node")
    island: str = "island0"
    datacenter: str = "dc0"
    price_per_gpu_hour_usd: float | None = spec_field(default=None, min=0, max=10_000)
    gpu_spec: DeviceSpec | None = spec_field(
        default=None, help="the GPU type's numbers where they are not the shipped catalog's "
        "(set from the cluster's `devices` or a --catalog file)")

    @property
    def device(self) -> DeviceSpec:
        return self.gpu_spec or device(self.gpu)

    @property
    def num_gpus(self) -> int:
        assert self.gpus_per_node is not None, "resolve the cluster first"
        return self.num_nodes * self.gpus_per_node

    @property
    def intra_node_bandwidth_bytes_per_s(self) -> float:
        assert self.intra_node_bandwidth_gb_per_s is not None
        return self.intra_node_bandwidth_gb_per_s * 1e9

    def check(self, where: str) -> None:
        if self.nvlink_domain_gpus is not None and self.gpus_per_node is not None:
            _check_domain(where, self.nvlink_domain_gpus, self.gpus_per_node)

    @property
    def nodes_per_domain(self) -> int:
        """Consecutive nodes of this group that share one NVLink domain."""
        assert self.nvlink_domain_gpus is not None and self.gpus_per_node is not None
        return self.nvlink_domain_gpus // self.gpus_per_node

    @property
    def node_nic_bandwidth_bytes_per_s(self) -> float:
        """All NICs of one node together, one direction."""
        assert self.nics_per_node is not None and self.nic_bandwidth_gbit_per_s is not None
        return self.nics_per_node * self.nic_bandwidth_gbit_per_s * 1e9 / 8

    def resolved(self, where: str = "") -> NodeGroup:
        """This group with every default taken from its GPU type's standard node."""
        dev = self.device
        node = dev.node
        if node is None:  # a user-defined GPU without a standard node: the group says all
            for name in ("gpus_per_node", "nic", "nics_per_node", "nic_bandwidth_gbit_per_s"):
                if getattr(self, name) is None:
                    raise SpecError(f"{at(where, name)}: missing (GPU type {dev.name!r} "
                                    "defines no standard node to take it from)")
        if self.intra_node_link == "loopback" and dev.vendor != "cpu":
            raise SpecError(f"{at(where, 'intra_node_link')}: 'loopback' is not allowed for "
                            f"GPU type {dev.name!r} (it joins the processes of one CPU host; "
                            "leave the field out for the type's standard node's link)")
        if self.intra_node_link not in (None, "loopback") and dev.vendor == "cpu":
            raise SpecError(f"{at(where, 'intra_node_link')}: {self.intra_node_link!r} is not "
                            f"allowed for {dev.name!r} ranks (the processes of one CPU host "
                            "talk over 'loopback'; leave the field out)")
        per_node: int = self.gpus_per_node or node.gpus_per_node  # type: ignore[union-attr]  # checked above
        domain = (self.nvlink_domain_gpus or (node.nvlink_domain_gpus if node else None)
                  or per_node)
        _check_domain(where, domain, per_node,
                      "" if self.nvlink_domain_gpus else f" ({dev.name}'s standard node's; "
                      "set nvlink_domain_gpus for nodes of another size)")
        return replace(
            self,
            gpu=dev.name,
            gpus_per_node=per_node,
            nvlink_domain_gpus=domain,
            intra_node_link=self.intra_node_link or dev.intra_node_link,  # type: ignore[arg-type]  # resolved from the catalog's link name
            intra_node_bandwidth_gb_per_s=(self.intra_node_bandwidth_gb_per_s
                                           or dev.intra_node_bandwidth_gb_per_s),
            nic=self.nic or node.nic,  # type: ignore[union-attr]  # checked above
            nics_per_node=self.nics_per_node or node.nics_per_node,  # type: ignore[union-attr]  # checked above
            nic_bandwidth_gbit_per_s=self.nic_bandwidth_gbit_per_s or node.nic_bandwidth_gbit_per_s,  # type: ignore[union-attr]  # checked above
        )


@dataclass(frozen=True, kw_only=True)
class IslandLink:
    """The link joining two islands (e.g. two datacenters); shared by all traffic on it."""

    islands: tuple[str, ...]
    bandwidth_gbit_per_s: float = spec_field(min=0.1, max=1_000_000,
                                             help="aggregate, per direction; 0.1 to 1e6")
    latency_ms: float = spec_field(default=0.01, min=0, max=10_000, help="0 to 10 s")
    kind: NicName = "ethernet"
    price_per_gb_usd: float = spec_field(default=0.0, min=0, max=1_000,
                                         help="egress price of traffic")

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
    """Where one GPU sits: its global index, node group, global node index, local slot
    and NVLink domain (global index: the GPUs NVLink reaches from it are those of its
    domain, the node's or several nodes' on GB200 NVL72; beyond it the NICs)."""

    index: int
    group: int
    node: int
    local: int
    domain: int


MAX_NODE_GROUPS = 256
MAX_ISLANDS = 32  # each pair of islands needs a link


@cached_hash
@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    description: str | None = None
    devices: tuple[DeviceSpec, ...] = spec_field(
        default=(), help="GPU types defined here (the catalog's fields): they add to the "
        "catalog, or replace its entry of the same name, for this cluster")
    node_groups: tuple[NodeGroup, ...]
    island_links: tuple[IslandLink, ...] = ()

    def check(self, where: str) -> None:
        if not self.node_groups:
            fail(at(where, "node_groups"), [], "at least one node group")
        if len(self.node_groups) > MAX_NODE_GROUPS:
            fail(at(where, "node_groups"), f"{len(self.node_groups)} groups",
                 f"at most {MAX_NODE_GROUPS}")
        defined: dict[str, DeviceSpec] = {}  # names match in any case (`resolved`)
        for i, d in enumerate(self.devices):
            if d.name.lower() in defined:
                fail(at(where, f"devices[{i}].name"), d.name, "defined twice; names must be "
                     "unique")
            defined[d.name.lower()] = d
        names: set[str] = set()
        for i, g in enumerate(self.node_groups):
            if g.name in names:
                fail(at(where, f"node_groups[{i}].name"), g.name, "names must be unique")
            names.add(g.name)
            if g.gpu_spec is not None:  # a resolved group (plan files carry it)
                if g.gpu_spec.name.lower() != g.gpu.lower():
                    fail(at(where, f"node_groups[{i}].gpu_spec.name"), g.gpu_spec.name,
                         f"the group's gpu is {g.gpu!r}")
                if defined.get(g.gpu.lower(), g.gpu_spec) != g.gpu_spec:
                    fail(at(where, f"node_groups[{i}].gpu_spec"), g.gpu,
                         "differs from the cluster's `devices` entry of that name (define a "
                         "GPU type once, under `devices:`)")
            if g.gpu_spec is None and g.gpu.lower() not in defined:
                try:
                    device(g.gpu, where=at(where, f"node_groups[{i}].gpu"))
                except SpecError as err:
                    raise SpecError(f"{err} (or define it under "
                                    "`devices:`)") from None
        self._check_size(where)
        dc_of: dict[str, str] = {}
        for i, g in enumerate(self.node_groups):
            if dc_of.setdefault(g.island, g.datacenter) != g.datacenter:
                fail(at(where, f"node_groups[{i}].datacenter"), g.datacenter,
                     f"island {g.island!r} is already in datacenter {dc_of[g.island]!r}")
        islands = set(dc_of)
        if len(islands) > MAX_ISLANDS:
            fail(at(where, "node_groups"), f"{len(islands)} islands", f"at most {MAX_ISLANDS}")
        pairs: dict[frozenset[str], int] = {}
        for i, link in enumerate(self.island_links):
            for name in link.islands:
                if name not in islands:
                    fail(at(where, f"island_links[{i}].islands"), name,
                         "known islands: " + ", ".join(sorted(islands)))
            first = pairs.setdefault(frozenset(link.islands), i)
            if first != i:
                fail(at(where, f"island_links[{i}].islands"), list(link.islands),
                     f"those islands already have a link: island_links[{first}]")
        for a, b in itertools.combinations(sorted(islands), 2):
            if self.island_link(a, b) is None:
                raise SpecError(f"{at(where, 'island_links')}: islands {a!r} and {b!r} "
                                "have no link (add one with their bandwidth and latency)")
        if not self.is_resolved:  # node fields left to the catalog: named with their path
            self.resolved(where)  # here (a Plan resolves its cluster where it has none)

    def _check_size(self, where: str) -> None:
        """At most MAX_GPUS GPUs (the catalog's node size where a group leaves it out)."""
        own = by_name(self.devices)
        total = 0
        for g in self.node_groups:
            spec = g.gpu_spec or own.get(g.gpu.lower())  # a GPU type the file defines
            standard = (spec.node.gpus_per_node if spec is not None and spec.node is not None
                        else _standard_gpus_per_node(g.gpu))
            total += g.num_nodes * (g.gpus_per_node or standard or 1)
        if total > MAX_GPUS:
            fail(at(where, "node_groups"), f"{total:,} GPUs", f"at most {MAX_GPUS:,} in a cluster")

    def island_link(self, a: str, b: str) -> IslandLink | None:
        for link in self.island_links:
            if set(link.islands) == {a, b}:
                return link
        return None

    def resolved(self, where: str = "") -> ClusterSpec:
        """Every node group with its GPU type's numbers (this cluster's `devices` first)
        and its standard node's defaults."""
        own = by_name(self.devices)

        def named(g: NodeGroup) -> NodeGroup:
            """GPU names match in any case (as `device` looks them up); a group takes the
            defining entry's spelling, so that every later lookup by name agrees."""
            if g.gpu_spec is not None:
                return g
            if (mine := own.get(g.gpu.lower())) is not None:
                return replace(g, gpu=mine.name, gpu_spec=mine)
            try:
                return replace(g, gpu=device(g.gpu).name)
            except SpecError:  # named with its path by NodeGroup.resolved
                return g

        groups = tuple(named(g) for g in self.node_groups)
        return replace(self, node_groups=tuple(
            g.resolved(at(where, f"node_groups[{i}]")) for i, g in enumerate(groups)))

    @property
    def is_resolved(self) -> bool:
        """Whether every node field the catalog can default is filled in, and every group
        of a GPU type the cluster's `devices` define carries its numbers."""
        own = by_name(self.devices)
        return all(g.gpus_per_node is not None and g.intra_node_link is not None
                   and g.intra_node_bandwidth_gb_per_s is not None and g.nic is not None
                   and g.nics_per_node is not None and g.nic_bandwidth_gbit_per_s is not None
                   and g.nvlink_domain_gpus is not None
                   and (g.gpu_spec is not None or g.gpu.lower() not in own)
                   for g in self.node_groups)

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
            part = replace(first, num_nodes=1, gpus_per_node=num_gpus,
                           nvlink_domain_gpus=num_gpus)
            return replace(self, name=f"{self.name} (first {count_gpus(num_gpus)})",
                           node_groups=(part,), island_links=())
        nodes, problem = self._first_nodes(num_gpus)
        if problem is not None:
            fail(where, self.name, problem)
        # the groups the GPUs reach (`nodes` stops at the last of them)
        groups = [replace(g, num_nodes=n)
                  for g, n in zip(self.node_groups, nodes, strict=False)]
        if num_gpus == self.num_gpus:
            return self
        islands = {g.island for g in groups}
        links = tuple(k for k in self.island_links if set(k.islands) <= islands)
        return replace(self, name=f"{self.name} (first {count_gpus(num_gpus)})",
                       node_groups=tuple(groups), island_links=links)

    def take_problem(self, num_gpus: int) -> str | None:
        """Why the first `num_gpus` GPUs are not whole nodes (or part of the first node);
        None where they are (`take`)."""
        first = self.node_groups[0]
        assert first.gpus_per_node is not None, "resolve the cluster first"
        if num_gpus < first.gpus_per_node:
            return None
        return self._first_nodes(num_gpus)[1]

    def _first_nodes(self, num_gpus: int) -> tuple[list[int], str | None]:
        """The nodes of each group (in the file's order, up to the last one reached) that
        the first `num_gpus` GPUs fill, and why they are not whole nodes (None where
        they are)."""
        nodes: list[int] = []
        left = num_gpus
        for g in self.node_groups:
            if left == 0:
                break
            assert g.gpus_per_node is not None, "resolve the cluster first"
            n, rest = divmod(min(left, g.num_gpus), g.gpus_per_node)
            if rest:
                return nodes, (f"{num_gpus} GPUs do not fill whole nodes of "
                               f"{g.gpus_per_node} GPUs in group {g.name!r}")
            nodes.append(n)
            left -= n * g.gpus_per_node
        return nodes, None

    def group_of(self, gpu_index: int) -> NodeGroup:
        """The node group holding the cluster's GPU `gpu_index` (global order, `slots`)."""
        return self.node_groups[self.slots[gpu_index].group]

    def device_of(self, gpu: str) -> DeviceSpec:
        """The device of the node groups of GPU type `gpu`."""
        return next(g.device for g in self.node_groups if g.gpu == gpu)

    @functools.cached_property
    def slots(self) -> tuple[GpuSlot, ...]:
        """Every GPU in global order (computed once per cluster). Nodes are filled in
        order, so an NVLink domain is `nodes_per_domain` consecutive nodes of one group
        (the group's last domain may hold fewer); a domain never spans two groups."""
        out: list[GpuSlot] = []
        node = domain = 0
        for gi, g in enumerate(self.node_groups):
            assert g.gpus_per_node is not None, "resolve the cluster first"
            per_domain = g.nodes_per_domain
            for n in range(g.num_nodes):
                out.extend(GpuSlot(len(out), gi, node, k, domain + n // per_domain)
                           for k in range(g.gpus_per_node))
                node += 1
            domain += -(-g.num_nodes // per_domain)
        return tuple(out)


def _standard_gpus_per_node(gpu: str) -> int | None:
    try:
        node = device(gpu).node
    except SpecError:
        return None
    return node.gpus_per_node if node is not None else None


def count_gpus(n: int) -> str:
    """'1 GPU', '8 GPUs'."""
    return f"{n} GPU{'s' if n != 1 else ''}"


def check_train_dtype(devices: Iterable[DeviceSpec], dtype: str, *, where: str) -> None:
    """The one rule for a training dtype, for every command and every Plan (`DType`):
    each GPU type that trains must run it: bf16, fp16 and fp8 need the device's own peak
    for them (a V100 has no bf16: fp16 or fp32 there; FP8 needs Hopper, Ada or newer);
    tf32 runs TF32 tensor cores where the device has them and fp32 elsewhere."""
    if dtype not in TRAIN_DTYPES:
        fail(where, dtype, "allowed: " + ", ".join(TRAIN_DTYPES))
    for dev in dict.fromkeys(devices):
        if not runs_dtype(dev, dtype):
            offers: list[str] = [d for d in TRAIN_DTYPES if d in dev.peak_tflops]
            if "tf32" not in dev.peak_tflops and "fp32" in dev.peak_tflops:
                offers.append("tf32 (as fp32)")
            fail(where, dtype, f"{dev.name} has no {dtype}; it offers {', '.join(offers)}")


def train_dtype(devices: Iterable[DeviceSpec], asked: str | None, *, where: str,
                each_alone: bool = False, allowed: Iterable[str] | None = None) -> DType:
    """The training dtype a command runs: `asked` when given (checked against every GPU
    type), else the default, bf16 where every type has it and fp16 otherwise (mixed
    precision as on a V100 or T4; fp32 only on a type with neither, and on CPU ranks).

    `each_alone`: the GPU types are planned one at a time (a framework that does not mix
    them), so the dtype need only be one some type runs (`runs_dtype`; the others are
    left out of the plan), and the default is the first of bf16, fp16 that some type has
    and `allowed` (the framework's dtypes) holds, else fp32."""
    devices = list(dict.fromkeys(devices))
    if asked is not None:
        if each_alone and any(runs_dtype(d, asked) for d in devices):
            return DType(asked)
        check_train_dtype(devices, asked, where=where)
        return DType(asked)
    if devices and all(d.vendor == "cpu" for d in devices):
        return DType.FP32  # CPU ranks train in fp32, as `plan run` and the profiles do
    ok = set(TRAIN_DTYPES if allowed is None else allowed)
    for default in (DType.BF16, DType.FP16):
        have = [str(default) in dev.peak_tflops for dev in devices]
        if str(default) in ok and (any(have) if each_alone else all(have)):
            return default
    lacking = [d for d in devices if not runs_dtype(d, DType.FP32)]
    if lacking and not (each_alone and len(lacking) < len(devices)):
        # the last default: name the flag the user may give, not a field they never wrote
        dev = lacking[0]
        fail(where, None, f"a dtype {dev.name} trains in, named with {where} (it has no bf16, "
             f"fp16 or fp32 peak; it offers {', '.join(dev.peak_tflops) or 'none'})")
    return DType.FP32


def runs_dtype(device: DeviceSpec, dtype: str) -> bool:
    """Whether `device` trains in `dtype` (`check_train_dtype`'s rule for one type): its
    own peak for it, except tf32, which runs as fp32 where the device has no TF32 (and
    not at all where it has neither)."""
    return dtype in TRAIN_DTYPES and (dtype in device.peak_tflops or (
        dtype == DType.TF32 and "fp32" in device.peak_tflops))


def load_cluster(path: str, *, catalog: dict[str, DeviceSpec] | None = None) -> ClusterSpec:
    """A ClusterSpec from YAML, with the catalog's defaults filled in (`catalog`: device
    types of a --catalog file, which the cluster's own `devices` override)."""
    raw = load_yaml(path)
    refuse_other_kind(raw, path, "cluster", "`name` and `node_groups`: a plan's `cluster:` "
                      "section is one")
    if catalog and isinstance(raw, Mapping):
        raw = _with_catalog_devices(raw, catalog)
    return parse(ClusterSpec, raw, where=f"{path}:").resolved(f"{path}:")


def by_name(devices: Iterable[DeviceSpec]) -> dict[str, DeviceSpec]:
    """GPU types by their name in lower case: names match in any case, as `device` looks
    them up."""
    return {d.name.lower(): d for d in devices}


def _with_catalog_devices(raw: Mapping, catalog: dict[str, DeviceSpec]) -> dict:
    """A cluster file's data with the --catalog entries its node groups use added to its
    `devices` (before the file is checked, so that a type the catalog defines is known);
    the file's own definitions win. Names match in any case."""
    devices = raw.get("devices") or []
    mine = {str(d.get("name", "")).lower() for d in devices if isinstance(d, Mapping)}
    entries = by_name(catalog.values())
    groups = raw.get("node_groups") or []
    used = dict.fromkeys(str(g["gpu"]).lower() for g in groups
                         if isinstance(g, Mapping) and "gpu" in g)
    extra = [dump(entries[g]) for g in used if g in entries and g not in mine]
    return {**raw, "devices": [*devices, *extra]} if extra else dict(raw)


def _standard_group(gpu: str, count: int, where: str, text: str,
                    entries: Mapping[str, DeviceSpec]) -> tuple[NodeGroup, DeviceSpec]:
    """`count` GPUs of type `gpu` in the type's standard nodes (one partial node if
    fewer), as a node group named after the type; `text` is the flag's value, for errors."""
    dev = entries.get(gpu.lower()) or device(gpu, where=where)  # any case, as `device` takes them
    if dev.node is None:
        fail(where, text, f"{dev.name} defines no standard node: describe the "
             "cluster in a --cluster file")
    per_node = dev.node.gpus_per_node
    if count < 1:
        fail(where, text, "the GPU count must be ≥ 1")
    if count > MAX_GPUS:
        fail(where, text, f"the GPU count must be ≤ {MAX_GPUS:,}")
    if count > per_node and count % per_node:
        fail(where, text, f"more than one {dev.node.name} node needs a multiple of "
             f"{per_node} {dev.name} GPUs")
    nodes, per = (1, count) if count <= per_node else (count // per_node, per_node)
    return NodeGroup(name=dev.name.lower(), gpu=dev.name, num_nodes=nodes,
                     gpus_per_node=per), dev


def homogeneous_cluster(gpu: str, count: int, *, where: str = "--gpus",
                        catalog: dict[str, DeviceSpec] | None = None) -> ClusterSpec:
    """`count` GPUs of one type in the type's standard nodes (one partial node if fewer);
    `catalog` (a --catalog file) may define the type."""
    return _standard_cluster([(gpu, count)], where, f"{gpu}:{count}", catalog)


def _standard_cluster(parts: list[tuple[str, int]], where: str, text: str,
                      catalog: dict[str, DeviceSpec] | None) -> ClusterSpec:
    """Each (type, count) of `parts` in the type's standard nodes, all on one network
    fabric (one island): the types' standard nodes must have the same kind of NIC."""
    entries = by_name((catalog or {}).values())
    built = [_standard_group(gpu, count, where, text, entries) for gpu, count in parts]
    devs = [dev for _, dev in built]
    names = [dev.name for dev in devs]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        fail(where, text, f"each GPU type once ({twice} is listed twice: add its counts)")
    if len(devs) > 1 and any(dev.vendor == "cpu" for dev in devs):
        fail(where, text, "CPU ranks are a cluster of their own: CPU:N alone")
    nics = {dev.name: dev.node.nic for dev in devs if dev.node is not None}
    if len(set(nics.values())) > 1:
        kinds = ", ".join(f"{name}'s {nic}" for name, nic in nics.items())
        fail(where, text, f"one network for all types, but their standard nodes have "
             f"different NICs ({kinds}): describe the islands and the links joining them "
             "in a --cluster file (e.g. cluster_specs/mixed-nic.yaml)")
    total = sum(count for _, count in parts)
    if total > MAX_GPUS:
        fail(where, text, f"at most {MAX_GPUS:,} GPUs in all")
    own = tuple(dev for dev in devs if dev.name.lower() in entries)
    return ClusterSpec(name=" + ".join(f"{count}x {dev.name}"
                                       for (_, count), dev in zip(parts, devs, strict=True)),
                       devices=own, node_groups=tuple(g for g, _ in built)).resolved()


def parse_gpus_arg(text: str, *, catalog: dict[str, DeviceSpec] | None = None) -> ClusterSpec:
    """`TYPE:COUNT[,TYPE:COUNT...]` (the CLI's --gpus): each type in its standard nodes,
    all on one network fabric."""
    parts = []
    for item in text.split(","):
        gpu, sep, count = item.strip().rpartition(":")
        if not sep or not gpu or not re.fullmatch(r"\s*-?[0-9]{1,12}\s*", count):  # ASCII digits
            fail("--gpus", text, "expected TYPE:COUNT[,TYPE:COUNT...], e.g. A100-80GB-SXM:64 "
                 "or A100-80GB-SXM:32,V100-32GB-SXM2:64")
        if ":" in gpu:  # "A100:8:8" read as a type name
            fail("--gpus", text, "TYPE:COUNT, one count a type, e.g. A100-80GB-SXM:64")
        parts.append((gpu.strip(), int(count)))
    return _standard_cluster(parts, "--gpus", text, catalog)

