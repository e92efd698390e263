"""Egress: dollars per iteration for traffic over priced island links."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.costs.egress import egress_usd_per_iteration
from planner.costs.memory import rank_param_count
from planner.search import SearchRequest, search
from planner.specs.cluster import ClusterSpec
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Sharding
from profiler.schema import load_yaml_text, parse

PRICE = 0.05  # $ per GB across the link

TWO_DC = f"""\
name: small-two-dc
node_groups:
  - {{name: east, gpu: H100-80GB-SXM, num_nodes: 1, island: east, datacenter: east,
      price_per_gpu_hour_usd: 3.0}}
  - {{name: west, gpu: H100-80GB-SXM, num_nodes: 1, island: west, datacenter: west,
      price_per_gpu_hour_usd: 3.0}}
island_links:
  - {{islands: [east, west], bandwidth_gbit_per_s: 100, latency_ms: 10, kind: ethernet,
      price_per_gb_usd: {PRICE}}}
"""


def _cluster(price: float = PRICE) -> ClusterSpec:
    c = parse(ClusterSpec, load_yaml_text(TWO_DC, where="test"), where="test").resolved()
    return replace(c, island_links=tuple(replace(k, price_per_gb_usd=price)
                                         for k in c.island_links))


MODEL = preset("llama2-7b")


def _plan(price: float = PRICE, **cfg: object):  # type: ignore[no-untyped-def]
    base = dict(mbs=1, gbs=16, seq_len=4096, sequence_parallel=True)
    return homogeneous_plan(MODEL, _cluster(price), ParallelConfig(**{**base, **cfg}))


def test_a_pipeline_split_across_the_link_pays_for_its_activations() -> None:
    plan = _plan(tp=8, pp=2, dp=1)  # stage 0 on the east node, stage 1 on the west
    act = 1 * 4096 * MODEL.hidden_size * 2  # bf16
    expected = 2 * act * 16 / 1e9 * PRICE  # forward activation and its gradient, 16 micro-batches
    assert egress_usd_per_iteration(plan) == pytest.approx(expected)


@pytest.mark.parametrize("vp", [2, 4])
def test_interleaved_chunks_cross_the_link_once_per_chunk(vp: int) -> None:
    """With vp chunks a stage, a micro-batch passes the east-west boundary vp times and
    the west-east wrap (last stage's chunk to the first stage's next) vp - 1 times, each
    way for its gradient: counted once, an interleaved plan across two datacenters was
    billed 11x too little at vp 6 and ranked by that (sweep of 2026-12-03)."""
    plan = _plan(tp=8, pp=2, dp=1, vp=vp)
    act = 1 * 4096 * MODEL.hidden_size * 2
    expected = 2 * act * 16 * (2 * vp - 1) / 1e9 * PRICE
    assert egress_usd_per_iteration(plan) == pytest.approx(expected)


def test_a_data_parallel_group_across_the_link_pays_for_its_gradients() -> None:
    plan = _plan(tp=8, pp=1, dp=2)  # one replica per datacenter
    params = rank_param_count(MODEL, num_layers=MODEL.num_layers, first=True, last=True, tp=1,
                              pp=1)
    # a hierarchical all-reduce of fp32 gradients moves 2 (k-1)/k of them over the cut
    assert egress_usd_per_iteration(plan) == pytest.approx(2 * params * 4 * 0.5 / 1e9 * PRICE)
    sharded = replace(plan, sharding=Sharding(params=2, grads=2, optim=2))
    extra = 2 * plan.pipelines[0].num_microbatches * params * 2 * 0.5 / 1e9 * PRICE
    assert egress_usd_per_iteration(sharded) == pytest.approx(
        egress_usd_per_iteration(plan) + extra)


def test_no_price_or_no_crossing_costs_nothing() -> None:
    assert egress_usd_per_iteration(_plan(price=0.0, tp=8, pp=2, dp=1)) == 0.0
    assert egress_usd_per_iteration(_plan(tp=4, pp=1, dp=1)) == 0.0  # inside the east node


def _islands(plan) -> set[str]:  # type: ignore[no-untyped-def]
    c = plan.cluster
    return {c.group_of(d).island for p in plan.pipelines for s in p.stages for d in s.devices}


def test_the_budget_and_run_cost_count_egress() -> None:
    """The fastest plan spans both datacenters; when crossing costs far more than the
    GPUs, a budget that affords the GPU-hours alone keeps the run in one datacenter."""
    def best(price: float, budget: float | None = None):  # type: ignore[no-untyped-def]
        return search(SearchRequest(model=MODEL, cluster=_cluster(price), gbs=64,
                                    seq_len=4096, objective="time-to-train", tokens=1e9,
                                    max_budget_usd=budget, top=1)).ranked[0]

    free = best(0.0)
    assert len(_islands(free.plan)) == 2
    budget = 2 * free.run_cost_usd(1e9)  # type: ignore[operator]
    assert best(0.0, budget).plan == free.plan
    dear = best(1000.0, budget)
    assert len(_islands(dear.plan)) == 1 and dear.egress_usd_per_iteration == 0.0
    spanning = best(1000.0)  # no budget: the same plan as free, now paying for the link
    assert spanning.egress_usd(1e9) > 1000 * free.gpu_cost_usd(1e9)  # type: ignore[operator]
    assert spanning.run_cost_usd(1e9) == pytest.approx(
        spanning.gpu_cost_usd(1e9) + spanning.egress_usd(1e9))  # type: ignore[operator]


def test_without_tokens_the_table_shows_egress_per_million_tokens() -> None:
    """`plan search --wide` without --tokens showed 'egress $ -' beside a $/1M tok that held
    $1.64 of egress: there is no run to total, so the column is per million tokens."""
    from planner.search.show import search_json, search_table

    req = SearchRequest(model=MODEL, cluster=_cluster(), gbs=64, seq_len=4096, top=1)
    result = search(req)
    best = result.ranked[0]
    assert len(_islands(best.plan)) == 2
    per_m = best.egress_usd_per_million_tokens
    assert per_m == pytest.approx(best.egress_usd_per_iteration * 1e6 / (64 * 4096)) and per_m > 0
    plan_json = search_json(result, req)["plans"][0]
    assert plan_json["egress_usd"] is None
    assert plan_json["egress_usd_per_million_tokens"] == pytest.approx(per_m)
    table = search_table(result, req, wide=True)
    assert "egress $/1M" in table and f"{per_m:.2f}" in table
