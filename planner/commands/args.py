"""What every command's parser shares: one-line errors, typed flags, model and cluster
arguments, and JSON output. Commands import this module, never `planner.cli`."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import NoReturn

__all__ = ["Parser", "add_cluster_args", "add_model_args", "bytes_arg", "gib_arg", "int_list",
           "name_list", "non_negative_int", "positive_int", "print_json"]


class Parser(argparse.ArgumentParser):
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


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def gib_arg(text: str) -> float:
    """A finite amount of memory in GiB, ≥ 0 (as bytes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB") from None
    if not 0 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"{text} is not allowed (GiB from 0 to 1e6)")
    return value * 1024**3


def add_model_args(p: argparse.ArgumentParser, *, required: bool = True,
                   plan: bool = False) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--model", metavar="NAME", help="a preset (see `plan models`)")
    g.add_argument("--model-file", metavar="FILE", help="a ModelSpec YAML file")
    if plan:
        g.add_argument("--plan", metavar="FILE", help="a Plan (.yaml/.json) to predict as it "
                       "is (heterogeneous ones too); it brings its model, cluster and layout")


def add_cluster_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--gpus", metavar="TYPE:COUNT",
                   help="a homogeneous cluster of standard nodes, e.g. A100-80GB-SXM:64")
    g.add_argument("--cluster", metavar="FILE", help="a ClusterSpec YAML file")


_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def bytes_arg(text: str) -> int:
    """"256MB", "1KB", "4096" -> bytes (binary units, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?B?)\s*", text.upper())
    if not m or m.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1KB, 16MB, 1GB)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed (each must be ≥ 1)")
    return values


def name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def print_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")
