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


def test_group_of_follows_the_global_gpu_order():
    c = load_cluster("cluster_specs/three-types.yaml")
    for slot in c.slots:
        assert c.group_of(slot.index) is c.node_groups[slot.group]
    first_of = {}
    for slot in c.slots:
        first_of.setdefault(c.group_of(slot.index).name, slot.index)
    # each group's GPUs follow the previous group's, in the file's order
    assert list(first_of) == [g.name for g in c.node_groups]
    assert sorted(first_of.values()) == list(first_of.values())


def test_gpus_shorthand_uses_standard_nodes():
    c = parse_gpus_arg("A100-80GB-SXM:64")
    (g,) = c.node_groups
    assert (g.num_nodes, g.gpus_per_node, g.nics_per_node, g.nic) == (8, 8, 8, "infiniband")
    assert parse_gpus_arg("A100-80GB-SXM:4").node_groups[0].gpus_per_node == 4


def test_gpus_shorthand_lists_several_types_on_one_network():
    c = parse_gpus_arg("A100-80GB-SXM:16, V100-32GB-SXM2:4,H100-80GB-SXM:8")
    assert c.name == "16x A100-80GB-SXM + 4x V100-32GB-SXM2 + 8x H100-80GB-SXM"
    got = [(g.gpu, g.num_nodes, g.gpus_per_node, g.nic) for g in c.node_groups]
    assert got == [("A100-80GB-SXM", 2, 8, "infiniband"), ("V100-32GB-SXM2", 1, 4, "infiniband"),
                   ("H100-80GB-SXM", 1, 8, "infiniband")]
    # one fabric: no island links to invent
    assert len({g.island for g in c.node_groups}) == 1 and c.island_links == ()
    assert c.num_gpus == 28
    # the GPUs in the order listed, as a --cluster file numbers them
    assert [c.group_of(i).gpu for i in (0, 15, 16, 19, 20)] == [
        "A100-80GB-SXM", "A100-80GB-SXM", "V100-32GB-SXM2", "V100-32GB-SXM2", "H100-80GB-SXM"]


@pytest.mark.parametrize("text, message", [
    ("A100-80GB-SXM:8,RTX4090-24GB:8", r"different NICs \(A100-80GB-SXM's infiniband, "
     r"RTX4090-24GB's ethernet\): describe the islands"),
    ("A100-80GB-SXM:8,a100-80gb-sxm:8", r"A100-80GB-SXM is listed twice"),
    ("CPU:2,CPU:4", "listed twice"),
    ("CPU:2,RTX4090-24GB:8", "CPU ranks are a cluster of their own"),
    ("A100-80GB-SXM:8,", "expected TYPE:COUNT"),
    ("A100-80GB-SXM:8,V100-32GB-SXM2", "expected TYPE:COUNT"),
    ("A100-80GB-SXM:8:8", "one count a type"),
    ("A100-80GB-SXM:8,V100-32GB-SXM2:12", "multiple of 8 V100-32GB-SXM2 GPUs"),
    ("A100-80GB-SXM:131072,V100-32GB-SXM2:8", "at most 131,072 GPUs in all"),
])
def test_gpus_shorthand_list_errors(text, message):
    with pytest.raises(SpecError, match=message) as err:
        parse_gpus_arg(text)
    assert str(err.value).startswith(f"--gpus: {text!r} is not allowed")


@pytest.mark.parametrize("text, message", [
    ("A100-80GB-SXM:12", "multiple of 8"),
    ("A100-80GB-SXM:0", "must be ≥ 1"),
    ("A100-80GB-SXM", "expected TYPE:COUNT"),
    ("Z100:8", "not a known GPU type"),
])
def test_gpus_shorthand_errors(text, message):
    with pytest.raises(SpecError, match=message):
        parse_gpus_arg(text)


def test_loopback_joins_cpu_ranks_only():
    data = {"name": "c", "node_groups": [{"name": "g", "gpu": "A100-80GB-SXM", "num_nodes": 1,
                                          "intra_node_link": "loopback"}]}
    with pytest.raises(SpecError, match=r"intra_node_link: 'loopback' is not allowed for GPU "
                                        r"type 'A100-80GB-SXM'"):
        parse(ClusterSpec, data).resolved()
    data["node_groups"][0].update(gpu="CPU")
    assert parse(ClusterSpec, data).resolved().node_groups[0].intra_node_link == "loopback"
    # and CPU ranks talk over nothing else: a CPU group with 'nvswitch' priced 74.6% MFU
    data["node_groups"][0].update(intra_node_link="nvswitch")
    with pytest.raises(SpecError, match=r"intra_node_link: 'nvswitch' is not allowed for "
                                        r"'CPU' ranks"):
        parse(ClusterSpec, data).resolved()


def test_islands_must_be_linked():
    data = {"name": "c", "node_groups": [
        {"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 1, "island": "x"},
        {"name": "b", "gpu": "A100-80GB-SXM", "num_nodes": 1, "island": "y"}]}
    with pytest.raises(SpecError, match="islands 'x' and 'y' have no link"):
        parse(ClusterSpec, data)
    data["island_links"] = [{"islands": ["x", "z"], "bandwidth_gbit_per_s": 100}]
    with pytest.raises(SpecError, match=r"island_links\[0\].islands: 'z' is not allowed"):
        parse(ClusterSpec, data)
    # two links for one pair: one of them was dropped without a word
    data["island_links"] = [{"islands": ["x", "y"], "bandwidth_gbit_per_s": 100},
                            {"islands": ["y", "x"], "bandwidth_gbit_per_s": 1}]
    with pytest.raises(SpecError, match=r"island_links\[1\].islands: \['y', 'x'\] is not "
                                        r"allowed \(those islands already have a link: "
                                        r"island_links\[0\]\)"):
        parse(ClusterSpec, data)


def test_gpu_types_defined_in_the_file_are_defined_once_and_counted_by_their_node():
    gpu = {"name": "MYGPU", "vendor": "nvidia", "arch": "ampere", "memory_gib": 40,
           "memory_bandwidth_gb_per_s": 1500, "num_compute_units": 100,
           "peak_tflops": {"bf16": 300, "fp32": 20},
           "node": {"name": "box", "gpus_per_node": 256, "nics_per_node": 8}}
    data = {"name": "c", "devices": [gpu, {**gpu, "memory_gib": 1}],
            "node_groups": [{"name": "a", "gpu": "MYGPU", "num_nodes": 1}]}
    with pytest.raises(SpecError, match=r"devices\[1\].name: 'MYGPU' is not allowed "
                                        r"\(defined twice; names must be unique\)"):
        parse(ClusterSpec, data)
    # 60,000 nodes of 256 of its GPUs are 15.4 M GPUs, not 60,000
    data = {**data, "devices": [gpu], "node_groups": [{"name": "a", "gpu": "MYGPU",
                                                       "num_nodes": 60_000}]}
    with pytest.raises(SpecError, match=r"'15,360,000 GPUs' is not allowed \(at most 131,072"):
        parse(ClusterSpec, data)


def test_a_resolved_groups_gpu_numbers_agree_with_its_name_and_the_files_devices():
    """A plan file's node groups carry their GPU type's numbers (`gpu_spec`); hand-edited,
    they won over the cluster's `devices` entry (and over the group's own `gpu`) without a
    word. Both disagreements are refused; the file as written loads."""
    gpu = {"name": "MYGPU", "vendor": "nvidia", "arch": "ampere", "memory_gib": 40,
           "memory_bandwidth_gb_per_s": 1500, "num_compute_units": 100,
           "peak_tflops": {"bf16": 300, "fp32": 20},
           "node": {"name": "box", "gpus_per_node": 8, "nics_per_node": 8}}
    group = {"name": "a", "gpu": "MYGPU", "num_nodes": 1, "gpu_spec": gpu}
    parse(ClusterSpec, {"name": "c", "devices": [gpu], "node_groups": [group]})
    with pytest.raises(SpecError, match=r"node_groups\[0\].gpu_spec: 'MYGPU' is not allowed "
                                        r"\(differs from the cluster's `devices` entry"):
        parse(ClusterSpec, {"name": "c", "devices": [gpu], "node_groups": [
            {**group, "gpu_spec": {**gpu, "memory_gib": 80}}]})
    with pytest.raises(SpecError, match=r"node_groups\[0\].gpu_spec.name: 'OTHER' is not "
                                        r"allowed \(the group's gpu is 'MYGPU'\)"):
        parse(ClusterSpec, {"name": "c", "node_groups": [
            {**group, "gpu_spec": {**gpu, "name": "OTHER"}}]})


def test_a_plan_file_given_as_a_cluster_says_so(tmp_path):
    """A plan file passed where a cluster goes was refused with its whole `cluster` value
    as an unknown field."""
    from planner.specs.layout import ParallelConfig, homogeneous_plan
    from planner.specs.model import preset
    from planner.specs.plan import save_plan

    cluster = load_cluster("cluster_specs/dgx-h100.yaml")
    plan = homogeneous_plan(preset("gpt3-1.3b"), cluster.take(8), ParallelConfig(
        tp=8, mbs=1, gbs=8, seq_len=2048))
    path = tmp_path / "p.yaml"
    save_plan(plan, str(path))
    with pytest.raises(SpecError, match=r"^\S+p.yaml: a plan file is not allowed here \(a "
                                        r"cluster file has `name` and `node_groups`"):
        load_cluster(str(path))


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
    ({"intra_node_bandwidth_gb_per_s": 1e9}, None, "must be ≤ 100,000"),
    ({"price_per_gpu_hour_usd": 1e7}, None, "price_per_gpu_hour_usd: 10000000.0 is not allowed"),
    ({"num_nodes": 1_000_000}, None,
     "node_groups[0].num_nodes: 1000000 is not allowed (must be ≤ 65,536)"),
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


# --- an NVLink domain over several nodes (GB200 NVL72) -------------------------------------

def test_nvlink_domain_defaults_to_the_catalog_or_the_node():
    gb200 = parse_gpus_arg("GB200-186GB:8").node_groups[0]
    assert (gb200.gpus_per_node, gb200.nvlink_domain_gpus) == (4, 72)
    h100 = parse_gpus_arg("H100-80GB-SXM:16").node_groups[0]
    assert h100.nvlink_domain_gpus == h100.gpus_per_node == 8
    data = {"name": "c", "node_groups": [
        {"name": "a", "gpu": "GB200-186GB", "num_nodes": 4, "nvlink_domain_gpus": 8}]}
    own = parse(ClusterSpec, data).resolved()
    assert [s.domain for s in own.slots[::4]] == [0, 0, 1, 1]


@pytest.mark.parametrize("group, message", [
    ({"gpu": "H100-80GB-SXM", "nvlink_domain_gpus": 12},
     "node_groups[0].nvlink_domain_gpus: 12 is not allowed (a multiple of gpus_per_node (8)"),
    ({"gpu": "GB200-186GB", "gpus_per_node": 5},  # the catalog's 72 over trays of 5
     "node_groups[0].nvlink_domain_gpus: 72 is not allowed (a multiple of gpus_per_node (5)"),
    ({"gpu": "GB200-186GB", "nvlink_domain_gpus": 0},
     "node_groups[0].nvlink_domain_gpus: 0 is not allowed (must be ≥ 1)"),
    ({"gpu": "GB200-186GB", "nvlink_domain_gpus": 1_000_000}, "must be ≤ 65,536"),
])
def test_nvlink_domain_is_whole_nodes(group, message):
    data = {"name": "c", "node_groups": [{"name": "a", "num_nodes": 2, **group}]}
    with pytest.raises(SpecError) as err:
        parse(ClusterSpec, data, where="c.yaml:").resolved("c.yaml:")
    assert str(err.value).startswith("c.yaml:") and message in str(err.value), str(err.value)


def test_a_bad_nvlink_domain_in_a_cluster_file_is_one_line_and_exit_2(tmp_path, capsys):
    from tests.planner.cli_helpers import run_cli

    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnode_groups:\n  - {name: a, gpu: H100-80GB-SXM, num_nodes: 2,"
                    " nvlink_domain_gpus: 12}\n")
    code, out, err = run_cli(["simulate", "--model", "llama2-7b", "--cluster", str(path),
                              "--tp", "8", "--pp", "1", "--dp", "2", "--mbs", "1", "--gbs", "16"],
                             capsys)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0, err
    assert "nvlink_domain_gpus: 12 is not allowed (a multiple of gpus_per_node (8)" in err


def test_take_of_part_of_a_tray_is_its_own_domain():
    part = parse_gpus_arg("GB200-186GB:144").take(2)
    assert part.node_groups[0].nvlink_domain_gpus == 2 and part.num_gpus == 2


def test_cpu_ranks_are_one_host_and_train_in_fp32():
    """`--gpus CPU:2` was two hosts joined by 10 Gb/s Ethernet in search and simulate (the
    catalog's CPU node held one rank) while `plan run --gpus CPU:2` runs two ranks on this
    host; a plan searched that way spanned two nodes and `plan run` printed torchrun lines
    for each. Both are now one host over loopback, trained in fp32 as `plan run` does."""
    from planner.specs.cluster import train_dtype

    (g,) = parse_gpus_arg("CPU:2").node_groups
    assert (g.num_nodes, g.gpus_per_node, g.intra_node_link) == (1, 2, "loopback")
    assert train_dtype((g.device,), None, where="--dtype") == "fp32"
    assert train_dtype((g.device,), "bf16", where="--dtype") == "bf16"  # asked: as asked
