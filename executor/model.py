"""A GPT / Llama-style decoder built from a ModelSpec, nanoGPT-style (Karpathy 2022).

Reads top to bottom: norms, attention, MLP, a block, the model. Shapes in comments use
b micro-batch, s sequence, h hidden, a local heads, g local kv heads, d head dim, v vocab.
Linear layers carry no bias, so the parameter count equals `ModelSpec.num_params()`.
Attention is `F.scaled_dot_product_attention` under one chosen SDPA backend. Model code
takes the local head count and sequence length from the tensors, not the spec, so tensor
and sequence parallelism can slice them (executor/tensor_parallel.py).

A `GPT` may hold only a slice of the model, one pipeline chunk: layers [first, last), with
or without the embedding and the head. Parameter names are those of the whole model
(`blocks.7.attn.qkv.weight`) and each parameter's initial value is drawn from a generator
seeded by its name, so a chunk built on any rank equals that part of the whole model.

Nothing here knows the hardware: device, dtype and threads are the caller's.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.moe import MLP, MoE
from planner.specs.choices import Recompute
from planner.specs.model import ModelSpec
from profiler.kernels import SDPA_BACKENDS

# The profiler measures the planner's ops with these same pieces (profiler/torch_ops.py):
# Megatron-LM's dropout probability, rotary embeddings, the SDPA backend by plan name.
from profiler.torch_ops import DROPOUT_P, apply_rope, rope_tables, sdpa_backend

__all__ = ["ATTENTION_BACKENDS", "GPT", "RECOMPUTE", "Attention", "Block", "MLP",
           "param_seed"]

INIT_STD = 0.02  # GPT-2 (Radford et al. 2019); output projections scaled by 1/sqrt(2L)
ATTENTION_BACKENDS = tuple(str(k) for k in SDPA_BACKENDS)  # PyTorch SDPA
# Activation recomputation (Korthikanti et al. 2022): "full" recomputes each layer in
# backward, "selective" only the attention core (softmax, dropout, scores x V).
RECOMPUTE = tuple(Recompute)
TIED_HEAD = "wte.weight"  # the name a tied output projection is initialised (and synced) by


def param_seed(seed: int, name: str) -> int:
    """The generator seed of one parameter: the model seed and the parameter's name.
    (32 bits: torch's CPU generator, a Mersenne Twister, keeps only the low 32.)"""
    return zlib.crc32(f"{seed}:{name}".encode())


def _norm(spec: ModelSpec) -> nn.Module:
    # LayerNorm keeps its bias (GPT); RMSNorm has a weight only (Llama).
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.hidden_size)
    return nn.RMSNorm(spec.hidden_size, eps=1e-5)


class Attention(nn.Module):
    """Causal self-attention with grouped K/V heads (GQA when kv_heads < heads).

    The QKV projection is one GEMM; its output columns are [q | k | v] (tensor parallelism
    regroups the rows per rank so each rank's slice is again [q | k | v])."""

    def __init__(self, spec: ModelSpec, *, backend: str, dropout_p: float,
                 recompute_core: bool = False) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.q_width = spec.num_heads * spec.head_dim
        self.kv_width = spec.kv_dim
        self.qkv = nn.Linear(spec.hidden_size, self.q_width + 2 * self.kv_width, bias=False)
        self.proj = nn.Linear(self.q_width, spec.hidden_size, bias=False)
        self.backend = sdpa_backend(backend)
        self.dropout_p = dropout_p
        self.gqa = spec.kv_heads != spec.num_heads
        self.recompute_core = recompute_core
        self.rope = spec.position_embedding == "rope"
        self.rope_theta = spec.rope_theta
        self._rope_tables: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _rotation(self, s: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (s, str(device))
        if key not in self._rope_tables:
            self._rope_tables[key] = rope_tables(s, self.head_dim, device=device,
                                                 base=self.rope_theta)
        return self._rope_tables[key]

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(self.backend):  # type: ignore[arg-type]
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=self.gqa,
                dropout_p=self.dropout_p if self.training else 0.0)  # [b, a, s, d]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape  # [b, s, h]
        y = self.qkv(x)  # [b, s, (a + 2g) d]: local heads under tensor parallelism
        q_w = y.size(-1) * self.q_width // (self.q_width + 2 * self.kv_width)
        kv_w = (y.size(-1) - q_w) // 2
        q, k, v = y.split([q_w, kv_w, kv_w], dim=-1)
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)  # [b, a, s, d]
        k = k.view(b, s, -1, self.head_dim).transpose(1, 2)  # [b, g, s, d]
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)  # [b, g, s, d]
        if self.rope:
            cos, sin = self._rotation(s, x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.recompute_core and self.training:
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        y = y.transpose(1, 2).reshape(b, s, -1)  # [b, s, a*d]
        return self.proj(y)  # [b, s, h]


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x)); on the
    model's MoE layers the MLP is the MoE layer (executor/moe.py), with this rank's
    experts (rank `ep_rank` of `ep`)."""

    def __init__(self, spec: ModelSpec, *, backend: str, dropout_p: float,
                 attention_dropout_p: float, recompute: str = "none", moe: bool = False,
                 ep: int = 1, ep_rank: int = 0) -> None:
        super().__init__()
        self.norm1 = _norm(spec)
        self.attn = Attention(spec, backend=backend, dropout_p=attention_dropout_p,
                              recompute_core=recompute == Recompute.SELECTIVE)
        self.norm2 = _norm(spec)
        self.mlp: nn.Module = MoE(spec, ep=ep, ep_rank=ep_rank) if moe else MLP(spec)
        self.dropout = nn.Dropout(dropout_p) if dropout_p else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    """The decoder, or one pipeline chunk of it: embeddings (with `embedding`), blocks
    `layers` = [first, last) (default all), final norm, logits and loss (with `head`).

    `attention` is the SDPA backend the plan selected, `recompute` the activation
    recomputation; `seed` makes the initial weights reproducible (the same seed gives the
    same parameter of the same name on any rank, in any chunk). With expert parallelism
    the chunk holds the routed experts of rank `ep_rank` of `ep` (executor/moe.py).
    """

    def __init__(self, spec: ModelSpec, *, attention: str = "math", seed: int = 0,
                 layers: tuple[int, int] | None = None, embedding: bool = True,
                 head: bool = True, recompute: str = "none", ep: int = 1,
                 ep_rank: int = 0) -> None:
        super().__init__()
        if spec.position_embedding == "alibi":
            raise ValueError(f"model {spec.name!r}: position_embedding 'alibi' is not "
                             "implemented by the executor model (learned or rope are)")
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute {recompute!r} is not one of {', '.join(RECOMPUTE)}")
        first, last = layers or (0, spec.num_layers)
        if not 0 <= first <= last <= spec.num_layers:
            raise ValueError(f"layers [{first}, {last}) outside the model's "
                             f"{spec.num_layers} layers")
        self.spec, self.embedding, self.head = spec, embedding, head
        self.recompute = recompute
        dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.wte = (nn.Embedding(spec.vocab_size, spec.hidden_size) if embedding else None)
        self.wpe = (nn.Embedding(spec.seq_len, spec.hidden_size)
                    if embedding and spec.position_embedding == "learned" else None)
        self.drop = nn.Dropout(dropout_p) if dropout_p else nn.Identity()
        # Keyed by global layer index: names match the whole model's `blocks.<i>.`.
        attention_p = DROPOUT_P if spec.drops_attention else 0.0
        self.blocks = nn.ModuleDict({str(i): Block(spec, backend=attention, dropout_p=dropout_p,
                                                   attention_dropout_p=attention_p,
                                                   recompute=recompute,
                                                   moe=spec.is_moe_layer(i), ep=ep,
                                                   ep_rank=ep_rank)
                                     for i in range(first, last)})
        self.norm_f = _norm(spec) if head else None
        self.lm_head = (nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
                        if head else None)
        self.tie_weights()
        self._init_weights(seed)

    @property
    def tied_head(self) -> bool:
        """Whether the output projection is the token embedding (tied embeddings)."""
        return self.head and self.spec.tied_embeddings

    def tie_weights(self) -> None:
        """Share the token embedding with the output projection when the spec ties them
        and this chunk holds both (again after tensor parallelism re-wraps parameters)."""
        if self.tied_head and self.wte is not None and self.lm_head is not None:
            self.lm_head.weight = self.wte.weight

    def init_name(self, name: str) -> str:
        """The whole-model name a parameter is initialised by (a tied output projection on
        a chunk without the embedding is the embedding's copy)."""
        return TIED_HEAD if self.tied_head and name == "lm_head.weight" else name

    def _init_weights(self, seed: int) -> None:
        out_std = INIT_STD / math.sqrt(2 * self.spec.num_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # norms keep weight 1, bias 0
            gen = torch.Generator().manual_seed(param_seed(seed, self.init_name(name)))
            std = out_std if name.endswith(("proj.weight", "fc2.weight")) else INIT_STD
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.wte is not None
        s = tokens.size(1)
        if self.wpe is not None and s > self.spec.seq_len:
            raise ValueError(f"sequence length {s} is longer than the {self.spec.seq_len} "
                             f"learned positions of model {self.spec.name!r}")
        x = self.wte(tokens)  # [b, s, h]
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(s, device=tokens.device))
        return self.drop(x)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens [b, s] (with the embedding) or hidden states [b, s, h] in; hidden states
        out, or with the head the logits [b, s, v], or the mean cross-entropy with
        targets [b, s]."""
        if self.embedding:
            x = self._embed(x)
        for block in self.blocks.values():
            if self.recompute == Recompute.FULL and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if not self.head:
            return x
        assert self.norm_f is not None and self.lm_head is not None
        logits = self.lm_head(self.norm_f(x))  # [b, s, v]
        if targets is None:
            return logits
        # The loss in fp32 whatever the training dtype (Megatron-LM's cross entropy).
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
