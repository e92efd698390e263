import glob

import pytest

from planner.specs.cluster import ClusterSpec, load_cluster, parse_gpus_arg
from profiler.schema import SpecError, parse


@pytest.mark.parametrize("path", sorted(glob.glob("cluster_specs/*.yaml")))
def test_shipped_specs_load(path):
    c = load_cluster(path)
    assert c.num_gpus == len(c.slots) > 0


def test_shipped_set_covers_the_required_kinds():
    specs = {p.split("/")[-1]: load_cluster(p) for p in glob.glob("cluster_specs/*.yaml")}
    assert len({g.gpu for g in specs["three-types.yaml"].node_groups}) == 3
    nics = {g.island: g.nic for g in specs["mixed-nic.yaml"].node_groups}
    assert sorted(nics.values()) == ["infiniband", "infiniband", "roce"]
    assert len({g.datacenter for g in specs["two-datacenter.yaml"].node_groups}) == 2


def test_gpus_shorthand_uses_standard_nodes():
    c = parse_gpus_arg("A100-80GB-SXM:64")
    (g,) = c.node_groups
    assert (g.num_nodes, g.gpus_per_node, g.nics_per_node, g.nic) == (8, 8, 8, "infiniband")
    assert parse_gpus_arg("A100-80GB-SXM:4").node_groups[0].gpus_per_node == 4


@pytest.mark.parametrize("text, message", [
    ("A100-80GB-SXM:12", "multiple of 8"),
    ("A100-80GB-SXM:0", "must be ≥ 1"),
    ("A100-80GB-SXM", "expected TYPE:COUNT"),
    ("Z100:8", "not a known GPU type"),
])
def test_gpus_shorthand_errors(text, message):
    with pytest.raises(SpecError, match=message):
        parse_gpus_arg(text)


def test_islands_must_be_linked():
    data = {"name": "c", "node_groups": [
        {"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 1, "island": "x"},
        {"name": "b", "gpu": "A100-80GB-SXM", "num_nodes": 1, "island": "y"}]}
    with pytest.raises(SpecError, match="islands 'x' and 'y' have no link"):
        parse(ClusterSpec, data)
    data["island_links"] = [{"islands": ["x", "z"], "bandwidth_gbit_per_s": 100}]
    with pytest.raises(SpecError, match=r"island_links\[0\].islands: 'z' is not allowed"):
        parse(ClusterSpec, data)


def test_take_uses_whole_nodes():
    c = load_cluster("cluster_specs/selene-a100.yaml")
    assert c.take(64).num_gpus == 64
    with pytest.raises(SpecError, match="do not fill whole nodes"):
        c.take(12)
    part = c.take(4)  # part of the first node
    assert part.num_gpus == 4 and part.node_groups[0].gpus_per_node == 4
    with pytest.raises(SpecError, match="has 4480 GPUs; the configuration needs 8192"):
        c.take(8192)


# --- every number from a file in a documented range (issue 15) ----------------------------

def _cluster(group=None, link=None):
    groups = [{"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 2, "island": "x"},
              {"name": "b", "gpu": "A100-80GB-SXM", "num_nodes": 2, "island": "y"}]
    groups[0].update(group or {})
    links = [{"islands": ["x", "y"], "bandwidth_gbit_per_s": 100, **(link or {})}]
    return {"name": "c", "node_groups": groups, "island_links": links}


@pytest.mark.parametrize("group, link, message", [
    ({"nic_bandwidth_gbit_per_s": 1e-300}, None,
     "node_groups[0].nic_bandwidth_gbit_per_s: 1e-300 is not allowed (must be ≥ 0.1)"),
    ({"nic_bandwidth_gbit_per_s": float("nan"), "price_per_gpu_hour_usd": float("nan")}, None,
     "node_groups[0].nic_bandwidth_gbit_per_s: nan is not allowed (expected a finite number)"),
    ({"intra_node_bandwidth_gb_per_s": 1e9}, None, "must be ≤ 100000"),
    ({"price_per_gpu_hour_usd": 1e7}, None, "price_per_gpu_hour_usd: 10000000.0 is not allowed"),
    ({"num_nodes": 1_000_000}, None,
     "node_groups[0].num_nodes: 1000000 is not allowed (must be ≤ 65536)"),
    ({"num_nodes": 60_000}, None, "node_groups: '480,016 GPUs' is not allowed (at most 131,072"),
    ({"gpus_per_node": 100_000}, None, "gpus_per_node: 100000 is not allowed (must be ≤ 256)"),
    (None, {"latency_ms": float("inf")},
     "island_links[0].latency_ms: inf is not allowed (expected a finite number)"),
    (None, {"bandwidth_gbit_per_s": 1e-300}, "must be ≥ 0.1"),
    (None, {"price_per_gb_usd": -1}, "must be ≥ 0"),
])
def test_cluster_numbers_are_finite_and_bounded(group, link, message):
    with pytest.raises(SpecError) as err:
        parse(ClusterSpec, _cluster(group, link), where="c.yaml:")
    assert str(err.value).startswith("c.yaml:") and message in str(err.value), str(err.value)


@pytest.mark.parametrize("text, message", [
    ("CPU:²", "expected TYPE:COUNT"),  # a unicode digit: str.isdigit() says yes, int() no
    ("A100-80GB-SXM:١٦", "expected TYPE:COUNT"),
    ("A100-80GB-SXM:8000000", "the GPU count must be ≤ 131,072"),
    ("A100-80GB-SXM:" + "9" * 5000, "expected TYPE:COUNT"),
])
def test_gpus_shorthand_takes_ascii_counts_in_range(text, message):
    with pytest.raises(SpecError, match=message):
        parse_gpus_arg(text)


def test_many_islands_are_refused_before_their_pairs_are_checked():
    groups = [{"name": f"g{i}", "gpu": "A100-80GB-SXM", "num_nodes": 1, "island": f"i{i}"}
              for i in range(200)]
    with pytest.raises(SpecError, match=r"'200 islands' is not allowed \(at most 32\)"):
        parse(ClusterSpec, {"name": "c", "node_groups": groups})
