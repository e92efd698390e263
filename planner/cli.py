"""`plan`: the command line. It builds the parser and dispatches; each command lives in
`planner/commands/` and never imports this module. Imports stay light (no torch, no
pandas) so it starts fast.

Bad input exits with code 2 and one line naming the field, the value and what is
allowed; nothing a user can cause prints a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from planner.commands import export, gpus, models, profile, replan, run, search, simulate, whatif
from planner.commands.args import Parser
from profiler import progress
from profiler.schema import SpecError

__all__ = ["main"]

# command name -> module with add_parser(sub) and run(args); in `plan --help` order
COMMANDS = {"simulate": simulate, "search": search, "export": export, "what-if": whatif,
            "profile": profile, "run": run, "replan": replan, "models": models, "gpus": gpus}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="plan", description="Plan LLM training on the GPUs you have: "
                    "search for the best configuration, simulate one, measure a profile, "
                    "run a plan, list models and GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = profile.default_verb(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if getattr(args, "json", False):
        progress.silence()  # stdout is one JSON object; nothing on stderr either
    try:
        return COMMANDS[args.command].run(args)
    except SpecError as err:
        print(f"plan {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
