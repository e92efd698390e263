"""Per-stage costs of a Plan: what one micro-batch costs on each stage, and the
data-parallel and optimizer work at the end of an iteration.

The analytic estimate and the event simulator both build on these numbers, so they
price the same work the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from planner.costs.comm import Tier, collective_time_s, group_tiers
from planner.costs.compute import ComputeCosts
from planner.memory import StageMemory, in_flight_chunks, rank_param_count, stage_memory
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, Stage
from planner.workload import (
    Comm,
    Work,
    WorkloadShape,
    embedding_work,
    head_work,
    layer_work,
    optimizer_work,
)
from profiler.devices import DeviceSpec, dtype_bytes

__all__ = ["CommCost", "StageCost", "plan_stage_costs", "stage_device"]

GRAD_BYTES = 4  # gradients are reduced in fp32 (Megatron main_grad)


@dataclass(frozen=True)
class CommCost:
    """Seconds of one kind of communication (per micro-batch or per iteration)."""

    tp_s: float = 0.0
    cp_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.tp_s + self.cp_s


@dataclass(frozen=True)
class StageCost:
    """One stage of one pipeline; times are per micro-batch unless named per iteration."""

    pipeline: int
    stage: int
    device: str
    num_layers: int
    num_params: float  # on one rank, before sharding
    forward_compute_s: float
    backward_compute_s: float  # includes recomputation
    forward_comm: CommCost
    backward_comm: CommCost  # includes recomputation's collectives
    p2p_s: float  # one activation (or its gradient) to the neighbouring stage
    dp_grad_sync_s: float  # per iteration: gradient reduction at the end of backward
    dp_param_sync_s: float  # per iteration: gathering updated parameters (sharded OS/P)
    zero3_gather_s: float  # per micro-batch: gathering sharded params in fwd and bwd
    optimizer_s: float  # per iteration
    memory: StageMemory

    @property
    def forward_s(self) -> float:
        return self.forward_compute_s + self.forward_comm.total_s

    @property
    def backward_s(self) -> float:
        return self.backward_compute_s + self.backward_comm.total_s


def stage_device(plan: Plan, stage: Stage) -> DeviceSpec:
    slots = plan.cluster.slots()
    return plan.cluster.node_groups[slots[stage.devices[0]].group].device


def _comm_s(items: tuple[Work, ...], tiers: dict[str, tuple[Tier, ...]]) -> CommCost:
    tp = cp = 0.0
    for item in items:
        if isinstance(item, Comm):
            t = collective_time_s(item.kind, item.bytes, tiers[item.axis])
            if item.axis == "cp":
                cp += t
            else:
                tp += t
    return CommCost(tp_s=tp, cp_s=cp)


@cache
def _layer_costs(model: ModelSpec, shape: WorkloadShape, device_name: str, tiers_key: tuple,
                 recompute: str) -> tuple[float, float, CommCost, CommCost]:
    """(forward compute, backward compute incl. recompute, forward comm, backward comm)
    of one layer for one micro-batch."""
    tiers = dict(tiers_key)
    costs = ComputeCosts(device_name, shape.dtype)
    work = layer_work(model, shape)
    fwd_c = costs.total_s(work.forward)
    bwd_c = costs.total_s(work.backward)
    fwd_comm, bwd_comm = _comm_s(work.forward, tiers), _comm_s(work.backward, tiers)
    if recompute == "full":
        bwd_c += fwd_c
        bwd_comm = CommCost(bwd_comm.tp_s + fwd_comm.tp_s, bwd_comm.cp_s + fwd_comm.cp_s)
    elif recompute == "selective":
        bwd_c += costs.total_s(work.selective_recompute)
        extra = _comm_s(work.selective_recompute, tiers)
        bwd_comm = CommCost(bwd_comm.tp_s + extra.tp_s, bwd_comm.cp_s + extra.cp_s)
    return fwd_c, bwd_c, fwd_comm, bwd_comm


def _dp_groups(plan: Plan, stage_index: int, pipelines: list[int]) -> list[tuple[int, ...]]:
    """Data-parallel groups of a stage: the same rank position across `pipelines`."""
    stages = [plan.pipelines[p].stages[stage_index] for p in pipelines]
    width = len(stages[0].devices)
    return [tuple(s.devices[r] for s in stages) for r in range(width)]


def _dp_sync_s(plan: Plan, stage_index: int, params: float, concurrency: int
               ) -> tuple[float, float, float]:
    """(gradient sync per iteration, parameter gather per iteration, ZeRO-3 gather per
    micro-batch) for rank position 0 of a stage, under the plan's AMSP sharding.

    Gradients: reduce-scatter inside each grads-sharding group of `g` replicas, then
    all-reduce of the shard across the dp/g groups (hierarchical, AMSP §3). Parameters:
    after each optimizer updates its 1/os shard, the params-sharding level (p) is rebuilt
    by an all-gather over os/p replicas. Sharded params (p > 1) are gathered before use in
    forward and again in backward (ZeRO-3), every micro-batch.
    """
    dp = plan.dp
    if dp == 1:
        return 0.0, 0.0, 0.0
    sh = plan.sharding
    low = dtype_bytes(plan.training.dtype)
    all_pipes = list(range(dp))
    grad_bytes = params * GRAD_BYTES

    def tiers(group_size: int, stride: int) -> tuple[Tier, ...]:
        pipes = all_pipes[0:group_size * stride:stride]
        return group_tiers(plan.cluster, _dp_groups(plan, stage_index, pipes)[0], concurrency)

    g, os_, p = sh.grads, sh.optim, sh.params
    if g == 1:
        grad_s = collective_time_s("all_reduce", grad_bytes, tiers(dp, 1))
    else:
        grad_s = collective_time_s("reduce_scatter", grad_bytes, tiers(g, 1))
        grad_s += collective_time_s("all_reduce", grad_bytes / g, tiers(dp // g, g))
    param_s = 0.0
    if os_ > p:  # rebuild the params level from the optimizer's shards
        param_s = collective_time_s("all_gather", params * low / p, tiers(os_ // p, p))
    zero3_s = 0.0
    if p > 1:
        zero3_s = 2 * collective_time_s("all_gather", params * low, tiers(p, 1))
    return grad_s, param_s, zero3_s


def _stage_cost(plan: Plan, pi: int, si: int) -> StageCost:
    model, tr = plan.model, plan.training
    pipe = plan.pipelines[pi]
    stage = pipe.stages[si]
    pp = len(pipe.stages)
    dev = stage_device(plan, stage)
    shape = WorkloadShape(micro_batch_size=pipe.micro_batch_size, seq_len=tr.seq_len, tp=stage.tp,
                          cp=stage.cp, sequence_parallel=tr.sequence_parallel, dtype=tr.dtype,
                          attention=plan.kernels.attention)
    tp_group = stage.devices[:stage.tp]
    cp_group = stage.devices[::stage.tp]
    tiers_key = (("tp", group_tiers(plan.cluster, tp_group)),
                 ("cp", group_tiers(plan.cluster, cp_group)))
    fwd_c, bwd_c, fwd_comm, bwd_comm = _layer_costs(model, shape, dev.name, tiers_key,
                                                    stage.recompute)
    n = stage.num_layers
    fwd_c, bwd_c = fwd_c * n, bwd_c * n
    fwd_comm = CommCost(fwd_comm.tp_s * n, fwd_comm.cp_s * n)
    bwd_comm = CommCost(bwd_comm.tp_s * n, bwd_comm.cp_s * n)
    costs = ComputeCosts(dev.name, tr.dtype)
    tiers = dict(tiers_key)
    first, last = si == 0, si == pp - 1
    extras: list[tuple[tuple[Work, ...], tuple[Work, ...]]] = []
    if first:
        extras.append(embedding_work(model, shape))
    if last:
        extras.append(head_work(model, shape)[:2])
    for fwd, bwd in extras:
        fwd_c += costs.total_s(fwd)
        bwd_c += costs.total_s(bwd)
        fe, be = _comm_s(fwd, tiers), _comm_s(bwd, tiers)
        fwd_comm = CommCost(fwd_comm.tp_s + fe.tp_s, fwd_comm.cp_s + fe.cp_s)
        bwd_comm = CommCost(bwd_comm.tp_s + be.tp_s, bwd_comm.cp_s + be.cp_s)
    p2p = 0.0
    if not last:
        # Megatron scatters the activation over the tp ranks and each sends its slice.
        nxt = pipe.stages[si + 1]
        size = pipe.micro_batch_size * tr.seq_len // stage.cp * model.hidden_size
        size *= dtype_bytes(tr.dtype) / stage.tp
        p2p = collective_time_s("send_recv", size,
                                group_tiers(plan.cluster, (stage.devices[0], nxt.devices[0])))
    params = rank_param_count(model, num_layers=n, first=first, last=last, tp=stage.tp, pp=pp)
    concurrency = sum(len(s.devices) for s in pipe.stages)
    grad_s, param_s, zero3_s = _dp_sync_s(plan, si, params, concurrency)
    opt = optimizer_work(params / plan.sharding.optim, dtype=tr.dtype,
                         implementation=plan.kernels.optimizer, num_tensors=max(1, 6 * n))
    in_flight = in_flight_chunks(schedule=tr.schedule, stage=si, pp=pp,
                                 num_microbatches=pipe.num_microbatches,
                                 virtual_stages=tr.virtual_stages)
    memory = stage_memory(model, device=dev, shape=shape, num_layers=n, first=first, last=last,
                          pp=pp, recompute=stage.recompute, sharding=plan.sharding,
                          in_flight=in_flight, virtual_stages=tr.virtual_stages)
    return StageCost(pipeline=pi, stage=si, device=dev.name, num_layers=n, num_params=params,
                     forward_compute_s=fwd_c, backward_compute_s=bwd_c,
                     forward_comm=fwd_comm, backward_comm=bwd_comm, p2p_s=p2p,
                     dp_grad_sync_s=grad_s, dp_param_sync_s=param_s, zero3_gather_s=zero3_s,
                     optimizer_s=costs.time_s(opt),
                     memory=memory)


def plan_stage_costs(plan: Plan) -> list[list[StageCost]]:
    """Costs of every stage of every pipeline; identical pipelines are priced once."""
    out: list[list[StageCost]] = []
    seen: dict[tuple, list[StageCost]] = {}
    for pi, pipe in enumerate(plan.pipelines):
        key = _pipeline_key(plan, pi)
        if key in seen:
            out.append([_replace_pipeline(c, pi) for c in seen[key]])
            continue
        costs = [_stage_cost(plan, pi, si) for si in range(len(pipe.stages))]
        seen[key] = costs
        out.append(costs)
    return out


def _pipeline_key(plan: Plan, pi: int) -> tuple:
    """Pipelines with the same shape on the same kind of hardware cost the same."""
    pipe = plan.pipelines[pi]
    slots = plan.cluster.slots()
    layout = []
    for si, s in enumerate(pipe.stages):
        nodes = [slots[d].node for d in s.devices]
        nxt = pipe.stages[si + 1].devices[0] if si + 1 < len(pipe.stages) else s.devices[0]
        layout.append((s.layers, s.tp, s.cp, s.recompute,
                       plan.cluster.node_groups[slots[s.devices[0]].group].name,
                       len(set(nodes)), slots[nxt].node == nodes[0]))
    return (pipe.micro_batch_size, pipe.num_microbatches, tuple(layout))


def _replace_pipeline(cost: StageCost, pi: int) -> StageCost:
    return replace(cost, pipeline=pi)


