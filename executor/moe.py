"""The mixture-of-experts layer of the executor's model, and expert parallelism.

An MoE layer replaces a block's MLP on the layers `ModelSpec.is_moe_layer` names:

* a router (one linear layer h -> E, no bias) scores every token; "softmax" takes the
  top-k of the softmax and renormalises them to sum to 1 (Mixtral, Jiang et al. 2024:
  softmax over the top-k logits, the same numbers); "sigmoid" takes the top-k sigmoid
  scores and normalises them (DeepSeek-V3, Liu et al. 2024 §2.1.2; no bias correction);
* each routed expert is an MLP of `expert_ffn` with the model's activation; the shared
  experts (DeepSeekMoE) run as one MLP of `shared_ffn` on every token;
* dropless by default; with a capacity factor each expert takes at most
  ceil(cf x s x k / E) tokens of each sequence, earlier tokens first, and the rest of
  that expert's tokens are dropped (their expert output is 0; Switch, Fedus et al. 2022
  §2.2). Capacity is counted per sequence, not per micro-batch as Megatron-Core does, so
  that a run routes exactly as the one-process reference whatever its micro-batches are.
  Dropped copies are still computed, with weight 0. There is no auxiliary
  load-balancing loss.

Expert parallelism (ep > 1) gives rank i of an ep group experts [i E/ep, (i+1) E/ep);
their parameters keep their whole-model names (`blocks.3.mlp.experts.5.fc1.weight`), so
a rank builds exactly its experts with the same initial values as the whole model. Token
copies are sent to the rank holding their expert and back with `all_to_all_single` over
the ep group (gloo has it, with uneven splits); its backward is the reverse all-to-all.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.specs.model import ModelSpec

__all__ = ["MLP", "MoE", "all_to_all"]


class MLP(nn.Module):
    """h -> ffn -> h with GELU, or a gated linear unit (Shazeer 2020) with gate and up
    fused in one GEMM: SwiGLU (SiLU of the gate times up) or GeGLU (GELU of the gate
    times up; Grok-1). GELU is torch's (the erf form) in both; Grok-1's jax.nn.gelu and
    Megatron-Core's fused geglu compute its tanh approximation, same shapes and bytes."""

    def __init__(self, spec: ModelSpec, ffn: int | None = None) -> None:
        super().__init__()
        ffn = ffn or spec.ffn_hidden_size
        self.activation = spec.activation
        self.fc1 = nn.Linear(spec.hidden_size, ffn * (2 if spec.gated else 1), bias=False)
        self.fc2 = nn.Linear(ffn, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)  # [.., ffn] (gelu) or [.., 2*ffn] (gated: [gate | up])
        if self.activation == "swiglu":
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        elif self.activation == "geglu":
            gate, up = y.chunk(2, dim=-1)
            y = F.gelu(gate) * up
        else:
            y = F.gelu(y)
        return self.fc2(y)  # [.., h]


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` with uneven splits; the gradient goes back the same way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int],
                recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int],
               group: dist.ProcessGroup) -> torch.Tensor:
    """Rows [sum(send), ...] out, `send[i]` of them to member i; rows [sum(recv), ...] in."""
    return _AllToAll.apply(x, send, recv, group)


class MoE(nn.Module):
    """Router, this rank's routed experts, shared experts (see the module docstring)."""

    def __init__(self, spec: ModelSpec, *, ep: int = 1, ep_rank: int = 0) -> None:
        super().__init__()
        if spec.num_experts % ep:
            raise ValueError(f"ep {ep} must divide num_experts {spec.num_experts}")
        self.num_experts, self.top_k = spec.num_experts, spec.experts_per_token
        self.router_kind, self.capacity_factor = spec.router, spec.capacity_factor
        self.ep, self.local = ep, spec.num_experts // ep
        self.first = ep_rank * self.local  # this rank's experts: [first, first + local)
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): MLP(spec, spec.expert_ffn)
                                      for e in range(self.first, self.first + self.local)})
        self.shared = MLP(spec, spec.shared_ffn) if spec.shared_ffn else None
        self.group: dist.ProcessGroup | None = None  # the ep group, set when ep > 1

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [b, s, h] -> (expert ids, weights), each [b, s, k]; dropped copies get
        weight 0."""
        logits = self.router(x).float()  # [b, s, E]
        scores = logits.softmax(-1) if self.router_kind == "softmax" else logits.sigmoid()
        weights, ids = scores.topk(self.top_k, dim=-1)  # [b, s, k]
        weights = weights / weights.sum(-1, keepdim=True)
        if self.capacity_factor is not None:
            weights = weights * self._kept(ids)
        return ids, weights.to(x.dtype)

    def _kept(self, ids: torch.Tensor) -> torch.Tensor:
        """1 for the copies each expert takes within its capacity per sequence, else 0."""
        b, s, k = ids.shape
        assert self.capacity_factor is not None
        capacity = math.ceil(self.capacity_factor * s * k / self.num_experts)
        onehot = F.one_hot(ids.reshape(b, s * k), self.num_experts)  # [b, s*k, E], token order
        position = (onehot.cumsum(1) * onehot).sum(-1).view(b, s, k)  # 1-based place in queue
        return (position <= capacity).to(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape  # [b, s, h]
        ids, weights = self.route(x)  # [b, s, k]
        tokens = x.reshape(b * s, h)
        flat_ids = ids.reshape(-1)  # [b*s*k]: copy j is token j // k
        order = flat_ids.argsort(stable=True)  # copies grouped by expert
        rows = tokens[order // self.top_k]  # [b*s*k, h]
        counts = torch.bincount(flat_ids, minlength=self.num_experts)  # [E]
        out = self._experts(rows, counts)  # [b*s*k, h], in the same order
        combined = out[order.argsort()]  # back to copy order
        y = (combined.view(b * s, self.top_k, h)
             * weights.reshape(b * s, self.top_k, 1)).sum(1).view(b, s, h)
        if self.shared is not None:
            y = y + self.shared(x)
        return y

    def _experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows grouped by expert ([sum(counts), h]) through their experts, same order."""
        if self.ep == 1:
            return self._local(rows, counts.tolist())
        assert self.group is not None, "expert parallelism without its group"
        # Each member's counts per expert, then the rows to each member's experts.
        mine = counts.view(self.ep, self.local)  # [ep, local]
        theirs = torch.empty_like(mine)  # [ep sources, local]: what each sends me
        dist.all_to_all_single(theirs, mine, group=self.group)
        send = mine.sum(1).tolist()
        recv = theirs.sum(1).tolist()
        got = all_to_all(rows, send, recv, self.group)  # [sum(recv), h], by source
        # Group by local expert: source-major -> expert-major, and back after.
        sizes = theirs.reshape(-1).tolist()  # (source, expert) blocks in arrival order
        blocks = got.split(sizes)
        by_expert = [blocks[src * self.local + e] for e in range(self.local)
                     for src in range(self.ep)]
        done = self._local(torch.cat(by_expert), theirs.sum(0).tolist())
        done_blocks = list(done.split([sizes[src * self.local + e] for e in range(self.local)
                                       for src in range(self.ep)]))
        back = torch.cat([done_blocks[e * self.ep + src] for src in range(self.ep)
                          for e in range(self.local)])
        return all_to_all(back, recv, send, self.group)

    def _local(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows grouped by this rank's experts, each block through its expert."""
        outs = [expert(part) for expert, part in zip(self.experts.values(),
                                                     rows.split(counts), strict=True)]
        return torch.cat(outs) if outs else rows
