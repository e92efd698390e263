"""What-if scenarios: parsing, what each change does to the cluster, and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner.specs.cluster import load_cluster
from planner.specs.model import preset
from planner.whatif.scenarios import Setting, apply, parse_scenario
from profiler.schema import SpecError

MIXED = "cluster_specs/mixed-a100-v100.yaml"
TWO_DC = "cluster_specs/two-datacenter.yaml"


def _base(path: str = MIXED) -> Setting:
    return Setting("baseline", preset("llama2-7b"), load_cluster(path), 1e12)


def _count(setting: Setting, gpu: str) -> int:
    return sum(g.num_gpus for g in setting.cluster.node_groups if g.gpu == gpu)


def test_label_and_several_changes() -> None:
    s = parse_scenario("more: add H100-80GB-SXM 16; price H100-80GB-SXM 2.5")
    assert s.label == "more"
    assert s.changes == (("add", "H100-80GB-SXM", "16"), ("price", "H100-80GB-SXM", "2.5"))
    assert parse_scenario("tokens 2e12").label == "tokens 2e12"  # unlabelled: its text


def test_add_takes_the_island_and_price_of_that_type() -> None:
    base = _base()
    s = apply(parse_scenario("add A100-80GB-SXM 16"), base)
    assert _count(s, "A100-80GB-SXM") == _count(base, "A100-80GB-SXM") + 16
    added = s.cluster.node_groups[-1]
    assert (added.island, added.price_per_gpu_hour_usd) == ("ib", 1.8)
    assert s.cluster.num_gpus == base.cluster.num_gpus + 16


def test_remove_whole_nodes_last_first() -> None:
    base = _base()
    s = apply(parse_scenario("remove V100-32GB-SXM2 64"), base)
    assert _count(s, "V100-32GB-SXM2") == _count(base, "V100-32GB-SXM2") - 64
    assert _count(s, "A100-80GB-SXM") == _count(base, "A100-80GB-SXM")


def test_swap_keeps_the_count_and_uses_the_clusters_price() -> None:
    base = _base()
    s = apply(parse_scenario("swap V100-32GB-SXM2 A100-80GB-SXM"), base)
    assert _count(s, "V100-32GB-SXM2") == 0
    assert _count(s, "A100-80GB-SXM") == base.cluster.num_gpus
    assert {g.price_per_gpu_hour_usd for g in s.cluster.node_groups} == {1.8}
    # a type the cluster has no price for stays unpriced
    h = apply(parse_scenario("swap V100-32GB-SXM2 H100-80GB-SXM"), base)
    assert any(g.price_per_gpu_hour_usd is None for g in h.cluster.node_groups)


def test_scale_nic_and_link_and_prices() -> None:
    base = _base()
    s = apply(parse_scenario("scale-nic V100-32GB-SXM2 2; price V100-32GB-SXM2 0.4"), base)
    for old, new in zip(base.cluster.node_groups, s.cluster.node_groups, strict=True):
        factor = 2 if old.gpu == "V100-32GB-SXM2" else 1
        assert new.nic_bandwidth_gbit_per_s == old.nic_bandwidth_gbit_per_s * factor
    assert {g.gpu: g.price_per_gpu_hour_usd for g in s.cluster.node_groups}["V100-32GB-SXM2"] == 0.4
    dc = _base(TWO_DC)
    t = apply(parse_scenario("scale-link east west 0.5; egress-price 0.05"), dc)
    link, old = t.cluster.island_links[0], dc.cluster.island_links[0]
    assert link.bandwidth_gbit_per_s == old.bandwidth_gbit_per_s / 2
    assert link.price_per_gb_usd == 0.05
    # free egress is a scenario too (what-if writes 0.0 for a new island's links itself)
    assert apply(parse_scenario("egress-price 0"), dc).cluster.island_links[0].price_per_gb_usd == 0
    with pytest.raises(SpecError, match="egress-price: '-1' is not allowed"):
        apply(parse_scenario("egress-price -1"), dc)


def test_a_price_of_zero_is_owned_gpus_as_in_a_cluster_file() -> None:
    """A cluster file takes price_per_gpu_hour_usd: 0; the scenario refused it (sweep)."""
    s = apply(parse_scenario("price A100-80GB-SXM 0"), _base())
    assert {g.price_per_gpu_hour_usd for g in s.cluster.node_groups if g.gpu == "A100-80GB-SXM"} \
        == {0.0}


def test_model_and_tokens() -> None:
    s = apply(parse_scenario("model llama2-13b; tokens 3e11"), _base())
    assert (s.model.name, s.tokens) == ("llama2-13b", 3e11)


@pytest.mark.parametrize("text, words", [
    ("buy H100-80GB-SXM 8", ["'buy' is not a change"]),
    # a change written like --gpus: its first words became the label
    ("add 8:H100-80GB-SXM", ["'add 8' before ':' is read as the scenario's label",
                             "'add TYPE COUNT'"]),
    ("add H100-80GB-SXM", ["add takes 2-10 arguments"]),
    ("add H100-80GB-SXM 8 cloud", ["island", "cloud", "link GBPS"]),
    ("add H100-80GB-SXM 8 island ib link 100", ["link", "only for a new island"]),
    ("add H100-80GB-SXM 8 island cloud link fast", ["link", "fast", "positive"]),
    ("add H100-80GB-SXM 8 isle cloud", ["add", "pairs of"]),
    ("remove A100-80GB-SXM 128; remove V100-32GB-SXM2 128", ["leaves no GPUs"]),
    ("add H100-80GB-SXM 12", ["count", "12", "multiple of 8"]),
    ("remove V100-32GB-SXM2 4096", ["fewer"]),
    ("swap P100 A100-80GB-SXM", ["P100"]),
    ("scale-nic a100 -1", ["factor", "-1", "positive"]),
    ("scale-link ib wan 2", ["scale-link", "two islands"]),
    ("egress-price 0.1", ["egress-price", "no links"]),
    ("model gpt-5", ["gpt-5"]),
    ("tokens lots", ["tokens", "lots"]),
    ("label only:", ["no change given"]),
    # a label heads a Markdown table cell and names a file: '|' became '/', '<script>'
    # went into report.md raw, '///' named clusters/02-.yaml
    ("a|b <script>: price A100-80GB-SXM 2", ["its label 'a|b <script>'", "none of"]),
    ("*bold*: price A100-80GB-SXM 2", ["its label '*bold*'"]),
    ("///: price A100-80GB-SXM 2", ["its label '///' needs a letter or digit"]),
    # a tab in a label was refused as the scenario cluster's name, not --scenario's
    ("a\tb: price A100-80GB-SXM 2", ["its label 'a\\tb'", "control characters"]),
    # issue 15: unicode digits, quotes, NaN and sizes past the limits
    ("add H100-80GB-SXM ²", ["count", "'²'", "a positive whole number"]),
    ("add H100-80GB-SXM ١٦", ["count", "a positive whole number"]),
    ("price A100-80GB-SXM ٣", ["price", "a number of $ per GPU-hour, 0 or more"]),
    ("price A100-80GB-SXM -1", ["price", "'-1'", "0 or more"]),
    ('add "H100-80GB-SXM 8', ["no closing quotation"]),
    ("tokens nan", ["tokens", "'nan'"]),
    ("tokens inf", ["tokens", "'inf'"]),
    ("tokens 1e30", ["tokens", "must be ≤ 1e+17"]),
    ("add H100-80GB-SXM 800000", ["count", "'800000'", "at most 131,072"]),
    ("add H100-80GB-SXM 131064 price 2", ["at most 131,072 in a cluster"]),
    # ten digits were refused as "not a positive whole number" (audit of 2026-12-06)
    ("add H100-80GB-SXM 1000000000", ["count", "at most 131,072, the most GPUs"]),
    ("remove A100-80GB-SXM " + "9" * 5000, ["count", "at most 131,072"]),
    # the factor's own bounds: it named the cluster's field path and the product
    ("scale-nic a100 1e300", ["scale-nic factor: '1e300' is not allowed (0.0005 to 500 here: "
                              "a NIC runs 0.1 to 100,000 Gb/s, a100's 200 Gb/s)"]),
    ("scale-nic a100 1e-300", ["scale-nic factor: '1e-300'", "0.0005 to 500 here"]),
    ("price A100-80GB-SXM 1e9", ["price_per_gpu_hour_usd", "must be ≤ 10,000"]),
])
def test_bad_scenarios_are_one_line_errors(text: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as err:
        apply(parse_scenario(text), _base())
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message, message


def test_scale_link_and_egress_price_stay_in_range() -> None:
    for text, words in (("scale-link east west 1e300", ["bandwidth_gbit_per_s", "≤ 1,000,000"]),
                        ("egress-price 1e9", ["price_per_gb_usd", "must be ≤ 1,000"])):
        with pytest.raises(SpecError) as err:
            apply(parse_scenario(text), _base(TWO_DC))
        assert all(w in str(err.value) for w in words), str(err.value)


def test_cli_bad_scenario_exits_2_with_one_line(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", "what-if", "--model", "llama2-7b", "--cluster",
         MIXED, "--tokens", "1e12", "--gbs", "256", "--dtype", "fp16",
         "--scenario", "add H100-80GB-SXM 12", "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "count" in lines[0] and "12" in lines[0]


@pytest.mark.parametrize("text", ["add H100-80GB-SXM 128; remove A100-80GB-SXM 128",
                                  "remove A100-80GB-SXM 128; add H100-80GB-SXM 128"])
def test_steps_are_checked_once_all_apply_so_order_does_not_matter(text: str) -> None:
    s = apply(parse_scenario(text), _base())
    assert (_count(s, "A100-80GB-SXM"), _count(s, "H100-80GB-SXM")) == (0, 128)
    assert all(g.num_nodes > 0 for g in s.cluster.node_groups)
    swapped = apply(parse_scenario("remove A100-80GB-SXM 128; remove V100-32GB-SXM2 128; "
                                   "add H100-80GB-SXM 64"), _base())
    assert swapped.cluster.num_gpus == 64 and swapped.cluster.node_groups[0].island == "ib"


def test_add_a_new_island_over_a_wan_link() -> None:
    s = apply(parse_scenario("rent: add H100-80GB-SXM 64 island cloud link 100 latency 5 "
                             "price 4.5"), _base())
    added = s.cluster.node_groups[-1]
    assert (added.island, added.datacenter, added.price_per_gpu_hour_usd) == (
        "cloud", "cloud", 4.5)
    (link,) = s.cluster.island_links
    assert set(link.islands) == {"ib", "cloud"} and link.bandwidth_gbit_per_s == 100
    assert link.latency_ms == 5 and link.kind == "ethernet"
    # on a cluster of two islands the new one is linked to both
    two = apply(parse_scenario("add H100-80GB-SXM 8 island cloud link 50"), _base(TWO_DC))
    assert {frozenset(k.islands) for k in two.cluster.island_links} >= {
        frozenset({"east", "cloud"}), frozenset({"west", "cloud"})}


def test_removing_an_island_drops_its_links() -> None:
    s = apply(parse_scenario("remove A100-80GB-SXM 256"), _base(TWO_DC))
    assert s.cluster.island_links == () and {g.island for g in s.cluster.node_groups} == {"east"}


def test_blanks_between_words_are_any_whitespace() -> None:
    """Changes separated by tabs (as a script may join them) were read, but the name they
    give an unlabelled scenario kept the tabs and was refused as the cluster's name."""
    scenario = parse_scenario("add\tH100-80GB-SXM  8 ;\tprice H100-80GB-SXM 3")
    assert scenario.label == "add H100-80GB-SXM 8 ; price H100-80GB-SXM 3"
    assert apply(scenario, _base()).cluster.name.startswith(scenario.label)


def test_a_scenarios_cluster_is_named_after_it() -> None:
    s = apply(parse_scenario("more: add A100-80GB-SXM 8"), _base())
    assert s.cluster.name == "more (mixed-a100-v100)" and s.label == "more"


def test_what_if_takes_gpus_as_well_as_a_cluster(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", "what-if", "--model", "gpt3-125m", "--gpus",
         "A100-80GB-SXM:16", "--tokens", "1e9", "--gbs", "16", "--scenario",
         "half: remove A100-80GB-SXM 8", "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "baseline:" in proc.stdout and "half:" in proc.stdout


@pytest.mark.parametrize("text", ["add MYGPU 8", "swap A100-80GB-SXM MYGPU"])
def test_scenarios_add_or_swap_in_a_type_the_cluster_defines(text: str) -> None:
    """A type the cluster file (or --catalog) defines was 'not a known GPU type' once a
    scenario added it: the new node group looked it up in the shipped catalog."""
    import dataclasses

    from planner.specs.cluster import ClusterSpec, NodeGroup
    from profiler.devices import device

    mine = dataclasses.replace(device("A100-80GB-SXM"), name="MYGPU", memory_gib=40,
                               source="user-defined")
    cluster = ClusterSpec(name="c", devices=(mine,), node_groups=(
        NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=1),
        NodeGroup(name="m", gpu="MYGPU", num_nodes=1))).resolved()
    s = apply(parse_scenario(text), Setting("baseline", preset("llama2-7b"), cluster, 1e12))
    mygpu = [g for g in s.cluster.node_groups if g.gpu == "MYGPU"]
    assert mygpu and all(g.device.memory_gib == 40 for g in mygpu)
