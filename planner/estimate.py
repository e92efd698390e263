"""Analytic estimate of one training iteration of a Plan (closed-form pipeline model).

Per pipeline, with t_s the time of one micro-batch (forward + backward + its
activation transfers) on stage s and m micro-batches, a 1F1B or GPipe schedule takes
m·max(t) + (Σt − max t)/v (Narayanan et al. 2021: the bubble is (p−1)/v micro-batch
times for p equal stages, v interleaved chunks). Gradient reduction overlaps the last
micro-batch's backward bucket by bucket; the optimizer step follows. The event simulator
refines this with the actual dependencies; both price work through `stage_costs`.
"""

from __future__ import annotations

import math

from planner.costs.comm import COMM_SOURCE
from planner.costs.compute import ANALYTIC_SOURCE
from planner.memory import MEMORY_SOURCE
from planner.results import Breakdown, SimResult, StageSummary
from planner.specs.plan import Plan, Stage
from planner.stage_costs import StageCost, plan_stage_costs, stage_device
from planner.workload import hardware_flops_per_token, model_flops_per_token
from profiler.analytic import math_dtype

__all__ = ["ESTIMATE_SOURCE", "estimate"]

ESTIMATE_SOURCE = "analytic pipeline estimate (closed form, planner/estimate.py)"
BUCKET_PARAMS = 40e6  # Megatron's DDP gradient bucket size in parameters


def _microbatch_s(c: StageCost) -> float:
    """One micro-batch on a stage: compute, its collectives, the two transfers, and the
    ZeRO-3 parameter gathers that one layer's compute cannot hide."""
    zero3 = 0.0
    if c.zero3_gather_s:
        hidden = c.forward_compute_s + c.backward_compute_s
        zero3 = max(c.zero3_gather_s / max(c.num_layers, 1), c.zero3_gather_s - hidden)
    return c.forward_s + c.backward_s + 2 * c.p2p_s + zero3


def _exposed(sync_s: float, window_s: float, num_params: float) -> float:
    """Communication overlapped with `window_s` of compute, bucket by bucket: the last
    bucket is always exposed."""
    buckets = max(1, math.ceil(num_params / BUCKET_PARAMS))
    return max(sync_s / buckets, sync_s - window_s)


def _pipeline_s(plan: Plan, costs: list[StageCost]) -> tuple[float, dict[str, float]]:
    """End time of one pipeline's iteration and the critical stage's breakdown."""
    m = plan.pipelines[costs[0].pipeline].num_microbatches
    vp = plan.training.virtual_stages
    times = [_microbatch_s(c) for c in costs]
    slow = max(range(len(costs)), key=lambda i: times[i])
    pipe_s = m * times[slow] + (sum(times) - times[slow]) / vp
    end, opt_s, drain = pipe_s, 0.0, 0.0
    for c in costs:  # stage s finishes its last backward `drain` before stage 0 does
        grad = _exposed(c.dp_grad_sync_s, c.backward_s, c.num_params)
        gather = _exposed(c.dp_param_sync_s, c.forward_s, c.num_params)
        stage_end = pipe_s - drain + grad + c.optimizer_s + gather
        if stage_end > end:
            end, opt_s = stage_end, c.optimizer_s
        drain += c.backward_s + c.p2p_s
    after = end - pipe_s  # what sticks out after the pipeline drains
    opt_s = min(opt_s, after)
    c = costs[slow]
    parts = {
        "compute": m * (c.forward_compute_s + c.backward_compute_s),
        "tp": m * (c.forward_comm.tp_s + c.backward_comm.tp_s),
        "cp": m * (c.forward_comm.cp_s + c.backward_comm.cp_s),
        "pp": m * 2 * c.p2p_s,
        "dp": after - opt_s + m * (times[slow] - c.forward_s - c.backward_s - 2 * c.p2p_s),
        "opt": opt_s,
    }
    parts["bubble"] = end - sum(parts.values())
    return end, parts


def estimate(plan: Plan) -> SimResult:
    """Iteration time, throughput, MFU, breakdown and memory of `plan` (closed form)."""
    costs = plan_stage_costs(plan)
    ends = [_pipeline_s(plan, pc) for pc in costs]
    critical = max(range(len(ends)), key=lambda i: ends[i][0])
    iteration_s, parts = ends[critical]
    tr = plan.training
    tokens = tr.global_batch_size * tr.seq_len
    num_gpus = plan.num_gpus_used
    model_flops = model_flops_per_token(plan.model, tr.seq_len) * tokens
    recompute = plan.pipelines[0].stages[0].recompute
    hw_flops = hardware_flops_per_token(plan.model, tr.seq_len, recompute) * tokens
    peak = sum(stage_device(plan, s).peak_flops(_peak_dtype(plan, s)) * len(s.devices)
               for p in plan.pipelines for s in p.stages)
    stages = tuple(
        StageSummary(pipeline=c.pipeline, stage=c.stage, device=c.device,
                     layers=plan.pipelines[c.pipeline].stages[c.stage].layers,  # type: ignore[arg-type]
                     forward_s=c.forward_s, backward_s=c.backward_s, memory=c.memory)
        for pc in costs for c in pc)
    breakdown = Breakdown(compute_s=parts["compute"], tp_comm_s=parts["tp"],
                          cp_comm_s=parts["cp"], pp_comm_s=parts["pp"], dp_comm_s=parts["dp"],
                          bubble_s=max(parts["bubble"], 0.0), optimizer_s=parts["opt"])
    return SimResult(
        method="analytic estimate",
        iteration_time_s=iteration_s,
        tokens_per_s=tokens / iteration_s,
        samples_per_s=tr.global_batch_size / iteration_s,
        tflops_per_gpu_model=model_flops / iteration_s / num_gpus / 1e12,
        tflops_per_gpu_hw=hw_flops / iteration_s / num_gpus / 1e12,
        mfu=model_flops / iteration_s / peak,
        num_gpus=num_gpus,
        breakdown=breakdown,
        stages=stages,
        sources={"compute": ANALYTIC_SOURCE, "communication": COMM_SOURCE,
                 "memory": MEMORY_SOURCE, "schedule": ESTIMATE_SOURCE},
    )


def _peak_dtype(plan: Plan, stage: Stage) -> str:
    return math_dtype(stage_device(plan, stage), plan.training.dtype)
