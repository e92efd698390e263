"""Measure ops on the local device and turn them into profile rows.

`OpCase` says what to measure: the planner's op (name, kind, variant, shape, FLOPs,
bytes: the row's key) and how to run it in torch (`impl` and `dims`, see
profiler/torch_ops.py; `grad_of` for a backward). This module imports torch only inside
the functions that measure, so the planner can build cases without it.

How: on the CPU each step shape's cases are timed in turn, one call each a round, as a
training step runs them (`_measure_in_turn`); on CUDA each case's calls back to back over
rotating copies of its tensors (`_measure_case`). `MeasureSettings.in_turn` chooses.

Forward ops run with autograd recording, as in training. A backward is timed as
`torch.autograd.grad` over the op's fragment; on the CPU the fixed cost of one
`autograd.grad` call (measured on a one-element graph) is subtracted, because a training
step pays it once per backward, not once per op. On CUDA the events time the device, which
runs ahead of that host cost.

Dtypes: `tf32` is fp32 storage with matmuls on TF32 tensor cores
(`torch.set_float32_matmul_precision("high")`), and `fp32` on CUDA sets "highest" (no
TF32), whatever the process had set; `fp8` runs the cases whose impl is an FP8 one
(profiler/torch_ops.py: `fp8_linear`, `fp8_qkv`) in FP8 and everything else in bf16.
Which dtypes a device can run is profiler/host.py's `check_dtype`.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planner.gc_pause import gc_paused
from profiler.store import ProfileRow
from profiler.timing import Timing, sampler, time_calls, timing_of

__all__ = ["MATMUL_PRECISION", "MeasureSettings", "Measured", "OpCase", "adamw_step", "cache_bytes",
           "device_description", "measure_ops", "torch_dtype"]

GradOf = Literal["input", "weight", "all"]
MAX_COPIES = 64  # rotating copies of one op's tensors
IN_TURN_MAX_ROUNDS = 200
# torch.set_float32_matmul_precision per profile dtype, on CUDA (TF32 or not)
MATMUL_PRECISION = {"fp32": "highest", "tf32": "high"}


@dataclass(frozen=True)
class OpCase:
    """One op to measure: its profile key and how torch runs it."""

    name: str
    kind: str
    variant: str | None
    shape: tuple[int, ...]
    flops: float
    bytes: float
    kernels: int
    impl: str  # "adamw" or a key of profiler.torch_ops.IMPLS
    dims: tuple[int, ...]  # the impl's dimensions (parameter sizes for "adamw")
    grad_of: GradOf | None = None  # time the backward with respect to these leaves
    reuse_bytes: float = 0.0  # bytes a training step touches between two uses of its
    # operands (0: assume more than the device's last-level cache)
    step: int = 0  # the step shape (tp, micro-batch, sequence) whose ops it is among:
    # cases measured in turn (`MeasureSettings.in_turn`) take turns with its others

    @property
    def key(self) -> tuple[str, str | None, tuple[int, ...]]:
        return (self.name, self.variant, self.shape)


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str = "fp32"
    warmup: int = 3
    repeats: int = 15
    min_sample_s: float = 2e-3  # back-to-back calls per sample, to at least this long
    # every case timed this many times, a pass over all cases after another; back to back
    # the fastest median kept (`measure_ops`), in turn every pass's calls pooled
    passes: int = 2
    # the cases of a step shape timed in turn, one call each a round (`_measure_in_turn`),
    # instead of each case's calls back to back over rotating copies (`_measure_case`);
    # None: in turn on the CPU, back to back on CUDA
    in_turn: bool | None = None
    # in turn: rounds of every step shape until this many seconds of them (at least
    # `repeats`, at most IN_TURN_MAX_ROUNDS)
    in_turn_s: float = 2.0


def torch_dtype(name: str) -> object:
    import torch

    table = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16, "fp8": torch.bfloat16}  # fp8: bf16 but the FP8 GEMMs
    return table[name]


def device_description(device: str) -> str:
    """What the hardware calls itself: the GPU name, or the CPU model."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_bytes(device: str) -> int:
    """The last-level cache of the device (CPU: the largest cache sysfs lists; CUDA: L2)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)
    largest = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in os.listdir(root):
            with open(os.path.join(root, index, "size"), encoding="ascii") as fh:
                text = fh.read().strip()
            scale = {"K": 1024, "M": 1024**2}.get(text[-1], 1)
            largest = max(largest, int(text.rstrip("KM")) * scale)
    except (OSError, ValueError):
        pass
    return largest or 32 * 1024**2


Call = Callable[[], object]


def adamw_step(dims: Sequence[int], *, variant: str | None = "fused", device: str = "cpu"
               ) -> Call:
    """An AdamW step (`variant`: fused, foreach or for_loop) over fp32 parameters of sizes
    `dims`, as planner/costs/workload.py `optimizer_work` prices it: AdamW, then the
    gradients zeroed in place for the next iteration (a trainer that keeps its gradient
    buffer, as Megatron-LM's `zero_grad_buffer` and the executor's
    `ShardedState.skip_step` do, writes it once a step)."""
    import torch

    dtype = torch.float32  # parameters the optimizer updates are fp32 master weights
    params = [torch.nn.Parameter(torch.randn(n, device=device, dtype=dtype)) for n in dims]
    for p in params:
        p.grad = torch.randn_like(p)
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
             "for_loop": {"foreach": False, "fused": False}}[variant or "fused"]
    opt = torch.optim.AdamW(params, lr=1e-4, **flags)
    grads = [p.grad for p in params]

    def step() -> None:
        opt.step()
        torch._foreach_zero_(grads)

    return step


def _adamw_step(case: OpCase, s: MeasureSettings) -> tuple[Call, int]:
    return (adamw_step(case.dims, variant=case.variant, device=s.device),
            16 * sum(case.dims))  # weight, grad and two moments in fp32


def _fragment(case: OpCase, s: MeasureSettings, *, frozen_weights: bool = False) -> Any:
    """The case's torch fragment; `frozen_weights`: its weights need no gradient."""
    from profiler import torch_ops

    frag = torch_ops.build(case.impl, case.dims, variant=case.variant,
                           dtype=torch_dtype(s.dtype), device=s.device)
    for w in frag.weights if frozen_weights else ():
        w.requires_grad_(False)
    return frag


def _backward(outputs: Sequence[Any], leaves: Sequence[Any]) -> Call:
    import torch

    grads = tuple(torch.randn_like(o) for o in outputs)
    return lambda: torch.autograd.grad(outputs, leaves, grads, retain_graph=True)


def _runners(case: OpCase, s: MeasureSettings) -> tuple[Call, Call | None, int]:
    """The callable whose time is the op's (a forward, a backward, an optimizer step);
    for a weight gradient, a baseline whose time is subtracted: the backward with respect
    to the input alone (the difference is what the weight gradient adds to a backward
    that runs anyway; layout copies before the GEMM belong to `.dgrad`); and the bytes
    the op touches. A fragment that does not prune its backward (the FP8 GEMM) is built
    with frozen weights where only the input gradient is wanted."""
    if case.impl == "adamw":
        step, footprint = _adamw_step(case, s)
        return step, None, footprint
    frag = _fragment(case, s)
    if not frag.prunes_backward and case.grad_of == "input":
        frag = _fragment(case, s, frozen_weights=True)
    outputs = frag.forward()
    footprint = sum(t.numel() * t.element_size()
                    for t in (*frag.inputs, *frag.weights, *outputs))
    if case.grad_of is None:
        return frag.forward, None, footprint
    if case.grad_of == "input":
        return _backward(outputs, frag.inputs), None, footprint
    both = _backward(outputs, frag.inputs + frag.weights)
    if case.grad_of == "weight" and frag.inputs:
        if frag.prunes_backward:
            return both, _backward(outputs, frag.inputs), footprint
        base = _fragment(case, s, frozen_weights=True)
        return both, _backward(base.forward(), base.inputs), footprint
    return both, None, footprint


def _rotating(calls: Sequence[Call]) -> Call:
    """Call each in turn, keeping each result until its turn comes again (as a training
    step keeps activations), so that every call finds its operands out of cache."""
    results: list[object] = [None] * len(calls)
    turn = 0

    def call() -> None:
        nonlocal turn
        k = turn % len(calls)
        results[k] = None
        results[k] = calls[k]()
        turn += 1

    return call


def _autograd_call_s(s: MeasureSettings) -> float:
    """Fixed cost of one `autograd.grad` call (a one-element graph); zero on CUDA."""
    if s.device.startswith("cuda"):
        return 0.0
    import torch

    leaf = torch.ones(1, requires_grad=True)
    out = leaf * 2.0
    grad = torch.ones(1)
    return time_calls(lambda: torch.autograd.grad(out, (leaf,), grad, retain_graph=True),
                      device=s.device, warmup=s.warmup, repeats=s.repeats,
                      min_sample_s=s.min_sample_s).median_s


def _row(case: OpCase, t: Timing, subtract_s: float) -> ProfileRow:
    """The profile row of a timing, less `subtract_s` (never below a tenth of it: an op
    is never free)."""
    shift = min(subtract_s, t.median_s * 0.9)
    return ProfileRow(kind=case.kind, name=case.name, variant=case.variant,  # type: ignore[arg-type]  # a case's kind is an op kind
                      shape=case.shape, flops=float(case.flops), bytes=float(case.bytes),
                      kernels=case.kernels, time_s=t.median_s - shift,
                      p10_s=max(t.p10_s - shift, 0.0), p90_s=max(t.p90_s - shift, 0.0),
                      samples=t.samples, calls=t.calls)


def _runnable(case: OpCase, s: MeasureSettings) -> tuple[Call, Call | None, int]:
    """`_runners`, its call run once: raises RuntimeError / ValueError here if torch
    cannot run the case (`_skip_reason` says why)."""
    with warnings.catch_warnings():  # torch warns why a backend cannot run; we report it
        warnings.simplefilter("ignore")
        fn, baseline, footprint = _runners(case, s)
        fn()
    return fn, baseline, footprint


def _skip_reason(err: Exception) -> str:
    """The first line of why torch could not run a case."""
    return str(err).strip().splitlines()[0]


def _measure_case(case: OpCase, s: MeasureSettings, autograd_call_s: float,
                  cache_size: int) -> ProfileRow:
    """Time one case (raises RuntimeError / ValueError if torch cannot run it here) with
    its operands as cold as a training step leaves them: a step touches `reuse_bytes`
    between two uses of an op's weights and saved activations, so the case rotates over
    copies of its tensors totalling that much, up to the last-level cache size (beyond
    it they come from DRAM either way). Rotating buffers are what rocBLAS and hipBLASLt
    benchmarks use; Triton's `do_bench` flushes the L2 for the same reason."""
    fn, baseline, footprint = _runnable(case, s)
    rotate = min(cache_size, case.reuse_bytes or cache_size)
    copies = min(MAX_COPIES, max(1, math.ceil(rotate / max(footprint, 1))))
    built = [(fn, baseline)] + [_runners(case, s)[:2] for _ in range(copies - 1)]

    def timed(calls: Sequence[Call]) -> Timing:
        return time_calls(_rotating(calls), device=s.device, warmup=max(s.warmup, copies),
                          repeats=s.repeats, min_sample_s=s.min_sample_s)

    t = timed([f for f, _ in built])
    if baseline is not None:
        return _row(case, t, timed([b for _, b in built if b is not None]).median_s)
    return _row(case, t, autograd_call_s if case.grad_of else 0.0)


@contextlib.contextmanager
def _on_device(s: MeasureSettings) -> Iterator[None]:
    """On CUDA: the measured GPU as the current device (scalars and generators land on
    it) and the matmul precision of the dtype (TF32 or not), restored afterwards."""
    if not s.device.startswith("cuda"):
        yield
        return
    import torch

    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(MATMUL_PRECISION.get(s.dtype, saved))
    try:
        with torch.cuda.device(torch.device(s.device)):
            yield
    finally:
        torch.set_float32_matmul_precision(saved)


@dataclass(frozen=True)
class Measured:
    rows: tuple[ProfileRow, ...]
    skipped: tuple[tuple[OpCase, str], ...]  # cases torch cannot run here, and why
    interrupted: bool


def measure_ops(cases: Sequence[OpCase], settings: MeasureSettings,
                progress: Callable[[int, str], None] | None = None) -> Measured:
    """Time every case; a case torch cannot run (an attention backend that does not
    support the shape or dropout, say) is skipped with its reason. Ctrl-C stops early
    and keeps what was measured.

    `settings.passes` passes over all the cases (progress counts passes x cases), each
    case's row the pass with the lowest median: other load on the host (another tenant of
    a VM, a burst of the machine's own services) only ever slows a kernel, and a burst
    longer than one case's samples (about 10-30 ms on the CPU) moves all of them, so no
    statistic of one pass can tell it; the pass that missed it is the device's time.
    On the 2-core development VM one pass measured debug-small's fc2 weight-gradient GEMM
    at 1.32 ms where the same shape took 0.40 ms a run before and after (2026-12-05)."""
    import torch

    cuda = settings.device.startswith("cuda")
    if settings.in_turn if settings.in_turn is not None else not cuda:
        return _measure_in_turn(cases, settings, progress)
    best: dict[int, ProfileRow] = {}
    skipped: dict[int, tuple[OpCase, str]] = {}
    passes = max(1, settings.passes)
    try:
        with _on_device(settings):
            overhead_s = _autograd_call_s(settings)
            rotate_bytes = cache_bytes(settings.device)
            for p in range(passes):
                for i, case in enumerate(cases):
                    if i in skipped:
                        continue
                    if progress is not None:
                        progress(p * len(cases) + i, case.name)
                    try:
                        row = _measure_case(case, settings, overhead_s, rotate_bytes)
                    except (RuntimeError, ValueError) as err:
                        skipped[i] = (case, _skip_reason(err))
                        if cuda:  # an out-of-memory case leaves the cache fragmented
                            torch.cuda.empty_cache()
                        continue
                    if i not in best or row.time_s < best[i].time_s:
                        best[i] = row
        if cuda:
            torch.cuda.empty_cache()
    except KeyboardInterrupt:
        return _in_case_order(best, skipped, interrupted=True)
    if progress is not None:
        progress(passes * len(cases), "done")
    return _in_case_order(best, skipped, interrupted=False)


def _measure_in_turn(cases: Sequence[OpCase], settings: MeasureSettings,
                     progress: Callable[[int, str], None] | None) -> Measured:
    """`measure_ops` with the cases of each step shape (`OpCase.step`) timed in turn: a
    round calls every case of the shape once in the cases' order (a layer's forward ops,
    its backward ops, the embedding's and head's, the optimizer step; then the weight
    gradients' baselines), each call timed alone and its result kept until its next turn,
    as a step keeps activations. Rounds go on after `warmup` untimed ones until
    `in_turn_s` seconds of them (at least `repeats`, at most IN_TURN_MAX_ROUNDS). So every
    op runs after other ops, as in a training step, with its operands as far back as the
    step's other ops put them; no copies are needed to push them out of cache.

    Timed back to back, an op runs faster than it does in a step, by more than where its
    data sit explains. On the 2-core development VM (2026-12-07) debug-tiny's fused AdamW
    step took 0.41 ms back to back, 0.60 ms rotated over 64 copies of its states (122 MB),
    and 1.2-1.5 ms right after other work (reading or writing 64 MB, a loop of GEMMs, a 5
    ms sleep) and in the training step itself (1.1 ms); the step's forward took 7.5 ms
    where its ops timed back to back summed to 6.4, timed in turn to 7.0-7.5. A row is
    the median of every pass's calls: a burst of other load slows a round's ops alike,
    and the fastest pass's median (`measure_ops` back to back) would be a low estimate of
    what a step meets. Ctrl-C keeps a row for every case timed at least once."""
    skipped: dict[int, tuple[OpCase, str]] = {}
    steps: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        steps.setdefault(case.step, []).append(i)
    passes = max(1, settings.passes)
    sample = sampler(settings.device)
    times: dict[tuple[int, bool], list[float]] = {}  # every pass's
    overhead_s = 0.0

    def rows() -> dict[int, ProfileRow]:
        out = {}
        for (i, is_baseline), samples in times.items():
            base = times.get((i, True))
            if is_baseline or not samples or (base is not None and not base):
                continue
            subtract = (timing_of(base).median_s if base
                        else overhead_s if cases[i].grad_of else 0.0)
            out[i] = _row(cases[i], timing_of(samples), subtract)
        return out

    try:
        with _on_device(settings):
            overhead_s = _autograd_call_s(settings)
            done = 0
            for _ in range(passes):
                for indices in steps.values():
                    calls = _in_turn_calls(cases, indices, settings, skipped)
                    for key, _call in calls:
                        times.setdefault(key, [])
                    # closed at once if progress raises (Ctrl-C): the collector back on
                    with contextlib.closing(
                            _in_turn_rounds(calls, times, settings, sample)) as rounds:
                        for planned, timed in rounds:
                            if progress is not None:
                                progress(done + timed * len(indices) // planned,
                                         f"round {timed}/{planned}")
                    done += len(indices)
                    del calls
        if settings.device.startswith("cuda"):  # as measure_ops back to back
            import torch

            torch.cuda.empty_cache()
    except KeyboardInterrupt:
        return _in_case_order(rows(), skipped, interrupted=True)
    if progress is not None:
        progress(passes * len(cases), "done")
    return _in_case_order(rows(), skipped, interrupted=False)


def _in_turn_calls(cases: Sequence[OpCase], indices: Sequence[int], s: MeasureSettings,
                   skipped: dict[int, tuple[OpCase, str]],
                   ) -> list[tuple[tuple[int, bool], Call]]:
    """The calls of one step shape's round, keyed (case index, is the weight gradient's
    baseline): each case's, then the baselines; a case torch cannot run is skipped with
    its reason (once)."""
    ops: list[tuple[tuple[int, bool], Call]] = []
    baselines: list[tuple[tuple[int, bool], Call]] = []
    for i in indices:
        if i in skipped:
            continue
        try:
            fn, baseline, _ = _runnable(cases[i], s)
        except (RuntimeError, ValueError) as err:
            skipped[i] = (cases[i], _skip_reason(err))
            continue
        ops.append(((i, False), fn))
        if baseline is not None:
            baselines.append(((i, True), baseline))
    return ops + baselines


def _in_turn_rounds(calls: Sequence[tuple[tuple[int, bool], Call]],
                    times: dict[tuple[int, bool], list[float]], s: MeasureSettings,
                    sample: Callable[[Call, int], float],
                    ) -> Generator[tuple[int, int], None, None]:
    """Run the rounds of `_measure_in_turn`, appending each timed call's seconds to
    `times`; yields (the rounds it will take as far as it knows, rounds done) after each
    timed round."""
    results: dict[tuple[int, bool], object] = {}
    kept = [(key, _keeping(results, key, fn)) for key, fn in calls]
    try:
        with gc_paused():
            for _ in range(s.warmup):
                for _key, fn in kept:
                    fn()
            rounds, spent, done = max(1, s.repeats), 0.0, 0
            while done < rounds:
                for key, fn in kept:
                    t = sample(fn, 1)
                    times[key].append(t)
                    spent += t
                done += 1
                if done == rounds and spent < s.in_turn_s and rounds < IN_TURN_MAX_ROUNDS:
                    rounds = min(IN_TURN_MAX_ROUNDS, max(
                        rounds + 1, math.ceil(rounds * s.in_turn_s / max(spent, 1e-9))))
                yield rounds, done
    finally:
        results.clear()


def _keeping(results: dict[tuple[int, bool], object], key: tuple[int, bool],
             fn: Call) -> Call:
    """`fn`, its result kept in `results` until its next call (dropped before it)."""
    def call() -> None:
        results[key] = None
        results[key] = fn()
    return call


def _in_case_order(rows: dict[int, ProfileRow], skipped: dict[int, tuple[OpCase, str]], *,
                   interrupted: bool) -> Measured:
    """`measure_ops`' rows and skipped cases (by case index) in the cases' order."""
    return Measured(tuple(rows[i] for i in sorted(rows)),
                    tuple(skipped[i] for i in sorted(skipped)), interrupted=interrupted)
