"""Where a rank's step goes, op by op: `plan run --trace N` runs N more steps under
torch.profiler after the measured ones and sums each op's own time by kind, to set
beside the cost model's split of the step (planner/predict/op_kinds.py).

On CPU ranks an op's time is its self CPU time (the ATen op's kernel and dispatch, not
the ops it calls); on GPUs it is the kernels' time on the device. Kinds, from the op or
kernel name (`op_kind`):

* gemm: matrix products (ATen mm / addmm / bmm / baddbmm / linear, scaled mm; cuBLAS,
  CUTLASS and nvJet kernels);
* attention: fused attention (ATen scaled_dot_product_* and flash / efficient attention;
  FlashAttention, cuDNN and fmha kernels);
* optimizer: the optimizer's update (ATen _fused_adam(w)_, _foreach_*; multi-tensor-apply
  kernels);
* collective: c10d collectives and sends (on CPU ranks the call's own time, which includes
  waiting for the peers; NCCL kernels on GPUs);
* elementwise: every other ATen op or kernel (norms, activations, the loss, copies);
* framework (CPU only): ATen ops that only make tensors (views, reshapes, transposes,
  empty allocations: no arithmetic, no data moved) and what is not an ATen or c10d op
  (the autograd engine's nodes, the optimizer's Python, record_function scopes). The cost
  model has no ops for them: on the CPU a profile's op times include the views their
  wrappers make (a linear layer's transposed weight), on GPUs they launch no kernel.

The profiler adds its own cost to every op it records (a few microseconds on the CPU), so
traced steps are not timed with the measured ones, and each is a profiling cycle of its
own (executor/runtime.py `_trace`): a profiler that keeps every event of several steps
grows the heap through them, and on CPU ranks a step's activations then land on pages
never touched (a debug-small GELU 3x its time, 256 page faults a call, in most steps).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KINDS", "TraceSummary", "op_kind", "summarize"]

KINDS = ("gemm", "attention", "elementwise", "optimizer", "collective", "framework")

_CPU_GEMM = re.compile(r"aten::(mm|addmm|bmm|baddbmm|addbmm|_addmm_activation|linear|matmul|"
                       r"_scaled_mm|_int_mm|mv|addmv)$")
_CPU_ATTENTION = re.compile(r"aten::(_?scaled_dot_product|_flash_attention|"
                            r"_efficient_attention|_cudnn_attention)")
_CPU_OPTIMIZER = re.compile(r"aten::(_fused_adamw?_|_fused_sgd_|_foreach_)")
# ATen ops that only make a tensor: views and metadata, and allocation without a fill
_CPU_FRAMEWORK = re.compile(r"aten::(view|_unsafe_view|view_as|reshape|_reshape_alias|t|"
                            r"transpose|permute|expand|expand_as|as_strided|unsqueeze|"
                            r"squeeze|slice|select|split|split_with_sizes|chunk|narrow|"
                            r"unbind|flatten|unflatten|detach|alias|lift_fresh|empty|"
                            r"empty_like|empty_strided|resize_|set_|is_nonzero|item|"
                            r"_local_scalar_dense|result_type|to)$")
_GPU_COLLECTIVE = re.compile(r"nccl", re.IGNORECASE)
_GPU_ATTENTION = re.compile(r"flash|fmha|attention|attn|sdpa|cudnn.*mha", re.IGNORECASE)
_GPU_GEMM = re.compile(r"gemm|gemv|xmma|cutlass|cublas|nvjet|_s1688|_s16816|_h1688|_i8816|"
                       r"wgrad|dgrad|tensorop", re.IGNORECASE)
_GPU_OPTIMIZER = re.compile(r"multi_tensor_apply|fused_?adam|adam_?kernel", re.IGNORECASE)


# In order, the first that fits: GPU kernels by a search of the name, CPU events by a
# match at its start (not an ATen op, or an ATen op that only makes a tensor: framework)
_GPU_KINDS = ((_GPU_COLLECTIVE, "collective"), (_GPU_OPTIMIZER, "optimizer"),
              (_GPU_ATTENTION, "attention"), (_GPU_GEMM, "gemm"))
_CPU_KINDS = ((re.compile(r"c10d::|gloo:|nccl:"), "collective"),
              (re.compile(r"(?!aten::)"), "framework"), (_CPU_FRAMEWORK, "framework"),
              (_CPU_ATTENTION, "attention"), (_CPU_GEMM, "gemm"),
              (_CPU_OPTIMIZER, "optimizer"))


def op_kind(name: str, *, device: bool = False) -> str:
    """The kind (`KINDS`) of a profiler event: an ATen / c10d op or a framework scope on
    the CPU, or a GPU kernel (`device`)."""
    if device:
        return next((kind for p, kind in _GPU_KINDS if p.search(name)), "elementwise")
    return next((kind for p, kind in _CPU_KINDS if p.match(name)), "elementwise")


@dataclass(frozen=True)
class TraceSummary:
    """One rank's traced steps: seconds a step by kind, the steps' mean wall time, and the
    ops that took longest (name, kind, calls a step, seconds a step)."""

    steps: int
    kinds: dict[str, float]
    wall_s: float
    top: list[tuple[str, str, float, float]]

    def to_dict(self) -> dict:
        return {"steps": self.steps, "kinds": self.kinds, "wall_s": self.wall_s,
                "top": [list(t) for t in self.top]}


def summarize(events: Iterable[tuple[str, int, float]], *, steps: int, wall_s: float,
              device: bool = False, top: int = 25) -> TraceSummary:
    """Sum (name, calls, self seconds) over all traced steps by kind, per step. With
    `device`, the events are GPU kernels and their framework share is not known (0)."""
    kinds = dict.fromkeys(KINDS, 0.0)
    ops = []
    for name, calls, seconds in events:
        kind = op_kind(name, device=device)
        kinds[kind] += seconds / steps
        ops.append((name, kind, calls / steps, seconds / steps))
    ops.sort(key=lambda o: -o[3])
    return TraceSummary(steps=steps, kinds=kinds, wall_s=wall_s, top=ops[:top])
