"""Timing of a callable on a device: warm-up, repeated samples, median and spread.

On CUDA each sample is bracketed by CUDA events (device time of the calls, including
any time the device waited for the host to issue them); on the CPU by `perf_counter`.
A sample runs the callable `calls` times back to back, enough calls that one sample
lasts at least `min_sample_s`, so that timer resolution and event overhead stay small.
Python's garbage collector is off while sampling (as `timeit` does) so that a collection
triggered by someone else's garbage does not land in one op's time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from planner.gc_pause import gc_paused

__all__ = ["Timing", "sampler", "time_calls", "timing_of"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and the 10th / 90th percentiles of the samples."""

    median_s: float
    p10_s: float
    p90_s: float
    samples: int
    calls: int  # calls per sample

    @property
    def spread(self) -> float:
        """Half the 10-90 percentile range relative to the median."""
        return (self.p90_s - self.p10_s) / 2 / self.median_s if self.median_s > 0 else 0.0


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of sorted values (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def sampler(device: str) -> Callable[[Callable[[], object], int], float]:
    """A function that runs `fn` `calls` times and returns the elapsed seconds."""
    if device.startswith("cuda"):
        import torch

        # the stream torch launches this device's kernels on (not the current device's:
        # with --device cuda:1 that may be GPU 0's, whose events would time nothing)
        stream = torch.cuda.current_stream(torch.device(device))

        def cuda_sample(fn: Callable[[], object], calls: int) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(calls):
                fn()
            end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) * 1e-3

        return cuda_sample

    def cpu_sample(fn: Callable[[], object], calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - start

    return cpu_sample


def time_calls(fn: Callable[[], object], *, device: str = "cpu", warmup: int = 3,
               repeats: int = 15, min_sample_s: float = 1e-3) -> Timing:
    """Time `fn` on `device` ("cpu", "cuda", "cuda:N"): `warmup` untimed calls, then
    `repeats` samples of back-to-back calls."""
    sample = sampler(device)
    with gc_paused():
        first = sample(fn, 1)  # also the first warm-up call
        for _ in range(max(warmup - 1, 0)):
            first = min(first, sample(fn, 1))
        calls = max(1, math.ceil(min_sample_s / max(first, 1e-9)))
        times = [sample(fn, calls) / calls for _ in range(repeats)]
    return timing_of(times, calls=calls)


def timing_of(samples: list[float], *, calls: int = 1) -> Timing:
    """The Timing of samples of seconds per call (each of `calls` calls)."""
    times = sorted(samples)
    return Timing(median_s=statistics.median(times), p10_s=_percentile(times, 0.1),
                  p90_s=_percentile(times, 0.9), samples=len(times), calls=calls)
