"""Op time on one device type: a measured profile where it has the op, else the analytic
device model.

A profile answers an op by its name, implementation (variant) and shape, interpolating
over sizes it did not measure inside the range it measured (profiler/store.py). Outside
that range the analytic model is scaled by what the profile measured at the nearest end of
the op's series (`profiled_op_time_s`): the measurement calibrates the model for that op
on that device, and the model carries it to the other size (a tp-2 half of a GEMM measured
at tp 1, a micro-batch larger than the profiled one), continuous at the edge and growing
as the model grows. Ops the profile lacks (a SwiGLU when the profiled model had GELU) are
the analytic model's alone. `compute_source` says which answered what. FlashAttention's Triton port,
which nothing here measures, is FlashAttention-2's time (measured or analytic) times its
published slowdown (`TRITON_FLASH_SLOWDOWN`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache

from planner.costs.workload import Op
from planner.specs.choices import DType
from profiler import analytic
from profiler.devices import DeviceSpec, device
from profiler.kernels import Attention
from profiler.schema import SpecError
from profiler.store import Profile, ProfileRow

__all__ = ["ANALYTIC_SOURCE", "ARCH_CALIBRATION", "TRITON_FLASH_SLOWDOWN", "TRITON_FLASH_SOURCE",
           "ComputeCosts",
           "calibration_source", "clear_op_cache", "compute_source", "measured_op_time_s",
           "peak_time_s", "priced_as", "profiled_op_time_s"]

# FlashAttention's 2022 Triton port (`Attention.FLASH_TRITON`) against FlashAttention-2,
# forward and backward: Dao 2023 (arXiv:2307.08691) §4.1, measured on an A100 80GB SXM4 at
# sequence 512-16k, head dimension 64 and 128, with and without the causal mask:
# "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the forward
# pass and around 2x faster in the backward pass" (the midpoint of the forward range).
# Other GPUs are assumed to keep the ratio (the port was tested on A100 only).
TRITON_FLASH_SLOWDOWN = {"forward": 1.4, "backward": 2.0}
TRITON_FLASH_SOURCE = (f"flash_triton attention: FlashAttention-2's times x "
                       f"{TRITON_FLASH_SLOWDOWN['forward']} forward, x "
                       f"{TRITON_FLASH_SLOWDOWN['backward']} backward (Dao 2023, "
                       "arXiv:2307.08691 §4.1)")

ANALYTIC_SOURCE = "analytic device model (datasheet peak x efficiency, profiler/data/efficiency.yaml)"


# What the shipped analytic parameters of each architecture were fitted to
# (profiler/data/efficiency.yaml, docs/calibration.md "Calibrated values"); the others carry
# the nearest calibrated generation's values, with no measurement of their own behind them.
ARCH_CALIBRATION = {
    "volta": "fitted to Megatron-LM's 2020 V100 rows",
    "ampere": "fitted to vTrain's 1,440 A100 runs, Korthikanti et al. 2022 and Megatron-LM's "
              "A100 rows",
    "hopper": "fitted to three Megatron-Core r0.8 H100 rows (the DGX Cloud H100 rows, held "
              "out, are 9-17% slower than measured in bf16)",
    # the GEMM rates only; every other blackwell value is a starting value
    "blackwell": "its 16-bit and FP8 GEMM rates fitted to the 18 DGX Cloud GB200 rows (NeMo "
                 "2.0, BF16 and FP8), the rest starting values (held out: Megatron-Bridge's "
                 "B200 / GB200 FP8 rows, 6-14% too fast on average), measured on B200 and "
                 "GB200 only",
}


def calibration_source(devices: Iterable[DeviceSpec]) -> str:
    """Where the analytic parameters of each GPU type come from, so that a user can tell a
    calibrated prediction from a starting value: the type's own fit in the shipped catalog
    (Zorse's per-layer times), a catalog file's own values, its architecture's fit
    (`ARCH_CALIBRATION`), or none."""
    parts = []
    for dev in sorted(set(devices), key=lambda d: d.name):
        if dev.vendor == "cpu":
            continue  # CPU ranks are priced from a profile measured on the host
        try:
            shipped = device(dev.name) == dev
        except SpecError:
            shipped = False
        # a type a catalog or cluster file defines or changes: its peaks and memory are
        # the file's, not the datasheet's (the sources said "datasheet peak" of them)
        own = "" if shipped else f" (its numbers from the user's file: {dev.source})"
        if dev.efficiency is not None:
            parts.append(f"{dev.name}: its own parameters, "
                         + ("fitted to Zorse's measured layer times (docs/calibration.md, "
                            '"Zorse")' if shipped else "from the catalog file") + own)
        elif dev.arch in ARCH_CALIBRATION:
            parts.append(f"{dev.name}: {dev.arch}'s parameters, {ARCH_CALIBRATION[dev.arch]}"
                         + own)
        else:
            parts.append(f"{dev.name}: {dev.arch}'s parameters, NOT calibrated against any "
                         "measurement (the nearest calibrated generation's starting values: "
                         "measure a profile with `plan profile` to replace them)" + own)
    return "; ".join(parts)


def gemm_precision(dtype: str, op: Op) -> DType:
    """What a GEMM runs in: FP8 only for linear layers (Transformer Engine keeps the
    attention GEMMs and the logits in bf16); TF32 for every fp32 matmul under tf32."""
    dt = DType(dtype)
    return dt if dt is not DType.FP8 or op.low_precision else dt.storage


@cache
def _analytic_op_time_s(dev: DeviceSpec, dtype: str, op: Op) -> float:
    extra = analytic.kernel_gap_s(dev) * (op.kernels - 1)  # small launches beside the main one
    if op.kind == "gemm":
        batch, m, n, k = op.shape
        precision = gemm_precision(dtype, op)
        return analytic.gemm_time_s(batch, m, n, k, device=dev, dtype=precision,
                                    elem_bytes=precision.gemm_operand_bytes,
                                    streams=op.streams) + extra
    if op.kind == "attention":  # fused attention kernels run at the storage precision
        return analytic.attention_time_s(op.flops, op.bytes, device=dev,
                                         dtype=DType(dtype).storage) + extra
    return analytic.memory_time_s(op.bytes, device=dev, kernels=op.kernels)


def _size(op: Op) -> float:
    """What a profile's series interpolates an op's time against (profiler/store.py)."""
    return op.flops if op.kind in ("gemm", "attention") else op.bytes


@cache
def measured_op_time_s(profile: Profile, op: Op) -> float | None:
    """The profile's time for `op`, or None where it does not have it."""
    return profile.time_s(kind=op.kind, name=op.name, variant=op.variant, shape=op.shape,
                          size=_size(op))


@cache
def _scaled_from_edge_s(profile: Profile, dev: DeviceSpec, dtype: str, op: Op) -> float | None:
    """The analytic time of `op` times the profile's measured / analytic time at the
    nearest measured size of its series, or None where the profile has no such series."""
    def analytic_s(row: ProfileRow | None) -> float:
        at = op if row is None else replace(op, shape=row.shape, flops=row.flops,
                                            bytes=row.bytes, kernels=row.kernels)
        return _analytic_op_time_s(dev, dtype, at)

    return profile.scaled_s(kind=op.kind, name=op.name, variant=op.variant, size=_size(op),
                            model_s=analytic_s)


def peak_time_s(dev: DeviceSpec, dtype: str, op: Op) -> float:
    """The least time `op` can take on `dev`: its FLOPs at the datasheet peak of the
    precision it runs in (GEMMs: `gemm_precision`; fused attention: the storage dtype);
    0 for other ops (small ones run from cache, faster than DRAM allows) and on the CPU
    (whose catalog peak is a template's)."""
    if dev.vendor == "cpu" or op.kind not in ("gemm", "attention"):
        return 0.0
    precision = gemm_precision(dtype, op) if op.kind == "gemm" else DType(dtype).storage
    return op.flops / dev.peak_flops(analytic.math_dtype(dev, precision))


def profiled_op_time_s(profile: Profile, dev: DeviceSpec, dtype: str, op: Op) -> float | None:
    """The profile's time for `op`: measured (or interpolated) inside the range its series
    measured, scaled from the nearest measurement outside it, never faster than the
    precision's peak allows (`peak_time_s`: a measurement near the peak, carried to a size
    where the model runs closer to it, would pass it); None where the profile did not
    measure the op at all."""
    measured = measured_op_time_s(profile, op)
    if measured is not None:
        return measured
    scaled = _scaled_from_edge_s(profile, dev, dtype, op)
    return None if scaled is None else max(scaled, peak_time_s(dev, dtype, op))


def priced_as(op: Op) -> tuple[Op, float]:
    """The op whose time prices `op`, and the factor: FlashAttention's Triton port is its
    FlashAttention-2 twin `TRITON_FLASH_SLOWDOWN` times slower (forward or backward, by the
    op's `.bwd` name); any other op is itself."""
    if op.kind == "attention" and op.variant == Attention.FLASH_TRITON:
        return (replace(op, variant=str(Attention.FLASH)),
                TRITON_FLASH_SLOWDOWN["backward" if op.name.endswith(".bwd") else "forward"])
    return op, 1.0


@dataclass(frozen=True)
class ComputeCosts:
    """Op times for one device type and training dtype, from `profile` first (one of
    this device type, measured in this dtype) and the analytic model for the rest."""

    device: DeviceSpec
    dtype: str
    profile: Profile | None = None

    def time_s(self, op: Op) -> float:
        if op.share != 1.0:  # run on `share` of the layers: that share of one whole run
            whole = replace(op, flops=op.flops / op.share, bytes=op.bytes / op.share, share=1.0)
            return op.share * self.time_s(whole)
        flash, slowdown = priced_as(op)
        if slowdown != 1.0:
            return slowdown * self.time_s(flash)
        if self.profile is not None:
            profiled = profiled_op_time_s(self.profile, self.device, self.dtype, op)
            if profiled is not None:
                return profiled
        return _analytic_op_time_s(self.device, self.dtype, op)

    def total_s(self, ops: tuple) -> float:
        """Sum over the compute ops of a sequence (collectives are skipped)."""
        return sum(self.time_s(op) for op in ops if isinstance(op, Op))


def compute_source(uses: Iterable[tuple[Profile | None, Op]]) -> str:
    """Which model answered the ops of a plan, given (profile, op) pairs: the profile's
    path and the op kinds it answered, and what was left to the analytic model."""
    measured: dict[str, set[str]] = {}
    scaled: dict[str, set[str]] = {}  # op names outside the sizes the profile measured
    analytic_names: set[str] = set()
    triton = False
    for profile, op in uses:
        op, slowdown = priced_as(op)
        triton |= slowdown != 1.0
        if profile is None:
            analytic_names.add(op.name)
        elif measured_op_time_s(profile, op) is not None:
            measured.setdefault(profile.path, set()).add(op.kind)
        elif profile.edge(kind=op.kind, name=op.name, variant=op.variant, size=_size(op)):
            scaled.setdefault(profile.path, set()).add(op.name)
        else:
            analytic_names.add(op.name)
    note = f"; {TRITON_FLASH_SOURCE}" if triton else ""
    if not measured and not scaled:
        return ANALYTIC_SOURCE + note
    parts = [f"measured profile {path} ({', '.join(sorted(kinds))})"
             for path, kinds in sorted(measured.items())]
    parts += [f"outside the sizes {path} measured: the analytic model scaled by its nearest "
              f"measurement ({', '.join(sorted(names))})" for path, names in sorted(scaled.items())]
    text = "; ".join(parts)
    if analytic_names:
        text += f"; {ANALYTIC_SOURCE} for the rest ({', '.join(sorted(analytic_names))})"
    return text + note


def clear_op_cache() -> None:
    _analytic_op_time_s.cache_clear()
    measured_op_time_s.cache_clear()
    _scaled_from_edge_s.cache_clear()
