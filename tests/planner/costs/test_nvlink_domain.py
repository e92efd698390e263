"""An NVLink domain that spans nodes: GB200 NVL72, 72 GPUs (18 compute trays of 4) on one
NVLink 5 fabric through the NVLink Switch trays, 900 GB/s per GPU per direction (NVIDIA
GB200 NVL72 specification; NVIDIA/nccl#1286: "72 Blackwell generation GPUs connected to a
single NVLink domain"). NCCL runs such a multi-node NVLink (MNNVL) clique over its P2P
transport as it runs one node (NVIDIA/nccl#1159; NCCL 2.20.3 src/graph/tuning.cc
ncclTopoTuneModel: "MNNVL support - treat as a single NVLink connected node"), so a group
inside the rack runs at NVLink bandwidth and only traffic between racks takes the NICs.
"""

import math

import pytest

from planner.costs.comm import collective_choices, collective_time_s, group_tiers
from planner.specs.cluster import ClusterSpec, homogeneous_cluster, load_cluster, parse_gpus_arg
from profiler.devices import catalog, link_kind
from profiler.schema import parse

GIB = 1 << 30


def busbw_gb_per_s(kind: str, size: float, tiers) -> float:
    """nccl-tests' bus bandwidth of the model's time: all_reduce moves 2(n-1)/n of the
    buffer per rank, send/recv the buffer."""
    n = math.prod(t.fanout for t in tiers)
    factor = 2 * (n - 1) / n if kind == "all_reduce" else 1.0
    return size / collective_time_s(kind, size, tiers) * factor / 1e9


def test_gb200_is_one_72_gpu_domain_of_18_trays():
    c = parse_gpus_arg("GB200-186GB:144")
    (g,) = c.node_groups
    assert (g.gpus_per_node, g.nvlink_domain_gpus, g.nodes_per_domain) == (4, 72, 18)
    assert {s.domain for s in c.slots[:72]} == {0} and {s.domain for s in c.slots[72:]} == {1}
    assert c.slots[71].node == 17 and c.slots[72].node == 18


def test_tp8_all_reduce_on_gb200_runs_at_nvlink_bandwidth():
    """tp 8 = two compute trays. Before the domain, the group crossed the trays' NICs (4x
    400 Gb/s, 200 GB/s a tray): 1 GiB all_reduce busbw ~190 GB/s. Inside the NVLink
    domain it is NVLink's 900 GB/s per direction at the switch's achieved ring share
    (links.yaml nvswitch, 0.79): ~711 GB/s, a ring as NCCL runs it in one node (NVLS is
    off across trays in NCCL 2.20.3: "MNNVL: NVLS not yet supported")."""
    c = parse_gpus_arg("GB200-186GB:8")
    tiers = group_tiers(c, tuple(range(8)))
    assert [(t.name, t.fanout) for t in tiers] == [("node", 8)]
    nvlink = 900 * link_kind("nvswitch").bandwidth_efficiency
    assert tiers[0].bandwidth_bytes_per_s == pytest.approx(nvlink * 1e9)
    assert busbw_gb_per_s("all_reduce", GIB, tiers) == pytest.approx(nvlink, rel=0.03)
    best = min(collective_choices("all_reduce", GIB, tiers), key=lambda c: c.time_s)
    assert best.algorithm == "ring"
    # the domain set back to the tray: the same GPUs cross the NICs, 3-4x slower
    trays = _gb200(nodes=2, nvlink_domain_gpus=4)
    tray_tiers = group_tiers(trays, tuple(range(8)))
    assert [t.name for t in tray_tiers] == ["node", "network"]
    assert busbw_gb_per_s("all_reduce", GIB, tray_tiers) < nvlink / 3


def test_one_tray_keeps_nvls():
    """Inside one tray NVLS still runs (NVLink SHARP on sm_90 and later, one node)."""
    tiers = group_tiers(parse_gpus_arg("GB200-186GB:4"), tuple(range(4)))
    assert tiers[0].nvls_bytes_per_s > 0
    assert group_tiers(parse_gpus_arg("GB200-186GB:8"), tuple(range(8)))[0].nvls_bytes_per_s == 0


def test_two_racks_still_cross_the_nics():
    """144 GPUs = two racks: a dp group over the racks (one rank in each) goes through the
    NICs, at one GPU's share of its tray's 4x 400 Gb/s; a pipeline send from tray 0 to
    tray 17 stays on NVLink, one to the next rack does not."""
    c = parse_gpus_arg("GB200-186GB:144")
    dp = group_tiers(c, (0, 72))
    assert [(t.name, t.fanout) for t in dp] == [("network", 2)]
    nic = link_kind("infiniband")  # one rank of a tray drives it: its single-rank efficiency
    share = 4 * 400e9 / 8 * nic.single_rank_efficiency / 4  # a tray's NICs, per GPU
    assert dp[0].bandwidth_bytes_per_s == pytest.approx(share)
    assert busbw_gb_per_s("all_reduce", GIB, dp) < 60
    # 8 GPUs straddling the racks: 4 in each, joined by the NICs
    straddle = group_tiers(c, tuple(range(68, 76)))
    assert [(t.name, t.fanout) for t in straddle] == [("node", 4), ("network", 2)]
    in_rack = collective_time_s("send_recv", 64e6, group_tiers(c, (0, 68)))
    across = collective_time_s("send_recv", 64e6, group_tiers(c, (0, 72)))
    assert [t.name for t in group_tiers(c, (0, 68))] == ["node"]
    assert across > 5 * in_rack


def test_other_gpu_types_keep_the_node_as_their_domain():
    """Only GB200 ships a domain beyond the node; every other type's domain is its node,
    so its tiers are those of before (H100: 8 per node, then the NICs)."""
    multi = {name for name, d in catalog().items()
             if d.node is not None and d.node.nvlink_domain_gpus not in (None, d.node.gpus_per_node)}
    assert multi == {"GB200-186GB"}
    for name, d in catalog().items():
        if d.node is None or name in multi:
            continue
        c = homogeneous_cluster(name, 2 * d.node.gpus_per_node)
        assert all(s.domain == s.node for s in c.slots), name
    h100 = parse_gpus_arg("H100-80GB-SXM:16")
    tiers = group_tiers(h100, tuple(range(16)))
    assert [(t.name, t.fanout) for t in tiers] == [("node", 8), ("network", 2)]


def _gb200(*, nodes: int, **group) -> ClusterSpec:
    data = {"name": "t", "node_groups": [{"name": "g", "gpu": "GB200-186GB",
                                          "num_nodes": nodes, **group}]}
    return parse(ClusterSpec, data).resolved()


def test_a_domain_never_spans_two_node_groups():
    data = {"name": "t", "node_groups": [
        {"name": "a", "gpu": "GB200-186GB", "num_nodes": 2},
        {"name": "b", "gpu": "GB200-186GB", "num_nodes": 2}]}
    c = parse(ClusterSpec, data).resolved()
    assert [s.domain for s in c.slots[::4]] == [0, 0, 1, 1]
    assert [t.name for t in group_tiers(c, (0, 8))] == ["network"]


def test_last_rack_may_be_partial():
    c = _gb200(nodes=20)  # a full rack and 2 trays of the next
    assert [c.slots[k].domain for k in (0, 71, 72, 79)] == [0, 0, 1, 1]


def test_the_shipped_nvl72_spec_is_four_racks():
    c = load_cluster("cluster_specs/gb200-nvl72.yaml")
    assert c.num_gpus == 288 and len({s.domain for s in c.slots}) == 4
    assert [t.name for t in group_tiers(c, tuple(range(0, 288, 72)))] == ["network"]
