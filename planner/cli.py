"""`plan`: the command line. It builds the parser and dispatches; each command lives in
`planner/commands/` and never imports this module. Imports stay light (no torch, no
pandas) so it starts fast.

Bad input exits with code 2 and one line naming the field, the value and what is
allowed; nothing a user can cause prints a traceback. Ctrl-C or SIGTERM exits 130 with one
line saying what was kept (outputs are written whole or not at all: planner/outputs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from planner.commands import export, gpus, models, profile, replan, run, search, simulate, whatif
from planner.commands.args import Parser
from planner.errors import INTERRUPTED, Interrupted
from profiler import progress
from profiler.schema import SpecError, one_line

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
    command = "plan"
    with _interrupts_on_sigterm():
        try:
            argv = profile.default_verb(argv)
            args = build_parser().parse_args(argv)
            args.argv = argv
            progress.silence(bool(getattr(args, "json", False)))  # stdout is one JSON object
            command = f"plan {args.command}"
            return COMMANDS[args.command].run(args)
        except SpecError as err:
            print(f"{command}: error: {one_line(str(err))}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            return 0
        except Interrupted as stop:
            _say_interrupted(command, stop.kept)
            return INTERRUPTED
        except KeyboardInterrupt:
            _say_interrupted(command, "nothing written")
            return INTERRUPTED


def _say_interrupted(command: str, kept: str) -> None:
    lead = "\n" if sys.stderr.isatty() else ""  # after a progress bar or the echoed ^C
    print(f"{lead}{command}: interrupted; {kept}", file=sys.stderr)


@contextlib.contextmanager
def _interrupts_on_sigterm() -> Iterator[None]:
    """SIGTERM stops a command as Ctrl-C does (KeyboardInterrupt): each command and the
    process pools clean up the same way, then `main` says so in one line and exits 130.
    Only in the main thread (where Python delivers signals); the old handler comes back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
