"""Kernel names the profiler measures, the planner chooses and the executor runs: one
registry each."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Attention", "OptimizerKernel"]


class Attention(StrEnum):
    """PyTorch scaled-dot-product attention backends; `math` is also Megatron-LM's unfused
    softmax around two batched GEMMs."""

    FLASH = "flash"  # FlashAttention-2 (Dao 2023)
    MEMORY_EFFICIENT = "memory_efficient"  # xFormers / cutlass (Rabe & Staats 2021)
    MATH = "math"

    @property
    def fused(self) -> bool:
        """Never materialises the s x s score matrix (and so can run ring attention)."""
        return self is not Attention.MATH


class OptimizerKernel(StrEnum):
    """torch.optim.AdamW implementations."""

    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for_loop"
