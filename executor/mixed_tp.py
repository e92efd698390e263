"""Data parallelism across replicas whose tensor parallelism differs at a stage position
("mixed tp": e.g. A100 replicas at tp 4 beside V100 replicas at tp 8).

The replicas' ranks at that position hold different shards of the same parameters, so
there is no rank-to-rank data-parallel group. Instead, per bucket, every rank writes its
gradient slice into a zero buffer of the full (unsharded) parameters, at the place its
DTensor placement gives it (Shard(d): chunk `tp_rank` of `torch.chunk` along d, as
DTensor cuts, of each row block of a fused QKV or SwiGLU weight, which tensor parallelism
regroups; Replicate, or a plain tensor: the whole, written by tp rank 0 only); one
all-reduce over every rank of the position (`Topology.position_group`) then sums the
full gradient of every replica, since inside a replica the slices are disjoint and cover
the parameter once. Each rank reads its own slice back and steps AdamW on its local
shards. This sends tp times a rank's shard per rank; correctness over bandwidth.

ZeRO-1 (OS = dp, P = G = 1) is: each whole parameter (in the flat buffer of the whole
parameters, in parameter order) is cut into dp contiguous pieces (piece r for the r-th
replica, in `plan.pipelines` order), piece r of a tp-sharded one into tp_r sub-pieces, one
per tp rank of replica r (a replicated one's piece is stepped by each of them alike).
After the gradient sum rank (r, t) steps AdamW on its sub-pieces only (fp32 master and
moments for 1/dp of its local shard, as planner/costs/memory.py counts), writes them into a
zero buffer of the whole parameters, and one all-reduce over the position gives every
rank the whole updated parameters, of which it keeps its slices. In fp32 the master
weights are the parameters (planner/costs/memory.py counts no copy): the sub-pieces are rebuilt
before each step by an all-reduce of the whole parameters to which replica 0 writes.
Other model-state sharding (P or G > 1, 1 < OS < dp) is refused (executor/preflight.py).
A tied
embedding's twins (first and last stage of a replica, at equal tp) are summed inside the
replica before (`Topology.embedding_pairs`), then each twin's position sums the replicas.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from executor.checkpoint_layout import ParamPlace, Piece, range_pieces, state_pieces
from executor.data_parallel import Groups, ShardedState, local_tensor
from executor.sharding import ShardLayout
from executor.train import empty_adamw_state

__all__ = ["MixedTpState", "local_pieces", "zero1_ranges"]


def zero1_ranges(params: list[tuple[int, int, bool]], *, dp: int, replica: int, tp: int,
                 tp_rank: int) -> list[tuple[int, int, bool]]:
    """[first, end) ranges of a whole-parameter flat buffer that rank (replica, tp_rank)
    steps, and whether it publishes each. `params`: (first, numel, sharded under this
    replica's tp) per parameter. Each parameter is cut into dp equal-ish pieces, piece
    `replica` of a sharded one into tp sub-pieces; a replicated one's piece is stepped by
    every tp rank of the replica alike and published by tp rank 0: 1/dp of the local
    shard, as planner/costs/memory.py counts."""
    def cut(lo: int, hi: int, parts: int, k: int) -> tuple[int, int]:
        return lo + (hi - lo) * k // parts, lo + (hi - lo) * (k + 1) // parts

    out = []
    for at, n, sharded in params:
        lo, hi = cut(at, at + n, dp, replica)
        if sharded:
            out.append((*cut(lo, hi, tp, tp_rank), True))
        else:
            out.append((lo, hi, tp_rank == 0))
    return [r for r in out if r[1] > r[0]]


def local_pieces(full: torch.Tensor, p: torch.Tensor, *, tp: int, tp_rank: int,
                 widths: list[int] | None = None) -> tuple[list[torch.Tensor], int]:
    """The views of `full` (shaped like the whole parameter `p`, rows in the model's order)
    that make up this rank's local tensor, concatenated along the returned dim. A fused
    weight (row blocks of `widths`, executor/tensor_parallel.py `fused_rows`) is regrouped
    under tp, so a rank holds its chunk of each block."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    placement = p.placements[0] if isinstance(p, DTensor) else Replicate()
    if isinstance(placement, Replicate):
        return [full], 0
    assert isinstance(placement, Shard), placement
    dim = placement.dim
    blocks = full.split(widths, dim=dim) if widths and dim == 0 else (full,)
    pieces = []
    for block in blocks:
        parts = torch.chunk(block, tp, dim=dim)
        # DTensor leaves the ranks past the last chunk empty (uneven sizes)
        pieces.append(parts[tp_rank] if tp_rank < len(parts) else block.narrow(dim, 0, 0))
    local = local_tensor(p).shape
    assert sum(v.shape[dim] for v in pieces) == local[dim], (p.shape, local, widths)
    return pieces, dim


class MixedTpState(ShardedState):
    """A bucket of parameters at a stage position of mixed tp (see the module docstring)."""

    def __init__(self, params: Iterable[nn.Parameter], rank: int, groups: Groups, *,
                 position_group: tuple[int, ...], tp: int, tp_rank: int,
                 fused: dict[int, list[int]],
                 make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 name: str, places: list[ParamPlace], tied: bool = False, replica: int = 0,
                 replica_tps: list[int] | None = None, optim: int = 1) -> None:
        """`fused`: id(parameter) -> the widths of its row blocks, for fused weights;
        `tied`: a tied embedding's bucket, summed with its twin in the replica first;
        `optim` 1 or dp (ZeRO-1) over the replicas at the position, whose tps are
        `replica_tps` (this rank's replica is number `replica`); `places`: where each
        parameter lies in the whole model, written by replica 0 only (every replica holds
        the same values, cut by its own tp)."""
        super().__init__(params, ShardLayout((rank,), rank), groups,
                         make_optimizer=make_optimizer, name=name, places=places, tied=tied)
        self.position_group, self.tp, self.tp_rank = position_group, tp, tp_rank
        self.fused = fused
        self.full_offsets = []  # (first, numel) of each whole parameter
        at = 0
        for p in self.params:
            self.full_offsets.append((at, p.numel()))  # a DTensor's numel is the whole's
            at += p.numel()
        self.full_numel = at
        tps = replica_tps or [tp]
        assert optim in (1, len(tps)), (optim, tps)
        self.optim, self.replica = optim, replica
        if optim > 1:
            self._zero1(zero1_ranges([(a, n, _shards(p)) for p, (a, n) in zip(
                self.params, self.full_offsets, strict=True)], dp=optim, replica=replica,
                tp=tp, tp_rank=tp_rank), make_optimizer)

    def _zero1(self, ranges: list[tuple[int, int, bool]], make_optimizer: Callable) -> None:
        """The optimizer on this rank's sub-pieces only (fp32 master, persistent in mixed
        precision; moments)."""
        self.ranges = ranges
        n = sum(hi - lo for lo, hi, _ in ranges)
        self.keep_master = self.dtype != torch.float32
        master = (self._gather(self._whole_params()) if self.keep_master
                  else torch.empty(0, dtype=torch.float32, device=self.device))
        self.master = nn.Parameter(master)
        self.master.grad = None
        self.optimizer = make_optimizer([self.master])
        self.chunk = n
        self._sub_grad: torch.Tensor | None = None

    def _pieces(self, full: torch.Tensor) -> list[tuple[list[torch.Tensor], int]]:
        return [local_pieces(full[at:at + n].view(p.shape), p, tp=self.tp,
                             tp_rank=self.tp_rank, widths=self.fused.get(id(p)))
                for p, (at, n) in zip(self.params, self.full_offsets, strict=True)]

    def _whole(self, local: torch.Tensor, *, write: bool) -> torch.Tensor:
        """Sum over the position of a zero whole-parameter buffer into which this rank
        wrote its slices of `local` (a flat buffer shaped like `self.offsets`) if `write`
        (a replicated parameter by tp rank 0 only)."""
        full = torch.zeros(self.full_numel, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            for p, (pieces, dim), (at, n) in zip(self.params, self._pieces(full),
                                                 self.offsets, strict=True):
                if write and (_shards(p) or self.tp_rank == 0):
                    part = local[at:at + n].view(local_tensor(p).shape)
                    for piece, x in zip(pieces, _split_like(part, pieces, dim), strict=True):
                        piece.copy_(x)
            dist.all_reduce(full, group=self.groups[self.position_group])
        return full

    def _keep_slices(self, full: torch.Tensor, out: torch.Tensor) -> None:
        """This rank's slices of the whole buffer `full`, into the flat `out`."""
        with torch.no_grad():
            for (pieces, dim), (at, n) in zip(self._pieces(full), self.offsets, strict=True):
                out[at:at + n].copy_(torch.cat(pieces, dim=dim).reshape(-1))

    def _gather(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's ZeRO-1 sub-pieces of a whole buffer, as one flat tensor."""
        return torch.cat([full[lo:hi] for lo, hi, _ in self.ranges])

    def _whole_params(self) -> torch.Tensor:
        """The whole parameters on every rank of the position (replica 0 writes them)."""
        return self._whole(self.full, write=self.replica == 0)

    def reduce_grads(self) -> None:
        """Sum the whole gradients of all replicas at this position; keep this rank's
        slices (in the optimizer's gradient), or with ZeRO-1 its sub-piece."""
        full = self._whole(self.grad, write=True)
        if self.optim > 1:
            self._sub_grad = self._gather(full)
            return
        # the optimizer's gradient is the whole of self.grad (`ShardedState`: G = OS = 1):
        # the summed slices overwrite this rank's own gradient, read into `full` above
        assert self.master.grad is not None
        assert self.master.grad.data_ptr() == self.grad.data_ptr()
        self._keep_slices(full, self.master.grad)

    def grads(self) -> list[torch.Tensor]:
        if self.optim == 1:
            return super().grads()
        assert self._sub_grad is not None
        return [self._sub_grad]

    def skip_step(self) -> None:
        if self.optim == 1:
            super().skip_step()
            return
        self._sub_grad = None
        self.grad.zero_()

    def step(self) -> None:
        """ZeRO-1: AdamW on this rank's sub-pieces, then every rank's slices of the
        whole updated parameters (`_publish`)."""
        if self.optim == 1:
            super().step()
            return
        if not self.keep_master:  # fp32: the master weights are the parameters
            self.master.data = self._gather(self._whole_params())
        self.master.grad = self._sub_grad
        self.optimizer.step()
        self.master.grad = self._sub_grad = None
        self._publish()
        self.grad.zero_()

    def _publish(self) -> None:
        """ZeRO-1: sum the ranks' updated sub-pieces over the position (each element
        written once) and keep this rank's slices."""
        if self.optim == 1:
            super()._publish()
            return
        with torch.no_grad():
            full = torch.zeros(self.full_numel, dtype=torch.float32, device=self.device)
            at = 0
            for lo, hi, write in self.ranges:
                if write:
                    full[lo:hi].copy_(self.master[at:at + hi - lo])
                at += hi - lo
            dist.all_reduce(full, group=self.groups[self.position_group])
            self._keep_slices(full, self.full)
            if not self.keep_master:
                self.master.data = torch.empty(0, dtype=torch.float32, device=self.device)

    def checkpoint_pieces(self) -> list[Piece]:
        """ZeRO-1: the sub-pieces' moments (and master weights in mixed precision), boxes
        of the whole parameters that each rank writes where it publishes; in fp32 the
        parameters (the master weights) as without ZeRO-1."""
        if self.optim == 1:
            return super().checkpoint_pieces()
        if self.master not in self.optimizer.state:
            self.optimizer.state[self.master] = empty_adamw_state(
                self.optimizer, torch.empty(self.chunk, dtype=torch.float32,
                                            device=self.device))
        adam = self.optimizer.state[self.master]
        starts = [at for at, _ in self.full_offsets]
        out, held = [], 0
        for lo, hi, publish in self.ranges:  # in the whole-parameter buffer
            i = bisect.bisect_right(starts, lo) - 1
            place = self.places[i]
            whole = ParamPlace(place.name, place.shape, copy=place.copy)  # not cut by tp
            part = slice(held, held + hi - lo)
            out += state_pieces(whole, lo - starts[i], hi - starts[i],
                                master=self.master.data[part] if self.keep_master else None,
                                adam={k: v if v.dim() == 0 else v[part]
                                      for k, v in adam.items()},
                                write=publish and not place.copy)
            held += hi - lo
        if not self.keep_master:  # fp32: this rank's parameters are the master weights
            for place, (at, n) in zip(self.places, self.offsets, strict=True):
                out += range_pieces(place.name, place, self.full[at:at + n], 0, n,
                                    write=place.write)
        return out

    def loaded(self) -> None:
        if self.optim == 1 or self.keep_master:
            self._publish()

    def state_bytes(self) -> dict[str, int]:
        if self.optim == 1:
            return super().state_bytes()
        master = self.chunk * 4 if self.keep_master else 0
        adam = sum(v.numel() * v.element_size()
                   for v in self.optimizer.state.get(self.master, {}).values())
        return {"params_bytes": self.full.numel() * self.full.element_size(),
                "grads_bytes": self.grad.numel() * 4, "optimizer_bytes": master + adam}


def _split_like(local: torch.Tensor, pieces: list[torch.Tensor], dim: int) -> tuple:
    return local.split([v.shape[dim] for v in pieces], dim=dim)


def _shards(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(p, DTensor) and isinstance(p.placements[0], Shard)
