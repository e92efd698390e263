"""Training pieces shared by the single-process step and the distributed runtime:
synthetic data, AdamW as the plan names it, one training step and its measured time,
and the single-process reference run that distributed runs are checked against.

The single-process step is the ground truth a profile-driven prediction is checked
against (tests/executor/test_step_vs_prediction.py): same shapes, dtype, threads and
kernels as the plan.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from executor.model import GPT
from executor.precision import DTYPES, LossScaler, unscale_grads
from executor.worker import LEARNING_RATE
from planner.specs.model import ModelSpec
from profiler.timing import Timing, time_calls

__all__ = ["DTYPES", "LEARNING_RATE", "StepTiming", "adamw", "empty_adamw_state", "make_optimizer", "reference_losses",
           "sample_batch", "synthetic_batch", "time_train_step", "train_step"]

WEIGHT_DECAY = 0.1


def synthetic_batch(spec: ModelSpec, *, batch_size: int, seq_len: int, seed: int = 0,
                    device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens [b, s] and their next-token targets, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(spec.vocab_size, (batch_size, seq_len + 1), generator=gen)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def sample_batch(spec: ModelSpec, *, seq_len: int, seed: int, step: int, first: int,
                 count: int, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [count, s] and targets of global samples first..first+count-1 of `step`.

    Each sample is drawn from its own generator seeded by (seed, step, sample index), so a
    sample is the same whichever replica, micro-batch or rank draws it: runs of different
    plans over the same global batch see the same data."""
    rows = []
    for i in range(first, first + count):
        gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{step}:{i}".encode()))
        rows.append(torch.randint(spec.vocab_size, (seq_len + 1,), generator=gen))
    data = torch.stack(rows)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def adamw(params: Iterable[torch.Tensor], *, implementation: str,
          learning_rate: float = LEARNING_RATE) -> torch.optim.Optimizer:
    """AdamW as the plan's kernels name it: fused, foreach (multi-tensor) or for_loop."""
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
             "for_loop": {"foreach": False, "fused": False}}
    if implementation not in flags:
        raise ValueError(f"optimizer {implementation!r} is not one of {', '.join(flags)}")
    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=WEIGHT_DECAY,
                             **flags[implementation])


def empty_adamw_state(optimizer: torch.optim.Optimizer, param: torch.Tensor
                      ) -> dict[str, torch.Tensor]:
    """AdamW's state of `param` as torch creates it at the first step (zero moments), so
    that a checkpoint can be loaded into it before any step ran."""
    group = optimizer.param_groups[0]
    on_device = group.get("fused") or group.get("capturable")
    step = (torch.zeros((), dtype=torch.float32, device=param.device) if on_device
            else torch.tensor(0.0, dtype=torch.float32))
    return {"step": step, "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}


def make_optimizer(model: torch.nn.Module, *, implementation: str) -> torch.optim.Optimizer:
    """AdamW over a model's parameters."""
    return adamw(model.parameters(), implementation=implementation)


def train_step(model: GPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               targets: torch.Tensor) -> torch.Tensor:
    """Forward, backward, optimizer step; returns the loss (not synchronised)."""
    loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def reference_losses(spec: ModelSpec, *, global_batch_size: int, seq_len: int, steps: int,
                     seed: int = 0, attention: str = "math", optimizer: str = "foreach",
                     dtype: str = "fp32", learning_rate: float = LEARNING_RATE,
                     overflow_steps: Iterable[int] = (),
                     micro_batches: Sequence[int] | None = None) -> list[float]:
    """The loss of each step of a one-process run over the whole global batch: what every
    distributed plan of the same batch must reproduce. In bf16 and fp16 it trains as the
    executor does: AdamW on fp32 master weights, in fp16 with the same dynamic loss
    scaling (executor/precision.py); `overflow_steps` (1-based) are taken as overflowed,
    as a run's injected inf (`--inject-fault RANK:STEP:overflow`) is. With
    `micro_batches` (the sizes of consecutive micro-batches, summing to the global batch)
    each micro-batch's 16-bit gradients are added to the fp32 ones, as the executor's
    buckets add a plan's micro-batches (the same roundings); else the whole batch is one
    backward."""
    model = GPT(spec, attention=attention, seed=seed).to(dtype=DTYPES[dtype])
    model.train()
    params = list(model.parameters())
    mixed = DTYPES[dtype] != torch.float32
    masters = [torch.nn.Parameter(p.detach().float().clone()) for p in params] if mixed \
        else params
    opt = adamw(masters, implementation=optimizer, learning_rate=learning_rate)
    scaler = LossScaler() if dtype == "fp16" else None
    overflows = set(overflow_steps)
    sizes = list(micro_batches or [global_batch_size])
    assert sum(sizes) == global_batch_size, (sizes, global_batch_size)
    losses = []
    for step in range(steps):
        loss, first = torch.zeros(()), 0
        for mbs in sizes:
            tokens, targets = sample_batch(spec, seq_len=seq_len, seed=seed, step=step,
                                           first=first, count=mbs)
            first += mbs
            part = model(tokens, targets) * (mbs / global_batch_size)
            (part * (scaler.scale if scaler else 1.0)).backward()
            loss += part.detach()
            if mixed:
                for m, p in zip(masters, params, strict=True):
                    if p.grad is not None:
                        m.grad = p.grad.float() if m.grad is None else m.grad.add_(p.grad)
                    p.grad = None
        skip = False
        if scaler is not None:
            found = unscale_grads([m.grad for m in masters if m.grad is not None], scaler.scale)
            skip = bool(found.item() > 0) or step + 1 in overflows
            scaler.update(skip)
        if not skip:
            opt.step()
            if mixed:
                with torch.no_grad():
                    for m, p in zip(masters, params, strict=True):
                        p.copy_(m)
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


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
