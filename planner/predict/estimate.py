"""Analytic estimate of one training iteration of a Plan (closed-form pipeline model).

Per pipeline, with t_s the time of one micro-batch (forward + backward + its
activation transfers) on stage s and m micro-batches, a 1F1B or GPipe schedule takes
max_k (Σ_{j<k} t_j / v + m·t_k): the critical path through each stage's fill, work and
drain (for p equal stages (m + (p−1)/v)·t, Narayanan et al. 2021, v interleaved chunks). Gradient reduction overlaps the last
micro-batch's backward bucket by bucket; the optimizer step follows. The event simulator
refines this with the actual dependencies; both price work through `stage_costs`.

ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2.1) defers each micro-batch's
weight gradients (W, w_s of t_s) on stage s by s micro-batches, so the drain through stage
k costs only f + b per earlier stage and stage k's last min(k + 1, m) W's run while the
last backward travels back: max_k (Σ_{j<k} (t_j − w_j) + m·t_k − min(k + 1, m)·w_k + w_0).
For p equal stages and m ≥ p that is m(f + b + w) + (p − 1)(f + b − w), the paper's
bubble, when w ≤ f; where w > f, stage 0's wait for its first B, (p − 1)·b, is the bubble
instead. Both match the simulator exactly while w ≤ b (the cost model's layers have
w ≤ b: W is one GEMM per forward GEMM, B the other and the attention backward).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.costs.memory import MEMORY_SOURCE
from planner.costs.stages import (
    PlanCosts,
    StageCost,
    cost_sources,
    exposed_s,
    gather_stall_s,
    plan_costs,
)
from planner.predict.results import Breakdown, SimResult, StageSummary, make_result
from planner.specs.choices import Schedule
from planner.specs.plan import Plan
from profiler.store import Profiles

__all__ = ["ESTIMATE_SOURCE", "critical_path_s", "estimate", "iteration_end_s", "iteration_time",
           "pass_host_s", "pipeline_time", "receives_s", "sends_s"]

ESTIMATE_SOURCE = "analytic pipeline estimate (closed form, planner/predict/estimate.py)"


def sends_s(c: StageCost, pp: int, vp: int, busy: float = 0.0) -> float:
    """The time one micro-batch's transfers add to the stage's micro-batch: one exchange
    over the link to the next stage (activations out, their gradients back), none from
    the last stage unless interleaving wraps it around to the first. Under interleaving
    the stage sends about two per model chunk (`_sent`) beside the other chunks' compute
    (Megatron overlaps them; the event simulation runs them on the sender's stream for
    the link): they add more only where they outlast the stage's own `busy` time, and
    the stage then waits for its link."""
    once = 2 * c.p2p_s if (c.stage < pp - 1 or vp > 1) else 0.0
    return once if vp == 1 else max(once, _sent(c, pp, vp) * c.p2p_s - busy)


def _sent(c: StageCost, pp: int, vp: int) -> int:
    """Transfers a stage sends per micro-batch: an activation per model chunk but the
    last stage's last, a gradient per chunk but the first stage's first."""
    return 2 * vp - (c.stage == 0) - (c.stage == pp - 1)


def receives_s(costs: Sequence[StageCost], stage: int, vp: int) -> float:
    """Blocking pipelines (DeepSpeed): the transfers over the link from the previous stage
    that also hold this stage's compute, one activation in and its gradient out per
    micro-batch (the previous stage's `p2p_s` each; stage 0 only when interleaving wraps
    the last stage around to it)."""
    c = costs[stage]
    if not c.p2p_blocking or (stage == 0 and vp == 1) or len(costs) == 1:
        return 0.0
    return 2 * costs[stage - 1].p2p_s


def _microbatch_s(c: StageCost, pp: int, vp: int, receives: float = 0.0) -> float:
    """One micro-batch on a stage: its work (`_busy_s`, `pass_host_s`) and the transfers
    it waits for (`sends_s`)."""
    busy = _busy_s(c, vp, receives) + pass_host_s(c, pp, vp)
    return busy + sends_s(c, pp, vp, busy)


def pass_host_s(c: StageCost, pp: int, vp: int) -> float:
    """What the passes of one micro-batch hold the stage's compute thread for beyond the
    stage's forward and backward sums, as the event simulation prices each pass
    (`simulator.build._chunk_parts`): the runner around each further model chunk's pass
    under interleaving (`StageCost.forward` counts it once), and with batched pipeline
    sends the calls of each transfer the stage sends and takes (`_sent` of each; CPU
    hosts' `p2p_send` / `p2p_recv` rows, 0 elsewhere)."""
    calls = 0.0 if c.p2p_blocking else _sent(c, pp, vp) * (c.p2p_send_host.total_s
                                                            + c.p2p_recv_host.total_s)
    return (vp - 1) * c.runner.total_s + calls


def _busy_s(c: StageCost, vp: int, receives: float = 0.0) -> float:
    """One micro-batch's work on a stage: compute, its collectives, blocking receives, the
    ZeRO-3 parameter gathers its compute cannot hide (the first unit of each pass, and
    what a gather-bound pass waits for), and sharded-gradient reduce-scatters: all of each
    where the framework runs them in line, else what outlasts the next micro-batch
    (`grad_paced_s`)."""
    span = _unpaced_s(c, vp, receives)
    return span + _paced_s(c, span)


def _unpaced_s(c: StageCost, vp: int, receives: float) -> float:
    """`_busy_s` without the reduce-scatters: the time from one micro-batch's gradients to
    the next's on the stage."""
    return (c.forward_s + c.backward_s + receives + _gathers_s(c, vp, c.forward.compute_s)
            + _gathers_s(c, vp, c.backward.compute_s))


def _gathers_s(c: StageCost, vp: int, compute_s: float) -> float:
    """What a pass of `compute_s` waits for ZeRO-3 parameter gathers: the first unit's,
    and in each chunk what a gather-bound pass waits beyond it (`gather_stall_s`)."""
    if not c.dp.gather_units:
        return 0.0
    return c.dp.gather_unit_s + vp * gather_stall_s(c.dp, compute_s / vp,
                                                    c.dp.gather_units / vp)


def _paced_s(c: StageCost, span_s: float) -> float:
    if not c.dp.overlap:
        return c.dp.grad_microbatch_s
    return max(0.0, c.dp.grad_microbatch_s - span_s)


def grad_paced_s(c: StageCost, vp: int = 1, receives: float = 0.0) -> float:
    """What a micro-batch's sharded-gradient reduce-scatter adds to its stage's next
    micro-batch: all of it where the framework does not overlap its reduction
    (`Communication.overlap_grad_reduce`: in line), else what outlasts that micro-batch
    (`_unpaced_s`: its own stream of them sets the pace, beside the compute and the
    parameter gathers' stream). The last micro-batch has no next one: its reduce-scatter
    goes with the final reduction into the stage's tail (as the simulator folds it into
    the gradient sync, `simulator.build`), so a pipeline's path counts m - 1 of these,
    and the fill a stage passes on none."""
    return _paced_s(c, _unpaced_s(c, vp, receives))


def _backlog_s(c: StageCost, m: int, schedule: Schedule, vp: int) -> float:
    """Sharded gradients: how much of the previous micro-batch's reduce-scatter is still
    running when the last gradient pass starts (one forward after it under 1F1B, the
    forward and B under ZB-H1, none under GPipe's back-to-back backwards; each pass with
    the parameter gathers it waits for)."""
    if m < 2 or not c.dp.grad_microbatch_s or not c.dp.overlap:  # none left: in line
        return 0.0
    forward = c.forward_s + _gathers_s(c, vp, c.forward.compute_s)
    if schedule == Schedule.GPIPE:
        gap = 0.0
    elif schedule == Schedule.ZB_H1:
        gap = forward + c.backward_s - c.weight_grad_s + _gathers_s(c, vp, c.backward.compute_s)
    else:
        gap = forward
    return max(0.0, c.dp.grad_microbatch_s - gap)


def pipeline_time(costs: Sequence[StageCost], *, num_microbatches: int, virtual_stages: int,
                  schedule: Schedule = Schedule.ONE_F_ONE_B, flushes: int = 1
                  ) -> tuple[float, dict[str, float]]:
    """End time of one pipeline's iteration (its stages' costs in order) under `schedule`
    (`flushes` of them in a row, `_pipeline_end`) and the critical stage's breakdown.
    Stages that are the same object are priced once."""
    m, vp, pp = num_microbatches, virtual_stages, len(costs)
    end, pipe_s, opt_s, slow, times, keys = _pipeline_end(costs, m, vp, Schedule(schedule),
                                                          flushes)
    after = end - pipe_s  # what sticks out after the pipeline drains
    opt_s = min(opt_s, after)
    c = costs[slow]
    work = c.forward + c.backward
    host = pass_host_s(c, pp, vp)
    sends = sends_s(c, pp, vp, _busy_s(c, vp, keys[slow][1]) + host) + keys[slow][1]
    parts = {
        "compute": m * work.compute_s,
        "host": m * (work.host_s + host),
        "tp": m * work.tp_s,
        "cp": m * work.cp_s,
        "ep": m * work.ep_s,
        "pp": m * sends,
        "dp": (after - opt_s + m * (times[slow] - work.total_s - host - sends)
               - grad_paced_s(c, vp, keys[slow][1])),
        "opt": opt_s,
    }
    parts["bubble"] = end - sum(parts.values())
    return end, parts


def _pipeline_end(costs: Sequence[StageCost], m: int, vp: int, schedule: Schedule,
                  flushes: int = 1
                  ) -> tuple[float, float, float, int, list[float], list[tuple[int, float]]]:
    """The iteration's end; the critical path before gradients and the optimizer; the
    optimizer step of the stage that ends last; the critical stage; micro-batch times;
    each stage's key (its cost object, the blocking receives it waits for). With
    `flushes` > 1 the m micro-batches run as that many schedules of m / flushes in a row
    (NeMo AutoModel's `schedule.step` per local batch): stage 0 starts the next one when
    it has finished the last (the critical path's end), so each adds its fill and drain;
    gradients and the optimizer follow the last."""
    zb = schedule.splits_backward
    memo, keys, times, paths = _critical_paths(costs, m // flushes, vp, schedule)
    slow = max(range(len(costs)), key=paths.__getitem__)
    # the schedules before the last, each with its last micro-batch's reduce-scatter (only
    # the iteration's last goes into the tail: `grad_paced_s`)
    lead = (flushes - 1) * (paths[slow] + grad_paced_s(costs[slow], vp, keys[slow][1]))
    pipe_s = lead + paths[slow]
    end, opt_s, drain = pipe_s, 0.0, 0.0
    w0 = memo[keys[0]][4]
    for s, c in enumerate(costs):  # stage s finishes its last backward `drain` before stage 0
        _, tail, step, _, w = memo[keys[s]]
        # under ZB-H1 its last B, then its last min(s + 1, m) W's
        stage_end = pipe_s - drain + tail + (min(s + 1, m // flushes) * w - w0 if zb else 0.0)
        if stage_end > end:
            end, opt_s = stage_end, c.optimizer_s
        drain += step
    return end, pipe_s, opt_s, slow, times, keys


def iteration_end_s(costs: Sequence[Sequence[StageCost]], microbatches: Sequence[int], *,
                    virtual_stages: int, schedule: Schedule, flushes: int = 1) -> float:
    """`iteration_time`'s time alone (what the search ranks by), without the breakdown."""
    schedule = Schedule(schedule)
    return max(_pipeline_end(pc, m, virtual_stages, schedule, flushes)[0]
               for pc, m in zip(costs, microbatches, strict=True))


_Key = tuple[int, float]  # a stage's cost object, and the blocking receives it waits for


def _critical_paths(costs: Sequence[StageCost], m: int, vp: int, schedule: Schedule
                    ) -> tuple[dict[_Key, tuple[float, float, float, float, float]],
                               list[_Key], list[float], list[float]]:
    """Per distinct (stage object, receives) its (micro-batch, tail, drain step, forward
    step, deferred W); each stage's key; each stage's micro-batch time; the critical path
    through each stage."""
    pp, zb = len(costs), Schedule(schedule).splits_backward
    memo: dict[_Key, tuple[float, float, float, float, float]] = {}
    paced: dict[_Key, float] = {}  # `grad_paced_s` of each, priced once as the rest
    keys = [(id(c), receives_s(costs, s, vp)) for s, c in enumerate(costs)]
    for c, key in zip(costs, keys, strict=True):
        if key not in memo:
            paced[key] = grad_paced_s(c, vp, key[1])
            w = c.weight_grad_s if zb else 0.0
            # with the last micro-batch's reduce-scatter (`grad_paced_s`)
            last_grads = c.dp.grad_iteration_s + c.dp.grad_microbatch_s
            # buckets are cut from the last gradient pass: the backward, or ZB-H1's last W,
            # less what the previous micro-batch's reduce-scatter still holds of the stream
            window = ((w if zb else c.backward_s + _gathers_s(c, vp, c.backward.compute_s))
                      - _backlog_s(c, m, schedule, vp))
            grad = exposed_s(last_grads, max(window, 0.0), c.dp) if last_grads else 0.0
            gather = (exposed_s(c.dp.param_iteration_s, c.forward_s, c.dp)
                      if c.dp.param_iteration_s else 0.0)
            half = (sends_s(c, pp, vp, c.forward_s + c.backward_s) + key[1]) / 2
            memo[key] = (_microbatch_s(c, pp, vp, key[1]), grad + c.optimizer_s + gather,
                         c.backward_s - w + half, c.forward_s + half, w)
    times = [memo[k][0] for k in keys]
    # the fill up to a stage is its predecessors' micro-batches without their reduce-
    # scatters, which pace only their own next micro-batch (`grad_paced_s`)
    excess = [paced[k] for k in keys]
    paths = (_zb_paths([memo[k] for k in keys], m, excess) if zb
             else _paths(times, m, vp, excess))
    # the last micro-batch's reduce-scatter is in the stage's tail, not its path
    paths = [p - e for p, e in zip(paths, excess, strict=True)]
    if vp > 1:
        # no shorter than micro-batch 0's own way through every chunk and back, each hop
        # a transfer (the fill shrinks by vp, its transfers do not): what a slow link
        # makes of a pipeline with few micro-batches
        chain = sum(c.forward_s + c.backward_s + pass_host_s(c, pp, vp)
                    + _sent(c, pp, vp) * c.p2p_s for c in costs)
        paths = [max(p, chain) for p in paths]
    return memo, keys, times, paths


def critical_path_s(costs: Sequence[StageCost], *, num_microbatches: int,
                    virtual_stages: int, schedule: Schedule) -> tuple[float, int]:
    """The pipeline's longest path through a stage's micro-batches (what `pipeline_time`
    adds gradient reduction and the optimizer to), and that stage."""
    _, _, _, paths = _critical_paths(costs, num_microbatches, virtual_stages,
                                     Schedule(schedule))
    slow = max(range(len(costs)), key=paths.__getitem__)
    return paths[slow], slow


def iteration_time(costs: Sequence[Sequence[StageCost]], microbatches: Sequence[int], *,
                   virtual_stages: int, schedule: Schedule, flushes: int = 1
                   ) -> tuple[float, dict[str, float], int]:
    """The iteration of replicas `costs` (one list of stage costs each) running
    `microbatches[r]` micro-batches each, as `flushes` schedules in a row: the latest
    replica's end, its breakdown, and which replica it is. The search ranks candidates
    with this, `estimate` prices Plans."""
    ends = [pipeline_time(pc, num_microbatches=m, virtual_stages=virtual_stages,
                          schedule=schedule, flushes=flushes)
            for pc, m in zip(costs, microbatches, strict=True)]
    critical = max(range(len(ends)), key=lambda i: ends[i][0])
    return ends[critical][0], ends[critical][1], critical


def _paths(times: list[float], m: int, vp: int, excess: list[float]) -> list[float]:
    """1F1B / GPipe: the critical path through stage k is the fill up to it, its m
    micro-batches, the drain back from it (the fill and drain shrink by v with
    interleaving). For equal stages the slowest path is the last stage's, (m + (p - 1)/v) t;
    a slow stage followed by faster ones is not delayed by them. `excess`: each stage's
    `grad_paced_s`, in its own micro-batches but not in the fill it passes on."""
    prefix, paths = 0.0, []
    for t, e in zip(times, excess, strict=True):
        paths.append(prefix / vp + m * t)
        prefix += t - e
    return paths


def _zb_paths(stages: list[tuple[float, float, float, float, float]], m: int,
              excess: list[float]) -> list[float]:
    """ZB-H1 (module docstring): the path through stage k's m micro-batches and the
    drain back to stage 0, which ends with stage 0's last W; or, where that is longer,
    stage k's own work after its first forward arrives, and stage 0's after its first
    backward arrives (it runs min(m, p) forwards before it)."""
    pp = len(stages)
    t0, _, b0, f0, w0 = stages[0]
    prefix = fill = back = 0.0
    paths = []
    for k, ((t, _, b, f, w), e) in enumerate(zip(stages, excess, strict=True)):
        paths.append(max(prefix + m * t - min(k + 1, m) * w + w0, fill + m * t))
        prefix += t - w - e
        fill += f
        back += b
    # stage 0's first B waits for micro-batch 0 to pass every stage and come back
    paths[0] = max(paths[0], fill + back - b0 + m * t0 - min(m, pp) * f0)
    return paths


def estimate(plan: Plan, *, costs: PlanCosts | list[list[StageCost]] | None = None,
             profiles: Profiles | None = None) -> SimResult:
    """Iteration time, throughput, MFU, breakdown and memory of `plan` (closed form),
    with `costs` in place of the cost model's if given (tests, what-ifs), and op and
    collective times from `profiles` where they have them."""
    priced = PlanCosts.of(costs) if costs is not None else plan_costs(plan, profiles)
    reps = priced.representatives
    iteration_s, parts, _ = iteration_time(
        [priced.costs[r] for r in reps], [plan.pipelines[r].num_microbatches for r in reps],
        virtual_stages=plan.training.virtual_stages, schedule=plan.training.schedule,
        flushes=plan.training.pipeline_flushes)
    stages = tuple(
        StageSummary(pipeline=c.pipeline, stage=c.stage, device=c.device,
                     layers=plan.pipelines[c.pipeline].stages[c.stage].layers,  # type: ignore[arg-type]  # a stage's layers are a checked pair
                     forward_s=c.forward_s, backward_s=c.backward_s, memory=c.memory,
                     attention=str(plan.attention_of(plan.pipelines[c.pipeline].stages[c.stage])))
        for pc in priced.costs for c in pc)
    # exposed parts are differences of sums: round-off below zero reads as zero
    part = {k: max(v, 0.0) for k, v in parts.items()}
    breakdown = Breakdown(compute_s=part["compute"], host_overhead_s=part["host"],
                          tp_comm_s=part["tp"], cp_comm_s=part["cp"], pp_comm_s=part["pp"],
                          dp_comm_s=part["dp"], bubble_s=part["bubble"], optimizer_s=part["opt"],
                          ep_comm_s=part["ep"])
    return make_result(plan, method="analytic estimate", iteration_s=iteration_s,
                       breakdown=breakdown, stages=stages,
                       sources={**cost_sources(plan, profiles), "memory": MEMORY_SOURCE,
                                "schedule": ESTIMATE_SOURCE})
