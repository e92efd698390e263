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
