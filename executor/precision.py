"""The training dtype's numerics: storage, the matmul precision, and fp16's dynamic loss
scaling.

* `bf16`, `fp16`: weights and activations in the 16-bit type, fp32 master weights and
  gradient reduction (the model-state buckets keep the masters: executor/data_parallel.py,
  executor/mixed_tp.py; FSDP2's sharded parameters are fp32, executor/fsdp.py).
* `fp16` adds dynamic loss scaling (Micikevicius et al. 2018, "Mixed Precision Training";
  as Megatron-LM and apex do it): the loss is multiplied by the scale before backward, so
  that small gradients survive fp16; the reduced fp32 gradients are divided by it before
  the step; if any rank of the job finds an inf or NaN in its gradients, every rank skips
  the step (one MAX all-reduce over all ranks) and the scale backs off.
* `tf32`: fp32 storage with TF32 tensor-core matmuls on CUDA; on the CPU it is plain fp32
  (the CPU has no TF32).
* `fp32`: fp32 matmuls, TF32 off on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["DTYPES", "LossScaler", "found_inf_anywhere", "set_matmul_precision",
           "unscale_grads"]

# storage of weights and activations per training dtype (tf32 stores fp32)
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}


def set_matmul_precision(dtype: str, device: torch.device) -> None:
    """TF32 matmuls on CUDA for `tf32`, full fp32 otherwise (whatever the process or an
    NVIDIA container had set); the profiler measures the same (profiler/measure.py). On
    the CPU nothing is set: tf32 trains as plain fp32 there."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")


@dataclass
class LossScaler:
    """Dynamic loss scaling, Megatron-LM's `DynamicGradScaler` (megatron/core/optimizer/
    grad_scaler.py): after `hysteresis` overflowing iterations (not necessarily in a row)
    the scale is multiplied by `backoff`, never below `min_scale`; after `growth_interval`
    iterations without one it is multiplied by `growth` and the hysteresis is restored.

    Defaults: Megatron-LM's (--min-loss-scale 1, --loss-scale-window 1000, --hysteresis
    2, backoff 0.5, growth 2) except the initial scale, 2**16 (torch.amp.GradScaler's
    and DeepSpeed's initial_scale_power 16) instead of Megatron's 2**32, which skips about
    17 steps at the start of every run to come down to where fp16 gradients fit. The
    scale stays a power of two, so scaling and unscaling are exact."""

    scale: float = 2.0**16
    min_scale: float = 1.0
    growth_interval: int = 1000
    hysteresis: int = 2
    growth: float = 2.0
    backoff: float = 0.5
    growth_tracker: int = 0
    hysteresis_tracker: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.hysteresis_tracker < 0:
            self.hysteresis_tracker = self.hysteresis

    def update(self, found_inf: bool) -> None:
        """After an iteration: back off on an overflow, grow after a clean interval."""
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff, self.min_scale)
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.growth_tracker = 0
            self.hysteresis_tracker = self.hysteresis
            self.scale *= self.growth

    def state(self) -> list[float]:
        """What a checkpoint keeps: [scale, growth tracker, hysteresis tracker]."""
        return [self.scale, float(self.growth_tracker), float(self.hysteresis_tracker)]

    def load(self, state: Iterable[float]) -> None:
        scale, growth, hysteresis = state
        self.scale = scale
        self.growth_tracker, self.hysteresis_tracker = int(growth), int(hysteresis)


def unscale_grads(grads: Iterable[torch.Tensor], scale: float) -> torch.Tensor:
    """Divide fp32 gradients by `scale` in place; returns 1.0 if any holds an inf or NaN
    (a 0-d fp32 tensor on their device), else 0.0. No host sync: the caller reduces it."""
    found: torch.Tensor | None = None
    for g in grads:
        g.mul_(1.0 / scale)  # exact: the scale is a power of two
        bad = torch.logical_not(torch.isfinite(g)).any().float()
        found = bad if found is None else torch.maximum(found, bad)
    return found if found is not None else torch.zeros(())


def found_inf_anywhere(local: torch.Tensor, device: torch.device) -> bool:
    """Whether any rank of the job found an inf or NaN: one MAX all-reduce over every rank
    (all data-, tensor- and pipeline-parallel groups), so that every rank skips together."""
    flag = local.to(device=device, dtype=torch.float32).reshape(1)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)
