"""Analytic estimate of one training iteration of a Plan (closed-form pipeline model).

Per pipeline, with t_s the time of one micro-batch (forward + backward + its
activation transfers) on stage s and m micro-batches, a 1F1B or GPipe schedule takes
max_k (Σ_{j<k} t_j / v + m·t_k): the critical path through each stage's fill, work and
drain (for p equal stages (m + (p−1)/v)·t, Narayanan et al. 2021, v interleaved chunks). Gradient reduction overlaps the last
micro-batch's backward bucket by bucket (per model chunk when interleaved); the optimizer
step follows. Replicas that split the layers alike reduce each stage's gradients together:
as long as the slowest member's share (`costs.stages.dp_paced`), ending after the last
replica's last bucket, and every replica's optimizer step waits for it
(`joint_reductions`). The event simulator refines this with the actual dependencies; both price
work through `stage_costs`.

Pipeline transfers: under 1F1B and ZB-H1 (batched sends) a stage's micro-batch takes
at least what its sends stream carries (its activation to the next stage and its gradient
to the previous one); the fill and drain through an earlier stage are its passes and a
transfer each way over its link; a stage whose warmup forwards do not cover micro-batch
0's way on and back waits for the rest (`_delays_s`); and where links are slow the
stages run at the pace of the cycles through them (`_cycle_paths`: a forward waits for an
earlier micro-batch's gradient, which crossed every link between them twice). Blocking
sends (DeepSpeed) hold the stage for its exchange with the next. Interleaved, its sends
run beside the other chunks' compute and cost the steady state only where they outlast
it, but the fill pays them in full (its compute shrinks by v, its transfers do not), and
no micro-batch is shorter than v / pp of a chunk's round through every stage; and, phase
by phase (`_interleaved_paths`), its warmup and cooldown run at the pace of the laps a
micro-batch's chunks make round every stage, its steady steps at least at the pace of the
cycles over the links (`_link_cycle_s`). No pipeline ends before each link has carried its
transfers both ways, which overlap only in the steady state (`_link_bound_s`).
`benchmarks/estimate_vs_simulation.py` measures the gap to the simulator (400 random
plans on nodes joined by InfiniBand or 10-100 Gb/s Ethernet: mean 7.8% -> 2.3%
(2026-12-06, transfers per link), 1F1B and ZB-H1 1.6% -> 0.5% (2026-12-06, cycles), the
whole set 1.92% -> 1.16% and its interleaved plans 2.63% -> 1.5% (2026-12-06, phases)).

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

import itertools
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
from planner.specs.layout import chunk_sizes
from planner.specs.plan import Plan
from profiler.store import Profiles

__all__ = ["ESTIMATE_SOURCE", "critical_path_s", "estimate", "iteration_end_s", "iteration_time",
           "joint_reductions", "pass_host_s", "pipeline_time", "receives_s", "sends_s"]

ESTIMATE_SOURCE = "analytic pipeline estimate (closed form, planner/predict/estimate.py)"

# a stage's cost object, the blocking receives it waits for, what its sends add
# (`_outbound_s`), its own two sends (`_hops_s`)
_Key = tuple[int, float, float, float]


def sends_s(c: StageCost, pp: int, vp: int, busy: float = 0.0,
            outbound: float | None = None) -> float:
    """The time a stage's transfers add to each of its micro-batches. Blocking
    (DeepSpeed): one exchange over the link to the next stage (activations out, their
    gradients back) holds the stage, none from the last stage. Otherwise the stage's own
    sends of a micro-batch (`outbound`, `_outbound_s`: its activation to the next stage,
    its gradient to the previous) run on its link's stream beside the compute; under
    1F1B and ZB-H1 `outbound` is what that stream takes beyond the stage's own work, or
    under GPipe what the stage waits for them (`_outbound_s`). Under interleaving a
    stage sends about two per model chunk beside the other chunks' compute: they add to
    the steady state only where they outlast the stage's own `busy` time (the stage then
    waits for its link); their latency is paid in the fill (`_paths`). Without
    `outbound` (a stage priced alone, its neighbours unknown: the mixed search's layer
    split) the exchange over the link to the next stage, both ways under 1F1B, every
    send interleaved."""
    if c.p2p_blocking or (outbound is None and vp == 1):
        return 2 * c.p2p_s if c.stage < pp - 1 else 0.0
    if outbound is None:
        outbound = _sent(c, pp, vp) * c.p2p_s
    return outbound if vp == 1 else max(0.0, outbound - busy)


def _outbound_s(costs: Sequence[StageCost], stage: int, vp: int,
                work: Sequence[float], steady: bool = False) -> float:
    """What stage `stage` waits for its pipeline transfers per micro-batch. Interleaved or
    blocking (DeepSpeed): what it sends, an activation per model chunk over the link to
    the next stage (but the last stage's last chunk) and a gradient per chunk over the
    link to the previous one (but the first stage's first; interleaved, the first stage's
    go over the last stage's link around to it). 1F1B and ZB-H1 (`steady`): what its
    sends stream, which carries its activation and its gradient one after the other
    (`_hops_s`), takes beyond its own work (`work`: each stage's `_work_s`); the cycles
    over links that pace it are priced apart (`_cycle_paths`). GPipe: each send less what
    the neighbour across that link has to spare, the time the stage computes longer than
    it per micro-batch."""
    pp = len(costs)
    if vp > 1 or costs[stage].p2p_blocking:
        acts, grads = vp - (stage == pp - 1), vp - (stage == 0)
        return acts * costs[stage].p2p_s + grads * costs[stage - 1].p2p_s
    if steady:
        return max(0.0, _hops_s(costs, stage) - work[stage])
    waits = 0.0
    for other, link in ((stage + 1, stage), (stage - 1, stage - 1)):
        if 0 <= other < pp:
            spare = max(0.0, work[stage] - work[other])
            waits += max(0.0, costs[link].p2p_s - spare)
    return waits


def _hops_s(costs: Sequence[StageCost], stage: int) -> float:
    """A stage's own sends of one micro-batch: its activation over the link to the next
    stage and its gradient over the link to the previous one."""
    return ((costs[stage].p2p_s if stage < len(costs) - 1 else 0.0)
            + (costs[stage - 1].p2p_s if stage > 0 else 0.0))


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


def _work_s(c: StageCost, pp: int, vp: int, receives: float = 0.0, zb: bool = False
            ) -> float:
    """One micro-batch's work on a stage: its passes (`_busy_s`) and their host calls;
    a micro-batch takes that and the transfers the stage waits for (`sends_s`)."""
    return _busy_s(c, vp, receives, zb) + pass_host_s(c, pp, vp)


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


def _busy_s(c: StageCost, vp: int, receives: float = 0.0, zb: bool = False) -> float:
    """One micro-batch's work on a stage: compute, its collectives, blocking receives, what
    each pass waits for its ZeRO-3 parameter gathers (`_gathers_s`), and sharded-gradient
    reduce-scatters: all of each where the framework runs them in line, else what outlasts
    the next micro-batch (`grad_paced_s`); no less than the gather stream's work
    (`_gather_stream_s`). `zb`: ZB-H1, whose B and W are passes of their own."""
    span = _unpaced_s(c, vp, receives, zb)
    return max(span + _paced_s(c, span), _gather_stream_s(c))


def _unpaced_s(c: StageCost, vp: int, receives: float, zb: bool = False) -> float:
    """`_busy_s` without the reduce-scatters: the time from one micro-batch's gradients to
    the next's on the stage."""
    return (c.forward_s + c.backward_s + receives + _gathers_s(c, vp, c.forward.compute_s)
            + _gathers_s(c, vp, _gathered_backward_s(c, zb)))


def _gathered_backward_s(c: StageCost, zb: bool) -> float:
    """The compute a backward's parameter gathers run under: under ZB-H1 B's alone (W is a
    pass of its own, after them: `simulator.build._gathers` of the B part), else the
    whole backward. With the whole backward, llama2-7b on 64 L40S at ZeRO-3, pp 2,
    trainplan, ZB-H1, was estimated 7.8% fast (its B waited 102 ms a micro-batch, priced
    5)."""
    return c.backward.compute_s - (c.weight_grad.compute_s if zb else 0.0)


def _gathers_s(c: StageCost, vp: int, compute_s: float) -> float:
    """What a pass of `compute_s` waits for its ZeRO-3 parameter gathers, as the simulator
    prices each pass (`simulator.build._gathers`): with prefetch the first unit's gather
    runs a pass ahead and the rest under the units' compute, so the pass waits where a unit
    gathers slower than one computes (`gather_stall_s`, per model chunk); without prefetch
    each gather is issued and waited for in turn, the first one's too. The gather stream
    carries every unit's gather of every pass: where passes follow back to back it sets
    the pace (`_gather_stream_s`, in `_busy_s`); where something runs between them (an
    in-line reduce-scatter) it gathers the next pass's units meanwhile. (A pass priced at
    the stream's pace, units x gather - compute, was 2.5% slow beside trainplan's in-line
    reduce-scatters: gpt3-1.3b on 16 L40S at ZeRO-3, pp 2, ZB-H1.)"""
    if not c.dp.gather_units:
        return 0.0
    stall = vp * gather_stall_s(c.dp, compute_s / vp, c.dp.gather_units / vp)
    return stall if c.dp.prefetch >= 1 else c.dp.gather_unit_s + stall


def _gather_stream_s(c: StageCost) -> float:
    """A micro-batch's work on the prefetching gather stream: every unit gathered for the
    forward and again for the backward (the simulator gathers for every pass but W)."""
    if not c.dp.gather_units or c.dp.prefetch < 1:
        return 0.0
    return 2 * c.dp.gather_units * c.dp.gather_unit_s


def _paced_s(c: StageCost, span_s: float) -> float:
    if not c.dp.overlap:
        return c.dp.grad_microbatch_s
    return max(0.0, c.dp.grad_microbatch_s - span_s)


def grad_paced_s(c: StageCost, vp: int = 1, receives: float = 0.0, zb: bool = False
                 ) -> float:
    """What a micro-batch's sharded-gradient reduce-scatter adds to its stage's next
    micro-batch: all of it where the framework does not overlap its reduction
    (`Communication.overlap_grad_reduce`: in line), else what outlasts that micro-batch
    (`_unpaced_s`: its own stream of them sets the pace, beside the compute and the
    parameter gathers' stream). The last micro-batch has no next one: its reduce-scatter
    goes with the final reduction into the stage's tail (as the simulator folds it into
    the gradient sync, `simulator.build`), so a pipeline's path counts m - 1 of these,
    and the fill a stage passes on none."""
    return _paced_s(c, _unpaced_s(c, vp, receives, zb))


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
        gap = (forward + c.backward_s - c.weight_grad_s
               + _gathers_s(c, vp, _gathered_backward_s(c, True)))
    else:
        gap = forward
    return max(0.0, c.dp.grad_microbatch_s - gap)


def _tail_grads_s(c: StageCost, grads_s: float, window_s: float, pp: int, vp: int,
                  lap_s: float = 0.0) -> float:
    """What the iteration's gradient reduction (`grads_s`) adds after the last backward
    pass (`window_s`, which hides its buckets as they are cut). With v interleaved chunks
    each chunk's gradients reduce once its own last backward is done (Megatron-Core's
    DistributedDataParallel per model chunk; the simulator's buckets per chunk): the
    cooldown runs the last pp micro-batches of each chunk in turn, so chunk k's reduction
    starts k x pp chunk-backwards before chunk 0's and only what it still holds of the
    stream when chunk 0's starts (the backlog), with chunk 0's own 1 / v, outlasts chunk
    0's last backward. Chunk k + 1's last backward comes no later than a lap of the
    backwards round every stage (`lap_s`: each stage's and link's share of one chunk)
    before chunk k's: the last micro-batch's gradient goes round the ring once per chunk."""
    if not grads_s:
        return 0.0
    if vp == 1 or not c.dp.overlap:
        return exposed_s(grads_s, max(window_s, 0.0), c.dp)
    chunk = grads_s / vp
    backlog = max(0.0, (vp - 1) * (chunk - max(pp * c.backward_s / vp, lap_s)))
    return max(grads_s / c.dp.buckets, chunk + backlog - max(window_s / vp, 0.0))


def pipeline_time(costs: Sequence[StageCost], *, num_microbatches: int, virtual_stages: int,
                  schedule: Schedule = Schedule.ONE_F_ONE_B, flushes: int = 1,
                  reduced: Sequence[float] | None = None) -> tuple[float, dict[str, float]]:
    """End time of one pipeline's iteration (its stages' costs in order) under `schedule`
    (`flushes` of them in a row, `_pipeline_end`) and the critical stage's breakdown.
    `reduced`: when each stage position's gradient reduction over every replica ends
    (`joint_reductions`), where the pipeline's own ends earlier. Stages that are the same
    object are priced once."""
    m, vp, pp = num_microbatches, virtual_stages, len(costs)
    end, pipe_s, opt_s, slow, times, keys, _ = _pipeline_end(
        costs, m, vp, Schedule(schedule), flushes, reduced)
    after = end - pipe_s  # what sticks out after the pipeline drains
    opt_s = min(opt_s, after)
    c, zb = costs[slow], Schedule(schedule).splits_backward
    work = c.forward + c.backward
    host = pass_host_s(c, pp, vp)
    sends = (sends_s(c, pp, vp, _busy_s(c, vp, keys[slow][1], zb) + host, keys[slow][2])
             + keys[slow][1])
    # interleaved: the fill's transfers up to the critical stage that its own link's
    # waits do not cover (`_paths`)
    fill = max(0.0, sum(_fill_hops_s(d, vp) for d in costs[:slow]) - m * sends)
    parts = {
        "compute": m * work.compute_s,
        "host": m * (work.host_s + host),
        "tp": m * work.tp_s,
        "cp": m * work.cp_s,
        "ep": m * work.ep_s,
        "pp": m * sends + fill,
        "dp": (after - opt_s + m * (times[slow] - work.total_s - host - sends)
               - grad_paced_s(c, vp, keys[slow][1], zb)),
        "opt": opt_s,
    }
    parts["bubble"] = end - sum(parts.values())
    return end, parts


def _pipeline_end(costs: Sequence[StageCost], m: int, vp: int, schedule: Schedule,
                  flushes: int = 1, reduced: Sequence[float] | None = None
                  ) -> tuple[float, float, float, int, list[float], list[_Key],
                             list[tuple[float, float]]]:
    """The iteration's end; the critical path before gradients and the optimizer; the
    optimizer step of the stage that ends last; the critical stage; micro-batch times;
    each stage's key (its cost object, the blocking receives it waits for); per stage,
    when its gradient reduction ends and what follows it (the optimizer step and the
    exposed parameter gather), its reduction ending no earlier than `reduced` (the
    joint reduction's end, `joint_reductions`) where given. With `flushes` > 1 the m
    micro-batches run as that many schedules of m / flushes in a row (NeMo AutoModel's
    `schedule.step` per local batch): stage 0 starts the next one when it has finished
    the last (the critical path's end), so each adds its fill and drain; gradients and
    the optimizer follow the last."""
    zb = schedule.splits_backward
    memo, keys, times, paths = _critical_paths(costs, m // flushes, vp, schedule)
    slow = max(range(len(costs)), key=paths.__getitem__)
    # the schedules before the last, each with its last micro-batch's reduce-scatter (only
    # the iteration's last goes into the tail: `grad_paced_s`)
    lead = (flushes - 1) * (paths[slow] + grad_paced_s(costs[slow], vp, keys[slow][1], zb))
    pipe_s = lead + paths[slow]
    end, opt_s, drain = pipe_s, 0.0, 0.0
    w0 = memo[keys[0]][4]
    ends: list[tuple[float, float]] = []
    for s, c in enumerate(costs):  # stage s finishes its last backward `drain` before stage 0
        _, tail, step, _, w = memo[keys[s]]
        after = _after_s(c)
        # under ZB-H1 its last B, then its last min(s + 1, m) W's
        grads_end = pipe_s - drain + tail - after + (min(s + 1, m // flushes) * w - w0
                                                     if zb else 0.0)
        if reduced is not None:
            grads_end = max(grads_end, reduced[s])
        ends.append((grads_end, after))
        if grads_end + after > end:
            end, opt_s = grads_end + after, c.optimizer_s
        drain += step
    return end, pipe_s, opt_s, slow, times, keys, ends


def _after_s(c: StageCost) -> float:
    """What follows a stage's gradient reduction: its optimizer step, and what its
    parameter gather (sharded parameters) adds beyond the next forward it overlaps."""
    gather = (exposed_s(c.dp.param_iteration_s, c.forward_s, c.dp)
              if c.dp.param_iteration_s else 0.0)
    return c.optimizer_s + gather


def joint_reductions(ends: Sequence[Sequence[tuple[float, float]]],
                     costs: Sequence[Sequence[StageCost]]) -> list[float] | None:
    """When each stage position's gradient reduction ends, where replicas that split the
    layers alike reduce it together (one collective over all their ranks: none finishes
    before the last replica's last bucket has gone round, and each replica's optimizer
    step waits for it; the simulator's reduction, `simulator.build`): the latest of the
    replicas' own ends (`ends`: per replica, per stage, its reduction's end and what
    follows, `_pipeline_end`). None where the replicas split the layers unlike (they
    reduce per layer segment) or there is one. A replica of a faster GPU ends its
    backward first, but not its iteration."""
    if len(costs) < 2:
        return None
    layers = [c.num_layers for c in costs[0]]
    if any([c.num_layers for c in row] != layers for row in costs[1:]):
        return None
    return [max(e[k][0] for e in ends) for k in range(len(layers))]


def iteration_end_s(costs: Sequence[Sequence[StageCost]], microbatches: Sequence[int], *,
                    virtual_stages: int, schedule: Schedule, flushes: int = 1) -> float:
    """`iteration_time`'s time alone (what the search ranks by), without the breakdown."""
    schedule = Schedule(schedule)
    own = [_pipeline_end(pc, m, virtual_stages, schedule, flushes)
           for pc, m in zip(costs, microbatches, strict=True)]
    joint = joint_reductions([o[6] for o in own], costs)
    if joint is None:
        return max(o[0] for o in own)
    return max(max(r + after for r, (_, after) in zip(joint, o[6], strict=True)) for o in own)


def _critical_paths(costs: Sequence[StageCost], m: int, vp: int, schedule: Schedule
                    ) -> tuple[dict[_Key, tuple[float, float, float, float, float]],
                               list[_Key], list[float], list[float]]:
    """Per distinct (stage object, receives) its (micro-batch, tail, drain step, forward
    step, deferred W); each stage's key; each stage's micro-batch time; the critical path
    through each stage."""
    pp, zb = len(costs), schedule.splits_backward
    memo: dict[_Key, tuple[float, float, float, float, float]] = {}
    paced: dict[_Key, float] = {}  # `grad_paced_s` of each, priced once as the rest
    receives = [receives_s(costs, s, vp) for s in range(pp)]
    priced: dict[tuple[int, float], float] = {}  # `_work_s` of each distinct stage
    for c, r in zip(costs, receives, strict=True):
        if (id(c), r) not in priced:
            priced[(id(c), r)] = _work_s(c, pp, vp, r, zb)
    work = [priced[(id(c), r)] for c, r in zip(costs, receives, strict=True)]
    steady = vp == 1 and schedule != Schedule.GPIPE and not costs[0].p2p_blocking
    lap_b = sum(c.backward_s / vp + c.p2p_s for c in costs) if vp > 1 else 0.0
    keys = [(id(c), r, _outbound_s(costs, s, vp, work, steady), _hops_s(costs, s))
            for s, (c, r) in enumerate(zip(costs, receives, strict=True))]
    for c, key, busy in zip(costs, keys, work, strict=True):
        if key not in memo:
            paced[key] = grad_paced_s(c, vp, key[1], zb)
            w = c.weight_grad_s if zb else 0.0
            # with the last micro-batch's reduce-scatter (`grad_paced_s`)
            last_grads = c.dp.grad_iteration_s + c.dp.grad_microbatch_s
            # buckets are cut from the last gradient pass: the backward, or ZB-H1's last W,
            # less what the previous micro-batch's reduce-scatter still holds of the stream
            window = ((w if zb else c.backward_s + _gathers_s(c, vp, c.backward.compute_s))
                      - _backlog_s(c, m, schedule, vp))
            grad = _tail_grads_s(c, last_grads, window, pp, vp, lap_b)
            # the fill's and drain's step on the stage: half its own two sends (1F1B,
            # ZB-H1), else half what it waits for per micro-batch
            half = (key[3] if steady else
                    sends_s(c, pp, vp, c.forward_s + c.backward_s, key[2]) + key[1]) / 2
            memo[key] = (busy + sends_s(c, pp, vp, busy, key[2]),
                         grad + _after_s(c),
                         c.backward_s - w + half, c.forward_s + half, w)
    times = [memo[k][0] for k in keys]
    if vp > 1:
        # micro-batch j's chunk c + 1 on a stage waits for its chunk c to go round all pp
        # stages, a pass and a transfer on each, while the stage runs the pp micro-batches
        # of its group (forwards and backwards alike): each micro-batch takes at least
        # v / pp of that round
        round_s = (max(sum(c.forward_s for c in costs), sum(c.backward_s for c in costs))
                   + vp * sum(c.p2p_s for c in costs))
        times = [max(t, round_s / pp) for t in times]
    # the fill up to a stage is its predecessors' micro-batches without their reduce-
    # scatters, which pace only their own next micro-batch (`grad_paced_s`)
    excess = [paced[k] for k in keys]
    # interleaved: the fill crosses each stage's link (`_paths`), and a stage's sends
    # hold it only where they keep its link busier than its compute
    hops = [_fill_hops_s(c, vp) for c in costs]
    waits = [t - busy if vp > 1 else 0.0 for t, busy in zip(times, work, strict=True)]
    # 1F1B and ZB-H1: the fill and drain through an earlier stage are its passes and a
    # transfer each way over its link to the next, not its steady state's period (a heavy
    # last stage slows the cycles through it but not micro-batch 0's way there and back)
    fills = ([busy + 2 * c.p2p_s for busy, c in zip(work, costs, strict=True)]
             if steady else times)
    delays = (_delays_s(costs, work, excess, m, zb) if steady
              else [0.0] * pp)
    if steady and zb:
        # ZB-H1: a stage whose sends stream outlasts its work (each micro-batch's slot in
        # `times`) sends its warmup's activations while it waits for its first B, so only
        # what the wait outlasts them idles the stream (under 1F1B the same took flat
        # pipelines over slow links 3% below the simulation: not applied there)
        delays = [max(0.0, d - min(pp - s - 1, m - 1) * (t - busy))
                  for s, (d, t, busy) in enumerate(zip(delays, times, work, strict=True))]
    inline = [_inline_s(c) for c in costs]
    paths = (_zb_paths([memo[k] for k in keys], m, excess, fills, delays, inline) if zb
             else _paths(times, m, vp, excess, hops, waits, fills, delays))
    if vp > 1:
        # the phases hold what a micro-batch's average misses (the warmup and cooldown at
        # the laps' pace), the average what the phases' shares of a chunk smooth over
        phased = _interleaved_paths(costs, [w - e for w, e in zip(work, excess, strict=True)],
                                    excess, m, vp)
        paths = [max(p, q) for p, q in zip(paths, phased, strict=True)]
    if steady:
        paths = _cycle_paths(costs, paths, times, work, excess, inline, m, zb)
    # the last micro-batch's reduce-scatter is in the stage's tail, not its path
    paths = [p - e for p, e in zip(paths, excess, strict=True)]
    if vp > 1:
        # no shorter than micro-batch 0's own way through every chunk and back, each hop
        # a transfer (the fill shrinks by vp, its transfers do not): what a slow link
        # makes of a pipeline with few micro-batches
        chain = sum(c.forward_s + c.backward_s + pass_host_s(c, pp, vp)
                    + k[2] for c, k in zip(costs, keys, strict=True))
        paths = [max(p, chain) for p in paths]
    bound = _link_bound_s(costs, m, vp, schedule)
    return memo, keys, times, [max(p, bound) for p in paths]


def _interleaved_paths(costs: Sequence[StageCost], work: list[float], excess: list[float],
                       m: int, vp: int) -> list[float]:
    """Interleaved 1F1B, phase by phase: the path through each stage to stage 0's last
    backward. Megatron's order (`simulator.schedules`) runs w_s = 2 (p - s - 1) + (v - 1) p
    warmup forwards on stage s, then pairs of a forward and a backward, then w_s
    backwards; micro-batches go in groups of p, each group's chunks in turn, so a
    micro-batch's chunk c + 1 follows its chunk c round every stage (a lap: each stage's
    pass of a chunk and each link's transfer). With f, b a stage's share of one chunk
    (`work`, without the sharded-gradient reduce-scatters `excess`, which pace each
    micro-batch) and L each link's transfer:
    - its first backward waits for micro-batch 0's last chunk: v laps forward and its
      gradient back to the stage; and for its warmup forwards, those after the first
      group's as far apart as a lap over p, the stage's forward or its link allows;
    - a pair takes the stage's work, at least ((v - 1) laps + p (f + b)) / (p v) (a group's
      chunks wait for their laps), and at least what the cycles over the links allow
      (`_link_cycle_s`);
    - the cooldown's backwards are as far apart as a backward lap over p, the stage's
      backward or its link to the previous stage allows;
    - from its first backward on, its sends stream carries every gradient it sends and the
      steady state's activations;
    and its last backward's gradient goes back to stage 0. On 10 uniform pipelines of
    flat costs (`benchmarks/estimate_vs_simulation.py`'s slow and PCIe sets hold the real
    ones) this lands within 3.3% of the simulation, where the per-micro-batch path alone
    (`_paths`) was 7% short: the warmup and cooldown run at the pace of the laps, not of
    the compute."""
    pp, total = len(costs), m * vp
    links = [c.p2p_s for c in costs]
    fwd = [w / vp * c.forward_s / max(c.forward_s + c.backward_s, 1e-30)
           for c, w in zip(costs, work, strict=True)]
    bwd = [w / vp - f for w, f in zip(work, fwd, strict=True)]
    lap_f, lap_b = sum(fwd) + sum(links), sum(bwd) + sum(links)
    cycle = _link_cycle_s([f + b for f, b in zip(fwd, bwd, strict=True)], links,
                          min(work) / vp)
    # a stage's chunks are of unlike size where vp does not divide its layers (the first
    # chunks take the extra) and by the embedding and the head (`_chunk_shares`):
    # micro-batch 0 goes to each stage by the chunk 0's forwards, its last chunk's
    # gradient comes back by the last chunk's backwards, a stage's last gradient (of
    # chunk 0) by chunk 0's
    shares = [_chunk_shares(c, vp, s == pp - 1) for s, c in enumerate(costs)]
    # sums over the stages before each: those passes, transfers
    fwds = [0.0, *itertools.accumulate(
        f * vp * sh[0] for f, sh in zip(fwd, shares, strict=True))]
    backs = [0.0, *itertools.accumulate(
        b * vp * sh[1] for b, sh in zip(bwd, shares, strict=True))]
    backs_last = [0.0, *itertools.accumulate(
        b * vp * sh[2] for b, sh in zip(bwd, shares, strict=True))]
    hops = [0.0, *itertools.accumulate(links)]
    paths = []
    for s in range(pp):
        warm = min(2 * (pp - s - 1) + (vp - 1) * pp, total)
        # micro-batch 0's last chunk: v laps but the last link, then its gradient from
        # the last stage back to this one
        chain = (vp * lap_f - links[-1] + (backs_last[pp] - backs_last[s + 1])
                 + (hops[pp - 1] - hops[s]))
        # micro-batch 0's way to the stage, and its last gradient's back to stage 0
        start, drain = fwds[s] + hops[s], backs[s] + hops[s]
        paced = (start + min(warm, pp) * fwd[s]
                 + max(0, warm - pp) * max(fwd[s], lap_f / pp, links[s]))
        # a steady state's first step runs its forward before that first backward
        steady = total - warm
        first_b = max(chain, paced + (fwd[s] if steady else 0.0))
        pair = max(work[s] / vp, ((vp - 1) * max(lap_f, lap_b)
                                  + pp * (fwd[s] + bwd[s])) / (pp * vp), cycle)
        back = max(bwd[s], lap_b / pp, links[s - 1])
        steady_sends = steady
        if s == pp - 1:  # the last chunk's activations go nowhere
            steady_sends -= _in_chunk(total, pp, vp, vp - 1) - _in_chunk(warm, pp, vp, vp - 1)
        stream = first_b + bwd[s] + steady_sends * links[s] + m * (vp - (s == 0)) * links[s - 1]
        phases = (first_b + (steady - 1) * pair + warm * back if steady
                  else first_b + (warm - 1) * back) + bwd[s]
        paths.append(max(phases, stream) + drain + m * excess[s])
    return paths


def _chunk_shares(c: StageCost, vp: int, last_stage: bool) -> tuple[float, float, float]:
    """The shares of a stage's forward and backward in its first chunk and of its
    backward in its last, as the simulator splits them (`simulator.build._chunk_parts`:
    `layout.chunk_sizes`' layers, the embedding in the first chunk, the head in the last
    stage's last; without the embedding and loss slots, which `Training.slots` moves
    only where the layer split counts them)."""
    sizes = chunk_sizes(c.num_layers, vp)
    f = [c.layer_forward.total_s * n + c.runner.total_s for n in sizes]
    b = [c.layer_backward.total_s * n for n in sizes]
    f[0] += c.embed_forward.total_s
    b[0] += c.embed_backward.total_s
    if last_stage:
        f[-1] += c.head_forward.total_s
        b[-1] += c.head_backward.total_s
    tf, tb = max(sum(f), 1e-30), max(sum(b), 1e-30)
    return f[0] / tf, b[0] / tb, b[-1] / tb


def _link_cycle_s(pairs: Sequence[float], links: Sequence[float], floor: float = 0.0
                  ) -> float:
    """Interleaved 1F1B's steady state: the shortest step (a chunk's forward and
    backward) the cycles over the links allow; 0 where none can exceed `floor`. Stage s
    runs its steady steps two after stage s - 1's for the same forward (their warmups
    differ by two) and in the same step for the same backward, so a forward from stage a
    over n links and the backward back close a cycle of 2 n + 1 steps holding the n + 1
    stages' steps and 2 n transfers: a step lasts at least (Σ pairs + 2 Σ links) / (2 n + 1)
    over every window (one link between equal stages of step t: (2 t + 2 L) / 3)."""
    pp, best = len(pairs), 0.0
    top, slowest = max(pairs), max(links)
    if max(2 * (top + slowest) / 3, (top + 2 * slowest) / 2) <= floor:
        return 0.0  # no window's average reaches the stages' own steps
    for a in range(pp):
        work, link = pairs[a], 0.0
        for n in range(1, pp + 1):
            work += pairs[(a + n) % pp]
            link += links[(a + n - 1) % pp]
            best = max(best, (work + 2 * link) / (2 * n + 1))
    return best


def _in_chunk(n: int, pp: int, vp: int, chunk: int) -> int:
    """How many of a stage's first `n` forwards (or backwards) under Megatron's
    interleaved order are of model chunk `chunk` (its k-th is of chunk (k // pp) % vp)."""
    groups, rest = divmod(n, pp * vp)
    return groups * pp + min(max(rest - chunk * pp, 0), pp)


def _link_bound_s(costs: Sequence[StageCost], m: int, vp: int, schedule: Schedule) -> float:
    """No pipeline ends before each link between stages has carried its transfers: the
    activations from stage s (one per micro-batch and chunk; interleaved, the last stage's
    go around to the first) one way, their gradients the other, each way on its sender's
    stream (batched sends). The two ways overlap only in the steady state: the
    activations of the warmup's forwards go before any gradient comes back, and the
    gradients of the cooldown's backwards after the last activation (warmup: pp - s - 1
    forwards under 1F1B and ZB-H1, 2 (pp - s - 1) + (v - 1) pp interleaved, as
    Megatron-Core's schedules run them; all of them under GPipe). With m v <= warmup the
    link carries its two ways in turn: llama2-7b at pp 8 vp 4, m 8, across 100 Gb/s
    Ethernet was estimated 46% faster than the simulation. Before the first transfer
    run the forwards up to the stage, after the last the backwards back to the first
    (ZB-H1: their B's, and the first stage's last W).
    Blocking sends (DeepSpeed) hold the compute and are priced there (`sends_s`)."""
    if len(costs) == 1 or costs[0].p2p_blocking:
        return 0.0
    zb = schedule.splits_backward  # ZB-H1: only B goes back; the W's follow beside it
    pp, bound, lead_in = len(costs), 0.0, 0.0
    lead_out = costs[0].weight_grad_s if zb else 0.0
    for s, c in enumerate(costs):
        lead_in += c.forward_s / vp
        lead_out += (c.backward_s - (c.weight_grad_s if zb else 0.0)) / vp
        sent = m * (vp - (s == pp - 1))
        if schedule == Schedule.GPIPE:
            warmup = sent
        elif vp > 1:
            warmup = 2 * (pp - s - 1) + (vp - 1) * pp
        else:
            warmup = pp - s - 1
        bound = max(bound, lead_in + (sent + min(sent, warmup)) * c.p2p_s + lead_out)
    return bound


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
    schedule = Schedule(schedule)
    # one replica (or alike ones, priced once) reduces alone: no pass for the joint ends
    joint = (joint_reductions([_pipeline_end(pc, m, virtual_stages, schedule, flushes)[6]
                               for pc, m in zip(costs, microbatches, strict=True)], costs)
             if len(costs) > 1 else None)
    ends = [pipeline_time(pc, num_microbatches=m, virtual_stages=virtual_stages,
                          schedule=schedule, flushes=flushes, reduced=joint)
            for pc, m in zip(costs, microbatches, strict=True)]
    critical = max(range(len(ends)), key=lambda i: ends[i][0])
    return ends[critical][0], ends[critical][1], critical


def _fill_hops_s(c: StageCost, vp: int) -> float:
    """Interleaved, what the fill spends on stage `c`'s link: the first micro-batches cross
    it once per model chunk each way (none without interleaving: the fill's transfers are
    then in its micro-batches, `sends_s`)."""
    return 2 * vp * c.p2p_s if vp > 1 else 0.0


def _paths(times: list[float], m: int, vp: int, excess: list[float], hops: list[float],
           waits: list[float], fills: list[float], delays: list[float]) -> list[float]:
    """1F1B / GPipe: the critical path through stage k is the fill up to it, its m
    micro-batches, the drain back from it (the fill and drain shrink by v with
    interleaving). For equal stages the slowest path is the last stage's, (m + (p - 1)/v) t;
    a slow stage followed by faster ones is not delayed by them. `excess`: each stage's
    `grad_paced_s`, in its own micro-batches but not in the fill it passes on.
    Interleaved, the fill's compute shrinks by v but its transfers do not: the first
    micro-batches cross each earlier stage's link once per chunk each way (`hops`, 2 v
    transfers), beyond what stage k already waits for its own link (`waits`, per
    micro-batch) in the meantime."""
    prefix, crossed, paths = 0.0, 0.0, []
    for t, e, hop, wait, fill, delay in zip(times, excess, hops, waits, fills, delays,
                                            strict=True):
        paths.append(prefix / vp + max(0.0, crossed - m * wait) + m * t + delay)
        prefix += fill - e
        crossed += hop
    return paths


def _delays_s(costs: Sequence[StageCost], work: list[float], excess: list[float], m: int,
              zb: bool) -> list[float]:
    """1F1B and ZB-H1 with batched sends: how long each stage waits for its first
    backward beyond its warmup. Its first gradient comes back after micro-batch 0's way
    through the later stages and back (their passes, under ZB-H1 their B's, and two
    transfers over each link from the stage on), while the stage runs its warmup's
    min(pp - k - 1, m - 1) further forwards: a slow stage followed by faster ones waits
    for nothing, a stage before slow links for what its forwards do not cover (two
    nodes of four stages each over 10 Gb/s, pp 8: the path through the stage before a
    slow link was 10% short without it)."""
    pp = len(costs)
    delays, beyond = [0.0] * pp, 0.0
    for k in range(pp - 1, -1, -1):
        if k < pp - 1:
            beyond += 2 * costs[k].p2p_s
        warm = min(pp - k - 1, m - 1)
        delays[k] = max(0.0, beyond - warm * costs[k].forward_s)
        beyond += work[k] - excess[k] - (costs[k].weight_grad_s if zb else 0.0)
    return delays


def _cycle_paths(costs: Sequence[StageCost], paths: list[float], times: list[float],
                 work: list[float], excess: list[float], inline: list[float], m: int,
                 zb: bool) -> list[float]:
    """1F1B and ZB-H1 with batched sends: the cycles over pipeline links. Stage j runs
    pp - j - 1 forwards ahead of its backwards (Megatron-Core's warmup), so on stages
    j < k the forward of micro-batch i goes from j to k, k runs it and then its backward
    of i - (pp - k - 1), whose gradient comes back to j, and j's next forward is of
    i + pp - j: a cycle of the passes of stages j..k (under ZB-H1 their B's, and stage
    0's W, which it runs before that forward; the others defer theirs) and two transfers
    over each link between them, every n = k - j + 1 micro-batches (it needs m > pp - j).
    Stage j's last backward comes then after micro-batch 0's way through every stage and
    back (`trip`), q = (m - 1) // n such cycles, and the r = (m - 1) % n micro-batches
    before them, which follow one another at the pace of the shorter cycles and of every
    stage's own work and sends (`times`). For equal stages of work t over links of
    transfer L the cycle through all of them paces t + 2 L (pp - 1) / pp, not the
    t + 2 L of a stage's own sends: llama2-13b on four L40S nodes over one 25 Gb/s NIC
    each (pp 4, 8 replicas a NIC), ZB-H1, simulated 10.83 s, estimated 10.85 s (13.02 s
    with each stage waiting for its own sends); gpt3-1.3b at pp 2 over 10 Gb/s, m 4:
    0.80 s to stage 0's last backward, as simulated. Each stage's sends stream is first
    in first out (below): a cycle's ends queue one transfer behind the other where it
    outlasts the pass beside it; five stages over 10 Gb/s of 2-7 ms passes and 58 ms
    transfers but the last (114 ms), llama2-13b on A100 + H100 nodes: estimated 14.8%
    fast without it, 0.1% with it."""
    pp = len(costs)
    if not any(c.p2p_s for c in costs[:-1]):
        return paths  # no cycle averages above its slowest stage
    w = [c.weight_grad_s if zb else 0.0 for c in costs]
    trip = sum(work[s] - excess[s] - w[s] for s in range(pp)) + w[0]
    trip += 2 * sum(c.p2p_s for c in costs[:-1])
    # Each stage has one sends stream, first in first out: the cycle's first stage j > 0
    # sends its backward's gradient up before the forward's activations down (the
    # forward, computed meanwhile, waits what the transfer outlasts it), and its last
    # stage k < pp - 1 its forward's activations down before the backward's gradient up
    queued_up = [max(0.0, costs[j - 1].p2p_s - c.forward_s) if j else 0.0
                 for j, c in enumerate(costs)]
    queued_down = [max(0.0, c.p2p_s - (c.backward_s - w[k])) if k < pp - 1 else 0.0
                   for k, c in enumerate(costs)]
    # in the steady state only: stage s's last pp - s - 1 backwards send no forward, so of
    # the m - 1 micro-batches after the first, m - pp + s queue at s
    steady = [max(0, m - pp + s) for s in range(pp)]
    links = [2 * c.p2p_s for c in costs]
    # a reduce-scatter run in line (`inline`, `_inline_s`) follows its backward (under
    # ZB-H1 its W) while the gradient goes on: on the cycle only where the first stage
    # runs it before its next forward (1F1B; under ZB-H1 stage 0, with its W)
    # per first stage j, its cycles' (span, period, what queues in all of them); and the
    # pace of micro-batches between cycles of span n: shorter cycles, own work
    windows: list[tuple[int, list[tuple[int, float, float]]]] = []
    shorter = [max(times)] * (pp + 1)
    for j in range(max(0, pp - m + 1), pp - 1):
        total = (work[j] - w[j] - (inline[j] if zb else 0.0)
                 + (w[0] + inline[0] if zb and j == 0 else 0.0))
        up, cycles = queued_up[j], []
        for k in range(j + 1, pp):
            total += work[k] - w[k] - inline[k] + links[k - 1]
            n = k - j + 1
            down = queued_down[k]
            queued = 0.0
            if up or down:  # the lesser of the two (inline: this loop runs pp^2 / 2 times)
                queued, most = (steady[j] * up + steady[k] * down) / n, (m - 1) // n * (up + down)
                if most < queued:
                    queued = most
            period = total / n
            cycles.append((n, period, queued))
            if n < pp and period > shorter[n + 1]:
                shorter[n + 1] = period
        windows.append((j, cycles))
    if not windows:
        return paths
    for n in range(1, pp + 1):
        shorter[n] = max(shorter[n], shorter[n - 1])
    out = list(paths)
    turns = [divmod(m - 1, n) if n else (0, 0) for n in range(pp + 1)]
    for j, cycles in windows:
        # (each path still holds its stage's last reduce-scatter, taken out after)
        base, longest = trip + excess[j], out[j]
        for n, period, queued in cycles:
            q, r = turns[n]
            path = base + r * shorter[n] + q * n * period + queued
            if path > longest:
                longest = path
        out[j] = longest
    return out


def _zb_paths(stages: list[tuple[float, float, float, float, float]], m: int,
              excess: list[float], fills: list[float], delays: list[float],
              inline: list[float]) -> list[float]:
    """ZB-H1 (module docstring): the path through stage k's m micro-batches and the
    drain back to stage 0, which ends with stage 0's last W; or, where that is longer,
    stage k's own work after its first forward arrives, and stage 0's after its first
    backward arrives (it runs min(m, p) forwards before it). A framework that
    reduce-scatters each micro-batch's gradients in line runs it after that micro-batch's
    W (`inline`), so the drain carries the deferred W's reduce-scatters too (but the
    last's, which goes into the tail)."""
    pp = len(stages)
    t0, _, b0, f0, w0 = stages[0]
    prefix = fill = back = 0.0
    paths = []
    for k, ((t, _, b, f, w), e, through, delay, rs) in enumerate(zip(
            stages, excess, fills, delays, inline, strict=True)):
        deferred = min(k + 1, m)
        paths.append(max(prefix + m * t - deferred * w - (deferred - 1) * rs + w0 + delay,
                         fill + m * t))
        prefix += through - w - e
        fill += f
        back += b
    # stage 0's first B waits for micro-batch 0 to pass every stage and come back
    paths[0] = max(paths[0], fill + back - b0 + m * t0 - min(m, pp) * f0)
    return paths


def _inline_s(c: StageCost) -> float:
    """A micro-batch's sharded-gradient reduce-scatter where the framework runs it in line
    after the weight gradients (`Communication.overlap_grad_reduce` off: trainplan's
    executor, DeepSpeed), else 0 (on its own stream: `grad_paced_s`)."""
    return 0.0 if c.dp.overlap else c.dp.grad_microbatch_s


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
