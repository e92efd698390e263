"""torch calls whose names changed between the torch versions this code meets: 2.13 on
the build machines (constraints.txt), older ones on GPU machines, whose images bring their
own torch (2.11 on the lent H200, docs/gpu-check.md).

torch 2.12 added `torch.distributed.all_gather_single` / `reduce_scatter_single` and
deprecated `all_gather_into_tensor` / `reduce_scatter_tensor` (pytorch/pytorch#186130);
both pairs take the same arguments. Imports torch inside each call.
"""

from __future__ import annotations

from typing import Any

__all__ = ["all_gather_single", "reduce_scatter_single"]


def all_gather_single(output: Any, shard: Any, *, group: Any = None) -> None:
    """All-gather every rank's `shard` into `output` (world x shard elements)."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, shard, group=group)


def reduce_scatter_single(output: Any, full: Any, *, group: Any = None) -> None:
    """Sum `full` over the ranks and keep this rank's shard of it in `output`."""
    import torch.distributed as dist

    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(output, full, group=group)
