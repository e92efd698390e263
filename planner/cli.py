"""`plan`: the command line. Imports stay light (no torch, no pandas) so it starts fast.

Bad input exits with code 2 and one line naming the field, the value and what is
allowed; nothing a user can cause prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from profiler.schema import SpecError

__all__ = ["main"]

GIB = 1024**3


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed (must be ≥ 1)")
    return value


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", metavar="NAME", help="a preset (see `plan models`)")
    g.add_argument("--model-file", metavar="FILE", help="a ModelSpec YAML file")


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--gpus", metavar="TYPE:COUNT",
                   help="a homogeneous cluster of standard nodes, e.g. A100-80GB-SXM:64")
    g.add_argument("--cluster", metavar="FILE", help="a ClusterSpec YAML file")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="plan", description="Plan LLM training on the GPUs you have: "
                     "simulate a configuration, list models and GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="predict one training iteration of a configuration",
                         description="Predict iteration time, throughput, MFU, time breakdown "
                         "and per-rank memory of one parallel configuration.")
    _add_model_args(sim)
    _add_cluster_args(sim)
    for flag, default, text in (("--tp", None, "tensor-parallel degree"),
                                ("--pp", None, "pipeline stages"),
                                ("--dp", None, "data-parallel replicas"),
                                ("--cp", 1, "context-parallel degree"),
                                ("--vp", 1, "interleaved chunks per stage (interleaved 1F1B)"),
                                ("--mbs", None, "micro-batch size"),
                                ("--gbs", None, "global batch size (sequences)")):
        sim.add_argument(flag, type=_positive_int, default=default, required=default is None,
                         metavar="N", help=text)
    sim.add_argument("--seq", type=_positive_int, metavar="N",
                     help="sequence length (default: the model's)")
    sim.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    sim.add_argument("--sequence-parallel", action="store_true")
    sim.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b",
                     help="pipeline schedule (with --vp > 1: interleaved 1F1B)")
    shard = sim.add_mutually_exclusive_group()
    shard.add_argument("--sharding", choices=("none", "zero1", "zero2", "zero3"),
                       help="ZeRO stage (a point of the sharding space)")
    shard.add_argument("--shard-params", type=_positive_int, metavar="N",
                       help="replicas sharing one copy of the parameters (AMSP)")
    sim.add_argument("--shard-grads", type=_positive_int, metavar="N",
                     help="replicas sharing one copy of the gradients")
    sim.add_argument("--shard-optim", type=_positive_int, metavar="N",
                     help="replicas sharing one copy of the optimizer states")
    sim.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    sim.add_argument("--attention", choices=("flash", "memory_efficient", "math"),
                     help="attention kernel (default: the fastest the device supports)")
    sim.add_argument("--profile", metavar="FILE|DIR", action="append",
                     help="measured profile (`plan profile`), or a folder of them matched by "
                     "device name; repeatable. It answers the ops and collectives it has, the "
                     "analytic models the rest")
    sim.add_argument("--method", choices=("simulate", "estimate"), default="simulate",
                     help="event simulation of the task graph (default) or the closed-form "
                     "estimate")
    sim.add_argument("--trace", metavar="FILE", help="write a Chrome-trace JSON of the "
                     "simulated timeline (open in Perfetto)")
    sim.add_argument("--gantt", metavar="PNG", help="write a picture of the pipeline schedule")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("-o", "--output", metavar="PLAN", help="also write the Plan (.yaml/.json)")

    models = sub.add_parser("models", help="list the model presets")
    models.add_argument("--json", action="store_true")
    gpus = sub.add_parser("gpus", help="list the device catalog")
    gpus.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _build_parser().parse_args(argv)
    args.argv = argv
    try:
        if args.command == "simulate":
            from planner.commands.simulate import run_simulate

            return run_simulate(args)
        if args.command == "models":
            from planner.commands.listing import list_models

            return list_models(as_json=args.json)
        if args.command == "gpus":
            from planner.commands.listing import list_gpus

            return list_gpus(as_json=args.json)
    except SpecError as err:
        print(f"plan {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    raise AssertionError(args.command)


def print_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    sys.exit(main())
