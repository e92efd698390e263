"""What a simulation of one iteration reports (analytic estimate or event simulation)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.costs.memory import StageMemory
from planner.costs.workload import (
    attention_core_flops_per_token,
    hardware_flops_per_token,
    model_flops_per_token,
)
from planner.specs.choices import DType
from planner.specs.plan import Plan
from profiler.analytic import math_dtype

__all__ = ["Breakdown", "SimResult", "StageSummary", "make_result"]


@dataclass(frozen=True)
class Breakdown:
    """Seconds of one iteration on the critical path, by what the time was spent on.

    Communication is what is exposed (not hidden behind compute); the parts add up to the
    iteration time.
    """

    compute_s: float
    host_overhead_s: float  # the GPU waiting for the host to issue kernels
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    bubble_s: float
    optimizer_s: float
    ep_comm_s: float = 0.0  # MoE token dispatch and combine (all-to-all), exposed

    @property
    def total_s(self) -> float:
        return sum(dataclasses.astuple(self))


@dataclass(frozen=True)
class StageSummary:
    pipeline: int
    stage: int
    device: str
    layers: tuple[int, int]
    forward_s: float  # per micro-batch
    backward_s: float  # per micro-batch, with recomputation
    memory: StageMemory
    attention: str = ""  # the attention kernel it runs


@dataclass(frozen=True)
class SimResult:
    method: str
    iteration_time_s: float
    tokens_per_s: float
    samples_per_s: float
    tflops_per_gpu_model: float
    tflops_per_gpu_hw: float
    mfu: float
    num_gpus: int
    breakdown: Breakdown
    stages: tuple[StageSummary, ...]
    sources: dict[str, str]

    @property
    def peak_memory_bytes(self) -> float:
        return max(s.memory.total_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return all(s.memory.fits for s in self.stages)

    def to_dict(self) -> dict:
        """The JSON form (`plan simulate --json`)."""
        return {
            "method": self.method,
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "tflops_per_gpu_model": self.tflops_per_gpu_model,
            "tflops_per_gpu_hw": self.tflops_per_gpu_hw,
            "mfu": self.mfu,
            "num_gpus": self.num_gpus,
            "peak_memory_bytes": int(self.peak_memory_bytes),
            "fits": self.fits,
            "breakdown": dataclasses.asdict(self.breakdown),
            "stages": [_stage_dict(s) for s in self.stages],
            "sources": dict(self.sources),
        }


def _stage_dict(s: StageSummary) -> dict:
    m = s.memory
    return {
        "pipeline": s.pipeline, "stage": s.stage, "device": s.device, "layers": list(s.layers),
        "attention": s.attention,
        "forward_s": s.forward_s, "backward_s": s.backward_s,
        "memory": {
            "params_bytes": int(m.params_bytes), "grads_bytes": int(m.grads_bytes),
            "optimizer_bytes": int(m.optimizer_bytes),
            "activations_bytes": int(m.activations_bytes), "buffers_bytes": int(m.buffers_bytes),
            "reserve_bytes": int(m.reserve_bytes), "total_bytes": int(m.total_bytes),
            "capacity_bytes": int(m.capacity_bytes), "fits": m.fits,
            "shortfall_bytes": int(m.shortfall_bytes),
        },
    }


def mfu_dtype(dtype: str) -> str:
    """The peak MFU is counted against: the training dtype's, but bf16's for fp8 training
    (as FP8 training reports do, e.g. DeepSeek-V3's and Megatron-Core's)."""
    return str(DType(dtype).storage) if DType(dtype) is DType.FP8 else dtype


def make_result(plan: Plan, *, method: str, iteration_s: float, breakdown: Breakdown,
                stages: tuple[StageSummary, ...], sources: dict[str, str]) -> SimResult:
    """Throughput, FLOP/s and MFU of an iteration time (one definition for every method).

    MFU is model FLOPs (no recompute, Megatron's count) over the summed peak of the GPUs
    the plan uses, at the training dtype."""
    tr = plan.training
    tokens = tr.global_batch_size * tr.seq_len
    num_gpus = plan.num_gpus_used
    model_flops = model_flops_per_token(plan.model, tr.seq_len) * tokens
    recompute = plan.pipelines[0].stages[0].recompute
    hw_flops = hardware_flops_per_token(plan.model, tr.seq_len, recompute,
                                        tuple(tr.recompute_modules)) * tokens
    peak = 0.0
    for pipe in plan.pipelines:
        for s in pipe.stages:
            dev = plan.group_of(s).device
            peak += dev.peak_flops(math_dtype(dev, mfu_dtype(tr.dtype))) * len(s.devices)
    return SimResult(
        method=method, iteration_time_s=iteration_s, tokens_per_s=tokens / iteration_s,
        samples_per_s=tr.global_batch_size / iteration_s,
        tflops_per_gpu_model=model_flops / iteration_s / num_gpus / 1e12,
        tflops_per_gpu_hw=hw_flops / iteration_s / num_gpus / 1e12,
        mfu=model_flops / iteration_s / peak, num_gpus=num_gpus, breakdown=breakdown,
        stages=stages, sources={**sources, "flops": flops_source(plan)})


def flops_source(plan: Plan) -> str:
    """How the FLOP/s and MFU count: Megatron-LM's formula, whose attention term counts
    the causal mask's half that fused kernels skip (at long sequences a large part)."""
    model, seq = plan.model, plan.training.seq_len
    share = (3 * model.num_layers * attention_core_flops_per_token(model, seq)
             / model_flops_per_token(model, seq))
    return ("Megatron-LM's count (Narayanan et al. 2021: 6 FLOPs a parameter and token plus "
            "attention; hardware FLOP/s add recomputation), attention's scores and context "
            f"counted unmasked: {share:.0%} of the count here, half of which causal fused "
            f"kernels skip; MFU over the summed {mfu_dtype(plan.training.dtype)} peak of the "
            "GPUs the plan uses")
