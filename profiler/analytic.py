"""Analytic device model: op time from datasheet peaks and size-dependent efficiency.

Used wherever no measured profile answers. A GEMM runs in output tiles spread over the
device's compute units, so small GEMMs waste part of a wave (wave quantisation), and a
short inner dimension keeps the tensor cores from their steady state; both shape the
efficiency curve. Everything else streams through DRAM (roofline). Every op pays a fixed
kernel overhead. Parameters per architecture: profiler/data/efficiency.yaml.
"""

from __future__ import annotations

import math

from profiler.devices import ArchEfficiency, DeviceSpec, arch_efficiency

__all__ = ["attention_time_s", "gemm_efficiency", "gemm_time_s", "math_dtype",
           "memory_time_s"]


def math_dtype(device: DeviceSpec, dtype: str) -> str:
    """The dtype whose peak a GEMM of `dtype` runs at (fp16 on devices without bf16)."""
    if dtype in device.peak_tflops:
        return dtype
    if dtype == "bf16" and "fp16" in device.peak_tflops:
        return "fp16"
    return "fp32"


def gemm_efficiency(batch: int, m: int, n: int, k: int, *, device: DeviceSpec,
                    eff: ArchEfficiency | None = None) -> float:
    """Fraction of peak FLOP/s a [m,k]x[k,n] GEMM (batched `batch` times) reaches."""
    eff = eff or arch_efficiency(device.arch)
    tm, tn = eff.gemm_tile_m, eff.gemm_tile_n
    tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
    waves = math.ceil(tiles / device.num_compute_units)
    wave_util = tiles / (waves * device.num_compute_units)
    tile_util = (m * n * batch) / (tiles * tm * tn)
    k_util = k / (k + eff.gemm_k_half)
    return eff.gemm_efficiency * wave_util * tile_util * k_util


def gemm_time_s(batch: int, m: int, n: int, k: int, *, device: DeviceSpec, dtype: str,
                elem_bytes: int) -> float:
    eff = arch_efficiency(device.arch)
    flops = 2.0 * batch * m * n * k
    peak = device.peak_flops(math_dtype(device, dtype))
    compute = flops / (peak * gemm_efficiency(batch, m, n, k, device=device, eff=eff))
    traffic = elem_bytes * batch * (m * k + k * n + m * n)
    memory = traffic / (device.memory_bandwidth_bytes_per_s * eff.memory_efficiency)
    return max(compute, memory) + eff.kernel_overhead_s


def attention_time_s(flops: float, io_bytes: float, *, device: DeviceSpec, dtype: str) -> float:
    """A fused (flash) attention kernel: a fixed fraction of peak, or its I/O if slower."""
    eff = arch_efficiency(device.arch)
    peak = device.peak_flops(math_dtype(device, dtype))
    compute = flops / (peak * eff.attention_efficiency)
    memory = io_bytes / (device.memory_bandwidth_bytes_per_s * eff.memory_efficiency)
    return max(compute, memory) + eff.kernel_overhead_s


def memory_time_s(io_bytes: float, *, device: DeviceSpec, kernels: int = 1) -> float:
    """A bandwidth-bound op (norms, activations, softmax, optimizer)."""
    eff = arch_efficiency(device.arch)
    return (io_bytes / (device.memory_bandwidth_bytes_per_s * eff.memory_efficiency)
            + kernels * eff.kernel_overhead_s)
