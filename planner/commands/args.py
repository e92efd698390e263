"""What every command's parser shares: one-line errors, typed flags, model and cluster
arguments, and JSON output. Commands import this module, never `planner.cli`."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from planner.export.frameworks import CAPABILITIES
from planner.specs.cluster import TRAIN_DTYPES
from planner.specs.limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, MAX_TOKENS, MAX_USD
from profiler.schema import one_line, short_repr

__all__ = ["Parser", "add_batch_args", "add_catalog_arg", "add_cluster_args", "add_framework_arg",
           "add_model_args", "budget_arg", "bytes_arg", "gbs_arg", "gib_arg", "int_in",
           "int_list", "int_list_in", "name_list", "non_negative_int", "number_in", "path_arg",
           "positive_int", "print_json", "seq_arg", "tokens_arg"]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), and a word that starts with a minus and a
    digit taken as a value, never a flag (no flag starts with a digit): argparse's own
    pattern knows only -5 and -.5, so `--tokens -1e9` or `--without -1:H100` read as a
    flag said "expected one argument" instead of naming what the value may be."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")


MAX_INT_FLAG = 2**31 - 1  # the largest integer any flag takes


def int_in(low: int, high: int = MAX_INT_FLAG) -> Callable[[str], int]:
    """An argparse type: an ASCII integer in [low, high]."""

    def parse(text: str) -> int:
        if re.fullmatch(r"\s*[+-]?[0-9]{20,}\s*", text):  # a whole number, far out of range
            bound = f"≥ {low}" if text.strip().startswith("-") else f"≤ {high:,}"
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not allowed (must be "
                                             f"{bound})")
        if not re.fullmatch(r"\s*[+-]?[0-9]{1,19}\s*", text):
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not an integer")
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not allowed (must be ≥ {low})")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value} is not allowed (must be ≤ {high:,})")
        return value

    parse.__name__ = "integer"
    return parse


def number_in(*, high: float, low: float | None = None, gt: float | None = None
              ) -> Callable[[str], float]:
    """An argparse type: a finite ASCII number, ≥ low (or > gt) and ≤ high."""

    def parse(text: str) -> float:
        try:
            value = float(text) if text.isascii() else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not allowed (a finite "
                                             "number)")
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{value!r} is not allowed (must be ≥ {low:g})")
        if gt is not None and value <= gt:
            raise argparse.ArgumentTypeError(f"{value!r} is not allowed (must be > {gt:g})")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value!r} is not allowed (must be ≤ {high:g})")
        return value

    parse.__name__ = "number"
    return parse


def path_arg(text: str) -> str:
    """An argparse type: a file or folder name (an empty one is refused, not ignored)."""
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not allowed (a file name)")
    return text


positive_int = int_in(1)
non_negative_int = int_in(0)
gbs_arg = int_in(1, MAX_GLOBAL_BATCH)
seq_arg = int_in(1, MAX_SEQ_LEN)
tokens_arg = number_in(gt=0, high=MAX_TOKENS)
budget_arg = number_in(gt=0, high=MAX_USD)


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
    g.add_argument("--model-file", type=path_arg, metavar="FILE", help="a ModelSpec YAML file")
    if plan:
        g.add_argument("--plan", type=path_arg, metavar="FILE",
                       help="a Plan (.yaml/.json) to predict as it "
                       "is (heterogeneous ones too); it brings its model, cluster and layout, "
                       "and the settings only a plan file has (training.pipeline_flushes: "
                       "pipeline schedules per step; training.master_weights: false for "
                       "16-bit states without an fp32 master copy)")


def add_cluster_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--gpus", metavar="TYPE:COUNT[,...]",
                   help="GPUs in their types' standard nodes on one network, e.g. "
                   "A100-80GB-SXM:64 or A100-80GB-SXM:32,V100-32GB-SXM2:64 (types whose "
                   "nodes have different NICs: a --cluster file)")
    g.add_argument("--cluster", type=path_arg, metavar="FILE", help="a ClusterSpec YAML file")
    add_catalog_arg(p)


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """--gbs, --seq and --dtype of a search (`plan search`, each `plan what-if` scenario)."""
    p.add_argument("--gbs", type=gbs_arg, required=True, metavar="N",
                   help="global batch size (sequences)")
    p.add_argument("--seq", type=seq_arg, metavar="N", help="sequence length (default: "
                   "the model's)")
    p.add_argument("--dtype", choices=TRAIN_DTYPES,
                   help="training dtype (default: bf16 where every GPU type has it, else fp16; "
                   "a framework that plans each type alone: one some type has)")


def add_catalog_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", type=path_arg, metavar="FILE", help="GPU types to add to the "
                   "catalog or override in it (the format of `plan gpus --json`; `plan profile "
                   "fit -o` writes one)")


def add_framework_arg(p: argparse.ArgumentParser, *,
                      default_words: str = "default trainplan, this project's executor"
                      ) -> None:
    """--framework: plan only what that framework, at the version trainplan targets, runs."""
    p.add_argument("--framework", choices=tuple(CAPABILITIES), default="trainplan",
                   help="plan only what this framework runs, at the version named in "
                   "planner/export/frameworks.py: " + "; ".join(
                       f"{c.name}: {c.version}" for c in CAPABILITIES.values())
                   + f" ({default_words})")


_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def bytes_arg(text: str) -> int:
    """"256MB", "1KB", "4096" -> bytes (binary units, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*([0-9]{1,15})\s*([KMG]?B?)\s*", text.upper())
    if not m or m.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1KB, 16MB, 1GB)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def int_list_in(high: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: up to 64 comma-separated ASCII integers, each in [1, high]."""

    def parse(text: str) -> tuple[int, ...]:
        words = text.split(",")
        if len(words) > 64 or not all(re.fullmatch(r"\s*[+-]?[0-9]{1,9}\s*", w)
                                      for w in words):
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not a comma-separated "
                                             "list of at most 64 integers")
        values = tuple(int(v) for v in words)
        if any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not allowed (each must be "
                                             "≥ 1)")
        if any(v > high for v in values):
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not allowed (each must be "
                                             f"≤ {high:,})")
        return values

    parse.__name__ = "list"
    return parse


int_list = int_list_in(MAX_INT_FLAG)


def name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def print_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")
