"""Tensor (and sequence) parallelism of a model chunk with DTensor `parallelize_module`
(Shoeybi et al. 2019; sequence parallelism: Korthikanti et al. 2022), as torchtitan
lays out a Llama:

* attention QKV and the MLP's first GEMM column-parallel, their output GEMMs row-parallel;
* the token embedding vocab-parallel (row-parallel over the vocabulary), the output
  projection column-parallel with the loss computed on vocab shards (`loss_parallel`);
* with sequence parallelism, norms and residuals work on 1/tp of the sequence, and the
  row-parallel outputs are reduce-scattered into it; learned position embeddings are
  replicated and sliced to the rank's part of the sequence.

An MoE layer (executor/moe.py) is not split: every tp rank holds its router and experts
whole (expert tp 1) and runs them on the replicated input (no sequence parallelism,
preflight), so its gradients are whole on every tp rank and need no tp reduction.

The fused QKV (and SwiGLU / GeGLU gate|up) weights are regrouped first so that each rank's
contiguous block of rows is again [q | k | v] for its heads (Megatron-LM groups them the
same way).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from executor.model import GPT
from executor.moe import MoE

__all__ = ["apply_tensor_parallel", "fused_rows", "regroup_rows"]


def regroup_rows(weight: torch.Tensor, widths: list[int], tp: int) -> torch.Tensor:
    """Rows [A | B | C] (of `widths`) reordered to [A_0 B_0 C_0 | A_1 B_1 C_1 | ...], where
    X_r is rank r's 1/tp of X: a contiguous split then gives each rank [A_r | B_r | C_r]."""
    parts = [p.chunk(tp) for p in weight.split(widths, dim=0)]
    return torch.cat([torch.cat([p[r] for p in parts]) for r in range(tp)])


def fused_rows(model: GPT) -> dict[str, list[int]]:
    """The fused weights, by parameter name, and the widths of their row blocks (QKV:
    [q | k | v]; a gated MLP's fc1, SwiGLU or GeGLU: [gate | up]), which tensor
    parallelism regroups."""
    spec = model.spec
    out = {}
    for i in model.blocks:
        out[f"blocks.{i}.attn.qkv.weight"] = [spec.num_heads * spec.head_dim, spec.kv_dim,
                                              spec.kv_dim]
        if spec.gated and not isinstance(model.blocks[i].mlp, MoE):
            out[f"blocks.{i}.mlp.fc1.weight"] = [spec.ffn_hidden_size] * 2
    return out


def _regroup_fused(model: GPT, tp: int) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, widths in fused_rows(model).items():
            params[name].copy_(regroup_rows(params[name], widths, tp))


def _positions(model: GPT, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Learned positions, replicated; under sequence parallelism each rank adds its slice
    (the slice's backward all-gathers the gradient, so every rank gets all of it)."""
    def take_input(_mod: object, inputs: tuple, mesh_: DeviceMesh) -> tuple:
        return (DTensor.from_local(inputs[0], mesh_, [Replicate()]),)

    def give_output(_mod: object, out: DTensor, mesh_: DeviceMesh) -> torch.Tensor:
        if sequence_parallel:
            out = out.redistribute(mesh_, [Shard(0)])
        return out.to_local()

    distribute_module(model.wpe, mesh, input_fn=take_input, output_fn=give_output)


def apply_tensor_parallel(model: GPT, mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Shard `model` (a chunk) over the 1-D `mesh` in place."""
    tp = mesh.size()
    _regroup_fused(model, tp)
    seq = Shard(1) if sequence_parallel else Replicate()
    layout: dict[str, object] = {}
    if model.wte is not None:
        layout["wte"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    for i in model.blocks:
        b = f"blocks.{i}"
        layout.update({f"{b}.attn.qkv": ColwiseParallel(),
                       f"{b}.attn.proj": RowwiseParallel(output_layouts=seq)})
        if not isinstance(model.blocks[i].mlp, MoE):  # an MoE layer stays whole
            layout.update({f"{b}.mlp.fc1": ColwiseParallel(),
                           f"{b}.mlp.fc2": RowwiseParallel(output_layouts=seq)})
        if sequence_parallel:
            layout.update({
                f"{b}.norm1": SequenceParallel(), f"{b}.norm2": SequenceParallel(),
                f"{b}.attn": PrepareModuleInput(input_layouts=(Shard(1),),
                                                desired_input_layouts=(Replicate(),)),
                f"{b}.mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),))})
    if model.head:
        if sequence_parallel:
            layout["norm_f"] = SequenceParallel()
        layout["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                            use_local_output=False)
    parallelize_module(model, mesh, layout)  # type: ignore[arg-type]
    if model.wpe is not None:
        _positions(model, mesh, sequence_parallel)
    model.tie_weights()
