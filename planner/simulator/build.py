"""The task graph of one training iteration of a Plan, and its simulation.

Per distinct pipeline (identical replicas are simulated once) and stage, one
representative rank with a compute stream and communication streams per link tier
(intra-node, inter-node) and per communicator (pipeline sends, data-parallel traffic).
Tasks, for every micro-batch j and model chunk c:

* F(s,c,j), B(s,c,j) on the compute stream, in the schedule's order. Their durations
  come from `stage_costs` (tensor/context-parallel collectives and recomputation run in
  line, as Megatron-LM does). Zero-bubble schedules (ZB-H1, Qi et al. 2024) split each
  backward into B (activation gradients, which the previous stage waits for) and W(s,c,j)
  (the layers' weight gradients): gradients are complete after the W's, and a micro-batch's
  activations are held until its W.
* sends of activations (and of their gradients) on the sender's stream for the link that
  joins the two stages; the receiver's pass depends on the send.
* data parallelism: the last backward (W) of each chunk is cut into gradient buckets, each
  reduced on the data-parallel group's stream as soon as it is ready (overlap, as PyTorch
  DDP and Megatron do); sharded gradients are reduce-scattered after every backward (W),
  beside the next pass, or before it where the framework reduces in line
  (`Communication.overlap_grad_reduce` false);
  sharded parameters are gathered one pass ahead of use, on a stream of their own; the optimizer step follows the
  last reduction, then updated parameters are gathered back (its exposed part: the next
  iteration's first forward hides the rest).

CPU ranks of one host share its cores: where the profile measured how much slower n of
them compute at once (`planner/costs/host.py` `shared_cores`), the schedule is a
processor-sharing simulation in which each compute task's CPU work is slowed by the number
of the host's ranks computing at that moment (`graph.SharedCores`); a simulated stage
stands for its tp ranks and for the identical replicas folded into it. Ranks that keep
in step (a tp group, the replicas of a data-parallel reduction) wait for the slowest at
every collective: where the profile measured how late the last rank arrives per second of
compute (`host.sync_skew`), their passes are that much longer (`in_step`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from planner.costs.comm import group_tiers
from planner.costs.host import collective_cpu_share, optimizer_shared, shared_cores, sync_skew
from planner.costs.memory import layers_in_flight, rank_param_count
from planner.costs.stages import (
    Part,
    PlanCosts,
    StageCost,
    dp_sync,
    exposed_s,
    gather_stall_s,
    plan_costs,
)
from planner.gc_pause import gc_paused
from planner.simulator.graph import Schedule, SharedCores, TaskGraph, schedule
from planner.simulator.schedules import Pass, stage_order
from planner.specs.layout import chunk_sizes, pipeline_moe_layers
from planner.specs.plan import Plan
from profiler.devices import DeviceSpec
from profiler.hostcost import activation_bytes
from profiler.store import Profile, Profiles

# A chunk's last backward is simulated in at most this many gradient-bucket pieces: real
# plans have up to a few hundred buckets per stage (Megatron's max(4e7, 1e6 x dp)
# parameters each); a model of trillions of parameters per stage would otherwise make
# millions of tasks (and a trace of hundreds of MB) for a tail it changes by < 0.1%.
MAX_SIMULATED_BUCKETS = 1024

__all__ = ["Simulation", "TaskMeta", "rescheduled", "simulate_graph"]


class TaskMeta(NamedTuple):
    """What a task is for (traces, the report, the shared-core load); a named tuple, made
    once per task: hundreds per plan, millions in a search's exhaustive check."""

    pipeline: int
    stage: int
    chunk: int = 0
    microbatch: int = -1
    part: Part | None = None  # compute-stream tasks: what their time is spent on
    detail: str = ""  # communication tasks: the collective, its size, group and algorithm
    ranks: int = 0  # communication tasks: the largest group of their collectives
    # communication tasks priced from a measurement with this many of the host's ranks in
    # such collectives at once (`DPSync.crowd`; 0: their group alone)
    crowd: int = 0
    # batched pipeline sends: the receiving stage, whose processes take the transfer in on
    # their own cores as the sender's do (-1: none, or a blocking receive, its own task)
    peer: int = -1


@dataclass
class Simulation:
    plan: Plan
    costs: list[list[StageCost]]
    graph: TaskGraph
    schedule: Schedule
    representatives: list[int]  # the pipelines simulated
    representative: list[int]  # per pipeline, the simulated one it equals
    in_flight_layers: dict[tuple[int, int], float]  # (pipeline, stage) -> peak layers held
    profiles: Profiles | None = None  # the measured profiles the costs came from
    host_load: _HostLoad | None = None  # what the shared-core scheduler was given


def chunk_layers(num_layers: int, vp: int, slots: tuple[int, int] = (0, 0)) -> list[int]:
    """Layers of each of a stage's chunks (`layout.chunk_sizes`; `slots`: the embedding and
    loss slots it holds, `Training.slots`)."""
    return chunk_sizes(num_layers, vp, lead=slots[0], tail=slots[1])


def _chunk_parts(c: StageCost, chunk: int, vp: int, last_stage: bool,
                 split_w: bool, slots: tuple[int, int] = (0, 0), *,
                 first_stage: bool = False) -> dict[str, Part]:
    """Time of each pass kind of one chunk: F, B and (with `split_w`) W, where B is the
    backward without its layers' weight gradients (embedding and head stay in B). With
    batched pipeline sends, a pass that receives or sends holds its compute thread for
    the calls (`StageCost.p2p_recv_host`, `p2p_send_host`): F receives its input but on
    the model's first chunk and sends its output but on the last; B the reverse."""
    layers = chunk_layers(c.num_layers, vp, slots)[chunk]
    fwd, bwd = c.layer_forward * layers + c.runner, c.layer_backward * layers
    if chunk == 0:
        fwd, bwd = fwd + c.embed_forward, bwd + c.embed_backward
    if last_stage and chunk == vp - 1:
        fwd, bwd = fwd + c.head_forward, bwd + c.head_backward
    if not c.p2p_blocking:
        if not (first_stage and chunk == 0):  # takes an activation, sends its gradient
            fwd, bwd = fwd + c.p2p_recv_host, bwd + c.p2p_send_host
        if not (last_stage and chunk == vp - 1):  # sends an activation, takes its gradient
            fwd, bwd = fwd + c.p2p_send_host, bwd + c.p2p_recv_host
    if not split_w:
        return {"F": fwd, "B": bwd}
    w = c.layer_weight_grad * layers
    return {"F": fwd, "B": bwd - w, "W": w}


def _comm_stream(g: TaskGraph, plan: Plan, pi: int, si: int, devices: tuple[int, ...],
                 kind: str) -> int:
    """The stream a rank's `kind` traffic (pipeline sends, grad reduce, param gather) to
    `devices` uses, inside the node (NVLink / PCIe) or across nodes (NIC). Each kind is its
    own NCCL communicator or stream, so pipeline sends, gradient reductions and parameter
    gathers do not queue behind each other; transfers of one kind do."""
    inter = any(t.name != "node" for t in group_tiers(plan.cluster, devices))
    return g.stream(f"p{pi}.s{si}.{kind} ({'network' if inter else 'in node'})")


class _Link(NamedTuple):
    """The sends from one stage to another of a pipeline, worked out once: blocking
    (DeepSpeed: on both compute streams) or not (on the sender's stream for the link),
    seconds each, and the tasks' streams and meta."""

    blocking: bool
    seconds: float
    send_stream: int
    recv_stream: int
    send_meta: TaskMeta
    recv_meta: TaskMeta


class _Builder:
    def __init__(self, plan: Plan, priced: PlanCosts, overlap: bool,
                 profiles: Profiles | None):
        self.plan, self.costs, self.overlap = plan, priced.costs, overlap
        self.representative = priced.representative
        self.profiles = profiles
        self.g = TaskGraph()
        self.passes: dict[tuple[int, int, str, int, int], int] = {}  # (p,s,F/B/W,c,j) -> task
        self.buckets: dict[tuple[int, int, int], list[int]] = {}  # (p,s,c) -> last-grad pieces
        self.last_compute: dict[tuple[int, int], int] = {}
        self.in_flight: dict[tuple[int, int], float] = {}
        self.links: dict[tuple[int, int, int], _Link] = {}  # (p, src, dst) -> its sends
        self.dp_groups: dict[int, tuple[int, ...]] = {}  # stage -> its data-parallel group
        self.dp_streams: dict[tuple[int, int, str], int] = {}  # (p, s, kind) -> stream
        self.next_compute: dict[int, int] = {}  # compute task -> the stage's next one
        self.prev_compute: dict[int, int] = {}  # compute task -> the stage's previous one

    def pipeline(self, pi: int) -> None:
        plan, tr = self.plan, self.plan.training
        pipe = plan.pipelines[pi]
        pp, vp, m = len(pipe.stages), tr.virtual_stages, pipe.num_microbatches
        for si in range(pp):
            self._stage_passes(pi, si, stage_order(tr.schedule, stage=si, pp=pp,
                                                   num_microbatches=m, virtual_stages=vp,
                                                   flushes=tr.pipeline_flushes))
        for si in range(pp):
            self._cross_stage_edges(pi, si, pp, vp, m)

    def _stage_passes(self, pi: int, si: int, order: list[Pass]) -> None:
        g, cost = self.g, self.costs[pi][si]
        pipe = self.plan.pipelines[pi]
        vp = self.plan.training.virtual_stages
        last = si == len(pipe.stages) - 1
        compute = g.stream(f"p{pi}.s{si}.compute")
        # the pass that completes a micro-batch's gradients and frees its activations
        grad = "W" if any(phase == "W" for phase, _, _ in order) else "B"
        slots = self.plan.training.slots(si, len(pipe.stages))
        parts = [_chunk_parts(cost, c, vp, last, grad == "W", slots, first_stage=si == 0)
                 for c in range(vp)]
        pieces = self._bucket_count(cost, vp)
        prev, prev2 = -1, -1
        layers = chunk_layers(cost.num_layers, vp, slots)
        last_grad = {c: max(j for ph, cc, j in order if ph == grad and cc == c)
                     for c in range(vp)}
        # a framework that does not overlap its gradient reduction (DeepSpeed without
        # overlap_comm, trainplan's executor) reduce-scatters a micro-batch's sharded
        # gradients in line: the next pass waits for it
        in_line, waits_for = not (self.overlap and cost.dp.overlap), -1
        for phase, c, j in order:
            part = parts[c][phase]
            after = (prev,) if prev >= 0 else ()
            if waits_for >= 0:
                after, waits_for = (*after, waits_for), -1
            name = f"{phase}{c}.{j}" if vp > 1 else f"{phase}{j}"
            if cost.dp.gather_units and phase != "W":
                part, gather = self._gathers(pi, si, (phase, c, j), part, prev, prev2)
                after = (*after, gather)
            if phase == grad and j == last_grad[c]:
                tid = self._bucketed_pass(pi, si, (phase, c, j), name, part, pieces[c], after)
            else:
                tid = g.add(f"{name} p{pi}s{si}", phase, compute, part.total_s,
                            TaskMeta(pi, si, c, j, part), after=after)
                self.passes[(pi, si, phase, c, j)] = tid
                self.passes[(pi, si, phase + "end", c, j)] = tid
            if prev >= 0:
                first = self.passes[(pi, si, phase, c, j)]
                self.next_compute[prev] = first
                self.prev_compute[first] = prev
            if phase == grad and cost.dp.grad_microbatch_s and j != last_grad[c]:
                rs = g.add(f"reduce-scatter p{pi}s{si}{grad}{c}.{j}", "dp",
                           self._dp_stream(pi, si), cost.dp.grad_microbatch_s / vp,
                           TaskMeta(pi, si, c, j, detail=cost.dp.about("grad_microbatch"),
                                    ranks=cost.dp.group_ranks("grad_microbatch"),
                                    crowd=cost.dp.crowd("grad_microbatch")),
                           after=(tid,))
                waits_for = rs if in_line else -1
            prev2, prev = prev, tid
        self.last_compute[(pi, si)] = prev
        # the layers its activations peak at, as the cost model holds them (this order)
        self.in_flight[(pi, si)] = layers_in_flight(
            self.plan.training.schedule, stage=si, pp=len(pipe.stages),
            num_microbatches=pipe.num_microbatches, chunk_layers=tuple(layers),
            flushes=self.plan.training.pipeline_flushes)

    def _gathers(self, pi: int, si: int, pass_: Pass, part: Part, prev: int, prev2: int
                 ) -> tuple[Part, int]:
        """ZeRO-3 / FSDP: the pass's parameter units all-gathered on the stage's gather
        stream, the first one pass ahead (one pass late without prefetch), the rest while
        the pass computes (without prefetch: inside the pass, which issues them); the pass
        waits where a unit gathers slower than the one before it computes
        (`gather_stall_s`). Returns the pass's time with that wait and the
        first gather, which the pass needs."""
        dp, vp = self.costs[pi][si].dp, self.plan.training.virtual_stages
        phase, c, j = pass_
        units = dp.gather_units / vp
        stream = self._dp_stream(pi, si, "param gather")
        ahead = prev2 if dp.prefetch >= 1 else prev
        meta = TaskMeta(pi, si, c, j, detail=dp.about("param_microbatch"),
                        ranks=dp.group_ranks("param_microbatch"),
                        crowd=dp.crowd("param_microbatch"))
        label = f"p{pi}s{si}{phase}{c}.{j}"
        first = self.g.add(f"all-gather {label} unit 1/{units:g}", "dp", stream,
                           dp.gather_unit_s, meta, after=(ahead,) if ahead >= 0 else ())
        # without prefetch the pass issues and waits for each gather in turn: they are its
        # stall (`gather_stall_s`), not a stream's work beside it (on shared CPU cores
        # such a task would load the host a second time)
        if units > 1 and dp.prefetch >= 1:
            self.g.add(f"all-gather {label} units 2-{units:g}", "dp", stream,
                       (units - 1) * dp.gather_unit_s, meta, after=(first,))
        return part + Part(dp_s=gather_stall_s(dp, part.compute_s, units)), first

    def _bucketed_pass(self, pi: int, si: int, pass_: Pass, name: str, part: Part,
                       pieces: int, after: tuple[int, ...]) -> int:
        """A chunk's last gradient pass, cut into `pieces` gradient buckets (each reduced
        as soon as it is computed); returns its last piece."""
        compute = self.g.stream(f"p{pi}.s{si}.compute")
        kind, c, j = pass_
        tids: list[int] = []
        for k in range(pieces):
            label = f"{name}[{k}] p{pi}s{si}" if pieces > 1 else f"{name} p{pi}s{si}"
            tid = self.g.add(label, kind, compute, part.total_s / pieces,
                             TaskMeta(pi, si, c, j, part * (1 / pieces)), after=after)
            if tids:
                self.next_compute[tids[-1]] = tid
                self.prev_compute[tid] = tids[-1]
            tids.append(tid)
            after = (tid,)
        self.buckets[(pi, si, c)] = tids
        self.passes[(pi, si, kind, c, j)] = tids[0]
        self.passes[(pi, si, kind + "end", c, j)] = tids[-1]
        return tids[-1]

    def _bucket_count(self, cost: StageCost, vp: int) -> list[int]:
        """Gradient buckets per chunk (one piece where nothing overlaps the backward), at
        most MAX_SIMULATED_BUCKETS: beyond that a piece carries several buckets, so the
        exposed tail is 1/MAX_SIMULATED_BUCKETS of the traffic instead of one bucket's
        (the buckets' latencies are priced in `dp_sync` all the same)."""
        if not self.overlap or not cost.dp.overlap:  # one bucket where nothing syncs
            return [1] * vp
        return [min(MAX_SIMULATED_BUCKETS, max(1, math.ceil(cost.dp.buckets / vp)))] * vp

    def _dp_stream(self, pi: int, si: int, kind: str = "grad reduce") -> int:
        """The stream of stage `si`'s data-parallel group (aligned replicas): reductions on
        one, parameter gathers on another (FSDP and DeepSpeed issue them on separate
        streams, so a gather does not queue behind pending reductions)."""
        key = (pi, si, kind)
        if key not in self.dp_streams:  # asked for by every pass of a sharded stage
            if si not in self.dp_groups:  # the same for every pipeline: once per stage
                self.dp_groups[si] = tuple(p.stages[min(si, len(p.stages) - 1)].devices[0]
                                           for p in self.plan.pipelines)
            self.dp_streams[key] = _comm_stream(self.g, self.plan, pi, si, self.dp_groups[si],
                                                kind)
        return self.dp_streams[key]

    def _send(self, pi: int, src: int, dst: int, src_task: int, label: str,
              consumer: int) -> int:
        """The transfer of `src_task`'s output from stage `src` to `dst`, which `consumer`
        needs; returns the task the consumer waits for. Batched p2p (Megatron) runs it on
        the sender's stream for the link; blocking p2p (DeepSpeed) holds the sender's
        compute for the send (its next pass waits) and the receiver's for the receive
        (right before the consumer, as DeepSpeed's instruction order has it)."""
        key = (pi, src, dst)
        if key not in self.links:
            pipe = self.plan.pipelines[pi]
            blocking = self.costs[pi][src].p2p_blocking
            devices = (pipe.stages[src].devices[0], pipe.stages[dst].devices[0])
            forward = dst == (src + 1) % len(pipe.stages)
            link = self.costs[pi][src if forward else dst]
            about = link.p2p_transfer.describe() if link.p2p_transfer else ""
            g = self.g
            self.links[key] = _Link(
                blocking, link.p2p_s,
                g.stream(f"p{pi}.s{src}.compute") if blocking else
                _comm_stream(g, self.plan, pi, src, devices, "pipeline sends"),
                g.stream(f"p{pi}.s{dst}.compute"),
                TaskMeta(pi, src, detail=about, ranks=2, peer=-1 if blocking else dst),
                TaskMeta(pi, dst, detail=about, ranks=2))
        ln, g = self.links[key], self.g
        # the transfer's chunk and micro-batch: the sending pass's (the receive: the pass
        # that takes it)
        made, taken = g.meta[src_task], g.meta[consumer]
        send_meta = ln.send_meta._replace(chunk=made.chunk, microbatch=made.microbatch)
        if not ln.blocking:
            return g.add(f"send {label} p{pi} s{src}->s{dst}", "send", ln.send_stream,
                         ln.seconds, send_meta, after=(src_task,))
        send = g.add(f"send {label} p{pi} s{src}->s{dst} (blocking)", "send", ln.send_stream,
                     ln.seconds, send_meta, after=(src_task,))
        if src_task in self.next_compute:
            g.edge(send, self.next_compute[src_task])
        before = self.prev_compute.get(consumer)
        return g.add(f"recv {label} p{pi} s{src}->s{dst} (blocking)", "recv", ln.recv_stream,
                     ln.seconds,
                     ln.recv_meta._replace(chunk=taken.chunk, microbatch=taken.microbatch),
                     after=(src_task,) if before is None else (src_task, before))

    def _cross_stage_edges(self, pi: int, si: int, pp: int, vp: int, m: int) -> None:
        """F(s,c,j) after F(s-1,c,j) (chunk c-1 of the last stage for s = 0) and
        B(s,c,j) after B(s+1,c,j) (chunk c+1 of the first stage for the last stage)."""
        g, passes = self.g, self.passes
        for c in range(vp):
            for j in range(m):
                if si > 0 or c > 0:
                    ss, sc = (si - 1, c) if si > 0 else (pp - 1, c - 1)
                    consumer = passes[(pi, si, "F", c, j)]
                    send = self._send(pi, ss, si, passes[(pi, ss, "Fend", sc, j)],
                                      f"F{sc}.{j}", consumer)
                    g.edge(send, consumer)
                if si < pp - 1 or c < vp - 1:
                    ss, sc = (si + 1, c) if si < pp - 1 else (0, c + 1)
                    consumer = passes[(pi, si, "B", c, j)]
                    send = self._send(pi, ss, si, passes[(pi, ss, "Bend", sc, j)],
                                      f"B{sc}.{j}", consumer)
                    g.edge(send, consumer)
                else:  # the last chunk's backward follows its own forward
                    g.edge(passes[(pi, si, "Fend", c, j)], passes[(pi, si, "B", c, j)])

    def data_parallel(self, reps: list[int]) -> None:
        """Gradient reduction, optimizer step and parameter gather per stage."""
        plan = self.plan
        if not plan.aligned_stages:
            self._segment_sync(reps)
            return
        vp = plan.training.virtual_stages
        first = reps[0]
        for si in range(len(self.costs[first])):
            # one reduction over the replicas' ranks: as long as its slowest member's
            # share (replicas of unlike tp hold unlike shares of the same layers)
            cost = max((self.costs[q][si] for q in reps),
                       key=lambda c: c.dp.grad_iteration_s + c.dp.grad_microbatch_s)
            stream = self._dp_stream(first, si)
            reductions = []
            grad = cost.dp.grad_iteration_s + cost.dp.grad_microbatch_s
            # a framework that reduces after the backward (DeepSpeed, trainplan's
            # executor) starts every chunk's reduction after the stage's last backward
            whole = (() if self.overlap and cost.dp.overlap else
                     tuple(self.last_compute[(q, si)] for q in reps))
            if grad:  # one reduction per bucket, once every replica has computed it
                for c in range(vp):
                    pieces = [self.buckets[(q, si, c)] for q in reps]
                    count = max(len(p) for p in pieces)
                    for k in range(count):
                        # replicas of other GPU types cut their backward into other numbers
                        # of buckets: wait for the piece holding the same share of grads
                        after = tuple(p[k * len(p) // count] for p in pieces) + whole
                        reductions.append(self.g.add(
                            f"grad-sync s{si}c{c}[{k}]", "dp", stream, grad / vp / count,
                            TaskMeta(first, si, c, detail=cost.dp.about("grad_iteration"),
                                     ranks=cost.dp.group_ranks("grad_iteration"),
                                     crowd=max(cost.dp.crowd("grad_iteration"),
                                               cost.dp.crowd("grad_microbatch"))),
                            after=after))
            for pi in reps:
                self._optimizer(pi, si, self.costs[pi][si], reductions)

    def _segment_sync(self, reps: list[int]) -> None:
        """Replicas that split the layers differently reduce gradients per layer segment
        (the pieces between all replicas' stage boundaries), after every replica holding
        the segment has finished its backward."""
        plan = self.plan
        cuts = sorted({b for p in plan.pipelines for s in p.stages for b in s.layers})
        per_stage_reductions: dict[tuple[int, int], list[int]] = {}
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            holders = [(pi, next(si for si, s in enumerate(plan.pipelines[pi].stages)
                                 if s.layers[0] <= lo < s.layers[1])) for pi in range(plan.dp)]
            # every holder's context-parallel ranks (`StageSpec.dp_cp_group`)
            group = tuple(d for pi, si in holders for d in
                          plan.pipelines[pi].stages[si].devices[::plan.pipelines[pi].stages[si].tp])
            pi0, si0 = holders[0]
            stage = plan.pipelines[pi0].stages[si0]
            params = self.costs[pi0][si0].num_params * (hi - lo) / stage.num_layers
            sync = dp_sync(plan.cluster, group, params, len(stage.devices), plan.sharding,
                           plan.training.dtype, self.profiles, comm=plan.training.comm,
                           units=hi - lo)
            rep_of = {pi: self.representative[pi] for pi, _ in holders}
            after = tuple({self.last_compute[(rep_of[pi], si)] for pi, si in holders})
            tid = self.g.add(f"grad-sync layers {lo}-{hi}", "dp",
                             _comm_stream(self.g, plan, pi0, si0, group, "grad reduce"),
                             sync.grad_iteration_s + sync.grad_microbatch_s,
                             TaskMeta(pi0, si0, detail=sync.about("grad_iteration"),
                                      ranks=sync.group_ranks("grad_iteration")),
                             after=after)
            for pi, si in holders:
                per_stage_reductions.setdefault((rep_of[pi], si), []).append(tid)
        for pi in reps:
            for si, cost in enumerate(self.costs[pi]):
                self._optimizer(pi, si, cost, per_stage_reductions.get((pi, si), []))

    def _optimizer(self, pi: int, si: int, cost: StageCost, reductions: list[int]) -> None:
        compute = self.g.stream(f"p{pi}.s{si}.compute")
        opt = self.g.add(f"optimizer p{pi}s{si}", "optimizer", compute, cost.optimizer_s,
                         TaskMeta(pi, si), after=(self.last_compute[(pi, si)], *reductions))
        if cost.dp.param_iteration_s:  # overlapped with the next iteration's forward
            self.g.add(f"param-gather p{pi}s{si}", "dp", self._dp_stream(pi, si, "param gather"),
                       exposed_s(cost.dp.param_iteration_s, cost.forward_s, cost.dp),
                       TaskMeta(pi, si, detail=cost.dp.about("param_iteration"),
                                ranks=cost.dp.group_ranks("param_iteration"),
                                crowd=cost.dp.crowd("param_iteration")), after=(opt,))


@dataclass(frozen=True)
class _HostLoad:
    """What the shared-core scheduler needs: the hosts, and per task its CPU share, the
    load its duration was measured at, and the share of it a profile measured with the
    stage's ranks at once and their count, and the slowdown measured on its own kind of
    work where a profile has one (`graph.schedule`)."""

    hosts: list[SharedCores]
    cpu_share: list[float]
    ref_load: list[float]
    in_situ: list[tuple[float, float]]
    own_slowdown: list[Callable[[float], float] | None]
    peer_ranks: list[float]


def _cpu_share(g: TaskGraph, t: int, collective_share: Callable[[int], float],
               groups: dict[str, int]) -> float:
    """The fraction of task `t`'s time that is CPU work on its rank: a pass's compute and
    host time, and of its in-line collectives (and waits for gathers) the share their
    processes are busy (`collective_share` of the group size; `groups`: each in-line
    `Part` field's group size; gloo's share, 0 where not measured), less what a profile
    measured off the CPU (`Part.off_cpu_s`: DTensor blocks waiting for their peers); all
    of the optimizer step; of a communication task, that share."""
    if g.kinds[t] == "optimizer":
        return 1.0
    meta = g.meta[t]
    if meta.ranks:
        return collective_share(meta.ranks)
    part = meta.part
    if part is None or part.total_s <= 0.0:
        return 0.0
    busy = sum(getattr(part, field) * collective_share(ranks)
               for field, ranks in groups.items() if getattr(part, field))
    return max(0.0, part.compute_s + part.host_s + busy - part.off_cpu_s) / part.total_s


def shared_hosts(plan: Plan, priced: PlanCosts, g: TaskGraph, profiles: Profiles | None
                 ) -> _HostLoad:
    """The hosts whose simulated streams share cores (CPU ranks, where the profile
    measured the slowdown), and each task's CPU share (`_cpu_share`) and reference load;
    empty where none do. A stage's streams (compute, and its sends, reductions and
    gathers) stand for the ranks of the stage on the host of its first rank, in every
    pipeline they represent. A collective was measured with a group of its size alone on
    the host, or with `TaskMeta.crowd` of the host's ranks in such groups at once: its
    reference load is those ranks times their CPU share."""
    slots = plan.cluster.slots
    ranks: dict[int, dict[int, float]] = {}  # node -> stream -> ranks on that node
    slowdowns = {}
    shares: dict[str, Callable[[int], float]] = {}  # device -> group size -> CPU share
    share_of_stream: dict[int, tuple[Callable[[int], float], dict[str, int]]] = {}
    measured_at: dict[int, int] = {}  # stream -> ranks its in-situ host rows ran on at once
    stage_ranks: dict[tuple[int, int, int], int] = {}  # (rep, stage, node) -> its ranks there
    node_of: dict[int, int] = {}  # stream -> the node of the ranks it stands for
    stepping: dict[tuple[int, int], Callable[[float], float]] = {}  # optimizer_shared
    for pi, pipe in enumerate(plan.pipelines):
        rep = priced.representative[pi]
        for si, stage in enumerate(pipe.stages):
            first = slots[stage.devices[0]]
            dev = plan.group_of(stage).device
            profile = profiles.get(dev.name) if profiles else None
            slowdown = shared_cores(dev, profile, activation_bytes(
                pipe.micro_batch_size, plan.training.seq_len, plan.model))
            if slowdown is None:
                continue
            if (rep, si) not in stepping:  # replicas folded into `rep` step alike
                step = optimizer_shared(dev, profile, _optimizer_params(plan, rep, si))
                if step is not None:
                    stepping[(rep, si)] = step
            node = first.node
            slowdowns[node] = slowdown
            if dev.name not in shares:
                shares[dev.name] = _share_by_ranks(dev, profile)
            on_node = sum(slots[d].node == node for d in stage.devices)
            for d in stage.devices:
                key = (rep, si, slots[d].node)
                stage_ranks[key] = stage_ranks.get(key, 0) + 1
            groups = {"tp_s": stage.tp, "cp_s": stage.cp, "ep_s": plan.training.ep or 1,
                      "dp_s": priced.costs[rep][si].dp.group_ranks("param_microbatch")
                      or plan.dp}
            prefix = f"p{rep}.s{si}."
            for sid, name in enumerate(g.stream_names):
                if name.startswith(prefix):
                    ranks.setdefault(node, {})[sid] = ranks.get(node, {}).get(sid, 0) + on_node
                    share_of_stream[sid] = (shares[dev.name], groups)
                    measured_at[sid] = stage.tp  # the DTensor rows' ranks
                    node_of[sid] = node
    hosts = [SharedCores(streams, slowdowns[node]) for node, streams in ranks.items()
             if sum(streams.values()) > 1]
    if not hosts:
        return _HostLoad([], [], [], [], [], [])
    none: tuple[Callable[[int], float], dict[str, int]] = (lambda n: 0.0, {})  # no shared host
    cpu, ref, in_situ = [], [], []
    own = [stepping.get((g.meta[t].pipeline, g.meta[t].stage)) if g.kinds[t] == "optimizer"
           else None for t in range(len(g))]
    for t in range(len(g)):
        share, groups = share_of_stream.get(g.streams[t], none)
        cpu.append(_cpu_share(g, t, share, groups))
        n = g.meta[t].ranks  # a communication task's group (0 for passes, the optimizer)
        # measured alone, or with `crowd` of the host's ranks in such collectives at once
        ref.append((g.meta[t].crowd or n) * share(n) if n else 0.0)
        part = g.meta[t].part
        measured = (part.measured_shared_s / part.total_s
                    if part is not None and part.total_s > 0.0 and not n else 0.0)
        in_situ.append((min(measured, cpu[-1]), float(measured_at.get(g.streams[t], 1))))
    # a batched send's receivers on the sender's host: their processes are as busy
    peers = [float(stage_ranks.get((g.meta[t].pipeline, g.meta[t].peer,
                                    node_of.get(g.streams[t], -1)), 0))
             if g.meta[t].peer >= 0 else 0.0 for t in range(len(g))]
    return _HostLoad(hosts, cpu, ref, in_situ, own, peers)


def _optimizer_params(plan: Plan, pi: int, si: int) -> float:
    """The parameters one rank of stage `si` of pipeline `pi` steps (its optimizer shard)."""
    pipe = plan.pipelines[pi]
    stage = pipe.stages[si]
    held = rank_param_count(plan.model, num_layers=stage.num_layers, first=si == 0,
                            last=si == len(pipe.stages) - 1, tp=stage.tp, pp=len(pipe.stages),
                            moe_layers=pipeline_moe_layers(plan, pipe)[si])
    return held / plan.sharding_of(si).optim


def sync_group(plan: Plan, pi: int, si: int) -> int:
    """The ranks that keep in step with stage `si` of pipeline `pi` within an iteration:
    its tp x cp ranks (their in-line collectives), and under data parallelism the same
    stage of every replica (the gradient reduction; pipeline neighbours are not counted)."""
    stage = plan.pipelines[pi].stages[si]
    if plan.dp == 1:
        return len(stage.devices)
    if plan.aligned_stages:
        return sum(len(p.stages[si].devices) for p in plan.pipelines)
    return len(stage.devices) * plan.dp


def in_step(plan: Plan, priced: PlanCosts, g: TaskGraph, profiles: Profiles | None) -> None:
    """CPU ranks that synchronise run at the pace of the slowest (`host.sync_skew`, where
    the profile measured it): each compute-stream pass of a stage in a group of n > 1
    ranks takes its compute and host time times the measured lateness per second longer,
    counted as compute (the others wait for the slowest rank's). Passes of one rank
    alone, and GPUs, are unchanged."""
    if profiles is None:
        return
    slope: dict[tuple[int, int], float] = {}
    for pi in priced.representatives:
        for si, stage in enumerate(plan.pipelines[pi].stages):
            dev = plan.group_of(stage).device
            skew = sync_skew(dev, profiles.get(dev.name), sync_group(plan, pi, si))
            if skew:
                slope[(pi, si)] = skew
    if not slope:
        return
    for t in range(len(g)):
        meta = g.meta[t]
        k = slope.get((meta.pipeline, meta.stage)) if g.kinds[t] in ("F", "B", "W") else None
        if k and meta.part is not None:
            extra = k * (meta.part.compute_s + meta.part.host_s)
            g.durations[t] += extra
            g.meta[t] = meta._replace(part=meta.part + Part(compute_s=extra))


def _share_by_ranks(dev: DeviceSpec, profile: Profile | None) -> Callable[[int], float]:
    """`host.collective_cpu_share` of `dev` by group size (0 where not measured)."""
    cache: dict[int, float] = {}

    def share(n: int) -> float:
        if n not in cache:
            cache[n] = collective_cpu_share(dev, profile, n) or 0.0
        return cache[n]

    return share


@gc_paused()  # a large task graph: planner/gc_pause.py
def simulate_graph(plan: Plan, *, costs: PlanCosts | list[list[StageCost]] | None = None,
                   overlap_grad_reduce: bool = True,
                   profiles: Profiles | None = None) -> Simulation:
    """Build and list-schedule the task graph of one iteration of `plan` (with `costs`
    in place of the cost model's, for tests and what-ifs; else priced with `profiles`
    where they answer). Identical pipelines are simulated once. Without overlap,
    gradients are reduced in one piece after each stage's last backward."""
    priced = PlanCosts.of(costs) if costs is not None else plan_costs(plan, profiles)
    reps = priced.representatives
    b = _Builder(plan, priced, overlap_grad_reduce, profiles)
    for pi in reps:
        b.pipeline(pi)
    b.data_parallel(reps)
    in_step(plan, priced, b.g, profiles)
    load = shared_hosts(plan, priced, b.g, profiles)
    return Simulation(plan=plan, costs=priced.costs, graph=b.g,
                      schedule=_list_schedule(b.g, load),
                      representatives=reps, representative=priced.representative,
                      in_flight_layers=b.in_flight, profiles=profiles, host_load=load)


def _list_schedule(g: TaskGraph, load: _HostLoad | None) -> Schedule:
    if load is None:
        return schedule(g)
    return schedule(g, shared=load.hosts, cpu_share=load.cpu_share, ref_load=load.ref_load,
                    in_situ=load.in_situ, own_slowdown=load.own_slowdown,
                    peer_ranks=load.peer_ranks)


def rescheduled(sim: Simulation, durations: Sequence[float]) -> Schedule:
    """`sim`'s task graph list-scheduled again with each task taking `durations[t]` in
    place of its priced time, under the same hosts' core sharing: how the iteration's
    order, waits and transfers carry other task times (benchmarks/pass_tails.py propagates
    measured pass-time spreads through it). The simulation itself is left as it was."""
    if len(durations) != len(sim.graph):
        raise ValueError(f"durations: {len(durations)} given for {len(sim.graph)} tasks")
    priced = list(sim.graph.durations)
    sim.graph.durations[:] = durations
    try:
        return _list_schedule(sim.graph, sim.host_load)
    finally:
        sim.graph.durations[:] = priced
