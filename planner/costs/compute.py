"""Op time on one device type: the analytic device model (profiles join in later)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from planner.workload import Op
from profiler import analytic
from profiler.devices import device, dtype_bytes

__all__ = ["ANALYTIC_SOURCE", "ComputeCosts", "clear_op_cache"]

ANALYTIC_SOURCE = "analytic device model (datasheet peak x efficiency, profiler/data/efficiency.yaml)"


@cache
def _analytic_op_time_s(device_name: str, dtype: str, op: Op) -> float:
    dev = device(device_name)
    elem = dtype_bytes(dtype)
    extra = analytic.kernel_gap_s(dev) * (op.kernels - 1)  # small launches beside the main one
    if op.kind == "gemm":
        batch, m, n, k = op.shape
        return analytic.gemm_time_s(batch, m, n, k, device=dev, dtype=dtype,
                                    elem_bytes=elem) + extra
    if op.kind == "attention":
        return analytic.attention_time_s(op.flops, op.bytes, device=dev, dtype=dtype) + extra
    return analytic.memory_time_s(op.bytes, device=dev, kernels=op.kernels)


@dataclass
class ComputeCosts:
    """Op times for one device type and training dtype."""

    device_name: str
    dtype: str

    def time_s(self, op: Op) -> float:
        return _analytic_op_time_s(self.device_name, self.dtype, op)

    def total_s(self, ops: tuple) -> float:
        """Sum over the compute ops of a sequence (collectives are skipped)."""
        return sum(self.time_s(op) for op in ops if isinstance(op, Op))


def clear_op_cache() -> None:
    _analytic_op_time_s.cache_clear()
