"""One training step of the executor model on one process, and its measured time.

The single-process step is the ground truth a profile-driven prediction is checked
against (tests/executor/test_step_vs_prediction.py): same shapes, dtype, threads and
kernels as the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.model import GPT
from planner.specs.model import ModelSpec
from profiler.timing import Timing, time_calls

__all__ = ["DTYPES", "StepTiming", "make_optimizer", "synthetic_batch", "time_train_step",
           "train_step"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LEARNING_RATE = 3e-4
WEIGHT_DECAY = 0.1


def synthetic_batch(spec: ModelSpec, *, batch_size: int, seq_len: int, seed: int = 0,
                    device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens [b, s] and their next-token targets, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(spec.vocab_size, (batch_size, seq_len + 1), generator=gen)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def make_optimizer(model: torch.nn.Module, *, implementation: str) -> torch.optim.Optimizer:
    """AdamW as the plan's kernels name it: fused, foreach (multi-tensor) or for_loop."""
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
             "for_loop": {"foreach": False, "fused": False}}
    if implementation not in flags:
        raise ValueError(f"optimizer {implementation!r} is not one of {', '.join(flags)}")
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY,
                             **flags[implementation])


def train_step(model: GPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               targets: torch.Tensor) -> torch.Tensor:
    """Forward, backward, optimizer step; returns the loss (not synchronised)."""
    loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@dataclass(frozen=True)
class StepTiming:
    timing: Timing
    final_loss: float


def time_train_step(spec: ModelSpec, *, batch_size: int, seq_len: int, dtype: str = "fp32",
                    attention: str = "math", optimizer: str = "foreach", device: str = "cpu",
                    threads: int | None = 1, warmup: int = 3, repeats: int = 15) -> StepTiming:
    """Median wall time of a training step of `spec` (one micro-batch, one process), with
    `threads` torch threads (None: leave torch's setting)."""
    if threads is not None:
        torch.set_num_threads(threads)
    model = GPT(spec, attention=attention).to(device=device, dtype=DTYPES[dtype])
    model.train()
    opt = make_optimizer(model, implementation=optimizer)
    tokens, targets = synthetic_batch(spec, batch_size=batch_size, seq_len=seq_len,
                                      device=device)
    losses: list[torch.Tensor] = []

    def step() -> None:
        losses.append(train_step(model, opt, tokens, targets))

    timing = time_calls(step, device=device, warmup=warmup, repeats=repeats, min_sample_s=0.0)
    return StepTiming(timing=timing, final_loss=float(losses[-1]))
