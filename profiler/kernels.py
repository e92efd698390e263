"""Kernel names the profiler measures, the planner chooses and the executor runs: one
registry each."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ARCH_ATTENTION", "SDPA_BACKENDS", "Attention", "OptimizerKernel"]


class Attention(StrEnum):
    """PyTorch scaled-dot-product attention backends; `math` is also Megatron-LM's unfused
    softmax around two batched GEMMs; `flash_triton` is FlashAttention's 2022 Triton port,
    which no PyTorch backend runs (the planner prices it against `flash`; the executor and
    the profiler do not run it)."""

    FLASH = "flash"  # FlashAttention-2 (Dao 2023)
    MEMORY_EFFICIENT = "memory_efficient"  # xFormers / cutlass (Rabe & Staats 2021)
    MATH = "math"
    # flash_attn_triton.py (Dao-AILab/flash-attention, 2022; LLM Foundry's
    # `attn_impl: triton`, llmfoundry/models/layers/flash_attn_triton.py): 16-bit inputs,
    # "only been tested on A100"; last, so that nothing picks it unasked
    FLASH_TRITON = "flash_triton"

    @property
    def fused(self) -> bool:
        """Never materialises the s x s score matrix (and so can run ring attention)."""
        return self is not Attention.MATH


# The kernels PyTorch's scaled_dot_product_attention runs: what the profiler measures and
# the executor runs (`flash_triton` is priced by the planner only).
SDPA_BACKENDS = (Attention.FLASH, Attention.MEMORY_EFFICIENT, Attention.MATH)


class OptimizerKernel(StrEnum):
    """torch.optim.AdamW implementations."""

    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for_loop"


# The backends PyTorch's scaled_dot_product_attention runs on each architecture, fastest
# first (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: flash on sm80 and newer,
# memory-efficient on sm50 and newer; FlashAttention gives Turing no kernels, Dao-AILab
# flash-attention PR #2379), and the Triton port on the two generations it ran on in
# published runs (LLM Foundry's A100 and H100 tables). A device may name its own
# (DeviceSpec.attention).
ARCH_ATTENTION: dict[str, tuple[Attention, ...]] = {
    "pascal": (Attention.MEMORY_EFFICIENT, Attention.MATH),
    "volta": (Attention.MEMORY_EFFICIENT, Attention.MATH),
    "turing": (Attention.MEMORY_EFFICIENT, Attention.MATH),
    "ampere": (Attention.FLASH, Attention.MEMORY_EFFICIENT, Attention.MATH, Attention.FLASH_TRITON),
    "ada": (Attention.FLASH, Attention.MEMORY_EFFICIENT, Attention.MATH),
    "hopper": (Attention.FLASH, Attention.MEMORY_EFFICIENT, Attention.MATH, Attention.FLASH_TRITON),
    "blackwell": (Attention.FLASH, Attention.MEMORY_EFFICIENT, Attention.MATH),
    "rdna2": (Attention.MATH,),
    "cdna2": (Attention.MEMORY_EFFICIENT, Attention.MATH),
    "cdna3": (Attention.FLASH, Attention.MEMORY_EFFICIENT, Attention.MATH),
    "cpu": (Attention.FLASH, Attention.MATH),
}
