"""A chunk's backward split in two for zero-bubble schedules (Qi et al. 2024, "Zero Bubble
Pipeline Parallelism", §2): B computes the gradient of the chunk's input, which the
previous stage waits for, and W later computes the weight gradients of the layers' linear
layers (their `.wgrad` GEMMs, what the simulator prices as W: planner/costs/stages.py
`layer_weight_grad`). Every other parameter (norms, embedding, head) gets its gradient in B.

Nothing is computed twice: B runs autograd from the output to the input and those other
parameters, and records the gradient arriving at each node where a linear weight's branch
leaves that path; W runs only those branches, from the recorded gradients. W reads saved
activations, not the weights, so sharded parameters need no gather for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["WeightGrads", "backward_input", "backward_weight", "recording_weights"]


@dataclass
class WeightGrads:
    """What W needs of a B: the weights and the recorded gradients at their branches."""

    weights: list[torch.Tensor]
    groups: list[dict[str, Any]]  # torch's parameter groups (see `_torch_split`)


@contextlib.contextmanager
def recording_weights(linears: Sequence[nn.Module]) -> Iterator[list[torch.Tensor]]:
    """The weight tensors `linears` use in the forward run inside the block: the leaves of
    the autograd graph. (Under FSDP2 these are its unsharded parameters, not the module's
    registered ones after the forward.)"""
    used: list[torch.Tensor] = []

    def record(module: nn.Module, _args: tuple) -> None:
        used.append(module.weight)

    handles = [m.register_forward_pre_hook(record) for m in linears]
    try:
        yield used
    finally:
        for h in handles:
            h.remove()


def _leaves(out: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor whose gradient the graph of `out` accumulates (its AccumulateGrad
    nodes' variables)."""
    seen, stack, leaves = set(), [out.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            leaves.append(node.variable)
        stack.extend(fn for fn, _ in node.next_functions)
    return leaves


def _torch_split() -> tuple:
    """torch.distributed.pipelining's B/W helpers (private, torch 2.13; used by its
    zero-bubble schedules): the only private API here. `stage_backward_input` runs
    autograd.grad to the given inputs with hooks that record the gradient at the nodes where
    each weight's branch meets that path, grouped by weight; `stage_backward_weight` runs
    autograd.grad from those nodes to the weights and adds the results to their `.grad`."""
    from torch.distributed.pipelining._backward import (
        stage_backward_input,
        stage_backward_weight,
    )

    return stage_backward_input, stage_backward_weight


def backward_input(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor,
                   weights: list[torch.Tensor]) -> tuple[torch.Tensor, WeightGrads]:
    """B: the gradient of `x` (returned) and of every leaf but `weights` (added to their
    `.grad`), from `out` (a loss when `grad` is None). The graph is kept for W."""
    assert out._base is None, "B detaches the chunk's output in place: it cannot be a view"
    deferred = {id(w) for w in weights}
    others = [t for t in _leaves(out) if id(t) not in deferred and t is not x]
    stage_backward_input, _ = _torch_split()
    grads, groups = stage_backward_input([out], None if grad is None else [grad],
                                         [x, *others], iter(weights))
    covered = {id(n) for g in groups for n in g["params"]}
    assert covered == {id(_grad_node(w)) for w in weights}, "a weight W would not reach"
    assert grads[0] is not None
    x.grad = None
    return grads[0], WeightGrads(weights, groups)


def backward_weight(pending: WeightGrads) -> None:
    """W: the deferred weights' gradients, added to their `.grad`; frees B's graph."""
    _, stage_backward_weight = _torch_split()
    stage_backward_weight(iter(pending.weights), pending.groups)
    pending.groups.clear()


def _grad_node(t: torch.Tensor) -> Any:
    """A leaf's AccumulateGrad node (created on demand by a view, as autograd does)."""
    node = t.view_as(t).grad_fn
    assert node is not None
    return node.next_functions[0][0]
