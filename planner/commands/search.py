"""`plan search`: the best plans for a model on a cluster, as a table and a Plan file."""

from __future__ import annotations

import argparse
import sys

from planner.commands.args import (
    add_cluster_args,
    add_framework_arg,
    add_model_args,
    budget_arg,
    gbs_arg,
    int_in,
    path_arg,
    print_json,
    seq_arg,
    tokens_arg,
)
from planner.commands.inputs import load_inputs, profiles_for, with_prediction
from planner.errors import InfeasiblePlan
from planner.outputs import PLAN_SUFFIXES, check_output_file
from planner.search import Ranked, SearchRequest, SearchResult, search
from planner.search.search import OBJECTIVES
from planner.specs.choices import Schedule, values
from planner.specs.cluster import train_dtype
from planner.specs.plan import TRAIN_DTYPES, save_plan
from profiler.kernels import Attention
from profiler.schema import one_line

__all__ = ["add_parser", "run"]

GIB = 1024**3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search", help="find the best parallel configuration",
        description="Search tp, pp, dp, cp, interleaving, micro-batch size, recompute, "
        "sequence parallelism and AMSP sharding (parameters, gradients, optimizer states "
        "each at their own group size) for the best plan; rank with the closed-form "
        "estimate, confirm the leaders with the event simulator.")
    add_model_args(p)
    add_cluster_args(p)
    p.add_argument("--gbs", type=gbs_arg, required=True, metavar="N",
                   help="global batch size (sequences)")
    p.add_argument("--seq", type=seq_arg, metavar="N", help="sequence length (default: "
                   "the model's)")
    p.add_argument("--dtype", choices=TRAIN_DTYPES,
                   help="training dtype (default: bf16 where every GPU type has it, else fp16)")
    p.add_argument("--objective", choices=OBJECTIVES,
                   default="throughput", help="what to optimise (cost and time-to-train may "
                   "use fewer GPUs)")
    p.add_argument("--tokens", type=tokens_arg, metavar="N", help="tokens to train on (for "
                   "time-to-train and the budget)")
    p.add_argument("--max-budget", type=budget_arg, metavar="USD", help="cap on the run's cost")
    p.add_argument("--top", type=int_in(1, 1000), default=5, metavar="K", help="plans to list")
    p.add_argument("--attention", choices=values(Attention))
    add_framework_arg(p)
    p.add_argument("--profile", type=path_arg, metavar="FILE|DIR", action="append",
                   help="measured profile (`plan profile`), or a folder of them matched by "
                   "device name; repeatable")
    p.add_argument("-o", "--output", type=path_arg, metavar="PLAN",
                   help="write the best plan (.yaml/.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, flag="-o", suffixes=PLAN_SUFFIXES)
    model, cluster = load_inputs(args)
    dtype = train_dtype((g.device for g in cluster.node_groups), args.dtype, where="--dtype")
    profiles = profiles_for(args, cluster, dtype)
    req = SearchRequest(model=model, cluster=cluster, gbs=args.gbs,
                        seq_len=args.seq or model.seq_len, dtype=dtype,
                        objective=args.objective, tokens=args.tokens,
                        max_budget_usd=args.max_budget, top=args.top, attention=args.attention,
                        profiles=profiles, framework=args.framework)
    try:
        result = search(req)
    except InfeasiblePlan as err:
        print(f"plan search: no plan: {one_line(str(err))}", file=sys.stderr)
        return 1
    best = result.ranked[0]
    if args.output:
        save_plan(with_prediction(best.plan, best.result, command=["plan", *args.argv],
                                  profiles=profiles), args.output)
    if args.json:
        print_json(_as_json(result, req))
    else:
        print(_table(result, req))
    return 0


def _row(r: Ranked, req: SearchRequest) -> dict:
    plan, res = r.plan, r.result
    stage = plan.pipelines[0].stages[0]
    sh = plan.sharding
    slots = plan.cluster.slots
    gpus = []
    for pipe in plan.pipelines:
        for st in pipe.stages:
            g = plan.cluster.node_groups[slots[st.devices[0]].group].gpu
            gpus += [g] * len(st.devices)
    return {
        "gpu_types": {g: gpus.count(g) for g in dict.fromkeys(gpus)},
        "gpus": res.num_gpus, "tp": stage.tp, "pp": len(plan.pipelines[0].stages),
        "dp": plan.dp, "cp": stage.cp, "vp": plan.training.virtual_stages,
        "schedule": plan.training.schedule,
        "mbs": plan.pipelines[0].micro_batch_size, "recompute": stage.recompute,
        "sequence_parallel": plan.training.sequence_parallel,
        "sharding": {"params": sh.params, "grads": sh.grads, "optim": sh.optim},
        "stage_sharding": None if plan.stage_sharding is None else [
            {"params": s.params, "grads": s.grads, "optim": s.optim}
            for s in plan.stage_sharding],
        "attention": plan.kernels.attention,
        "iteration_time_s": res.iteration_time_s, "estimate_s": r.estimate_s,
        "tokens_per_s": res.tokens_per_s, "mfu": res.mfu,
        "peak_memory_bytes": int(res.peak_memory_bytes),
        "usd_per_million_tokens": r.usd_per_million_tokens,
        "time_to_train_s": r.time_to_train_s(req.tokens),
        "run_cost_usd": r.run_cost_usd(req.tokens),
        "egress_usd": r.egress_usd(req.tokens),
        "sources": res.sources,
    }


def _baselines(result: SearchResult) -> list[dict]:
    """Each baseline's simulated iteration and how much faster the best plan is."""
    best = result.ranked[0].result.iteration_time_s
    out = []
    for b in result.baselines:
        t = b.result.iteration_time_s if b.result is not None and b.result.fits else None
        out.append({"name": b.name, "iteration_time_s": t,
                    "best_is_faster_by": None if t is None else t / best - 1,
                    "note": b.note})
    return out


def _as_json(result: SearchResult, req: SearchRequest) -> dict:
    return {"objective": req.objective, "candidates": result.num_candidates,
            "fitting": result.num_fitting, "layouts": result.num_layouts,
            "search_s": result.elapsed_s, "notes": result.notes,
            "baselines": _baselines(result),
            "plans": [_row(r, req) for r in result.ranked]}


# the table's schedule column (interleaving shows in the vp column)
_SCHEDULE_SHORT = {s: str(Schedule.ONE_F_ONE_B if s.interleaved else s) for s in Schedule}


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f} d" if seconds >= 86400 else f"{seconds / 3600:.1f} h"


def _table(result: SearchResult, req: SearchRequest) -> str:
    header = (f"{'#':>2} {'GPUs':>6} {'tp':>3} {'pp':>3} {'dp':>5} {'cp':>3} {'vp':>3} "
              f"{'sched':>5} {'mbs':>4} {'recomp':>9} {'sp':>3} {'P/G/OS':>13} {'iter s':>8} "
              f"{'tok/s':>10} {'MFU':>6} {'mem GiB':>8} {'$/1M tok':>9}")
    if req.tokens:
        header += f" {'time to train':>14} {'run $':>11}"
    lines = [f"{req.model.name} on {req.cluster.name}: gbs {req.gbs}, seq {req.seq_len}, "
             f"{req.dtype}, objective {req.objective}", header]
    mixed = len({g.gpu for g in req.cluster.node_groups}) > 1
    for i, r in enumerate(result.ranked, 1):
        d = _row(r, req)
        sh = d["sharding"]
        shard = (f"{sh['params']}/{sh['grads']}/{sh['optim']}" if d["stage_sharding"] is None
                 else "per stage")
        usd = d["usd_per_million_tokens"]
        line = (f"{i:>2} {d['gpus']:>6} {d['tp']:>3} {d['pp']:>3} {d['dp']:>5} {d['cp']:>3} "
                f"{d['vp']:>3} {_SCHEDULE_SHORT[d['schedule']]:>5} {d['mbs']:>4} "
                f"{d['recompute']:>9} "
                f"{'yes' if d['sequence_parallel'] else 'no':>3} "
                f"{shard:>13} "
                f"{d['iteration_time_s']:>8.3f} {d['tokens_per_s']:>10,.0f} "
                f"{d['mfu'] * 100:>5.1f}% {d['peak_memory_bytes'] / GIB:>8.1f} "
                f"{'-' if usd is None else f'{usd:.2f}':>9}")
        if req.tokens:
            ttt, cost = d["time_to_train_s"], d["run_cost_usd"]
            line += f" {_days(ttt):>14} {'-' if cost is None else f'{cost:,.0f}':>11}"
        if mixed:
            stages = r.plan.pipelines[0].stages
            line += "  " + ", ".join(f"{n} {g}" for g, n in d["gpu_types"].items())
            line += f"; layers/stage {[s.num_layers for s in stages]}" if len(stages) > 1 else ""
            if r.plan.stage_sharding:
                line += "; " + r.plan.sharding_label
        lines.append(line)
    best = result.ranked[0].result
    lines.append(f"searched {result.num_candidates:,} candidates on {result.num_layouts} "
                 f"layouts ({result.num_fitting:,} fit) in {result.elapsed_s:.1f} s; "
                 f"times: event simulation of the leaders, ranked by closed-form estimate")
    for b in _baselines(result):
        rated = ("-" if b["iteration_time_s"] is None else
                 f"{b['iteration_time_s']:.3f} s/iteration; the best plan is "
                 f"{b['best_is_faster_by'] * 100:.1f}% faster")
        lines.append(f"baseline {b['name']}: {rated}" + (f" ({b['note']})" if b["note"] else ""))
    lines.extend(f"note: {n}" for n in result.notes)
    lines.append("sources: " + "; ".join(f"{k}: {v}" for k, v in best.sources.items()))
    return "\n".join(lines)
