"""Analytic device model: op time from datasheet peaks and size-dependent efficiency.

Used wherever no measured profile answers. A GEMM runs in output tiles spread over the
device's compute units: a GEMM too small to fill the last wave wastes part of it (wave
quantisation), partial tiles waste their padding, and a short inner dimension keeps the
tensor cores from their steady state. Like cuBLAS's heuristics, the model picks the tile
size that is fastest for the shape, smaller tiles running at a lower fraction of peak.
Everything else streams through DRAM (roofline). Every kernel leaves a small gap on the
GPU. Parameters per architecture: profiler/data/efficiency.yaml.

A GEMM runs on the tensor cores, or on the CUDA cores (SIMT) where the dtype has none:
fp32 without TF32, every dtype on Pascal and RDNA2. The two sustain different fractions
of their peaks (docs/calibration.md, "SIMT GEMMs"), and on GA10x / AD10x the datasheet
fp32 peak counts a second FP32 datapath that shares its issue slot with INT32: a GEMM's
address and loop arithmetic keeps most of it, so a CUDA-core GEMM runs against the
single-issue half of the peak plus the share of the second datapath it gets.
"""

from __future__ import annotations

import math

from profiler.devices import ArchEfficiency, DeviceSpec, device_efficiency

__all__ = ["attention_time_s", "gemm_efficiency", "gemm_peak_flops", "gemm_time_s",
           "kernel_gap_s", "launch_overhead_s", "math_dtype", "memory_time_s", "on_cuda_cores"]


def math_dtype(device: DeviceSpec, dtype: str) -> str:
    """The dtype whose peak a GEMM of `dtype` runs at (fp16 on devices without bf16)."""
    if dtype in device.peak_tflops:
        return dtype
    if dtype == "bf16" and "fp16" in device.peak_tflops:
        return "fp16"
    return "fp32"


def on_cuda_cores(device: DeviceSpec, dtype: str, eff: ArchEfficiency | None = None) -> bool:
    """Whether a GEMM of `dtype` runs on the CUDA cores (SIMT) rather than tensor cores:
    fp32 without TF32 (PyTorch's default since 1.12, pytorch/pytorch#77114), or any dtype
    on an architecture without tensor cores."""
    eff = eff or device_efficiency(device)
    return math_dtype(device, dtype) == "fp32" or not eff.tensor_cores


def gemm_peak_flops(device: DeviceSpec, dtype: str, eff: ArchEfficiency | None = None) -> float:
    """The peak FLOP/s a GEMM of `dtype` runs against: the dtype's datasheet peak; for
    CUDA-core GEMMs on a device whose fp32 peak counts dual issue (GA10x, AD10x: NVIDIA
    Ampere GA102 whitepaper, "2x FP32"; Ada Lovelace whitepaper), the single-issue half
    plus `dual_issue_fp32_gain` of the other half."""
    eff = eff or device_efficiency(device)
    peak = device.peak_flops(math_dtype(device, dtype))
    if device.fp32_dual_issue and on_cuda_cores(device, dtype, eff):
        return peak / 2 * (1 + (eff.dual_issue_fp32_gain or 0.0))
    return peak


def _tiles(eff: ArchEfficiency) -> list[tuple[int, int, float]]:
    """Candidate output tiles (m, n) and the fraction of the largest tile's throughput
    each reaches: (area / largest area) ** small_tile_penalty."""
    out = []
    for fm in (1, 2, 4):
        for fn in (1, 2, 4):
            tm, tn = max(eff.gemm_tile_m // fm, 1), max(eff.gemm_tile_n // fn, 1)
            out.append((tm, tn, (1.0 / (fm * fn)) ** eff.small_tile_penalty))
    return out


def _tile_fraction(tm: int, tn: int, tile_eff: float, batch: int, m: int, n: int, units: int,
                   in_flight: int) -> float:
    """Fraction of the tensor cores' steady rate a tile (tm, tn) keeps over `batch` [m, n]
    outputs when at most `in_flight` of those GEMMs' tiles run at once (`units` SMs: the
    last wave of tiles leaves some idle; padded partial tiles waste their padding)."""
    per_gemm = math.ceil(m / tm) * math.ceil(n / tn)
    tiles = per_gemm * batch
    slots = min(units, in_flight * per_gemm)
    waves = math.ceil(tiles / slots)
    wave_util = tiles / (waves * units)
    tile_util = (m * n * batch) / (tiles * tm * tn)
    return tile_eff * wave_util * tile_util


def gemm_efficiency(batch: int, m: int, n: int, k: int, *, device: DeviceSpec,
                    eff: ArchEfficiency | None = None, simt: bool = False,
                    dtype: str = "bf16", streams: int = 0) -> float:
    """Fraction of peak FLOP/s a [m,k]x[k,n] GEMM (batched `batch` times) of `dtype`
    reaches, with the best tile for its shape; `simt`: on the CUDA cores (of
    gemm_peak_flops).

    `streams` > 0: the `batch` GEMMs are separate launches, round-robin over `streams`
    CUDA streams (a grouped GEMM as Transformer Engine and the grouped_gemm package run
    it on Hopper: `grouped_gemm_streams` in planner/costs/workload.py). Each launch's
    tile is the best for its own shape alone (cuBLAS picks a kernel per call from that
    call's m, n, k), and at most `streams` of them run at once, so their tiles share the
    SMs only up to that many GEMMs' tiles."""
    eff = eff or device_efficiency(device)
    top = eff.gemm_peak_fraction(math_dtype(device, dtype), simt=simt)
    units = device.num_compute_units
    if streams > 0:
        tm, tn, tile_eff = max(_tiles(eff), key=lambda t: _tile_fraction(
            t[0], t[1], t[2], 1, m, n, units, 1))
        best = _tile_fraction(tm, tn, tile_eff, batch, m, n, units, min(streams, batch))
    else:
        best = max(_tile_fraction(tm, tn, tile_eff, batch, m, n, units, batch)
                   for tm, tn, tile_eff in _tiles(eff))
    return top * best * k / (k + eff.gemm_k_half)


def gemm_time_s(batch: int, m: int, n: int, k: int, *, device: DeviceSpec, dtype: str,
                elem_bytes: int, streams: int = 0) -> float:
    """A GEMM's time: compute at `gemm_efficiency` or its DRAM traffic, whichever is
    slower, and the kernel's gap; `streams` > 0 (separate launches over that many
    streams): a gap per launch on each stream, the streams' gaps overlapping."""
    eff = device_efficiency(device)
    flops = 2.0 * batch * m * n * k
    peak = gemm_peak_flops(device, dtype, eff)
    simt = on_cuda_cores(device, dtype, eff)
    compute = flops / (peak * gemm_efficiency(batch, m, n, k, device=device, eff=eff, simt=simt,
                                              dtype=dtype, streams=streams))
    traffic = elem_bytes * batch * (m * k + k * n + m * n)
    memory = traffic / (device.memory_bandwidth_bytes_per_s * eff.memory_efficiency)
    launches = math.ceil(batch / streams) if streams > 0 else 1
    return max(compute, memory) + launches * eff.kernel_overhead_s


def attention_time_s(flops: float, io_bytes: float, *, device: DeviceSpec, dtype: str) -> float:
    """A fused (flash) attention kernel: a fixed fraction of peak, or its I/O if slower."""
    eff = device_efficiency(device)
    peak = device.peak_flops(math_dtype(device, dtype))
    compute = flops / (peak * eff.attention_efficiency)
    memory = io_bytes / (device.memory_bandwidth_bytes_per_s * eff.memory_efficiency)
    return max(compute, memory) + eff.kernel_overhead_s


def memory_time_s(io_bytes: float, *, device: DeviceSpec, kernels: int = 1) -> float:
    """A bandwidth-bound op (norms, activations, softmax, optimizer)."""
    eff = device_efficiency(device)
    return (io_bytes / (device.memory_bandwidth_bytes_per_s * eff.memory_efficiency)
            + kernels * eff.kernel_overhead_s)


def kernel_gap_s(device: DeviceSpec) -> float:
    """GPU idle time a kernel costs besides its work (launch latency, tail)."""
    return device_efficiency(device).kernel_overhead_s


def launch_overhead_s(device: DeviceSpec) -> float:
    """Host time to dispatch one kernel (framework, autograd and driver together)."""
    return device_efficiency(device).launch_overhead_us * 1e-6
