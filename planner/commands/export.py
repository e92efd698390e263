"""`plan export`: a Plan as Megatron-LM arguments, a DeepSpeed config or a torchtitan TOML."""

from __future__ import annotations

import argparse
import sys

from planner.commands.args import path_arg
from planner.export.formats import FORMATS, export_plan
from planner.outputs import check_distinct, check_output_file, write_text
from planner.specs.plan import load_plan

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a plan in a training framework's terms",
                       description="Write a Plan as Megatron-LM command-line arguments, a "
                       "DeepSpeed config JSON or a torchtitan TOML, and list what the "
                       "framework cannot express.")
    p.add_argument("plan", type=path_arg, metavar="PLAN", help="a Plan file (.yaml/.json)")
    p.add_argument("--format", choices=sorted(FORMATS), required=True)
    p.add_argument("-o", "--output", type=path_arg, metavar="FILE",
                   help="write here instead of stdout")


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, flag="-o")
    check_distinct({"PLAN": args.plan, "-o": args.output})
    out = export_plan(load_plan(args.plan), args.format)
    if args.output is not None:
        write_text(args.output, out.text)
    else:
        sys.stdout.write(out.text)
    for item in out.unsupported:
        print(f"plan export: not expressible in {args.format}: {item}", file=sys.stderr)
    return 0
