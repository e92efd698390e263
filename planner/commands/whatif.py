"""`plan what-if`: plan a baseline cluster and scenarios of it, and report cost and time."""

from __future__ import annotations

import argparse
import os
import shlex

from planner.commands.args import (
    add_batch_args,
    add_cluster_args,
    add_framework_arg,
    add_model_args,
    budget_arg,
    gib_arg,
    path_arg,
    tokens_arg,
)
from planner.commands.inputs import load_inputs, profiles_for
from planner.describe import count_words, duration_words
from planner.outputs import check_output_dir
from planner.search.search import (
    DEFAULT_HEADROOM_BYTES,
    OBJECTIVES,
    check_framework,
    check_headroom,
    search_dtype,
)
from planner.whatif.report import plan_scenarios, write_report
from planner.whatif.scenarios import Setting, parse_scenario
from profiler.schema import SpecError, fail

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "what-if", help="compare scenarios of a cluster: time to train and dollars",
        description="Plan the baseline cluster and each scenario (add/remove/swap GPUs, "
        "scale a NIC or link, change prices, the model or the token budget) with the same "
        "search as `plan search`, and write report.html, report.md, table.csv and figures.",
        epilog="Scenario changes (join several with ';', prefix a label with 'label:'): "
        "add TYPE COUNT [ISLAND]; add TYPE COUNT island NEW link GBPS [latency MS] [price "
        "USD] (a new island, e.g. rented GPUs over a WAN); remove TYPE COUNT; swap OLD NEW; "
        "scale-nic TYPE|GROUP FACTOR; scale-link ISLAND ISLAND FACTOR; price TYPE USD_PER_GPU_HOUR; "
        "egress-price USD_PER_GB; model NAME; tokens N.  Example: --scenario "
        "\"more H100: add H100-80GB-SXM 64; price H100-80GB-SXM 3\"")
    add_model_args(p)
    add_cluster_args(p)  # the baseline: --cluster FILE or --gpus TYPE:COUNT
    p.add_argument("--tokens", type=tokens_arg, required=True, metavar="N",
                   help="tokens to train on (e.g. 2e12)")
    add_batch_args(p)
    p.add_argument("--scenario", action="append", default=[], metavar="CHANGES",
                   help="a scenario (repeatable); the baseline is always the first row")
    p.add_argument("--objective", choices=OBJECTIVES, default="time-to-train",
                   help="what each scenario's search optimises (default time-to-train; "
                   "cost and time-to-train may use fewer GPUs, as in `plan search`)")
    p.add_argument("--max-budget", type=budget_arg, metavar="USD", help="cap on each run's cost")
    add_framework_arg(p)
    p.add_argument("--profile", type=path_arg, metavar="FILE|DIR", action="append",
                   help="measured profile(s) for the cluster's GPU types")
    p.add_argument("--memory-headroom", type=gib_arg, default=DEFAULT_HEADROOM_BYTES,
                   metavar="GIB", help="GPU memory a plan should leave free at its peak; "
                   f"plans with less are flagged (default {DEFAULT_HEADROOM_BYTES / 1024**3:g})")
    p.add_argument("-o", "--output", required=True, type=path_arg, metavar="DIR",
                   help="report folder (e.g. reports/my-cluster/)")


def run(args: argparse.Namespace) -> int:
    check_output_dir(args.output, flag="-o")
    model, cluster = load_inputs(args)
    dtype = search_dtype(args.framework, model, (g.device for g in cluster.node_groups),
                         args.dtype)
    # what the framework cannot run on any cluster fails every scenario alike: say so once
    check_framework(args.framework, model, dtype)
    scenarios = [parse_scenario(text) for text in args.scenario]
    seen = {"baseline"}
    for text, sc in zip(args.scenario, scenarios, strict=True):
        if sc.label in seen:  # the report names rows by their labels
            fail("--scenario", text, f"its label {sc.label!r} is taken (the baseline's, or "
                 "another scenario's): give each scenario a label of its own, 'LABEL: ...'")
        seen.add(sc.label)
    check_headroom(args.memory_headroom, cluster)
    base = Setting(label="baseline", model=model, cluster=cluster, tokens=args.tokens)
    profiles = profiles_for(args, cluster, dtype)
    rows = plan_scenarios(base, scenarios, gbs=args.gbs, seq_len=args.seq,
                          objective=args.objective, dtype=dtype,
                          dtype_asked=args.dtype is not None,
                          memory_headroom_bytes=args.memory_headroom,
                          max_budget_usd=args.max_budget, profiles=profiles,
                          framework=args.framework)
    if all(r.refused for r in rows):  # bad input for every scenario: no report to write
        raise SpecError(rows[0].refused)
    title = f"What if: {model.name} on {cluster.name}, {count_words(args.tokens)} tokens"
    paths = write_report(rows, args.output, title=title,
                         command=shlex.join(["plan", *args.argv]), profiles=profiles)
    for r in rows:
        if r.ranked is None:
            print(f"{r.label}: {r.note}")
        else:
            ttt = duration_words(r.time_to_train_s)  # type: ignore[arg-type]  # planned rows have a time
            cost = "-" if r.total_usd is None else f"${r.total_usd:,.0f}"
            print(f"{r.label}: {ttt}, {cost}, {r.gpus_used} GPUs used, "
                  f"bottleneck {r.bottleneck}")
    print("wrote " + ", ".join(_shown(p) for p in paths.values()))
    return 0


def _shown(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel
