"""The hierarchical alpha-beta collective model (Thakur et al. 2005 per-phase costs)."""

import pytest

from planner.costs.comm import collective_time_s, group_tiers
from planner.specs.cluster import ClusterSpec, load_cluster, parse_gpus_arg
from profiler.devices import link_kind
from profiler.schema import parse

S = 256e6


def test_intra_node_all_reduce_is_two_ring_phases():
    c = parse_gpus_arg("A100-80GB-SXM:8")
    (tier,) = group_tiers(c, tuple(range(8)))
    nv = link_kind("nvswitch")
    assert tier.bandwidth_bytes_per_s == pytest.approx(300e9 * nv.bandwidth_efficiency)
    phase = 7 / 8 * S / tier.bandwidth_bytes_per_s + 6 * nv.latency_s  # tree steps: 2*log2(8)
    assert collective_time_s("reduce_scatter", S, (tier,)) == pytest.approx(phase)
    assert collective_time_s("all_reduce", S, (tier,)) == pytest.approx(2 * phase)


def test_one_rank_per_node_uses_that_ranks_nic_share():
    c = parse_gpus_arg("A100-80GB-SXM:32")
    (tier,) = group_tiers(c, (0, 8, 16, 24))
    ib = link_kind("infiniband")
    assert tier.name == "network" and tier.fanout == 4
    assert tier.bandwidth_bytes_per_s == pytest.approx(8 * 200e9 / 8 * ib.bandwidth_efficiency / 8)


def test_hierarchy_puts_less_data_on_slower_tiers():
    c = parse_gpus_arg("A100-80GB-SXM:32")
    tiers = group_tiers(c, tuple(range(32)))
    assert [t.name for t in tiers] == ["node", "network"]
    flat_network = collective_time_s("all_reduce", S, tiers[1:])
    assert collective_time_s("all_reduce", S, tiers) < flat_network


def test_island_link_is_shared_by_concurrent_groups():
    c = load_cluster("cluster_specs/two-datacenter.yaml")
    across = (0, 32 * 8)  # a GPU in each datacenter
    alone = group_tiers(c, across, 1)
    crowded = group_tiers(c, across, 64)
    assert alone[-1].name == "islands" and alone[-1].latency_s >= 0.010
    assert crowded[-1].bandwidth_bytes_per_s < alone[-1].bandwidth_bytes_per_s
    assert collective_time_s("send_recv", S, crowded) > collective_time_s("send_recv", S, alone)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"])
def test_time_grows_with_size(kind):
    tiers = group_tiers(parse_gpus_arg("H100-80GB-SXM:16"), tuple(range(0, 16, 2)))
    times = [collective_time_s(kind, s, tiers) for s in (1e3, 1e6, 1e8, 1e9)]
    assert times == sorted(times) and times[0] > 0


def test_pcie_node_is_slower_than_nvswitch_node():
    def ar(gpu):
        return collective_time_s("all_reduce", S, group_tiers(parse_gpus_arg(f"{gpu}:8"), tuple(range(8))))
    assert ar("A100-80GB-PCIe") > 5 * ar("A100-80GB-SXM")


def test_mixed_nodes_take_the_slower_nic():
    data = {"name": "m", "node_groups": [
        {"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 1},
        {"name": "v", "gpu": "V100-32GB-SXM2", "num_nodes": 1}]}
    c = parse(ClusterSpec, data).resolved()
    (tier,) = group_tiers(c, (0, 8))
    v100_share = 4 * 100e9 / 8 * link_kind("infiniband").bandwidth_efficiency / 8
    assert tier.bandwidth_bytes_per_s == pytest.approx(v100_share)


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
    across = group_tiers(parse_gpus_arg("CPU:2"), (0, 1))
    assert across[0].name == "network"
    assert collective_time_s("all_reduce", 1 << 20, across, profiles=profiles) == \
        collective_time_s("all_reduce", 1 << 20, across)
