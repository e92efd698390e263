"""What a plan pays per iteration for traffic across priced island links (egress).

Island links (e.g. between two datacenters) may carry a price per GB. The bytes a plan
sends across them per iteration, an estimate of the hierarchical collectives the
communication model times (planner/costs/comm.py):

* every activation and its gradient that crosses a pipeline-stage boundary between two
  islands: 2 * micro-batch * seq * hidden * dtype bytes per micro-batch, once per chunk
  with interleaving (vp chunks a stage: a micro-batch passes each boundary vp times and
  wraps from the last stage back to the first vp - 1 times, model chunk c of stage s
  being the pipeline's chunk c * pp + s);
* a stage whose data-parallel group spans k islands reduces its gradients across them:
  a hierarchical all-reduce moves 2 * (k-1)/k of the gradient bytes over the cut; with
  parameters sharded (p > 1) over the group, the all-gathers before every forward and
  backward add 2 * (k-1)/k of the parameter bytes per micro-batch.

Each crossing is billed at its link's price (the highest among the islands spanned).
"""

from __future__ import annotations

from planner.costs.memory import rank_param_count
from planner.specs.choices import DType
from planner.specs.layout import pipeline_moe_layers
from planner.specs.plan import Plan

__all__ = ["egress_usd_per_iteration"]


def egress_usd_per_iteration(plan: Plan) -> float:
    """Dollars of priced island-link traffic in one iteration of `plan` (0 when no link
    is priced)."""
    c, tr, m = plan.cluster, plan.training, plan.model
    if not any(k.price_per_gb_usd > 0 for k in c.island_links):
        return 0.0
    def island(d: int) -> str:
        return c.group_of(d).island

    def price(islands: set[str]) -> float:
        names = sorted(islands)
        links = [c.island_link(a, b) for a in names for b in names if a < b]
        return max((k.price_per_gb_usd for k in links if k is not None), default=0.0)

    usd = 0.0
    vp = tr.virtual_stages
    for pipe in plan.pipelines:
        act = pipe.micro_batch_size * tr.seq_len * m.hidden_size * DType(tr.dtype).element_bytes
        hops = [(a, b, vp) for a, b in zip(pipe.stages, pipe.stages[1:], strict=False)]
        if vp > 1 and len(pipe.stages) > 1:  # the last stage's chunk hands to the first's
            hops.append((pipe.stages[-1], pipe.stages[0], vp - 1))
        for a, b, times in hops:
            pair = {island(a.devices[0]), island(b.devices[0])}
            if len(pair) > 1:
                usd += 2 * act * times * pipe.num_microbatches / 1e9 * price(pair)
    microbatches = max(p.num_microbatches for p in plan.pipelines)
    moe = pipeline_moe_layers(plan, plan.pipelines[0])
    for k, stage in enumerate(plan.pipelines[0].stages):
        per_replica = [island(p.stages[min(k, len(p.stages) - 1)].devices[0])
                       for p in plan.pipelines]
        spanned = set(per_replica)
        if len(spanned) < 2:
            continue
        pp = len(plan.pipelines[0].stages)
        params = rank_param_count(m, num_layers=stage.num_layers, first=k == 0,
                                  last=k == pp - 1, tp=1, pp=pp, moe_layers=moe[k])
        grad_bytes = DType(tr.comm.grad_reduce_dtype).element_bytes
        usd += 2 * params * grad_bytes * _cut(spanned) / 1e9 * price(spanned)
        sh = plan.sharding_of(k)
        if sh.params > 1:  # each parameter-sharding group gathers its own copy
            # the sizes count dp x cp ranks (`Sharding`): a group spans params / cp
            # replicas, and each of a replica's cp ranks gathers the parameters
            span = max(1, sh.params // stage.cp)
            for i in range(0, len(per_replica), span):
                group = set(per_replica[i:i + span])
                usd += (2 * microbatches * params * DType(tr.dtype).element_bytes * _cut(group)
                        * stage.cp / 1e9 * price(group))
    return usd


def _cut(islands: set[str]) -> float:
    """The share of a hierarchical collective's bytes that crosses between islands."""
    return (len(islands) - 1) / len(islands)
