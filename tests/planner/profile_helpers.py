"""Synthetic profiles (no torch): rows for chosen workload ops with chosen times."""

from planner.costs.workload import Op
from profiler.store import PROFILE_SCHEMA_VERSION, ProfileMeta, ProfileRow, save_profile

# `plan profile` flags that measure a debug model in a few seconds: one small shape, one
# attention backend and AdamW implementation, few samples
QUICK_PROFILE = ["--mbs", "2", "--seq", "32", "--attention", "flash", "--optimizer", "fused",
                 "--warmup", "1", "--repeats", "3"]


def meta(device="CPU", dtype="fp32", world_size=1):
    """As `plan profile` writes it: a GPU's with its CUDA runtime, the CPU's without."""
    return ProfileMeta(schema_version=PROFILE_SCHEMA_VERSION, device=device,
                       device_detail="synthetic", dtype=dtype, torch_version="2.13.0",
                       cuda_version=None if device == "CPU" else "12.4",
                       host="test", created="2026-01-01T00:00:00+00:00", num_threads=1,
                       world_size=world_size, warmup=1, repeats=1)


def op_row(op: Op, time_s: float) -> ProfileRow:
    return ProfileRow(kind=op.kind, name=op.name, variant=op.variant, shape=op.shape,
                      flops=float(op.flops), bytes=float(op.bytes), kernels=op.kernels,
                      time_s=time_s, p10_s=time_s, p90_s=time_s, samples=1, calls=1)


def collective_row(kind: str, size: int, time_s: float, ranks: int = 2) -> ProfileRow:
    return ProfileRow(kind="collective", name=kind, shape=(size,), flops=0.0,
                      bytes=float(size), ranks=ranks, time_s=time_s, p10_s=time_s,
                      p90_s=time_s, samples=1, calls=1)


def write_profile(path, rows, **meta_fields) -> str:
    save_profile(str(path), meta(**meta_fields), rows)
    return str(path)
