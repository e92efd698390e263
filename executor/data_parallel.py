"""Data parallelism with AMSP sharding on flat buffers (our own collectives).

One `ShardedState` holds one bucket of parameters (a model chunk's, or a tied embedding
on its own) for one rank: the parameters become views of a flat buffer, gradients are
gathered into a flat fp32 buffer, and AdamW runs on this rank's optimizer shard of it.
Which elements a rank keeps and with whom it talks is index arithmetic in
executor/sharding.py; the order of work follows planner/costs/stages.py `dp_sync`, so the
run does what the simulator prices:

* p > 1: `unshard()` all-gathers the parameters before each forward and backward,
  `reshard()` frees them after (the storage is released and refilled in place, so the
  tensors autograd saved stay valid, as FSDP1 did); with p = os in 16 bits (ZeRO-3, HSDP)
  the fp32 master is the only copy of the shard, cast for each gather, as FSDP2 keeps it;
* after every backward (`add_grads`): gradients are added to the fp32 buffer; with g > 1
  they are reduce-scattered inside the g group first and only the shard is kept. With
  g = 1 and fp32 parameters (plain tensors) each parameter's `.grad` is its slice of the
  buffer from the start, so autograd accumulates into it in place and there is nothing
  to copy (Megatron-Core's `main_grad`, DDP's `gradient_as_bucket_view`);
* `reduce_grads()` once per iteration: reduce-scatter over the members holding the same
  gradient shard, all-reduce over blocks of os replicas. The optimizer's fp32 gradient is
  this rank's chunk of the gradient buffer, not a copy (the reduce-scatter writes it in
  place, as Megatron-Core's distributed optimizer takes its shard's main_grad as a view
  of the bucket's buffer): fp32 gradients take 4 bytes per parameter over g, as
  planner/costs/memory.py `state_bytes_per_param` counts them;
* `step()`: AdamW on the optimizer shard (fp32 master weights), then the members whose
  shards make up a parameter shard all-gather them; in fp16 the trainer first unscales
  `grads()` and, after an overflow on any rank, calls `skip_step()` instead
  (executor/precision.py).

Gradients are summed, not averaged: the caller weights each micro-batch's loss by its
share of the global batch, which is what makes replicas with unequal micro-batch counts
right.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from executor.checkpoint_layout import ParamPlace, Piece, state_pieces
from executor.sharding import ShardLayout
from executor.train import empty_adamw_state
from profiler.torch_compat import all_gather_single, reduce_scatter_single

__all__ = ["ModelState", "ShardedState", "local_grad", "local_tensor"]

Groups = Mapping[tuple[int, ...], dist.ProcessGroup]


class ModelState(Protocol):
    """What the pipeline runner and the trainer need of a bucket of model state
    (`ShardedState` here, `FsdpState` in executor/fsdp.py)."""

    name: str

    def unshard(self) -> None: ...  # before a forward or backward pass
    def reshard(self) -> None: ...  # after it
    # around the pass that makes a chunk's weight gradients: a backward, or a W
    def before_backward(self) -> None: ...
    def add_grads(self, *, ghost: bool = False) -> None: ...
    def tied_grads(self) -> list[torch.Tensor]: ...
    def reduce_grads(self) -> None: ...  # once per iteration
    # the fp32 gradients `step` applies, once reduced (fp16 unscales and checks them)
    def grads(self) -> list[torch.Tensor]: ...
    def step(self) -> None: ...
    def skip_step(self) -> None: ...  # drop the iteration's gradients (an fp16 overflow)
    # this rank's model state in the layout-independent form (executor/checkpoint_layout.py)
    def checkpoint_pieces(self) -> list[Piece]: ...
    def loaded(self) -> None: ...  # after a checkpoint was read into those pieces
    def state_bytes(self) -> dict[str, int]: ...


def local_tensor(p: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's elements of a parameter (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    return p._local_tensor if isinstance(p, DTensor) else p


def local_grad(p: torch.Tensor) -> torch.Tensor | None:
    """This rank's elements of a parameter's gradient. A DTensor gradient that is still a
    partial sum (sequence-parallel norm weights) is reduced to the parameter's layout."""
    from torch.distributed.tensor import DTensor

    g = p.grad
    if isinstance(g, DTensor):
        assert isinstance(p, DTensor)
        if g.placements != p.placements:
            g = g.redistribute(p.device_mesh, p.placements)
        return g.to_local()
    return g


class ShardedState:
    """A bucket of parameters under AMSP sharding (see the module docstring)."""

    def __init__(self, params: Iterable[nn.Parameter], layout: ShardLayout, groups: Groups, *,
                 make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 name: str, places: list[ParamPlace], tied: bool = False) -> None:
        """`places`: where each parameter lies in the whole model (its checkpoint form)."""
        self.params = list(params)
        assert len(places) == len(self.params), (name, len(places), len(self.params))
        self.places = places
        self.tied = tied  # a tied embedding (or its copy): summed with its twin first
        self.layout, self.groups, self.name = layout, groups, name
        locals_ = [local_tensor(p) for p in self.params]
        self.dtype, self.device = locals_[0].dtype, locals_[0].device
        n = sum(t.numel() for t in locals_)
        self.numel = -(-max(n, 1) // layout.optim) * layout.optim  # padded: os equal chunks
        self.chunk = self.numel // layout.optim
        self.full = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        self._views(locals_)
        p_len = self.numel // layout.params
        self.pshard = (self.full[layout.p_chunk * p_len:(layout.p_chunk + 1) * p_len].clone()
                       if layout.params > 1 else self.full)
        if layout.params > 1:
            self.reshard()
        os_at = (layout.os_chunk - layout.p_chunk * (layout.optim // layout.params)) * self.chunk
        self._os_view = self.pshard[os_at:os_at + self.chunk]
        # fp32 master weights of the optimizer shard: the parameters themselves in fp32.
        master = (self._os_view if self.dtype == torch.float32
                  else self._os_view.detach().float().clone())
        self.master = nn.Parameter(master)
        self.optimizer = make_optimizer([self.master])
        g_len = self.numel // layout.grads
        self.grad = torch.zeros(g_len, dtype=torch.float32, device=self.device)
        # The optimizer's gradient is its chunk of the gradient shard: all of it where G =
        # OS, else the slice the end-of-iteration reduce-scatter leaves this member (its
        # place in `grad_reduce_group`, stride g: position i // g), written in place.
        at = layout.position % layout.optim // layout.grads * self.chunk
        self.master.grad = self.grad[at:at + self.chunk]
        self._grad_views = self._bucket_views(locals_)
        # P = OS > 1 in 16 bits (ZeRO-3, HSDP): the master is this rank's whole parameter
        # shard, so the 16-bit shard is not kept (each gather casts the master, as FSDP2
        # gathers its fp32 shards in param_dtype): 16 bytes per parameter over k
        # (planner/costs/memory.py `state_bytes_per_param`).
        self.lean = layout.params == layout.optim > 1 and self.dtype != torch.float32
        if self.lean:
            self.pshard.untyped_storage().resize_(0)

    def _views(self, locals_: list[torch.Tensor]) -> None:
        """Point every parameter at its slice of the flat buffer (values copied in)."""
        self.offsets = []
        at = 0
        with torch.no_grad():
            for t in locals_:
                view = self.full[at:at + t.numel()]
                view.copy_(t.reshape(-1))
                t.data = view.view_as(t)
                self.offsets.append((at, t.numel()))
                at += t.numel()

    def _bucket_views(self, locals_: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Each parameter's slice of the gradient buffer, set as its `.grad`, where the
        buffer holds every gradient whole (g = 1) in the parameters' own dtype (fp32) and
        the parameters are plain tensors (a DTensor's gradient is a DTensor, and sequence
        parallelism leaves some partial: `local_grad` reduces those); else None."""
        from torch.distributed.tensor import DTensor

        if (self.layout.grads != 1 or self.dtype != torch.float32
                or any(isinstance(p, DTensor) for p in self.params)):
            return None
        views = [self.grad[at:at + n].view_as(t)
                 for (at, n), t in zip(self.offsets, locals_, strict=True)]
        for p, v in zip(self.params, views, strict=True):
            p.grad = v
        return views

    def _group(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return self.groups[ranks]

    # ---- parameters ---------------------------------------------------------------
    def unshard(self) -> None:
        """All-gather the full parameters into the flat buffer (p > 1)."""
        if self.layout.params == 1:
            return
        storage = self.full.untyped_storage()
        if storage.size() == 0:
            storage.resize_(self.numel * self.full.element_size())
            shard = self.master.detach().to(self.dtype) if self.lean else self.pshard
            all_gather_single(self.full, shard, group=self._group(self.layout.param_group))

    def reshard(self) -> None:
        """Free the full parameters (p > 1); this rank keeps its shard."""
        if self.layout.params > 1:
            self.full.untyped_storage().resize_(0)

    # ---- gradients ----------------------------------------------------------------
    def before_backward(self) -> None:
        pass

    def add_grads(self, *, ghost: bool = False) -> None:
        """Take the gradients of one backward into the buffer (and free them; where they
        are the buffer's views already, `_keep_views`). A `ghost` backward (a micro-batch
        this replica does not have) adds zeros, so that the per-micro-batch collectives of
        g > 1 still match the other replicas'."""
        if self._grad_views is not None:
            self._keep_views()
            return
        grads = [None if ghost else local_grad(p) for p in self.params]
        for p in self.params:
            p.grad = None
        with torch.no_grad():
            if self.layout.grads == 1:
                for (at, n), g in zip(self.offsets, grads, strict=True):
                    if g is not None:
                        self.grad[at:at + n].add_(g.reshape(-1))
                return
            packed = torch.zeros(self.numel, dtype=torch.float32, device=self.device)
            for (at, n), g in zip(self.offsets, grads, strict=True):
                if g is not None:
                    packed[at:at + n].copy_(g.reshape(-1))
            shard = torch.empty_like(self.grad)
            reduce_scatter_single(shard, packed, group=self._group(self.layout.grad_group))
            self.grad.add_(shard)

    def _keep_views(self) -> None:
        """Autograd has accumulated into the buffer's views; a gradient that is not its
        view (the `.grad` was dropped or replaced since) is added in and the view set
        back."""
        assert self._grad_views is not None
        with torch.no_grad():
            for p, v in zip(self.params, self._grad_views, strict=True):
                if p.grad is not v:
                    if p.grad is not None:
                        v.add_(p.grad)
                    p.grad = v

    def tied_grads(self) -> list[torch.Tensor]:
        """The gradients to sum with the tied twin's (same layout on both) before
        `reduce_grads`."""
        return [self.grad] if self.tied else []

    def reduce_grads(self) -> None:
        """Sum this rank's optimizer shard of the gradients over all replicas."""
        lay = self.layout
        out = self.master.grad  # this rank's chunk of self.grad (`__init__`)
        assert out is not None
        if len(lay.grad_reduce_group) > 1:  # in place: the rest of self.grad is spent
            reduce_scatter_single(out, self.grad, group=self._group(lay.grad_reduce_group))
        if len(lay.replica_group) > 1:
            dist.all_reduce(out, group=self._group(lay.replica_group))

    # ---- optimizer ----------------------------------------------------------------
    def grads(self) -> list[torch.Tensor]:
        """The reduced gradients of the optimizer shard (fp32)."""
        assert self.master.grad is not None
        return [self.master.grad]

    def step(self) -> None:
        """AdamW on the optimizer shard, then rebuild this rank's parameter shard."""
        self.optimizer.step()
        self._publish()
        self.skip_step()

    def skip_step(self) -> None:
        """Zero the gradient buffer for the next iteration (without a step: an fp16
        overflow somewhere; every rank skips alike, so no collective is left waiting).
        The optimizer's gradient is a view of it."""
        self.grad.zero_()

    def _publish(self) -> None:
        """Copy the master weights into the parameters (unless they are the same memory)
        and all-gather the optimizer shards that make up this rank's parameter shard."""
        if self.lean:
            return  # the master is the parameter shard (P = OS: nothing to gather)
        with torch.no_grad():
            if self.master.data_ptr() != self._os_view.data_ptr():
                self._os_view.copy_(self.master)
            group = self.layout.param_gather_group
            if len(group) > 1:
                outs = [self.pshard[k * self.chunk:(k + 1) * self.chunk]
                        for k in self.layout.gather_slots()]
                dist.all_gather(outs, self._os_view.clone(), group=self._group(group))

    # ---- checkpoint and accounting ------------------------------------------------
    def _adam(self) -> dict[str, torch.Tensor]:
        """AdamW's state of the master weights (zeros before the first step, so that a
        checkpoint can be read into it)."""
        state = (self.optimizer.state.get(self.master)
                 or empty_adamw_state(self.optimizer, self.master))
        self.optimizer.state[self.master] = state
        return state

    def checkpoint_pieces(self) -> list[Piece]:
        """The optimizer shard (master weights, AdamW moments and step) as boxes of the
        whole model's parameters: the part of each parameter inside the shard's range of
        the flat buffer. Replicas holding the same shard give the same boxes (written
        once)."""
        adam, out = self._adam(), []
        first = self.layout.os_chunk * self.chunk  # the shard's place in the flat buffer
        for place, (at, n) in zip(self.places, self.offsets, strict=True):
            lo, hi = max(at, first), min(at + n, first + self.chunk)
            if lo < hi:
                held = slice(lo - first, hi - first)
                out += state_pieces(place, lo - at, hi - at, master=self.master.data[held],
                                    adam={k: v if v.dim() == 0 else v[held]
                                          for k, v in adam.items()}, write=place.write)
        return out

    def loaded(self) -> None:
        """After a checkpoint was read into `checkpoint_pieces()`' tensors: rebuild the
        parameters from the master weights, as after a step."""
        self._publish()

    def state_bytes(self) -> dict[str, int]:
        """Bytes of model state this rank holds between iterations, by kind (the lean
        mode's fp32 master counted as the parameters, as FSDP2's shards are; gradients:
        every buffer they are held in, once, the optimizer's being a view of the
        gradient buffer)."""
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in (self.grad, self.master.grad) if t is not None}
        params = self.pshard.untyped_storage().nbytes()
        master = 0 if self.master.data_ptr() == self._os_view.data_ptr() else self.chunk * 4
        if self.lean:
            params, master = master, 0
        adam = sum(v.numel() * v.element_size()
                   for v in self.optimizer.state.get(self.master, {}).values())
        return {"params_bytes": params, "grads_bytes": sum(held.values()),
                "optimizer_bytes": master + adam}
