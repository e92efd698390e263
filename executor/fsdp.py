"""Data parallelism with FSDP2 (`fully_shard`) where it expresses the plan's sharding:
parameters, gradients and optimizer states all over the same k replicas, i.e. ZeRO-3
(k = dp) and HSDP / MiCS (k < dp: sharded inside blocks of k, replicated across them).

It is used for such plans when every replica has the same micro-batch count and tp = 1;
everything else runs on the flat-buffer AMSP engine (executor/data_parallel.py), which
expresses every P/G/OS combination. Semantics as there and as the simulator prices them
(planner/costs/stages.py dp_sync): parameters gathered before each forward and backward
(per layer here), gradients reduce-scattered after every backward, and all-reduced across
the blocks of k once, after the last; gradients are summed (divide factor 1), since the
micro-batch losses carry their share of the global batch.

`FsdpState` offers the interface of `ShardedState` that the pipeline runner and trainer
use (executor/pipeline.py, executor/runtime.py).

Mixed precision: the sharded parameters stay fp32 (the master weights), each unit gathers
and computes in the plan's dtype and reduces gradients in fp32 (`MixedPrecisionPolicy`).
In fp16 the gradients arrive scaled by the loss scale; the trainer unscales this rank's
fp32 shards of them (`grads`) and skips the step on an overflow anywhere
(executor/precision.py), as torch's ShardedGradScaler does for FSDP1.

A backward split into B and W (zero-bubble schedules, executor/split_backward.py) leaves the
gradients outside FSDP's backward hooks, which fire in B: there the hooks only free the
gathered parameters, and after each W its gradients are reduced by FSDP's own post-backward
(`_reduce_split`), with the same collectives a whole backward's hooks would issue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from executor.checkpoint_layout import ADAM_MOMENTS, Piece
from executor.data_parallel import local_tensor
from executor.model import GPT
from executor.sharding import ShardLayout
from executor.train import empty_adamw_state

__all__ = ["FsdpState", "data_parallel_mesh", "fsdp_applies"]


def fsdp_applies(*, params: int, grads: int, optim: int, equal_counts: bool,
                 tp: int) -> bool:
    """Whether FSDP2 expresses this sharding (see the module docstring)."""
    return params == grads == optim > 1 and equal_counts and tp == 1


def data_parallel_mesh(layout: ShardLayout, groups: Mapping[tuple[int, ...], dist.ProcessGroup],
                       device_type: str) -> DeviceMesh:
    """The data-parallel mesh: 1-D (shard) for ZeRO-3, 2-D (replicate, shard) for HSDP,
    over the groups the plan already made (the same contiguous blocks as AMSP's)."""
    k = layout.params
    if k == layout.dp:
        return DeviceMesh.from_group(groups[layout.param_group], device_type)
    grid = torch.tensor([list(layout.members[b:b + k]) for b in range(0, layout.dp, k)])
    return DeviceMesh.from_group([groups[layout.replica_group], groups[layout.param_group]],
                                 device_type, mesh=grid,
                                 mesh_dim_names=("replicate", "shard"))


class FsdpState:
    """One model chunk under FSDP2: each block, the tied embedding (if any) and the rest
    are FSDP units; one AdamW over the chunk's sharded parameters."""

    def __init__(self, module: GPT, mesh: DeviceMesh, *, dtype: torch.dtype,
                 tied: list[nn.Parameter], num_microbatches: int,
                 make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 name: str, split_backward: bool = False) -> None:
        self.module, self.name, self.num_microbatches = module, name, num_microbatches
        self.split_backward = split_backward
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        units: list[nn.Module] = list(module.blocks.values())
        self._tied_module = None
        if tied:
            self._tied_module = module.wte if module.wte is not None else module.lm_head
            units.append(self._tied_module)
        for unit in units:
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)
        self._fsdp = [u for u in module.modules() if isinstance(u, FSDPModule)]
        for u in self._fsdp:
            u.set_gradient_divide_factor(1.0)  # a sum: losses carry their batch share
            u.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
            u.set_requires_gradient_sync(not split_backward, recurse=False)
        # fully_shard replaced the parameters: the tied one is now the unit's (sharded) weight
        self.tied = [self._tied_module.weight] if self._tied_module is not None else []
        self.optimizer = make_optimizer(list(module.parameters()))
        self._backwards = 0

    # ---- passes (FSDP's hooks gather and free the parameters) ------------------------
    def unshard(self) -> None:
        pass

    def reshard(self) -> None:
        pass

    def before_backward(self) -> None:
        """All-reduce across the blocks of k only in the iteration's last backward."""
        self._backwards += 1
        for u in self._fsdp:
            u.set_requires_all_reduce(self._backwards == self.num_microbatches)

    def add_grads(self, *, ghost: bool = False) -> None:
        assert not ghost, "FSDP2 runs plans whose replicas have equal micro-batch counts"
        if self.split_backward:
            self._reduce_split()

    def _reduce_split(self) -> None:
        """After a W: reduce its gradients (and those its B left on the gathered
        parameters) as the hooks of a whole backward would. FSDP2 has no public call for
        this; torch.distributed.pipelining does the same (`perform_reduce_grad`)."""
        state = self.module._get_fsdp_state()
        for u in self._fsdp:
            u.set_requires_gradient_sync(True, recurse=False)
        for s in state._state_ctx.all_states:
            for group in s._fsdp_param_groups:
                # As FSDP's hooks without sync do: gradients of B hooks already moved to
                # the reduce dtype absorb W's, so that all reach post_backward in one dtype.
                for p in group.fsdp_params:
                    p.accumulate_unsharded_grad_if_needed()
                    p.to_accumulated_grad_if_needed()
                group.post_backward()
        state._root_post_backward_final_callback()
        for u in self._fsdp:
            u.set_requires_gradient_sync(False, recurse=False)

    # ---- iteration end ------------------------------------------------------------
    def tied_grads(self) -> list[torch.Tensor]:
        """This rank's shard of the tied embedding's gradient (summed with its twin)."""
        return [p.grad.to_local() for p in self.tied if p.grad is not None]

    def reduce_grads(self) -> None:
        self._backwards = 0  # FSDP reduced them in the backward passes

    def grads(self) -> list[torch.Tensor]:
        """This rank's shards of the reduced gradients (fp32, as the sharded parameters)."""
        return [local_tensor(p.grad) for p in self.module.parameters() if p.grad is not None]

    def step(self) -> None:
        self.optimizer.step()
        self.skip_step()

    def skip_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # ---- checkpoint and accounting ------------------------------------------------
    def checkpoint_pieces(self) -> list[Piece]:
        """Each parameter's shard (the fp32 master weights) and AdamW state as one box of
        the whole parameter, where its DTensor placement puts it (HSDP's replicas give
        the same box, written once; a tied head's copy is the embedding's)."""
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        out: list[Piece] = []
        for fqn, p in self.module.named_parameters():
            name = self.module.init_name(fqn)
            state = self.optimizer.state.get(p) or empty_adamw_state(self.optimizer, p)
            self.optimizer.state[p] = state
            sizes, offsets = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                   p.placements)
            assert tuple(sizes) == tuple(_local(p).shape), (fqn, sizes, _local(p).shape)
            write = name == fqn
            for key, t in ((name, p), *((f"state.{name}.{k}", state[k])
                                        for k in ADAM_MOMENTS)):
                out.append(Piece(key, tuple(p.shape), tuple(offsets), local_tensor(t), write))
            out.append(Piece(f"state.{name}.step", (), (), state["step"], write))
        return out

    def loaded(self) -> None:
        pass  # DCP read the shards in place

    def state_bytes(self) -> dict[str, int]:
        params = sum(_local(p).numel() * _local(p).element_size()
                     for p in self.module.parameters())
        adam = sum(_local(v).numel() * _local(v).element_size()
                   for s in self.optimizer.state.values() for v in s.values())
        return {"params_bytes": params, "grads_bytes": params, "optimizer_bytes": adam}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t

