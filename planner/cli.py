"""`plan`: the command line. Imports stay light (no torch, no pandas) so it starts fast.

Bad input exits with code 2 and one line naming the field, the value and what is
allowed; nothing a user can cause prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
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


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is not allowed (must be ≥ {low})")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _add_model_args(p: argparse.ArgumentParser, *, required: bool = True,
                    plan: bool = False) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--model", metavar="NAME", help="a preset (see `plan models`)")
    g.add_argument("--model-file", metavar="FILE", help="a ModelSpec YAML file")
    if plan:
        g.add_argument("--plan", metavar="FILE", help="a Plan (.yaml/.json) to predict as it "
                       "is (heterogeneous ones too); it brings its model, cluster and layout")


def _add_cluster_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--gpus", metavar="TYPE:COUNT",
                   help="a homogeneous cluster of standard nodes, e.g. A100-80GB-SXM:64")
    g.add_argument("--cluster", metavar="FILE", help="a ClusterSpec YAML file")


_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def _bytes(text: str) -> int:
    """"256MB", "1KB", "4096" -> bytes (binary units, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?B?)\s*", text.upper())
    if not m or m.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1KB, 16MB, 1GB)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed (each must be ≥ 1)")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _add_profile_parser(sub: argparse._SubParsersAction) -> None:
    """`plan profile [measure|show|fit]` (measure when no verb is given)."""
    prof = sub.add_parser("profile", help="measure ops and collectives; show or fit a profile",
                          description="Measure a model's ops (and collectives) on this "
                          "machine into a profile that `plan simulate --profile` uses; "
                          "show one; fit the analytic device model to one.")
    verbs = prof.add_subparsers(dest="profile_command", required=True, parser_class=_Parser)
    _add_measure(verbs)
    show = verbs.add_parser("show", help="achieved FLOP/s and bandwidth per op")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--plot", metavar="PNG", help="also draw them")
    show.add_argument("--json", action="store_true")
    fit = verbs.add_parser("fit", help="fit the analytic model of the profiled GPU type")
    fit.add_argument("file", metavar="FILE")
    fit.add_argument("--iterations", type=_positive_int, default=400, metavar="N",
                     help="Nelder-Mead evaluations (default 400)")


def _add_measure(verbs: argparse._SubParsersAction) -> None:
    m = verbs.add_parser("measure", help="measure (the default verb)",
                         description="Measure the ops a model's training step runs at the "
                         "planner's shapes, and/or collectives across local processes.")
    _add_model_args(m, required=False)
    m.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    m.add_argument("--device-name", metavar="GPU", help="the catalog type it is (default: "
                   "recognised from the driver's name; `plan gpus`)")
    m.add_argument("--tp", type=_int_list, default=(1,), metavar="N,N", help="tensor-parallel "
                   "degrees (default 1)")
    m.add_argument("--mbs", type=_int_list, default=(1,), metavar="N,N",
                   help="micro-batch sizes (default 1)")
    m.add_argument("--seq", type=_int_list, metavar="N,N",
                   help="sequence lengths (default: the model's)")
    m.add_argument("--dtype", choices=("fp32", "bf16", "fp16"),
                   help="default fp32 on cpu, bf16 on cuda")
    m.add_argument("--attention", type=_name_list, metavar="K,K", help="attention backends "
                   "(default: all the device supports; those torch cannot run are skipped)")
    m.add_argument("--optimizer", type=_name_list, default=("fused", "foreach", "for_loop"),
                   metavar="K,K", help="AdamW implementations (default fused,foreach,for_loop)")
    m.add_argument("--sequence-parallel", action="store_true")
    m.add_argument("--threads", type=_positive_int, default=1, metavar="N",
                   help="torch threads (default 1: one CPU rank is one core)")
    m.add_argument("--warmup", type=_non_negative_int, default=3, metavar="N")
    m.add_argument("--repeats", type=_positive_int, default=15, metavar="N",
                   help="timed samples per row")
    m.add_argument("--collectives", action="store_true",
                   help="also measure collectives across --nprocs local processes")
    m.add_argument("--nprocs", type=_positive_int, default=2, metavar="N")
    m.add_argument("--min-bytes", type=_bytes, default=1024, metavar="SIZE")
    m.add_argument("--max-bytes", type=_bytes, default=256 * 1024**2, metavar="SIZE")
    m.add_argument("-o", "--output", required=True, metavar="FILE", help="the profile (.csv)")


def _build_parser() -> argparse.ArgumentParser:
    from planner.layout import SCHEDULES

    parser = _Parser(prog="plan", description="Plan LLM training on the GPUs you have: "
                     "search for the best configuration, simulate one, measure a profile, "
                     "run a plan, list models and GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="predict one training iteration of a configuration",
                         description="Predict iteration time, throughput, MFU, time breakdown "
                         "and per-rank memory of one parallel configuration (the flags), or "
                         "of a Plan file (--plan).")
    _add_model_args(sim, plan=True)
    _add_cluster_args(sim, required=False)
    for flag, default, text in (("--tp", None, "tensor-parallel degree"),
                                ("--pp", None, "pipeline stages"),
                                ("--dp", None, "data-parallel replicas"),
                                ("--cp", 1, "context-parallel degree"),
                                ("--vp", 1, "interleaved chunks per stage (interleaved 1F1B)"),
                                ("--mbs", None, "micro-batch size"),
                                ("--gbs", None, "global batch size (sequences)")):
        sim.add_argument(flag, type=_positive_int, default=default, metavar="N",
                         help=text + (" (required without --plan)" if default is None else ""))
    sim.add_argument("--seq", type=_positive_int, metavar="N",
                     help="sequence length (default: the model's)")
    sim.add_argument("--recompute", choices=("none", "selective", "full"),
                     help="activation recomputation (default none)")
    sim.add_argument("--sequence-parallel", action="store_true")
    sim.add_argument("--schedule", choices=SCHEDULES,
                     help="pipeline schedule, default 1f1b (with --vp > 1: interleaved 1F1B; zb-h1: "
                     "zero-bubble ZB-H1, Qi et al. 2024, needs --pp > 1 and --vp 1)")
    shard = sim.add_mutually_exclusive_group()
    shard.add_argument("--sharding", choices=("none", "zero1", "zero2", "zero3"),
                       help="ZeRO stage (a point of the sharding space)")
    shard.add_argument("--shard-params", type=_positive_int, metavar="N",
                       help="replicas sharing one copy of the parameters (AMSP)")
    sim.add_argument("--shard-grads", type=_positive_int, metavar="N",
                     help="replicas sharing one copy of the gradients")
    sim.add_argument("--shard-optim", type=_positive_int, metavar="N",
                     help="replicas sharing one copy of the optimizer states")
    sim.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default bf16")
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

    from planner.commands.search import add_search_parser

    add_search_parser(sub, _add_model_args, _add_cluster_args, _positive_int)
    from planner.commands.export import add_export_parser

    add_export_parser(sub)
    from planner.commands.whatif import add_whatif_parser

    add_whatif_parser(sub, _add_model_args, _add_cluster_args, _positive_int)
    _add_profile_parser(sub)
    from planner.commands.run import add_run_parser

    add_run_parser(sub, _positive_int)

    models = sub.add_parser("models", help="list the model presets")
    models.add_argument("--json", action="store_true")
    gpus = sub.add_parser("gpus", help="list the device catalog")
    gpus.add_argument("--json", action="store_true")
    return parser


_PROFILE_VERBS = ("measure", "show", "fit", "-h", "--help")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["profile"] and argv[1:2] and argv[1] not in _PROFILE_VERBS:
        argv.insert(1, "measure")  # `plan profile --device cpu ...` measures
    args = _build_parser().parse_args(argv)
    args.argv = argv
    try:
        if args.command == "simulate":
            from planner.commands.simulate import run_simulate

            return run_simulate(args)
        if args.command == "search":
            from planner.commands.search import run_search

            return run_search(args)
        if args.command == "what-if":
            from planner.commands.whatif import run_whatif

            return run_whatif(args)
        if args.command == "export":
            from planner.commands.export import run_export

            return run_export(args)
        if args.command == "profile":
            from planner.commands.profile import run_profile

            return run_profile(args)
        if args.command == "run":
            from planner.commands.run import run_run

            return run_run(args)
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
