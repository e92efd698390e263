"""What a simulation of one iteration reports (analytic estimate or event simulation)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.memory import StageMemory

__all__ = ["Breakdown", "SimResult", "StageSummary"]


@dataclass(frozen=True)
class Breakdown:
    """Seconds of one iteration on the critical path, by what the time was spent on.

    Communication is what is exposed (not hidden behind compute); the parts add up to the
    iteration time.
    """

    compute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    bubble_s: float
    optimizer_s: float

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
