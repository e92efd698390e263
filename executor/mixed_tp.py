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

Model-state sharding (P/G/OS > 1) is not combined with it (refused in
executor/preflight.py): a `MixedTpState` is a `ShardedState` of one member. A tied
embedding's twins (first and last stage of a replica, at equal tp) are summed inside the
replica before (`Topology.embedding_pairs`), then each twin's position sums the replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from executor.data_parallel import Groups, ShardedState, local_tensor
from executor.sharding import ShardLayout

__all__ = ["MixedTpState", "local_pieces"]


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
                 name: str, tied: bool = False) -> None:
        """`fused`: id(parameter) -> the widths of its row blocks, for fused weights;
        `tied`: a tied embedding's bucket, summed with its twin in the replica first."""
        super().__init__(params, ShardLayout((rank,), rank), groups,
                         make_optimizer=make_optimizer, name=name, tied=tied)
        self.position_group, self.tp, self.tp_rank = position_group, tp, tp_rank
        self.fused = fused
        self.full_offsets = []  # (first, numel) of each whole parameter
        at = 0
        for p in self.params:
            self.full_offsets.append((at, p.numel()))  # a DTensor's numel is the whole's
            at += p.numel()
        self.full_numel = at

    def _pieces(self, full: torch.Tensor) -> list[tuple[list[torch.Tensor], int]]:
        return [local_pieces(full[at:at + n].view(p.shape), p, tp=self.tp,
                             tp_rank=self.tp_rank, widths=self.fused.get(id(p)))
                for p, (at, n) in zip(self.params, self.full_offsets, strict=True)]

    def reduce_grads(self) -> None:
        """Sum the whole gradients of all replicas at this position; keep this rank's
        slices (in the optimizer's gradient)."""
        super().reduce_grads()  # alone: the local gradients into the optimizer's buffer
        out = self.master.grad
        assert out is not None
        full = torch.zeros(self.full_numel, dtype=torch.float32, device=out.device)
        where = self._pieces(full)
        with torch.no_grad():
            for p, (pieces, dim), (at, n) in zip(self.params, where, self.offsets, strict=True):
                if _shards(p) or self.tp_rank == 0:  # a replicated one is written once
                    local = out[at:at + n].view(local_tensor(p).shape)
                    for piece, part in zip(pieces, _split_like(local, pieces, dim), strict=True):
                        piece.copy_(part)
            dist.all_reduce(full, group=self.groups[self.position_group])
            for (pieces, dim), (at, n) in zip(where, self.offsets, strict=True):
                out[at:at + n].copy_(torch.cat(pieces, dim=dim).reshape(-1))


def _split_like(local: torch.Tensor, pieces: list[torch.Tensor], dim: int) -> tuple:
    return local.split([v.shape[dim] for v in pieces], dim=dim)


def _shards(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(p, DTensor) and isinstance(p.placements[0], Shard)
