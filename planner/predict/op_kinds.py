"""A step's compute on each stage, split by kind of op, as the cost model prices it.

`plan run --trace N` times the ops of N steps on each rank (executor/trace.py) and sets
this beside it, so that a run that misses its prediction says in which kind of work:
GEMMs, attention kernels, the memory-bound rest (norms, activations, the loss, the
embedding), or the optimizer step. The times are the ops' own (a measured profile's where
it has the op, else the analytic device model's), summed over every pass a step runs:
each micro-batch's forward, recomputation and backward through the stage's layers, the
embedding on the first stage and the head on the last, and the optimizer step once. What
the event simulation adds on top (host issue gaps, ranks sharing cores, waits for other
stages and for collectives) is not in them; neither are collectives.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.costs.compute import ComputeCosts
from planner.costs.stages import plan_costs, stage_work
from planner.costs.workload import Op, Work
from planner.specs.plan import Plan
from profiler.store import Profiles

__all__ = ["COMPUTE_KINDS", "stage_op_kinds"]

# The kinds a step's compute is split into (workload `Op.kind`, the embedding's lookup
# counted with the memory-bound ops as the executor's trace counts it)
COMPUTE_KINDS = ("gemm", "attention", "elementwise", "optimizer")


def _add(out: dict[str, float], ops: Iterable[Work], costs: ComputeCosts, times: float) -> None:
    for op in ops:
        if isinstance(op, Op):
            kind = "elementwise" if op.kind == "embedding" else op.kind
            out[kind] = out.get(kind, 0.0) + times * costs.time_s(op)


def stage_op_kinds(plan: Plan, profiles: Profiles | None = None
                   ) -> dict[tuple[int, int], dict[str, float]]:
    """(pipeline, stage) -> seconds of a step's compute on one of that stage's ranks, by
    kind (`COMPUTE_KINDS`)."""
    priced = plan_costs(plan, profiles)
    out: dict[tuple[int, int], dict[str, float]] = {}
    for pi, (specs, run) in enumerate(zip(priced.specs, priced.runs, strict=True)):
        m = plan.pipelines[pi].num_microbatches
        for si, spec in enumerate(specs):
            dev = spec.device
            costs = ComputeCosts(dev, run.dtype, profiles.get(dev.name) if profiles else None)
            layer, extra = stage_work(plan.model, spec, run)
            kinds = dict.fromkeys(COMPUTE_KINDS, 0.0)
            _add(kinds, layer, costs, m * spec.placed.num_layers)
            _add(kinds, extra, costs, m)  # the embedding, the head
            kinds["optimizer"] += priced.costs[pi][si].optimizer_s
            out[(pi, si)] = kinds
    return out
