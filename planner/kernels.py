"""Kernel selection: which attention and optimizer implementation a plan uses.

`--attention` (or a measured profile) decides. Without either, the analytic model
assumes the attention kernel of the published runs it was calibrated against on that
GPU generation (docs/calibration.md): Megatron-LM's fused softmax around two batched
GEMMs ("math") on Volta and Ampere, as in the Megatron-LM and Korthikanti et al. runs
and vTrain's A100 measurements; fused flash attention on Hopper and newer, as
Megatron-Core with Transformer Engine runs there. The fused AdamW everywhere.
"""

from __future__ import annotations

from planner.specs.plan import Kernels
from profiler.devices import DeviceSpec
from profiler.schema import fail

__all__ = ["ATTENTION_SUPPORT", "CALIBRATED_ATTENTION", "default_kernels"]

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


# The attention kernel the calibration data of each generation used (see module doc).
CALIBRATED_ATTENTION: dict[str, str] = {"volta": "math", "turing": "math", "ampere": "math"}


def default_kernels(devices: list[DeviceSpec], *, attention: str | None = None,
                    where: str = "--attention") -> Kernels:
    """The kernels a plan uses: the one asked for if every device supports it, else the
    calibrated assumption for the plan's GPUs (see the module doc)."""
    common = [k for k in ("flash", "memory_efficient", "math")
              if all(k in ATTENTION_SUPPORT.get(d.arch, ("math",)) for d in devices)]
    if attention is None:
        assumed = [CALIBRATED_ATTENTION.get(d.arch) for d in devices]
        choice = "math" if "math" in assumed else common[0]
        return Kernels(attention=choice)  # type: ignore[arg-type]
    if attention not in common:
        names = ", ".join(sorted({d.name for d in devices}))
        fail(where, attention, f"{names} support {', '.join(common)}")
    return Kernels(attention=attention)  # type: ignore[arg-type]
