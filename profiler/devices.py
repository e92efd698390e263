"""Device catalog: datasheet numbers per GPU type, link kinds, and the local CPU host.

The numbers live in `profiler/data/*.yaml` with their sources; this module types and
validates them. Specs keep the units of their data files in field names; properties
give SI values (bytes, bytes/s, FLOP/s, seconds).
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from typing import Literal, get_args

from profiler.kernels import ARCH_ATTENTION, Attention
from profiler.schema import (
    SpecError,
    at,
    dump,
    fail,
    load_yaml,
    load_yaml_text,
    parse,
    spec_field,
)

__all__ = [
    "DTYPES",
    "LINK_KINDS",
    "NIC_KINDS",
    "ArchEfficiency",
    "DeviceSpec",
    "LinkKind",
    "NcclTuning",
    "NodeTemplate",
    "arch_efficiency",
    "catalog",
    "device_efficiency",
    "device",
    "dtype_bytes",
    "link_kind",
    "load_catalog",
    "match_device",
    "nccl_tuning",
    "parameter_overrides",
    "parse_catalog",
]

DTypeName = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
DTYPES: tuple[str, ...] = get_args(DTypeName)
# what joins a node's GPUs, and what joins nodes; a device's link is either
IntraLinkName = Literal["nvlink", "nvlink-mesh", "nvswitch", "xgmi", "pcie", "pcie-host",
                        "loopback"]
NicName = Literal["infiniband", "roce", "ethernet"]
LinkName = Literal[IntraLinkName, NicName]
LINK_KINDS: tuple[str, ...] = get_args(LinkName)
NIC_KINDS: tuple[str, ...] = get_args(NicName)

MIN_TFLOPS, MAX_TFLOPS = 0.001, 1_000_000  # a device's peak per dtype: 1 GFLOP/s to 1 EFLOP/s
_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
GIB = 1024**3


def dtype_bytes(dtype: str) -> int:
    """Storage size of one element; tf32 is stored as fp32."""
    return _BYTES[dtype]


@dataclass(frozen=True, kw_only=True)
class NodeTemplate:
    """The standard node a GPU type comes in (e.g. DGX A100: 8 GPUs, 8x 200 Gb/s IB)."""

    name: str
    # the bounds of a cluster's node group (planner/specs/cluster.py NodeGroup), which
    # takes these where it leaves a field out
    gpus_per_node: int = spec_field(min=1, max=256)
    nic: NicName = "infiniband"
    nics_per_node: int = spec_field(default=1, min=1, max=64)
    nic_bandwidth_gbit_per_s: float = spec_field(default=100.0, min=0.1, max=100_000)
    nvlink_domain_gpus: int | None = spec_field(
        default=None, min=1, max=65_536, help="GPUs of consecutive nodes that share one "
        "NVLink domain (a GB200 NVL72 rack: 72, 18 trays of 4); None: the node")

    def check(self, where: str) -> None:
        if self.nvlink_domain_gpus is not None and self.nvlink_domain_gpus % self.gpus_per_node:
            fail(at(where, "nvlink_domain_gpus"), self.nvlink_domain_gpus,
                 f"a multiple of gpus_per_node ({self.gpus_per_node}): whole nodes share "
                 "an NVLink domain")


@dataclass(frozen=True, kw_only=True)
class ArchEfficiency:
    """Parameters of the analytic device model for one architecture (profiler/analytic.py)."""

    # Bounds: physical ranges with room (a GPU at 0.1% of its peak, a 1 s kernel gap), so
    # that a catalog or cluster file's value cannot price an iteration at 1e300 s or inf.
    gemm_efficiency: float = spec_field(min=1e-3, max=1)
    gemm_tile_m: int = spec_field(min=1, max=4096)
    gemm_tile_n: int = spec_field(min=1, max=4096)
    gemm_k_half: float = spec_field(min=0, max=1e6)
    small_tile_penalty: float = spec_field(min=0, max=100)
    attention_efficiency: float = spec_field(min=1e-3, max=1)
    memory_efficiency: float = spec_field(min=1e-3, max=1)
    kernel_overhead_us: float = spec_field(min=0, max=1e6)
    launch_overhead_us: float = spec_field(min=0, max=1e6)
    tp_comm_overlap: float = spec_field(default=0.0, min=0, max=1)
    simt_gemm_efficiency: float | None = spec_field(
        default=None, min=1e-3, max=1, help="fraction of the single-issue FP32 peak a GEMM on "
        "the CUDA cores (no tensor cores: fp32 without TF32) sustains; None: the "
        "architecture's, else gemm_efficiency")
    dual_issue_fp32_gain: float | None = spec_field(
        default=None, min=0, max=1, help="on a device whose fp32 peak counts dual issue: "
        "the share of the second (INT32-shared) datapath's rate a CUDA-core GEMM gets; "
        "None: the architecture's, else 0")
    tensor_cores: bool = spec_field(default=True, help="matrix units for its 16-bit dtypes "
                                    "(false: Pascal, RDNA2 run every GEMM on the CUDA cores)")
    tf32_gemm_efficiency: float | None = spec_field(
        default=None, min=1e-3, max=1, help="fraction of the datasheet TF32 tensor peak a large "
        "TF32 GEMM sustains; None: gemm_efficiency (the 16-bit fraction)")
    fp8_gemm_efficiency: float | None = spec_field(
        default=None, min=1e-3, max=1, help="fraction of the datasheet FP8 tensor peak a large "
        "FP8 GEMM sustains; None: gemm_efficiency (the 16-bit fraction)")

    @property
    def kernel_overhead_s(self) -> float:
        return self.kernel_overhead_us * 1e-6

    def gemm_peak_fraction(self, math_dtype: str, *, simt: bool = False) -> float:
        """The fraction of its peak (profiler/analytic.py gemm_peak_flops) the largest tile
        of a GEMM in `math_dtype` sustains: each tensor-core precision its own where set
        (power and data movement per FLOP differ between them), the CUDA cores theirs."""
        if simt:
            own = self.simt_gemm_efficiency
        else:
            own = {"tf32": self.tf32_gemm_efficiency,
                   "fp8": self.fp8_gemm_efficiency}.get(math_dtype)
        return self.gemm_efficiency if own is None else own


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One GPU type (or the local CPU) with datasheet numbers."""

    name: str
    vendor: Literal["nvidia", "amd", "cpu"]
    arch: str
    # Bounds: generous physical limits, so every derived time, size and price stays finite
    memory_gib: float = spec_field(min=0.01, max=1_048_576)  # 10 MiB: below, no byte count
    memory_bandwidth_gb_per_s: float = spec_field(min=0.1, max=1_000_000)
    num_compute_units: int = spec_field(min=1, max=1_000_000, help="SMs or CUs; CPU cores "
                                        "in use")
    peak_tflops: dict[DTypeName, float] = spec_field(help=f"per dtype, {MIN_TFLOPS} to "
                                                     f"{MAX_TFLOPS:,}")
    intra_node_link: LinkName = "nvswitch"
    intra_node_bandwidth_gb_per_s: float = spec_field(default=100.0, min=0.1, max=100_000,
                                                      help="per GPU, per direction")
    node: NodeTemplate | None = spec_field(
        default=None, help="the standard node `--gpus TYPE:N` expands to (a cluster's node "
        "groups of a type without one must give their node fields)")
    source: str = spec_field(default="user-defined", help="where the numbers come from")
    attention: tuple[Attention, ...] | None = spec_field(
        default=None, help="attention backends it runs (default: its architecture's)")
    efficiency: ArchEfficiency | None = spec_field(
        default=None, help="analytic-model parameters of this device (default: its "
        "architecture's in profiler/data/efficiency.yaml), e.g. from `plan profile fit`")
    fp32_dual_issue: bool = spec_field(
        default=False, help="the fp32 peak counts a second FP32 datapath shared with INT32 "
        "(GA10x, AD10x): CUDA-core GEMMs run against half of it")

    def check(self, where: str) -> None:
        if not self.peak_tflops:
            fail(f"{where}.peak_tflops", self.peak_tflops, "at least one dtype")
        for dtype, value in self.peak_tflops.items():
            if not MIN_TFLOPS <= value <= MAX_TFLOPS:
                fail(f"{where}.peak_tflops.{dtype}", value,
                     f"must be {MIN_TFLOPS} to {MAX_TFLOPS:,}")
        if self.attention is not None and (not self.attention
                                           or len(set(self.attention)) != len(self.attention)):
            # an empty list fell back to the architecture's kernels without a word
            fail(at(where, "attention"), [str(a) for a in self.attention],
                 "the backends it runs, each once (leave it out for its architecture's)")
        if self.efficiency is None and self.arch not in _efficiencies():
            fail(at(where, "arch"), self.arch, "a known architecture ("
                 + ", ".join(_efficiencies()) + ") or an `efficiency:` of its own")
        if (self.intra_node_link == "loopback") != (self.vendor == "cpu"):
            # as a cluster file's node group is held (planner/specs/cluster.py)
            fail(at(where, "intra_node_link"), self.intra_node_link,
                 "loopback for a CPU host's processes, and only for them")

    def __hash__(self) -> int:  # a cache key of the cost model (peak_tflops is a dict)
        return hash((self.name, self.arch, self.memory_gib, self.memory_bandwidth_gb_per_s,
                     self.num_compute_units, tuple(sorted(self.peak_tflops.items())),
                     self.intra_node_link, self.intra_node_bandwidth_gb_per_s, self.attention,
                     self.efficiency, self.fp32_dual_issue))

    @property
    def attention_kernels(self) -> tuple[Attention, ...]:
        """The attention backends it runs, fastest first."""
        return self.attention or ARCH_ATTENTION.get(self.arch, (Attention.MATH,))

    def attention_in(self, dtype: str, *, dropout: bool = False) -> tuple[Attention, ...]:
        """The attention kernels it runs in `dtype`, fastest first: FlashAttention (and its
        Triton port) take 16-bit inputs on GPUs, so fp32 and tf32 runs go without; on a CPU
        a model with attention `dropout` runs the unfused path only (PyTorch's CPU
        kernels: "Both fused kernels do not support non-zero dropout",
        aten/src/ATen/native/transformers/sdp_utils_cpp.h)."""
        kernels = self.attention_kernels
        if self.vendor != "cpu" and dtype in ("fp32", "tf32"):
            kernels = tuple(k for k in kernels
                            if k not in (Attention.FLASH, Attention.FLASH_TRITON))
        if self.vendor == "cpu" and dropout:
            kernels = tuple(k for k in kernels if not k.fused)
        return kernels or (Attention.MATH,)

    def default_attention(self, dtype: str, *, dropout: bool = False) -> Attention:
        """The kernel it runs unasked in `dtype`: its fastest (math, the unfused path, only
        where nothing else runs)."""
        kernels = self.attention_in(dtype, dropout=dropout)
        return next(k for k in kernels if k is not Attention.MATH or len(kernels) == 1)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gb_per_s * 1e9

    @property
    def intra_node_bandwidth_bytes_per_s(self) -> float:
        return self.intra_node_bandwidth_gb_per_s * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for `dtype`; a dtype the device lacks is a SpecError."""
        if dtype not in self.peak_tflops:
            fail("dtype", dtype, f"{self.name} offers {', '.join(self.peak_tflops)}")
        return self.peak_tflops[dtype] * 1e12


@dataclass(frozen=True, kw_only=True)
class LinkKind:
    """What NCCL achieves over one kind of link (profiler/data/links.yaml explains each
    field and names its source)."""

    nccl_hw: Literal["nvlink", "pci", "net"]
    latency_us: float = spec_field(min=0, help="the transport's own latency per step")
    bandwidth_efficiency: float = spec_field(gt=0, max=1)
    p2p_efficiency: float | None = spec_field(default=None, gt=0, max=1)
    channels: int = spec_field(min=1)
    rdma: bool = spec_field()
    shared_efficiency: float | None = spec_field(default=None, gt=0, max=1)
    single_rank_efficiency: float | None = spec_field(default=None, gt=0, max=1)
    nvls_efficiency: float | None = spec_field(default=None, gt=0, max=1)
    socket_stream_gbit_per_s: float | None = spec_field(default=None, gt=0)
    full_mesh: bool = False
    source: str = spec_field()

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    def peer_share(self, members: int, gpus_per_node: int) -> float:
        """Fraction of a GPU's intra-node bandwidth a group of `members` GPUs of a node of
        `gpus_per_node` reaches: all of it, except on a full mesh (`full_mesh`), where
        the figure is a GPU's links to all its peers together and a group uses its
        links to the other members only, (members - 1) / (gpus_per_node - 1), in its
        rings and its all-to-alls alike; a pair (a send) one peer's, 1 / (gpus_per_node
        - 1)."""
        if not self.full_mesh or gpus_per_node <= 2:
            return 1.0
        return max(1, members - 1) / (gpus_per_node - 1)

    @property
    def send_efficiency(self) -> float:
        """Fraction of the nominal bandwidth a point-to-point transfer reaches."""
        return self.p2p_efficiency if self.p2p_efficiency is not None else self.bandwidth_efficiency


ProtocolTable = dict[Literal["ll", "ll128", "simple"], float]
ArchRow = dict[str, tuple[float, float, float]]


@dataclass(frozen=True, kw_only=True)
class NcclTuning:
    """NCCL's cost-model constants (profiler/data/nccl.yaml, from NCCL 2.20.3's
    src/graph/tuning.cc): latencies in us, bandwidths in GB/s, as in the source."""

    version: str
    source: str
    base_latency_us: dict[Literal["ring", "tree"], ProtocolTable]
    hop_latency_us: dict[Literal["nvlink", "pci", "net"], dict[Literal["ring", "tree"], ProtocolTable]]
    net_overhead_us: float = spec_field(min=0)
    net_overhead_simple_factor: float = spec_field(min=1)
    ring_ll_factor: float = spec_field(gt=0, max=1)
    ring_ll_factor_single_node: float = spec_field(gt=0, max=1)
    ll128_factor: float = spec_field(gt=0, max=1)
    ll128_factor_one_rank_per_node: float = spec_field(gt=0, max=1)
    tree_factor: float = spec_field(gt=0, max=1)
    tree_ll_factor: float = spec_field(gt=0, max=1)
    tree_ll128_factor_single_node: float = spec_field(gt=0, max=1)
    tree_ll128_factor_multi_node: float = spec_field(gt=0, max=1)
    tree_algbw_factor: float = spec_field(gt=0, max=1)
    ll_max_bw_gb_per_s: ArchRow
    ll128_max_bw_per_channel_gb_per_s: ArchRow
    tree_ll128_max_bw_per_channel_gb_per_s: ArchRow
    tree_max_bw_per_channel_gb_per_s: ArchRow
    tree_simple_correction: tuple[float, ...]
    ring_plateau_factor: float = spec_field(min=1)
    ring_plateau_factor_pre_ampere: float = spec_field(min=1)
    ring_plateau_min_bytes: float = spec_field(min=0)
    ll128_architectures: tuple[str, ...]
    nvls_latency_us: float = spec_field(min=0)
    architecture_rows: dict[str, str]

    def arch_row(self, arch: str | None) -> str:
        """The row of the per-architecture tables NCCL uses for `arch` (None: mixed
        architectures, whose lowest NCCL cannot know here: Volta's, the most cautious)."""
        return self.architecture_rows.get(arch or "", "volta")


_DEVICE_FIELDS = frozenset(f.name for f in fields(DeviceSpec))


def parse_catalog(raw: object, *, where: str) -> dict[str, DeviceSpec]:
    """Device types from a mapping in the catalog's format (name -> fields)."""
    if not isinstance(raw, Mapping):
        fail(where.rstrip(":"), raw, "a mapping of GPU type names to their fields "
             "(the format of profiler/data/devices.yaml)")
    for name, entry in raw.items():
        if isinstance(entry, Mapping) and "name" in entry and str(entry["name"]) != str(name):
            fail(at(at(where, str(name)), "name"), entry["name"],
                 f"the entry's key ({name}) or left out: the key names the type")
    return {str(name): parse(DeviceSpec, {"name": str(name), **entry}
                             if isinstance(entry, Mapping) else entry, where=at(where, str(name)))
            for name, entry in raw.items()}


def load_catalog(path: str) -> dict[str, DeviceSpec]:
    """A catalog file (`--catalog FILE`, or what `plan profile fit` writes): device types
    that add to the shipped catalog or override its entries of the same name. An entry
    for a shipped type may give only the fields it changes (`{A100-80GB-SXM: {memory_gib:
    40}}`), and a field holding a mapping only the keys it changes (`peak_tflops: {bf16:
    400}` keeps the shipped fp32, tf32 and fp16 peaks; it dropped them); the rest are the
    shipped entry's. Two entries naming one type (in any case) are refused."""
    raw = load_yaml(path)
    if isinstance(raw, Mapping) and ({"node_groups"} <= raw.keys() or {"pipelines"} <= raw.keys()):
        kind = "a plan file" if "pipelines" in raw else "a cluster file"
        fail(path, kind, "a catalog file: GPU type names, each with its fields (the format "
             "of profiler/data/devices.yaml; `plan profile fit -o` writes one)")
    if isinstance(raw, Mapping) and list(raw) == ["devices"] and not (
            isinstance(raw["devices"], Mapping) and _DEVICE_FIELDS & raw["devices"].keys()):
        # a cluster file's `devices:` section (a list of entries with names), or the
        # catalog's mapping under that key: "devices" read as a GPU type, its types as
        # unknown fields
        fail(at(f"{path}:", "devices"), "devices", "a catalog file names its GPU types at "
             "the top level, without `devices:` (that section belongs in a cluster file), "
             "e.g. `MY-GPU: {vendor: nvidia, arch: hopper, ...}`")
    if isinstance(raw, Mapping):
        seen: dict[str, str] = {}
        for name in raw:
            first = seen.setdefault(str(name).lower(), str(name))
            if first != str(name):  # the later one won without a word
                fail(at(f"{path}:", str(name)), str(name), f"one entry a type: {first!r} "
                     "names it too (names are compared without case)")
        shipped = _by_lower()  # an entry names a shipped type in any case
        raw = {(spec.name if (spec := shipped.get(str(name).lower())) else name):
               (_merged(_fields(spec), _sourced(entry, spec, path))
                if spec is not None and isinstance(entry, Mapping) else entry)
               for name, entry in raw.items()}
    return parse_catalog(raw, where=f"{path}:")


def _sourced(entry: Mapping, shipped: DeviceSpec, path: str) -> Mapping:
    """An override of a shipped entry that names its changes as its source (it kept the
    datasheet's, so `plan gpus` and the sources credited the file's numbers to it)."""
    if "source" in entry or not entry:
        return entry
    changed = ", ".join(str(k) for k in entry)
    return {**entry, "source": f"{path}: {changed} overridden; otherwise {shipped.source}"}


def _merged(shipped: dict, entry: Mapping) -> dict:
    """A shipped entry's fields with an override's: a mapping field takes the override's
    keys over the shipped ones (a value that is not a mapping replaces it whole)."""
    out = dict(shipped)
    for key, value in entry.items():
        old = out.get(key)
        out[key] = ({**old, **value} if isinstance(old, Mapping) and isinstance(value, Mapping)
                    else value)
    return out


def _fields(dev: DeviceSpec) -> dict:
    """A shipped device's fields as its catalog entry gives them (without its name)."""
    out = dump(dev)
    out.pop("name", None)
    return out


def _data(name: str) -> object:
    text = resources.files("profiler").joinpath("data", name).read_text(encoding="utf-8")
    return load_yaml_text(text, where=f"profiler/data/{name}")


@cache
def catalog() -> dict[str, DeviceSpec]:
    """All device types by name, in catalog order (CPU is one core of this host)."""
    out = parse_catalog(_data("devices.yaml"), where="devices")
    out["CPU"] = _local_cpu(out["CPU"])
    return out


def _local_cpu(template: DeviceSpec) -> DeviceSpec:
    """One rank of this host: one core, one thread, an equal share of host memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory_gib = template.memory_gib
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    memory_gib = int(line.split()[1]) * 1024 / GIB
                    break
    except OSError:
        pass
    return replace(template, memory_gib=round(memory_gib / (cores or 1), 2))


@cache
def _by_lower() -> dict[str, DeviceSpec]:
    return {k.lower(): v for k, v in catalog().items()}


def device(name: str, *, where: str = "gpu") -> DeviceSpec:
    """Look a device type up by name (case-insensitive); an unknown name is a SpecError
    naming the field `where`."""
    found = _by_lower().get(name.lower())
    if found is not None:
        return found
    table = catalog()
    near = difflib.get_close_matches(name, list(table), n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(near)}?" if near else "see `plan gpus`"
    raise SpecError(f"{where}: {name!r} is not a known GPU type ({hint})")


def match_device(description: str, memory_gib: float) -> DeviceSpec | None:
    """The catalog entry for a GPU as the driver names it ("NVIDIA H100 80GB HBM3"):
    the model token of the catalog name as a whole word, PCIe if the name says so, and
    the memory size closest to what the device reports; None if nothing matches."""
    import re

    words = re.split(r"[^A-Z0-9]+", description.upper())
    words += [a + b for a, b in zip(words, words[1:], strict=False)]  # "RTX 4090" -> RTX4090
    pcie = "PCIE" in words
    candidates = []
    for spec in catalog().values():
        if spec.vendor != "cpu" and spec.name.split("-")[0].upper() in words:
            candidates.append((("PCIE" in spec.name.upper()) != pcie,
                               abs(spec.memory_gib - memory_gib), spec))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


@cache
def _links() -> dict[str, LinkKind]:
    raw = _data("links.yaml")
    assert isinstance(raw, dict)
    return {k: parse(LinkKind, v, where=f"links.{k}") for k, v in raw.items()}


_OVERRIDES: dict[str, dict] = {"links": {}, "arch": {}}


@contextlib.contextmanager
def parameter_overrides(*, arch: Mapping[str, ArchEfficiency] | None = None,
                        links: Mapping[str, LinkKind] | None = None) -> Iterator[None]:
    """Use other analytic-model parameters inside the block (calibration only; callers
    must drop any costs they cached meanwhile)."""
    saved = {k: dict(v) for k, v in _OVERRIDES.items()}
    _OVERRIDES["arch"].update(arch or {})
    _OVERRIDES["links"].update(links or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            _OVERRIDES[k] = v


@cache
def nccl_tuning() -> NcclTuning:
    """NCCL's tuner constants (profiler/data/nccl.yaml)."""
    return parse(NcclTuning, _data("nccl.yaml"), where="nccl")


def link_kind(name: str) -> LinkKind:
    if name in _OVERRIDES["links"]:
        return _OVERRIDES["links"][name]
    links = _links()
    if name not in links:
        fail("link", name, "known: " + ", ".join(links))
    return links[name]


@cache
def _efficiencies() -> dict[str, ArchEfficiency]:
    raw = _data("efficiency.yaml")
    assert isinstance(raw, dict)
    return {k: parse(ArchEfficiency, v, where=f"efficiency.{k}") for k, v in raw.items()}


# Fields a device's own `efficiency:` may leave to its architecture (added after the
# per-device fits, which did not fit them).
_INHERITED = ("simt_gemm_efficiency", "dual_issue_fp32_gain")


def device_efficiency(dev: DeviceSpec) -> ArchEfficiency:
    """The analytic-model parameters of one device: its own, else its architecture's (a
    device's own without a SIMT GEMM efficiency takes its architecture's)."""
    if dev.arch in _OVERRIDES["arch"]:
        return _OVERRIDES["arch"][dev.arch]
    if dev.efficiency is None:
        return arch_efficiency(dev.arch)
    if dev.arch not in _efficiencies() and dev.arch not in _OVERRIDES["arch"]:
        return dev.efficiency
    arch = arch_efficiency(dev.arch)
    missing = {name: getattr(arch, name) for name in _INHERITED
               if getattr(dev.efficiency, name) is None}
    return replace(dev.efficiency, **missing) if missing else dev.efficiency


def arch_efficiency(arch: str) -> ArchEfficiency:
    if arch in _OVERRIDES["arch"]:
        return _OVERRIDES["arch"][arch]
    table = _efficiencies()
    if arch not in table:
        fail("arch", arch, "known: " + ", ".join(table))
    return table[arch]
