"""`plan replan`: the path back after nodes die. The cluster of a Plan less the lost
nodes is searched again for the plan's own model, global batch, sequence length, dtype,
framework and attention kernel, and the best plan is written; its run resumes the old
run's checkpoints (`plan run --plan NEW --checkpoint-dir DIR --resume`: checkpoints are
layout-independent, executor/checkpoint.py).

    plan replan --plan plan.yaml --without 1:A100-80GB-SXM -o plan-b.yaml

The framework is the one whose communication the plan carries (a plan searched with
`--framework megatron` keeps Megatron-LM's, and with it fp8), unless `--framework` says
otherwise. The attention kernel is kept where every GPU left runs it; else each GPU type
takes its own, as a search does. A searched plan holds only the GPUs it uses; `--cluster`
gives the whole cluster (the plan's GPUs, idle ones too) to take the lost nodes from.

Nodes of a type are taken away from the last node group of that type first (as `plan
what-if`'s `remove`); the new plan numbers the remaining GPUs from 0.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import replace

from planner.commands.args import add_framework_arg, int_in, path_arg, print_json
from planner.commands.inputs import profiles_for, with_prediction
from planner.costs.kernels import default_kernels
from planner.errors import InfeasiblePlan
from planner.export.frameworks import CAPABILITIES, unsupported
from planner.outputs import check_distinct
from planner.search import SearchRequest, search
from planner.specs.cluster import ClusterSpec, NodeGroup, load_cluster
from planner.specs.plan import Plan, describe_layout, load_plan, save_plan
from profiler.devices import device
from profiler.schema import SpecError, fail, one_line

__all__ = ["add_parser", "framework_of", "kept_attention", "resume_command", "run",
           "without_nodes"]

PLAN_EXTENSIONS = (".yaml", ".yml", ".json")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replan", help="search again after nodes are lost, for a run to resume",
        description="Search the cluster of a Plan less the lost nodes for the plan's model, "
        "global batch, sequence length and dtype, and write the best plan; `plan run "
        "--plan NEW --checkpoint-dir DIR --resume` then continues the old run from its "
        "checkpoints under the new layout.")
    p.add_argument("--plan", required=True, metavar="FILE", help="the plan that ran")
    p.add_argument("--cluster", type=path_arg, metavar="FILE",
                   help="the whole cluster the plan ran on, idle GPUs too (default: the "
                   "plan's own cluster, which holds only the GPUs it uses)")
    p.add_argument("--without", required=True, action="append", metavar="N:TYPE",
                   help="N lost nodes of GPU type TYPE (repeatable)")
    p.add_argument("-o", "--output", required=True, metavar="PLAN",
                   help="write the new plan (.yaml/.json)")
    p.add_argument("--top", type=int_in(1, 1000), default=5, metavar="K",
                   help="plans the search ranks (the best is written; default 5)")
    p.add_argument("--profile", metavar="FILE|DIR", action="append",
                   help="measured profile(s) to price the search, as `plan search`")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_framework_arg(p, default_words="default: the framework the plan was searched for, "
                      "the one whose communication it carries")
    p.set_defaults(framework=None)


def _lost(text: str, cluster: ClusterSpec) -> tuple[int, str]:
    """`N:TYPE` -> (N, the name of TYPE: the cluster's spelling, any case, else the
    catalog's)."""
    m = re.fullmatch(r"([0-9]+):(.+)", text.strip())
    if not m or int(m.group(1)) < 1:
        fail("--without", text, "N:TYPE, N ≥ 1 lost nodes of GPU type TYPE")
    mine = {g.gpu.lower(): g.gpu for g in cluster.node_groups}
    if (name := mine.get(m.group(2).strip().lower())) is not None:
        return int(m.group(1)), name
    return int(m.group(1)), device(m.group(2), where="--without").name


def _check_ran_on(plan: Plan, cluster: ClusterSpec, path: str) -> None:
    """The --cluster file holds the GPUs the plan ran on (each type, at least as many)."""
    have: dict[str, int] = {}
    for g in cluster.node_groups:
        have[g.gpu] = have.get(g.gpu, 0) + g.num_gpus
    used: dict[str, int] = {}
    for p in plan.pipelines:
        for s in p.stages:
            gpu = plan.group_of(s).gpu
            used[gpu] = used.get(gpu, 0) + len(s.devices)
    for gpu, n in used.items():
        if have.get(gpu, 0) < n:
            fail("--cluster", path, f"the cluster the plan ran on: the plan uses {n} {gpu} "
                 f"GPUs, the file holds {have.get(gpu, 0)}")


def without_nodes(cluster: ClusterSpec, lost: int, gpu: str, *, where: str = "--without"
                  ) -> ClusterSpec:
    """`cluster` less `lost` nodes of GPU type `gpu`, taken from its last node group of
    that type first; island links to islands left empty go too."""
    have = sum(g.num_nodes for g in cluster.node_groups if g.gpu == gpu)
    if have == 0:
        types = ", ".join(dict.fromkeys(g.gpu for g in cluster.node_groups))
        fail(where, f"{lost}:{gpu}", f"a GPU type of the plan's cluster: {types}")
    if lost > have:
        fail(where, f"{lost}:{gpu}", f"the plan's cluster has {have} {gpu} node(s)")
    kept: list[NodeGroup] = []
    left = lost
    for g in reversed(cluster.node_groups):
        take = min(left, g.num_nodes) if g.gpu == gpu else 0
        left -= take
        if take < g.num_nodes:
            kept.append(replace(g, num_nodes=g.num_nodes - take))
    if not kept:
        fail(where, f"{lost}:{gpu}", "would leave no GPUs")
    islands = {g.island for g in kept}
    out = replace(cluster, name=f"{cluster.name} without {lost} {gpu} node(s)",
                  node_groups=tuple(reversed(kept)),
                  island_links=tuple(k for k in cluster.island_links
                                     if set(k.islands) <= islands))
    out.check("cluster")
    return out


def _check_output(path: str) -> None:
    """Before any work: a plan file name in a folder that exists."""
    if os.path.splitext(path)[1].lower() not in PLAN_EXTENSIONS:
        fail("--output", path, "a plan file: " + ", ".join(PLAN_EXTENSIONS))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        fail("--output", path, f"its folder {folder} does not exist")
    if os.path.isdir(path):
        fail("--output", path, "a file, not a folder")


def framework_of(plan: Plan) -> str:
    """The framework a plan was searched for: the one whose communication it carries
    (`FrameworkCapabilities.communication`), this project's executor where none does."""
    dtype = plan.training.dtype
    return next((name for name, caps in CAPABILITIES.items()
                 if caps.communication(dtype) == plan.training.comm), "trainplan")


def kept_attention(plan: Plan, cluster: ClusterSpec) -> str | None:
    """The plan's attention kernel where every GPU type of `cluster` runs it in the plan's
    dtype, else None (each GPU type its own, as a search without --attention)."""
    try:
        default_kernels([g.device for g in cluster.node_groups], dtype=plan.training.dtype,
                        attention=plan.kernels.attention, dropout=plan.model.drops_attention)
    except SpecError:
        return None
    return plan.kernels.attention


def run(args: argparse.Namespace) -> int:
    _check_output(args.output)
    check_distinct({"--plan": args.plan, "--output": args.output})  # the old plan is the
    # record of what the checkpoints were written under
    old = load_plan(args.plan)
    cluster = (load_cluster(args.cluster) if args.cluster else old.cluster).resolved()
    if args.cluster:
        _check_ran_on(old, cluster, args.cluster)
    for text in args.without:
        lost = _lost(text, cluster)
        try:
            cluster = without_nodes(cluster, *lost).resolved()
        except SpecError as err:
            if args.cluster:
                raise
            raise SpecError(f"{err}; the plan's cluster holds only the GPUs it uses: "
                            "--cluster FILE gives the whole cluster") from None
    tr = old.training
    profiles = profiles_for(args, cluster, tr.dtype)
    framework = args.framework or framework_of(old)
    req = SearchRequest(model=old.model, cluster=cluster, gbs=tr.global_batch_size,
                        seq_len=tr.seq_len, dtype=tr.dtype,
                        attention=kept_attention(old, cluster), top=args.top,
                        profiles=profiles, framework=framework)
    try:
        best = search(req).ranked[0]
    except InfeasiblePlan as err:
        print(f"plan replan: no plan on {cluster.name}: {err}", file=sys.stderr)
        if args.json:  # still the one JSON object --json promises, as `plan search --json`
            print_json({"cluster": cluster.name, "gpus": cluster.num_gpus, "plan": None,
                        "no_plan": one_line(str(err)), "framework": framework})
        return 1
    new = with_prediction(best.plan, best.result, command=["plan", *args.argv],
                          profiles=profiles)
    save_plan(new, args.output)
    summary = {**_summary(old, new, args.output), "framework": framework}
    resume = resume_command(new, framework, args.output)
    if args.json:
        print_json({**summary, "resume": resume})
    else:
        whose = "" if args.framework else " (the plan's framework)"
        print(f"{old.model.name}: {summary['gpus_before']} -> {summary['gpus']} GPUs "
              f"({cluster.name}), searched for {framework}{whose}\n"
              f"was: {summary['layout_before']}\n"
              f"now: {summary['layout']}\npredicted iteration "
              f"{summary['iteration_time_s']:.4g} s"
              + (f" (was {summary['iteration_time_s_before']:.4g} s)"
                 if summary["iteration_time_s_before"] else "")
              + f"\nwrote {args.output}; resume the run with: {resume}")
    return 0


def resume_command(new: Plan, framework: str, path: str) -> str:
    """How to go on with the new plan at `path`: `plan run ... --resume` for this
    project's executor (and on CPU ranks, which only it runs); for another framework its
    own files from `plan export` (its run wrote its own checkpoints), and `plan run` as
    well where the executor runs the layout (a run of a plan searched for another
    framework may have been the executor's)."""
    own = f"plan run --plan {path} --checkpoint-dir DIR --resume"
    if framework == "trainplan" or all(g.device.vendor == "cpu"
                                       for g in new.cluster.node_groups):
        return own
    export = (f"plan export {path} --format {framework}, from the run's checkpoints as "
              f"{framework} resumes")
    if unsupported(new, CAPABILITIES["trainplan"], communication=False):
        return f"{export} (this project's executor cannot run it)"
    return f"{export}; a run of this project's executor: {own}"


def _summary(old: Plan, new: Plan, path: str) -> dict:
    assert new.predicted is not None
    return {"plan": path, "gpus_before": old.num_gpus_used, "gpus": new.num_gpus_used,
            "layout_before": describe_layout(old), "layout": describe_layout(new),
            "iteration_time_s_before": old.predicted.iteration_time_s if old.predicted
            else None, "iteration_time_s": new.predicted.iteration_time_s,
            "cluster": new.cluster.name}
