"""Kernel selection: which attention and optimizer implementation a plan uses.

Without a profile the choice follows what each device supports: fused (flash) attention
on Ampere and newer and on the CPU (PyTorch's SDPA), the memory-efficient kernel on
older GPUs; the fused AdamW everywhere.
"""

from __future__ import annotations

from planner.specs.plan import Kernels
from profiler.devices import DeviceSpec
from profiler.schema import fail

__all__ = ["ATTENTION_SUPPORT", "default_kernels"]

# Attention backends each architecture can run (PyTorch SDPA: flash needs sm80+).
ATTENTION_SUPPORT: dict[str, tuple[str, ...]] = {
    "volta": ("memory_efficient", "math"),
    "turing": ("memory_efficient", "math"),
    "ampere": ("flash", "memory_efficient", "math"),
    "ada": ("flash", "memory_efficient", "math"),
    "hopper": ("flash", "memory_efficient", "math"),
    "blackwell": ("flash", "memory_efficient", "math"),
    "cdna2": ("memory_efficient", "math"),
    "cdna3": ("flash", "memory_efficient", "math"),
    "cpu": ("flash", "math"),
}


def default_kernels(devices: list[DeviceSpec], *, attention: str | None = None,
                    where: str = "--attention") -> Kernels:
    """The fastest kernels every device of the plan supports (or the one asked for)."""
    common = [k for k in ("flash", "memory_efficient", "math")
              if all(k in ATTENTION_SUPPORT.get(d.arch, ("math",)) for d in devices)]
    if attention is None:
        return Kernels(attention=common[0])  # type: ignore[arg-type]
    if attention not in common:
        names = ", ".join(sorted({d.name for d in devices}))
        fail(where, attention, f"{names} support {', '.join(common)}")
    return Kernels(attention=attention)  # type: ignore[arg-type]
