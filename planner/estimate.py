"""Analytic estimate of one training iteration of a Plan (closed-form pipeline model).

Per pipeline, with t_s the time of one micro-batch (forward + backward + its
activation transfers) on stage s and m micro-batches, a 1F1B or GPipe schedule takes
max_k (Σ_{j<k} t_j / v + m·t_k): the critical path through each stage's fill, work and
drain (for p equal stages (m + (p−1)/v)·t, Narayanan et al. 2021, v interleaved chunks). Gradient reduction overlaps the last
micro-batch's backward bucket by bucket; the optimizer step follows. The event simulator
refines this with the actual dependencies; both price work through `stage_costs`.
"""

from __future__ import annotations

from planner.memory import MEMORY_SOURCE
from planner.results import Breakdown, SimResult, StageSummary, make_result
from planner.specs.plan import Plan
from planner.stage_costs import StageCost, cost_sources, exposed_s, plan_stage_costs
from profiler.store import Profiles

__all__ = ["ESTIMATE_SOURCE", "estimate", "pipeline_time"]

ESTIMATE_SOURCE = "analytic pipeline estimate (closed form, planner/estimate.py)"


def _sends(c: StageCost, pp: int, vp: int) -> float:
    """Activation transfers one micro-batch makes from this stage (and their gradients):
    none from the last stage unless interleaving wraps it around to the first."""
    return 2 * c.p2p_s if (c.stage < pp - 1 or vp > 1) else 0.0


def _microbatch_s(c: StageCost, pp: int, vp: int) -> float:
    """One micro-batch on a stage: compute, its collectives, the transfers, the ZeRO-3
    parameter gathers that one layer's compute cannot hide, and sharded-gradient
    reduce-scatters that outlast the next micro-batch's work."""
    work = c.forward.compute_s + c.backward.compute_s
    extra = 0.0
    if c.dp.param_microbatch_s:
        layers = max(c.num_layers, 1)
        extra += max(c.dp.param_microbatch_s / layers, c.dp.param_microbatch_s - work)
    extra += max(0.0, c.dp.grad_microbatch_s - work)
    return c.forward_s + c.backward_s + _sends(c, pp, vp) + extra


def pipeline_time(costs: list[StageCost], *, num_microbatches: int, virtual_stages: int
                  ) -> tuple[float, dict[str, float]]:
    """End time of one pipeline's iteration (its stages' costs in order) and the critical
    stage's breakdown. Stages that are the same object are priced once."""
    m, vp, pp = num_microbatches, virtual_stages, len(costs)
    memo: dict[int, tuple[float, float, float]] = {}  # id -> (micro-batch, tail, drain step)
    for c in costs:
        if id(c) not in memo:
            last_grads = c.dp.grad_microbatch_s + c.dp.grad_iteration_s
            grad = exposed_s(last_grads, c.backward_s, c.num_params) if last_grads else 0.0
            gather = (exposed_s(c.dp.param_iteration_s, c.forward_s, c.num_params)
                      if c.dp.param_iteration_s else 0.0)
            memo[id(c)] = (_microbatch_s(c, pp, vp), grad + c.optimizer_s + gather,
                           c.backward_s + _sends(c, pp, vp) / 2)
    times = [memo[id(c)][0] for c in costs]
    # The critical path through stage k: the fill up to it, its m micro-batches, the drain
    # back from it (the fill and drain shrink by v with interleaving). For equal stages
    # the slowest path is the last stage's, (m + (p - 1)/v) t; a slow stage followed by
    # faster ones is not delayed by them.
    prefix, paths = 0.0, []
    for t in times:
        paths.append(prefix / vp + m * t)
        prefix += t
    slow = max(range(len(costs)), key=paths.__getitem__)
    pipe_s = paths[slow]
    end, opt_s, drain = pipe_s, 0.0, 0.0
    for c in costs:  # stage s finishes its last backward `drain` before stage 0 does
        _, tail, step = memo[id(c)]
        stage_end = pipe_s - drain + tail
        if stage_end > end:
            end, opt_s = stage_end, c.optimizer_s
        drain += step
    after = end - pipe_s  # what sticks out after the pipeline drains
    opt_s = min(opt_s, after)
    c = costs[slow]
    work = c.forward + c.backward
    sends = _sends(c, pp, vp)
    parts = {
        "compute": m * work.compute_s,
        "host": m * work.host_s,
        "tp": m * work.tp_s,
        "cp": m * work.cp_s,
        "pp": m * sends,
        "dp": after - opt_s + m * (times[slow] - work.total_s - sends),
        "opt": opt_s,
    }
    parts["bubble"] = end - sum(parts.values())
    return end, parts


def estimate(plan: Plan, *, costs: list[list[StageCost]] | None = None,
             profiles: Profiles | None = None) -> SimResult:
    """Iteration time, throughput, MFU, breakdown and memory of `plan` (closed form),
    with `costs` in place of the cost model's if given (tests, what-ifs), and op and
    collective times from `profiles` where they have them."""
    costs = costs if costs is not None else plan_stage_costs(plan, profiles)
    ends = [pipeline_time(pc, num_microbatches=plan.pipelines[pc[0].pipeline].num_microbatches,
                          virtual_stages=plan.training.virtual_stages) for pc in costs]
    critical = max(range(len(ends)), key=lambda i: ends[i][0])
    iteration_s, parts = ends[critical]
    stages = tuple(
        StageSummary(pipeline=c.pipeline, stage=c.stage, device=c.device,
                     layers=plan.pipelines[c.pipeline].stages[c.stage].layers,  # type: ignore[arg-type]
                     forward_s=c.forward_s, backward_s=c.backward_s, memory=c.memory)
        for pc in costs for c in pc)
    breakdown = Breakdown(compute_s=parts["compute"], host_overhead_s=parts["host"],
                          tp_comm_s=parts["tp"],
                          cp_comm_s=parts["cp"], pp_comm_s=parts["pp"], dp_comm_s=parts["dp"],
                          bubble_s=max(parts["bubble"], 0.0), optimizer_s=parts["opt"])
    return make_result(plan, method="analytic estimate", iteration_s=iteration_s,
                       breakdown=breakdown, stages=stages,
                       sources={**cost_sources(plan, profiles), "memory": MEMORY_SOURCE,
                                "schedule": ESTIMATE_SOURCE})
