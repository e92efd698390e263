"""`plan search`: the best plans for a model on a cluster, as a table and a Plan file."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from planner.commands.args import (
    add_batch_args,
    add_cluster_args,
    add_framework_arg,
    add_model_args,
    budget_arg,
    gib_arg,
    int_in,
    path_arg,
    print_json,
    tokens_arg,
)
from planner.commands.inputs import input_files, load_inputs, profiles_for, with_prediction
from planner.errors import InfeasiblePlan
from planner.outputs import PLAN_SUFFIXES, check_distinct, check_output_file
from planner.search import SearchRequest, search
from planner.search.search import DEFAULT_HEADROOM_BYTES, OBJECTIVES, check_headroom, search_dtype
from planner.search.show import search_json, search_table
from planner.specs.choices import DType, values
from planner.specs.cluster import runs_dtype
from planner.specs.plan import Plan, save_plan
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
    add_batch_args(p)
    p.add_argument("--objective", choices=OBJECTIVES,
                   default="throughput", help="what to optimise (throughput plans on all "
                   "the GPUs of each type a plan uses: each type alone, and mixed plans of "
                   "several, so a row may leave a type idle (its GPUs column; the notes say "
                   "why of the best); cost and time-to-train may use fewer: whole nodes in "
                   "powers of two, "
                   "the node counts between that take more data parallelism of the batch, "
                   "then halves of a node)")
    p.add_argument("--tokens", type=tokens_arg, metavar="N", help="tokens to train on (for "
                   "time-to-train and the budget)")
    p.add_argument("--max-budget", type=budget_arg, metavar="USD", help="cap on the run's cost")
    p.add_argument("--top", type=int_in(1, 1000), default=5, metavar="K",
                   help="plans to list (default 5)")
    p.add_argument("--attention", choices=values(Attention),
                   help="attention kernel every plan uses (default: the fastest each GPU type "
                   "runs, or that a --profile measured); the framework must run it "
                   "(flash_triton: plan simulate only)")
    add_framework_arg(p)
    p.add_argument("--profile", type=path_arg, metavar="FILE|DIR", action="append",
                   help="measured profile (`plan profile`: .csv or .parquet), or a folder of "
                   "them matched by device name; repeatable")
    p.add_argument("-o", "--output", type=path_arg, metavar="PLAN",
                   help="write the best plan (.yaml/.json)")
    p.add_argument("--memory-headroom", type=gib_arg, default=DEFAULT_HEADROOM_BYTES,
                   metavar="GIB", help="GPU memory a plan should leave free at its peak "
                   "(allocator fragmentation, other processes); plans with less are flagged "
                   f"(default {DEFAULT_HEADROOM_BYTES / GIB:g})")
    p.add_argument("--wide", action="store_true", help="more columns than fit 100 "
                   "(tokens/s, the closed-form estimate, egress, attention kernel)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, flag="-o", suffixes=PLAN_SUFFIXES)
    check_distinct({**input_files(args), "-o": args.output})
    model, cluster = load_inputs(args)
    dtype = search_dtype(args.framework, model, (g.device for g in cluster.node_groups),
                         args.dtype)
    check_headroom(args.memory_headroom, cluster)
    profiles = profiles_for(args, cluster, dtype)
    req = SearchRequest(model=model, cluster=cluster, gbs=args.gbs,
                        seq_len=args.seq or model.seq_len, dtype=dtype,
                        objective=args.objective, tokens=args.tokens,
                        max_budget_usd=args.max_budget, top=args.top, attention=args.attention,
                        profiles=profiles, framework=args.framework,
                        memory_headroom_bytes=args.memory_headroom)
    try:
        result = search(req)
    except InfeasiblePlan as err:
        print(f"plan search: no plan: {one_line(str(err))}", file=sys.stderr)
        if args.json:  # still the one JSON object --json promises, with no plan in it
            print_json({"objective": req.objective, "plans": [],
                        "no_plan": one_line(str(err)),
                        "memory_headroom_bytes": int(req.memory_headroom_bytes)})
        return 1
    best = result.ranked[0]
    if args.dtype is None and (note := _default_dtype_note(req, best.plan)):
        result = replace(result, notes=[*result.notes, note])
    if args.output:
        save_plan(with_prediction(best.plan, best.result, command=["plan", *args.argv],
                                  profiles=profiles), args.output)
    if args.json:
        print_json(search_json(result, req))
    else:
        print(search_table(result, req, wide=args.wide))
    return 0


def _default_dtype_note(req: SearchRequest, best: Plan) -> str | None:
    """Why the default dtype is fp16 where the best plan's GPU types all run bf16: another
    type of the cluster has none (the default is one every type runs), which a user reading
    a plan of H100s in fp16 would not guess."""
    if req.dtype != DType.FP16 or DType.BF16 not in req.capabilities.dtypes_for(req.model):
        return None
    used = sorted(best.gpu_types)
    lacking = sorted(g.gpu for g in req.cluster.node_groups
                     if not runs_dtype(g.device, DType.BF16))
    if not lacking or not all(runs_dtype(req.cluster.device_of(t), DType.BF16) for t in used):
        return None
    names = list(dict.fromkeys(lacking))
    have = "has" if len(names) == 1 else "have"
    return (f"fp16 because {', '.join(names)} {have} no bf16 (the default is a dtype every "
            f"GPU type runs); the best plan uses only {', '.join(used)}, which run bf16: "
            "--dtype bf16 plans them in it")
