"""A GPT / Llama-style decoder built from a ModelSpec, nanoGPT-style (Karpathy 2022).

Reads top to bottom: norms, attention, MLP, a block, the model. Shapes in comments use
b micro-batch, s sequence, h hidden, a local heads, g local kv heads, d head dim, v vocab.
Linear layers carry no bias, so the parameter count equals `ModelSpec.num_params()`.
Attention is `F.scaled_dot_product_attention` under one chosen SDPA backend. Model code
takes the local head count and sequence length from the tensors, not the spec, so tensor
and context parallelism can slice them later.

Nothing here knows the hardware: device, dtype and threads are the caller's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from planner.specs.model import ModelSpec

# The profiler measures the planner's ops with these same pieces (profiler/torch_ops.py):
# Megatron-LM's dropout probability, rotary embeddings, the SDPA backend by plan name.
from profiler.torch_ops import DROPOUT_P, apply_rope, rope_tables, sdpa_backend

__all__ = ["ATTENTION_BACKENDS", "GPT", "Attention", "Block", "MLP"]

INIT_STD = 0.02  # GPT-2 (Radford et al. 2019); output projections scaled by 1/sqrt(2L)
ATTENTION_BACKENDS = ("flash", "memory_efficient", "math")


def _norm(spec: ModelSpec) -> nn.Module:
    # LayerNorm keeps its bias (GPT); RMSNorm has a weight only (Llama).
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.hidden_size)
    return nn.RMSNorm(spec.hidden_size, eps=1e-5)


class Attention(nn.Module):
    """Causal self-attention with grouped K/V heads (GQA when kv_heads < heads)."""

    def __init__(self, spec: ModelSpec, *, backend: str, dropout_p: float) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.q_width = spec.num_heads * spec.head_dim
        self.kv_width = spec.kv_dim
        self.qkv = nn.Linear(spec.hidden_size, self.q_width + 2 * self.kv_width, bias=False)
        self.proj = nn.Linear(self.q_width, spec.hidden_size, bias=False)
        self.backend = sdpa_backend(backend)
        self.dropout_p = dropout_p
        self.gqa = spec.kv_heads != spec.num_heads

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        b, s, _ = x.shape  # [b, s, h]
        q, k, v = self.qkv(x).split([self.q_width, self.kv_width, self.kv_width], dim=-1)
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)  # [b, a, s, d]
        k = k.view(b, s, -1, self.head_dim).transpose(1, 2)  # [b, g, s, d]
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)  # [b, g, s, d]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        with sdpa_kernel(self.backend):  # type: ignore[arg-type]
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=self.gqa,
                dropout_p=self.dropout_p if self.training else 0.0)  # [b, a, s, d]
        y = y.transpose(1, 2).reshape(b, s, -1)  # [b, s, a*d]
        return self.proj(y)  # [b, s, h]


class MLP(nn.Module):
    """h -> ffn -> h with GELU, or SwiGLU with gate and up fused in one GEMM."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.swiglu = spec.activation == "swiglu"
        self.fc1 = nn.Linear(spec.hidden_size, spec.mlp_in_width, bias=False)
        self.fc2 = nn.Linear(spec.ffn_hidden_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)  # [b, s, ffn] (gelu) or [b, s, 2*ffn] (swiglu)
        if self.swiglu:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up  # Shazeer 2020
        else:
            y = F.gelu(y)
        return self.fc2(y)  # [b, s, h]


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec, *, backend: str, dropout_p: float) -> None:
        super().__init__()
        self.norm1 = _norm(spec)
        self.attn = Attention(spec, backend=backend, dropout_p=dropout_p)
        self.norm2 = _norm(spec)
        self.mlp = MLP(spec)
        self.dropout = nn.Dropout(dropout_p) if dropout_p else nn.Identity()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), rope))
        return x + self.dropout(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    """The decoder: embeddings, `num_layers` blocks, final norm, logits and loss.

    `attention` is the SDPA backend the plan selected; `seed` makes the initial weights
    reproducible (the same seed gives the same model on any rank).
    """

    def __init__(self, spec: ModelSpec, *, attention: str = "math", seed: int = 0) -> None:
        super().__init__()
        if spec.position_embedding == "alibi":
            raise ValueError(f"model {spec.name!r}: position_embedding 'alibi' is not "
                             "implemented by the executor model (learned or rope are)")
        self.spec = spec
        dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.wte = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.wpe = (nn.Embedding(spec.seq_len, spec.hidden_size)
                    if spec.position_embedding == "learned" else None)
        self.drop = nn.Dropout(dropout_p) if dropout_p else nn.Identity()
        self.blocks = nn.ModuleList(Block(spec, backend=attention, dropout_p=dropout_p)
                                    for _ in range(spec.num_layers))
        self.norm_f = _norm(spec)
        self.lm_head = (None if spec.tied_embeddings else
                        nn.Linear(spec.hidden_size, spec.vocab_size, bias=False))
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        out_std = INIT_STD / math.sqrt(2 * self.spec.num_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # norms keep weight 1, bias 0
            std = out_std if name.endswith(("proj.weight", "fc2.weight")) else INIT_STD
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Logits [b, s, v] for tokens [b, s], or the mean cross-entropy with targets."""
        s = tokens.size(1)
        if self.wpe is not None and s > self.spec.seq_len:
            raise ValueError(f"sequence length {s} is longer than the {self.spec.seq_len} "
                             f"learned positions of model {self.spec.name!r}")
        x = self.wte(tokens)  # [b, s, h]
        rope = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(s, device=tokens.device))
        else:
            rope = rope_tables(s, self.spec.head_dim, device=tokens.device)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rope)
        x = self.norm_f(x)
        weight = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, weight)  # [b, s, v]
        if targets is None:
            return logits
        # The loss in fp32 whatever the training dtype (Megatron-LM's cross entropy).
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
