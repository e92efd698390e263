"""`plan export`: a Plan as a framework's config (Megatron-LM arguments, a DeepSpeed JSON,
a torchtitan TOML) or as launch files (a Slurm script, a Kubernetes JobSet) that run it.

A config is written only when the framework expresses the plan exactly; otherwise the
command exits 2 with one line per setting it cannot express. `--approximate` writes the
nearest expressible plan instead and prints both plans' simulated iteration times.
"""

from __future__ import annotations

import argparse
import sys

from planner.commands.args import path_arg
from planner.costs.memory import GIB
from planner.export.approximate import nearest
from planner.export.formats import FORMATS, export_plan
from planner.export.frameworks import CAPABILITIES, FRAMEWORKS, unsupported
from planner.outputs import check_distinct, check_output_file, write_text
from planner.specs.plan import Plan, load_plan, plan_to_dict
from profiler.schema import SpecError, fail

__all__ = ["add_parser", "run"]

LAUNCH_FORMATS = ("slurm", "kubernetes")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a plan in a training framework's terms",
                       description="Write a Plan as Megatron-LM command-line arguments, a "
                       "DeepSpeed config JSON or a torchtitan TOML, or as launch files (a Slurm "
                       "sbatch script, a Kubernetes JobSet) that run it with a framework. "
                       "Exits 2, naming each setting, when the framework cannot express the "
                       "plan exactly.")
    p.add_argument("plan", type=path_arg, metavar="PLAN", help="a Plan file (.yaml/.json)")
    p.add_argument("--format", choices=(*sorted(FORMATS), *LAUNCH_FORMATS), required=True,
                   help="a framework's own terms, or launch files for --framework")
    p.add_argument("--framework", choices=FRAMEWORKS,
                   help="with --format slurm|kubernetes: what the nodes run (default trainplan, "
                   "this project's executor)")
    p.add_argument("--approximate", action="store_true",
                   help="write the nearest plan the framework expresses, and print its "
                   "simulated iteration time beside the plan's")
    p.add_argument("-o", "--output", type=path_arg, metavar="FILE",
                   help="write here instead of stdout")


def _framework(args: argparse.Namespace) -> str:
    if args.format in FORMATS:
        if args.framework not in (None, args.format):
            fail("--framework", args.framework, "only with --format slurm or kubernetes (the "
                 "format names the framework here)")
        return args.format
    return args.framework or "trainplan"


def _refuse(framework: str, issues: list[str] | tuple[str, ...], *, what: str) -> int:
    for item in issues:
        print(f"plan export: {framework} cannot express {what}: {item}", file=sys.stderr)
    return 2


def _approximate(plan: Plan, framework: str) -> Plan | None:
    """The nearest plan, with both simulated times printed; None (said why) if none."""
    from planner.simulator import simulate

    approx, changes = nearest(plan, CAPABILITIES[framework])
    left = _issues(approx, framework)
    if left:
        _refuse(framework, left, what="the nearest plan either (it needs a new search)")
        return None
    before, after = simulate(plan), simulate(approx)
    for change in changes:
        print(f"plan export: approximated: {change}", file=sys.stderr)
    delta = after.iteration_time_s / before.iteration_time_s - 1
    fits = "" if after.fits or before.fits else "; it does not fit in memory, nor does the plan"
    print(f"plan export: simulated iteration time: plan {before.iteration_time_s:.4g} s, "
          f"exported {after.iteration_time_s:.4g} s ({delta:+.1%}){fits}", file=sys.stderr)
    if before.fits and not after.fits:  # out of memory where the plan was not: no nearest
        worst = max(after.stages, key=lambda s: s.memory.total_bytes / s.memory.capacity_bytes)
        m = worst.memory
        _refuse(framework, [f"it runs out of memory: {m.total_bytes / GIB:,.1f} GiB at the "
                            f"peak of pipeline {worst.pipeline} stage {worst.stage}, which has "
                            f"{m.capacity_bytes / GIB:,.1f} GiB; search for {framework} "
                            f"(plan search --framework {framework})"],
                what="the nearest plan either")
        return None
    return approx


def _nearest_refused(plan: Plan, framework: str) -> bool:
    """Whether the framework cannot express the nearest plan either."""
    try:
        return bool(_issues(nearest(plan, CAPABILITIES[framework])[0], framework))
    except SpecError:  # --approximate says why
        return False


def _issues(plan: Plan, framework: str) -> list[str]:
    if framework in FORMATS:
        return list(export_plan(plan, framework).unsupported)
    return unsupported(plan, CAPABILITIES[framework])


def _text(plan: Plan, args: argparse.Namespace, framework: str) -> str:
    import yaml

    from planner.export.launch import kubernetes_manifest, slurm_script

    if framework == "trainplan":
        config = yaml.safe_dump(plan_to_dict(plan), sort_keys=False, width=100)
    else:
        exported = export_plan(plan, framework)
        config = exported.text
        for note in exported.notes:
            print(f"plan export: note: {note}", file=sys.stderr)
    if args.format in FORMATS:
        return config
    version = CAPABILITIES[framework].version
    if args.format == "slurm":
        return slurm_script(plan, framework=framework, config_text=config, version=version)
    return yaml.safe_dump_all(kubernetes_manifest(plan, framework=framework, config_text=config,
                                                  version=version), sort_keys=False, width=100)


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, flag="-o")
    check_distinct({"PLAN": args.plan, "-o": args.output})
    framework = _framework(args)
    plan = load_plan(args.plan)
    issues = _issues(plan, framework)
    if issues and not args.approximate:
        _refuse(framework, issues, what="this plan")
        # --approximate only where its nearest plan is one the framework expresses (it
        # was suggested for mixed GPU types too, and then refused)
        if _nearest_refused(plan, framework):
            print(f"plan export: nothing written; --approximate cannot help (no plan near "
                  f"it is one {framework} expresses): plan search --framework {framework} "
                  "finds one", file=sys.stderr)
        else:
            print("plan export: nothing written; --approximate writes the nearest plan it "
                  "expresses", file=sys.stderr)
        return 2
    if issues:
        approx = _approximate(plan, framework)
        if approx is None:
            return 2
        plan = approx
    text = _text(plan, args, framework)
    if args.output is not None:
        write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
