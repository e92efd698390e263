"""Collectives as NCCL runs them, held to published nccl-tests figures.

Every measured number cited here is a row of planner/data/reference/nccl_tests.csv (its
README names the sources); the bounds say how close NCCL's own model, with the links'
measured efficiencies, comes to each.
"""


import pytest

from planner.costs.comm import collective_choices, collective_time_s, group_ranks, group_tiers
from planner.specs.cluster import ClusterSpec, NodeGroup, load_cluster, parse_gpus_arg
from profiler.devices import link_kind
from profiler.schema import parse

GIB = 1 << 30
BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n}


def cluster(gpu: str, nodes: int, **group) -> ClusterSpec:
    data = {"name": "t", "node_groups": [{"name": "g", "gpu": gpu, "num_nodes": nodes, **group}]}
    return parse(ClusterSpec, data).resolved()


def busbw(kind: str, size: float, tiers) -> float:
    """nccl-tests' bus bandwidth of the model's time (GB/s)."""
    n = group_ranks(tiers)
    return size / collective_time_s(kind, size, tiers) * BUSBW[kind](n) / 1e9


def best(kind: str, size: float, tiers) -> str:
    c = min(collective_choices(kind, size, tiers), key=lambda c: c.time_s)
    return f"{c.algorithm}/{c.protocol}"


# -- 8 GPUs in one node ---------------------------------------------------------------------

def test_eight_a100_all_reduce_bus_bandwidth():
    """8 A100 on NVSwitch, 1 GiB all_reduce: 228.1 GB/s (Azure NDv4, row 6), 231.45 GB/s
    (NDmv4, row 31)."""
    tiers = group_tiers(parse_gpus_arg("A100-80GB-SXM:8"), tuple(range(8)))
    assert busbw("all_reduce", GIB, tiers) == pytest.approx(230, rel=0.05)
    assert best("all_reduce", GIB, tiers) == "ring/simple"


def test_eight_h100_all_reduce_runs_in_the_switch():
    """8 H100: NVLS reaches 478.87 GB/s busbw at 8 GiB (row 14), more than a ring can
    (365-370 GB/s with NCCL_ALGO=RING, row 89); all_gather stays a ring at ~360 GB/s
    (row 95)."""
    tiers = group_tiers(parse_gpus_arg("H100-80GB-SXM:8"), tuple(range(8)))
    assert busbw("all_reduce", 8 * GIB, tiers) == pytest.approx(478.87, rel=0.05)
    assert best("all_reduce", 8 * GIB, tiers) == "nvls/simple"
    ring = min(c.time_s for c in collective_choices("all_reduce", 2 * GIB, tiers)
               if c.algorithm == "ring")
    assert 2 * GIB / ring * 2 * 7 / 8 / 1e9 == pytest.approx(367, rel=0.05)
    assert busbw("all_gather", 16 * GIB, tiers) == pytest.approx(360, rel=0.05)


def test_protocol_follows_message_size():
    """8 H200 (stas00/ml-engineering all-reduce-8xH200.md): "Ring/LL up to 1MiB,
    NVLS/Simple from 2MiB"; A100 moves from LL to LL128 to Simple."""
    h200 = group_tiers(parse_gpus_arg("H200-141GB-SXM:8"), tuple(range(8)))
    assert best("all_reduce", 32 << 10, h200) == "ring/ll"
    assert best("all_reduce", 2 << 20, h200) == "nvls/simple"
    a100 = group_tiers(parse_gpus_arg("A100-80GB-SXM:8"), tuple(range(8)))
    assert [best("all_reduce", s, a100).split("/")[1] for s in (1 << 10, 16 << 20, GIB)] == \
        ["ll", "ll128", "simple"]


def test_small_message_latency():
    """1 KB all_reduce on 8 A100: 17.0 us (row 30); 8 B across 2 A100 nodes on HDR IB, one
    GPU each: 19.9 us (row 92); 1 KB over 2 x 8 A100 on HDR IB: 35.9 us (row 43)."""
    a100 = group_tiers(parse_gpus_arg("A100-80GB-SXM:8"), tuple(range(8)))
    assert collective_time_s("all_reduce", 1024, a100) == pytest.approx(17.0e-6, rel=0.2)
    two = parse_gpus_arg("A100-80GB-SXM:16")
    assert collective_time_s("all_reduce", 8, group_tiers(two, (0, 8))) == \
        pytest.approx(19.9e-6, rel=0.1)
    assert collective_time_s("all_reduce", 1024, group_tiers(two, tuple(range(16)))) == \
        pytest.approx(35.9e-6, rel=0.15)


# -- across nodes -------------------------------------------------------------------------

def test_bus_bandwidth_is_limited_by_the_nics_per_node():
    """3 nodes of 8 A100 with 4 HDR NICs: 95.74 GB/s at 133 MB (row 60; the maintainer's
    rule: 24 GB/s per 200 Gb/s NIC); 4 nodes of 8 B200 with 8 x 400 Gb/s: 376.71 GB/s at
    16 GiB (row 26); 2 x 8 A100 with 8 HDR NICs: 188.18 GB/s at 4 GiB (row 45)."""
    four_nics = cluster("A100-40GB-SXM", 3, nics_per_node=4)
    assert busbw("all_reduce", 133169160, group_tiers(four_nics, tuple(range(24)))) == \
        pytest.approx(95.74, rel=0.15)
    b200 = parse_gpus_arg("B200-180GB:32")
    assert busbw("all_reduce", 16 * GIB, group_tiers(b200, tuple(range(32)))) == \
        pytest.approx(376.71, rel=0.05)
    a100 = parse_gpus_arg("A100-80GB-SXM:16")
    assert busbw("all_reduce", 4 * GIB, group_tiers(a100, tuple(range(16)))) == \
        pytest.approx(188.18, rel=0.05)


def test_one_rank_per_node_reaches_less_of_its_nic():
    """One A100 per node on HDR IB: all_gather 15.84, all_reduce 18.65 GB/s busbw of the
    NIC's 25 (rows 35, 37)."""
    tiers = group_tiers(parse_gpus_arg("A100-80GB-SXM:16"), (0, 8))
    assert busbw("all_gather", GIB, tiers) == pytest.approx(15.84, rel=0.1)
    assert busbw("all_reduce", GIB, tiers) == pytest.approx(18.65, rel=0.12)


def test_a_group_split_unevenly_over_nodes_counts_its_own_ranks():
    """Three A100 over two 4-GPU nodes (2 + 1) run a ring of 3 ranks crossing the network
    twice: never slower than the same 3 ranks one per node (the ring was counted as 2 per
    node x 2 nodes = 4 ranks, its 2(n-1)/n factor 12.5% too large), and said as 3 ranks."""
    from planner.costs.comm import Transfer, group_domains, group_ranks

    c = cluster("A100-80GB-SXM", 3, gpus_per_node=4)
    uneven = group_tiers(c, (0, 2, 4))
    spread = group_tiers(c, (0, 4, 8))
    assert (group_ranks(uneven), group_domains(uneven)) == (3, 2)
    assert (group_ranks(spread), group_domains(spread)) == (3, 3)
    size = 157e6
    assert collective_time_s("all_reduce", size, uneven) <= collective_time_s(
        "all_reduce", size, spread)
    assert "3 ranks (up to 2 per node/2 nodes)" in Transfer("all_reduce", size, uneven).describe()
    # the inner tier alone (the NVLink share of an all-to-all) is the node's 2 ranks
    assert group_ranks(uneven[:1]) == 2


def test_scale_64_and_256_gpus_one_nic_per_node():
    """8 V100 nodes with one 100 Gb/s NIC (AWS p3dn, 2019): 7.66 GB/s busbw at 64 GPUs
    (row 81), 6-8 GB/s at 256 (row 82). Early EFA reached less than RDMA NICs do, so the
    model is an upper bound there, limited by the one NIC (12 GB/s) at every scale; no
    public nccl-tests figure at 512 GPUs was found."""
    for gpus, measured in ((64, 7.66), (256, 8.0)):
        c = cluster("V100-32GB-SXM2", gpus // 8, nics_per_node=1, nic="roce")
        model = busbw("all_reduce", 70e6, group_tiers(c, tuple(range(gpus))))
        assert measured <= model <= 12.5 * 0.96


def test_ring_latency_grows_with_ranks_and_tree_with_log_nodes():
    """NCCL's ring takes n-1 steps (all_gather), its tree 2 log2(nodes) network hops."""
    c = parse_gpus_arg("H100-80GB-SXM:512")
    small = {n: collective_time_s("all_gather", 8 * n, group_tiers(c, tuple(range(n))))
             for n in (16, 64, 512)}
    assert small[16] < small[64] < small[512]
    assert small[512] / small[64] == pytest.approx(512 / 64, rel=0.25)
    tree = {n: min(x.latency_s for x in collective_choices(
        "all_reduce", 8, group_tiers(c, tuple(range(n)))) if x.algorithm == "tree")
        for n in (16, 64, 512)}
    # 2, 8, 64 nodes: 1, 3, 6 tree levels
    assert (tree[512] - tree[64]) / (tree[64] - tree[16]) == pytest.approx(3 / 2)


def test_members_off_their_rails_pay_an_nvlink_hop():
    c = parse_gpus_arg("A100-80GB-SXM:16")
    aligned = group_tiers(c, (0, 8))
    crossed = group_tiers(c, (0, 9))
    assert aligned[0].aligned and not crossed[0].aligned
    assert collective_time_s("all_reduce", 1024, crossed) > \
        collective_time_s("all_reduce", 1024, aligned)


# -- PCIe, TCP sockets, islands -------------------------------------------------------------

def test_pcie_with_and_without_peer_to_peer():
    """4 RTX 4090 with P2P on PCIe Gen4 (tinygrad's patched kernel module): 25.95 GB/s
    busbw (row 58); 2 GeForce cards without P2P (staged through host memory) on Gen3 x16:
    4.0 GB/s (row 54). Stock GeForce drivers give the 4090, the 3090 and Turing's GeForce
    cards no P2P (NVIDIA/nccl#1127, rows 51-57), so their standard nodes stage through host
    memory; the workstation and data-center cards on PCIe keep P2P."""
    p2p = cluster("RTX4090-24GB", 1, gpus_per_node=4, intra_node_link="pcie",
                  intra_node_bandwidth_gb_per_s=31.5)
    assert busbw("all_reduce", GIB, group_tiers(p2p, tuple(range(4)))) == \
        pytest.approx(25.95, rel=0.05)
    host = cluster("RTX4090-24GB", 1, gpus_per_node=2, intra_node_link="pcie-host",
                   intra_node_bandwidth_gb_per_s=15.75)
    assert busbw("all_reduce", GIB, group_tiers(host, (0, 1))) == pytest.approx(4.0, rel=0.1)
    from profiler.devices import device

    for geforce in ("RTX4090-24GB", "RTX3090-24GB", "RTX3080Ti-12GB", "RTX2080Ti-11GB",
                    "RTX2080-8GB"):
        assert device(geforce).intra_node_link == "pcie-host", geforce
        stock = cluster(geforce, 1)
        assert busbw("all_reduce", GIB, group_tiers(stock, tuple(range(8)))) < 9, geforce
    for pro in ("A6000-48GB", "L40S-48GB", "L4-24GB", "A100-80GB-PCIe"):
        assert device(pro).intra_node_link == "pcie", pro


def test_tcp_sockets_on_ethernet():
    """NCCL's socket transport: 96-98% of 32 Gb/s with one GPU per node (NVIDIA/nccl#209,
    rows 72, 74), 45-72% with 8 GPUs per node (rows 73, 75), at best 4-6 GB/s busbw on
    100 GbE (NVIDIA/nccl#450, row 76). So an all-gather over 10 Gb/s Ethernet between 8-GPU
    nodes moves 58% of 1.25 GB/s, and one GPU per node 96%."""
    eight = cluster("A10G-24GB", 4, nic_bandwidth_gbit_per_s=32)
    assert 14.5 / 8 < busbw("all_reduce", 128 << 20, group_tiers(eight, tuple(range(32)))) \
        < 22.9 / 8
    hundred = cluster("A10G-24GB", 2, nic_bandwidth_gbit_per_s=100)
    assert 4.0 <= busbw("all_reduce", GIB, group_tiers(hundred, tuple(range(16)))) <= 6.0
    for per_node, fraction in ((8, 0.58), (1, 0.96)):
        ten = cluster("A10G-24GB", 4, gpus_per_node=per_node, nic_bandwidth_gbit_per_s=10)
        group = tuple(range(4 * per_node))
        assert busbw("all_gather", GIB, group_tiers(ten, group)) == \
            pytest.approx(1.25 * fraction, rel=0.02)
    eth = link_kind("ethernet")
    assert not eth.rdma and eth.latency_us > link_kind("infiniband").latency_us


def test_island_link_is_shared_by_concurrent_groups():
    c = load_cluster("cluster_specs/two-datacenter.yaml")
    across = (0, 32 * 8)  # a GPU in each datacenter
    alone = group_tiers(c, across, 1)
    crowded = group_tiers(c, across, 64)
    assert alone[-1].name == "islands" and alone[-1].latency_s >= 0.010
    assert crowded[-1].bandwidth_bytes_per_s < alone[-1].bandwidth_bytes_per_s
    assert collective_time_s("send_recv", 256e6, crowded) > \
        collective_time_s("send_recv", 256e6, alone)


def _two_islands(kind: str) -> ClusterSpec:
    """Two islands of two DGX A100 nodes (InfiniBand inside), joined by a 3.2 Tb/s link."""
    data = {"name": "c", "node_groups": [
        {"name": f"g{i}", "gpu": "A100-80GB-SXM", "num_nodes": 2, "island": f"i{i}"}
        for i in range(2)],
        "island_links": [{"islands": ["i0", "i1"], "bandwidth_gbit_per_s": 3200,
                          "kind": kind}]}
    return parse(ClusterSpec, data).resolved()


def test_a_group_across_an_island_link_without_rdma_runs_over_sockets():
    """InfiniBand islands joined by Ethernet: NCCL drives every connection of a
    communicator with one network transport, so a group crossing the link runs TCP
    sockets on every NIC (its own island's too: one 40 Gb/s stream a NIC, 40 us a step;
    Holmes, Yang et al. 2023: IB and RoCE islands talk over Ethernet). The link's kind was
    ignored: the three kinds priced the same. A group inside one island keeps its RDMA."""
    group = tuple(range(0, 32, 8))  # one GPU of each node: 2 + 2 nodes
    times = {}
    for kind in ("ethernet", "roce", "infiniband"):
        c = _two_islands(kind)
        network = next(t for t in group_tiers(c, group) if t.name == "network")
        # each rank its 1/8 of the node's eight 200 Gb/s NICs: RDMA at one rank per
        # node's fraction, sockets one 40 Gb/s stream a NIC
        rdma = 8 * 200e9 / 8 * link_kind("infiniband").single_rank_efficiency / 8
        expected = 8 * 40e9 / 8 / 8 if kind == "ethernet" else rdma
        assert network.bandwidth_bytes_per_s == pytest.approx(expected)
        assert network.rdma is (kind != "ethernet")
        assert group_tiers(c, (0, 8))[-1].rdma  # inside island i0
        times[kind] = collective_time_s("all_reduce", 1e9, group_tiers(c, group))
    assert times["roce"] == times["infiniband"]
    assert times["ethernet"] > 3 * times["infiniband"]


# -- point to point and the rest -------------------------------------------------------------

def test_send_recv_over_nvswitch():
    """8 A100 send/recv 1 GiB: 195.1 GB/s each way (row 49)."""
    pair = group_tiers(parse_gpus_arg("A100-80GB-SXM:8"), (0, 1))
    assert GIB / collective_time_s("send_recv", GIB, pair) / 1e9 == pytest.approx(195.1, rel=0.05)


def test_a_full_nvlink_mesh_gives_a_group_its_links_to_the_other_members():
    """A quad GH200 node has no NVSwitch: each GPU's 18 NVLink4 links run 6 to each of its
    3 peers (450 GB/s a GPU, 150 to a peer; HPE Cray EX254n; Fusco et al. 2024). A ring
    over all four uses every GPU's links to all its peers, as NCCL's rings do on DGX-1's
    cube mesh; a pair has only its own 6. Bus bandwidth at 1 GiB is then the link kind's
    efficiency times 450 GB/s for 4 GPUs, times 150 for 2, and a send between two GPUs of
    the node runs on the 150 GB/s between them, an all-to-all of the four on all 450.
    Sailor measured that send on its Clariden nodes: 125.46 GB/s for one pair (row 103)
    and 125.28 each for two pairs at once (row 104: no sharing, each pair on links of its
    own). No measured all-reduce over a quad GH200 node is known; Sailor's GH200 layer
    profile at tp 4, held out, is priced at 0.92-0.99 of its forward with this, 1.34-1.56
    without (test_sailor_layers.py)."""
    quad = parse_gpus_arg("GH200-96GB:4")
    kind = link_kind("nvlink-mesh")
    assert quad.node_groups[0].intra_node_link == "nvlink-mesh" and kind.full_mesh
    four, two = group_tiers(quad, (0, 1, 2, 3)), group_tiers(quad, (1, 3))
    assert busbw("all_reduce", GIB, four) == pytest.approx(450 * kind.bandwidth_efficiency,
                                                           rel=0.05)
    assert busbw("all_reduce", GIB, two) == pytest.approx(150 * kind.bandwidth_efficiency,
                                                          rel=0.05)
    assert GIB / collective_time_s("send_recv", GIB, two) / 1e9 == pytest.approx(
        150 * kind.send_efficiency, rel=0.05)
    assert GIB / collective_time_s("send_recv", GIB, two) / 1e9 == pytest.approx(125.4,
                                                                                 rel=0.1)
    # an all-to-all of the four sends to its 3 peers at once, each on its own links
    assert 0.75 * GIB / collective_time_s("all_to_all", GIB, four) / 1e9 == pytest.approx(
        450 * kind.send_efficiency, rel=0.05)
    # a switched node's group gets the whole per-GPU figure at any size
    assert link_kind("nvswitch").peer_share(2, 8) == 1.0 == kind.peer_share(4, 4)
    assert kind.peer_share(3, 4) == pytest.approx(2 / 3)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"])
def test_time_grows_with_size(kind):
    tiers = group_tiers(parse_gpus_arg("H100-80GB-SXM:16"), tuple(range(0, 16, 2)))
    times = [collective_time_s(kind, s, tiers) for s in (1e3, 1e6, 1e8, 1e9)]
    assert times == sorted(times) and times[0] > 0


def test_pcie_node_is_slower_than_nvswitch_node():
    def ar(gpu):
        return collective_time_s("all_reduce", 256e6, group_tiers(parse_gpus_arg(f"{gpu}:8"), tuple(range(8))))
    assert ar("A100-80GB-PCIe") > 5 * ar("A100-80GB-SXM")


def test_mixed_nodes_take_the_slower_nic():
    data = {"name": "m", "node_groups": [
        {"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 1},
        {"name": "v", "gpu": "V100-32GB-SXM2", "num_nodes": 1}]}
    c = parse(ClusterSpec, data).resolved()
    (tier,) = group_tiers(c, (0, 8))
    v100_share = 4 * 100e9 / 8 * link_kind("infiniband").single_rank_efficiency / 8
    assert tier.bandwidth_bytes_per_s == pytest.approx(v100_share)
    assert tier.arch is None  # mixed architectures: no LL128
    assert all(x.protocol != "ll128" for x in collective_choices("all_reduce", 1e6, (tier,)))


def test_a_collective_profile_answers_groups_inside_one_node_of_its_size(tmp_path):
    from profiler.store import load_profiles
    from tests.planner.profile_helpers import collective_row, write_profile

    path = write_profile(tmp_path / "coll.csv", [collective_row("all_reduce", 1 << 20, 1e-3),
                                                 collective_row("all_reduce", 1 << 22, 3e-3)],
                         world_size=2)
    profiles = load_profiles([path], devices=["CPU"], dtype="fp32")
    local = load_cluster("cluster_specs/local-cpu.yaml")
    pair = group_tiers(local, (0, 1))
    assert pair[0].device == "CPU"
    assert collective_time_s("all_reduce", 1 << 20, pair, profiles=profiles) == 1e-3
    middle = collective_time_s("all_reduce", 1 << 21, pair, profiles=profiles)
    assert 1e-3 < middle < 3e-3
    # not measured: another kind, or a group across nodes
    assert collective_time_s("all_gather", 1 << 20, pair, profiles=profiles) == \
        collective_time_s("all_gather", 1 << 20, pair)
    two_hosts = ClusterSpec(name="two hosts", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=2, gpus_per_node=1),)).resolved()
    across = group_tiers(two_hosts, (0, 1))
    assert across[0].name == "network"
    assert collective_time_s("all_reduce", 1 << 20, across, profiles=profiles) == \
        collective_time_s("all_reduce", 1 << 20, across)
