"""ZB-H1, the zero-bubble schedule of Qi et al. 2024 ("Zero Bubble Pipeline Parallelism",
ICLR 2024, arXiv 2401.10241, §2.1): backward split into B (input gradients) and W (weight
gradients), W deferred into the drain bubble, peak activation memory that of 1F1B."""

import dataclasses

import pytest

from planner.costs.memory import in_flight_chunks
from planner.costs.stages import Part, plan_costs
from planner.predict.estimate import estimate
from planner.simulator import simulate, simulate_detailed, write_gantt
from planner.simulator.build import simulate_graph
from planner.simulator.schedules import stage_order
from tests.planner.simulator_helpers import flat_costs, make_plan

PAPER = (1.0, 1.0, 1.0)  # T_F = T_B = T_W, as the paper draws its schedules


def _pass_names(order):
    return " ".join(f"{ph}{j}" for ph, _, j in order)


def test_order_is_1f1b_with_each_w_lagging_its_b_by_the_stage_index():
    """Stage s of p: 1F1B's F/B order, W(k) right after B(k + s), the rest at the end
    (the paper's Figure 3, and torch.distributed.pipelining's order for one stage per
    rank)."""
    orders = [stage_order("zb-h1", stage=s, pp=4, num_microbatches=6) for s in range(4)]
    assert _pass_names(orders[0]) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5"
    assert _pass_names(orders[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5"
    for pp, m in ((4, 6), (4, 2), (8, 3), (2, 9)):
        for s in range(pp):
            order = stage_order("zb-h1", stage=s, pp=pp, num_microbatches=m)
            assert sorted(order) == sorted((ph, 0, j) for ph in "FBW" for j in range(m))
            fb = [p for p in order if p[0] != "W"]
            assert fb == stage_order("1f1b", stage=s, pp=pp, num_microbatches=m)
            for _, _, j in order:
                assert order.index(("F", 0, j)) < order.index(("B", 0, j)) \
                    < order.index(("W", 0, j))
                if j + s < m:  # W(j) waits exactly for B(j + s)
                    assert order.index(("W", 0, j)) == order.index(("B", 0, j + s)) + 1


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 4), (4, 5), (4, 8), (8, 16), (8, 32)])
@pytest.mark.parametrize("fwd, bwd, wgrad", [PAPER, (1.0, 1.5, 0.5), (1.2, 1.4, 1.2),
                                             (2.0, 1.0, 0.8)])
def test_makespan_is_the_papers_formula(pp, m, fwd, bwd, wgrad):
    """No communication, p equal stages, m >= p, T_W <= T_F and T_W <= T_B: exactly
    m(T_F + T_B + T_W) + (p - 1)(T_F + T_B - T_W) (Qi et al. 2024 §2.1), never slower
    than 1F1B's (m + p - 1)(T_F + T_B + T_W), and the bubble 1/3 of 1F1B's when the three
    are equal."""
    plan = make_plan(pp=pp, m=m, schedule="zb-h1", layers=24)
    costs = flat_costs(plan, fwd=fwd, bwd=bwd + wgrad, wgrad=wgrad)
    got = simulate_graph(plan, costs=costs).schedule.makespan_s
    t = fwd + bwd + wgrad
    assert got == pytest.approx(m * t + (pp - 1) * (fwd + bwd - wgrad), rel=1e-12)
    base = make_plan(pp=pp, m=m, schedule="1f1b", layers=24)
    one = simulate_graph(base, costs=flat_costs(base, fwd=fwd, bwd=bwd + wgrad, wgrad=wgrad))
    assert one.schedule.makespan_s == pytest.approx((m + pp - 1) * t, rel=1e-12)
    assert got <= one.schedule.makespan_s
    if (fwd, bwd, wgrad) == PAPER:
        assert got - m * t == pytest.approx((one.schedule.makespan_s - m * t) / 3, rel=1e-12)


@pytest.mark.parametrize("pp, m", [(4, 4), (4, 8), (8, 16)])
@pytest.mark.parametrize("fwd, bwd, wgrad", [(0.5, 1.5, 1.0), (0.5, 1.0, 1.0), (1.0, 2.0, 1.5)])
def test_w_longer_than_f_leaves_the_warm_up_bubble(pp, m, fwd, bwd, wgrad):
    """Where T_F < T_W <= T_B the formula does not hold: stage 0 runs p forwards, then
    waits (p - 1) T_B for its first B, and is busy from there on. The bubble is
    (p - 1) T_B, more than the paper's (p - 1)(T_F + T_B - T_W)."""
    plan = make_plan(pp=pp, m=m, schedule="zb-h1", layers=24)
    costs = flat_costs(plan, fwd=fwd, bwd=bwd + wgrad, wgrad=wgrad)
    got = simulate_graph(plan, costs=costs).schedule.makespan_s
    t = fwd + bwd + wgrad
    assert got == pytest.approx(m * t + (pp - 1) * bwd, rel=1e-12)
    assert got > m * t + (pp - 1) * (fwd + bwd - wgrad)


@pytest.mark.parametrize("kw", [dict(pp=4, m=8), dict(pp=8, m=4), dict(pp=4, m=16, dp=2),
                                dict(pp=2, m=8, tp=2, dp=2)])
def test_memory_compute_and_speed_against_1f1b(kw):
    """With the cost model's stages (embedding, head, communication): every stage holds
    min(m, p) micro-batches at its peak, so the maximum over stages equals 1F1B's (the
    paper's claim) and no stage exceeds it; each stage computes exactly what it computes
    under 1F1B (B + W = the backward); and the iteration is shorter."""
    zb, one = make_plan(schedule="zb-h1", **kw), make_plan(schedule="1f1b", **kw)
    sz, so = simulate_graph(zb), simulate_graph(one)
    pp, m = kw["pp"], kw["m"]
    layers = [s.num_layers for s in zb.pipelines[0].stages]
    peak_1f1b = max(so.in_flight_layers[(0, s)] / layers[s] for s in range(pp))
    assert peak_1f1b == min(m, pp)
    for s in range(pp):
        chunks = sz.in_flight_layers[(0, s)] / layers[s]
        assert chunks == min(m, pp) == in_flight_chunks(
            schedule="zb-h1", stage=s, pp=pp, num_microbatches=m, virtual_stages=1)
        assert chunks <= peak_1f1b
    for s in range(pp):
        busy = [sum(sim.graph.durations[t] for t in range(len(sim.graph))
                    if sim.graph.kinds[t] in ("F", "B", "W") and sim.graph.meta[t].pipeline == 0
                    and sim.graph.meta[t].stage == s) for sim in (sz, so)]
        assert busy[0] == pytest.approx(busy[1], rel=1e-12)
    assert sz.schedule.makespan_s < so.schedule.makespan_s


def test_w_is_the_weight_gradient_gemms():
    """W of a layer is its `.wgrad` GEMMs: part of the backward's compute, no collectives."""
    plan = make_plan(pp=2, m=4, tp=2, schedule="zb-h1")
    c = plan_costs(plan).costs[0][0]
    w, bwd = c.layer_weight_grad, c.layer_backward
    assert 0.3 * bwd.compute_s < w.compute_s < 0.6 * bwd.compute_s
    assert w.tp_s == w.cp_s == 0 and bwd.tp_s > 0
    assert c.weight_grad == w * c.num_layers


def test_gradients_are_reduced_after_the_w_passes():
    """Data-parallel buckets wait for the last W, sharded-gradient reduce-scatters follow
    each W: gradients are complete only once the weight gradients are."""
    from planner.specs.plan import Sharding

    for sharding in (Sharding(), Sharding(grads=2, optim=2)):
        sim = simulate_graph(make_plan(pp=2, dp=2, m=4, schedule="zb-h1", sharding=sharding))
        g = sim.graph
        preds = {t: [] for t in range(len(g))}
        for t, succ in enumerate(g.succs):
            for u in succ:
                preds[u].append(t)
        reductions = [t for t in range(len(g)) if g.kinds[t] == "dp"
                      and g.names[t].startswith(("grad-sync", "reduce-scatter"))]
        assert reductions
        for t in reductions:
            assert {g.kinds[p] for p in preds[t]} == {"W"}, g.names[t]


def test_closed_form_is_exact_on_equal_stages():
    """The closed form (planner/predict/estimate.py) on equal stages without communication:
    the simulator's makespan, including m < p and T_W > T_F (while T_W <= T_B)."""
    for pp, m in ((4, 8), (4, 3), (8, 32), (8, 5)):
        plan = make_plan(pp=pp, m=m, schedule="zb-h1", layers=24)
        for fwd, bwd, wgrad in (PAPER, (1.0, 1.5, 0.5), (0.5, 1.5, 1.0)):
            costs = flat_costs(plan, fwd=fwd, bwd=bwd + wgrad, wgrad=wgrad)
            assert estimate(plan, costs=costs).iteration_time_s == pytest.approx(
                simulate_graph(plan, costs=costs).schedule.makespan_s, rel=1e-12)


@pytest.mark.parametrize("factors", [(1, 1.5, 1, 1), (1.5, 1, 1, 1), (1, 1, 1, 1.5),
                                     (0.7, 1, 1, 1.3), (1, 1.2, 0.8, 1.1)])
@pytest.mark.parametrize("p2p", [0.0, 0.05])
def test_closed_form_is_close_on_unequal_stages(factors, p2p):
    """Stages of unequal speed (with and without transfers): within 5% of the simulator
    (the 1F1B closed form is off by up to 6% on the same stages)."""
    plan = make_plan(pp=4, m=16 if factors != (1, 1.2, 0.8, 1.1) else 8, schedule="zb-h1",
                     layers=24)
    costs = [[dataclasses.replace(c, layer_forward=c.layer_forward * k,
                                  layer_backward=c.layer_backward * k,
                                  layer_weight_grad=c.layer_weight_grad * k)
              for c, k in zip(row, factors, strict=True)]
             for row in flat_costs(plan, fwd=1.0, bwd=2.0, wgrad=0.8, p2p=p2p)]
    assert estimate(plan, costs=costs).iteration_time_s == pytest.approx(
        simulate_graph(plan, costs=costs).schedule.makespan_s, rel=0.05)


@pytest.mark.parametrize("kw", [dict(pp=4, m=16), dict(pp=8, m=8), dict(pp=2, dp=4, m=8),
                                dict(pp=4, dp=2, m=8, tp=2)])
def test_closed_form_agrees_with_the_simulator_on_real_plans(kw):
    plan = make_plan(schedule="zb-h1", **kw)
    assert estimate(plan).iteration_time_s == pytest.approx(simulate(plan).iteration_time_s,
                                                            rel=0.03)


@pytest.mark.parametrize("kw", [dict(pp=8, m=16), dict(pp=8, m=16, layers=64),
                                dict(pp=4, m=8, layers=48)])
def test_real_plans_save_two_w_per_extra_stage(kw):
    """With the cost model's stages (GPT-3 1.3B, embedding and head on the end stages,
    transfers): the iteration and its bubble shrink by 1F1B's (p - 1)(F + B + W) minus
    ZB-H1's (p - 1)(F + B - W) = 2(p - 1)W of a middle stage, the same compute."""
    plan = make_plan(schedule="zb-h1", **kw)
    one, zb = simulate(make_plan(**kw)), simulate(plan)
    saving = 2 * (kw["pp"] - 1) * plan_costs(plan).costs[0][1].weight_grad_s
    assert one.iteration_time_s - zb.iteration_time_s == pytest.approx(saving, rel=1e-6)
    assert one.breakdown.bubble_s - zb.breakdown.bubble_s == pytest.approx(saving, rel=0.01)
    assert zb.breakdown.total_s == pytest.approx(zb.iteration_time_s, rel=1e-9)
    assert zb.breakdown.compute_s == pytest.approx(one.breakdown.compute_s, rel=1e-9)


def test_zero_w_is_1f1b():
    """With nothing to defer, ZB-H1 is 1F1B."""
    plan, base = make_plan(pp=4, m=8, schedule="zb-h1"), make_plan(pp=4, m=8)
    zero = [[dataclasses.replace(c, layer_weight_grad=Part()) for c in row]
            for row in plan_costs(plan).costs]
    assert simulate_graph(plan, costs=zero).schedule.makespan_s == pytest.approx(
        simulate_graph(base).schedule.makespan_s, rel=1e-12)


def test_gantt_draws_w_in_its_own_colour(tmp_path):
    """W passes are purple in the Gantt chart (and named in its legend); 1F1B has none."""
    import matplotlib.image
    import matplotlib.pyplot as plt
    import numpy as np

    purple = np.array(plt.cm.Purples(0.45)[:3])
    found = {}
    for schedule in ("zb-h1", "1f1b"):
        _, sim = simulate_detailed(make_plan(pp=4, m=8, schedule=schedule))
        png = tmp_path / f"{schedule}.png"
        write_gantt(sim, str(png))
        pixels = matplotlib.image.imread(str(png))[..., :3]
        found[schedule] = int((np.abs(pixels - purple).max(axis=-1) < 0.02).sum())
    assert found["zb-h1"] > 1000 and found["1f1b"] == 0
