"""What several commands read the same way: the model and cluster flags, measured
profiles for a cluster's GPUs, and a Plan stamped with its prediction."""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from dataclasses import replace

from planner.predict.results import SimResult
from planner.specs.cluster import ClusterSpec, load_cluster, parse_gpus_arg
from planner.specs.model import ModelSpec, load_model, preset
from planner.specs.plan import Plan, Predicted, Provenance
from profiler.devices import DeviceSpec, load_catalog
from profiler.store import Profiles, load_profiles

__all__ = ["extra_catalog", "input_files", "load_cluster_arg", "load_inputs", "load_model_arg", "profiles_for",
           "with_prediction"]


def input_files(args: argparse.Namespace) -> dict[str, str | None]:
    """The files a command reads, by flag (an output must not be one of them: writing a
    plan over the --cluster file replaced the user's cluster)."""
    out: dict[str, str | None] = {flag: getattr(args, name, None) for flag, name in (
        ("--cluster", "cluster"), ("--model-file", "model_file"), ("--catalog", "catalog"))}
    for i, path in enumerate(getattr(args, "profile", None) or []):
        out["--profile" + (f" ({i + 1})" if i else "")] = path
    return out


def extra_catalog(args: argparse.Namespace) -> dict[str, DeviceSpec] | None:
    """The device types of `--catalog FILE` (None without it)."""
    path = getattr(args, "catalog", None)
    return load_catalog(path) if path is not None else None


def load_inputs(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec]:
    """The model (--model or --model-file) and cluster (--gpus or --cluster, with
    --catalog) flags; an empty file name is a file name (and refused as one), not a
    missing flag."""
    return load_model_arg(args), load_cluster_arg(args)


def load_model_arg(args: argparse.Namespace) -> ModelSpec:
    if args.model_file is not None:
        return load_model(args.model_file)
    return preset(args.model, where="--model")


def load_cluster_arg(args: argparse.Namespace) -> ClusterSpec:
    catalog = extra_catalog(args)
    if args.cluster is not None:
        return load_cluster(args.cluster, catalog=catalog)
    return parse_gpus_arg(args.gpus, catalog=catalog)


def profiles_for(args: argparse.Namespace, cluster: ClusterSpec, dtype: str) -> Profiles | None:
    """The measured profiles (`--profile FILE|DIR`, repeatable) for the cluster's GPUs."""
    if not args.profile:
        return None
    devices = sorted({g.device.name for g in cluster.node_groups})
    profiles = load_profiles(args.profile, devices=devices, dtype=dtype)
    name = getattr(args, "command", None)
    for note in profiles.notes:
        print(f"{f'plan {name}' if name else 'plan'}: note: {note}", file=sys.stderr)
    return profiles


def with_prediction(plan: Plan, result: SimResult, *, command: list[str],
                    profiles: Profiles | None = None) -> Plan:
    """The plan with its predicted metrics and where they came from."""
    predicted = Predicted(
        iteration_time_s=result.iteration_time_s, tokens_per_s=result.tokens_per_s,
        tflops_per_gpu_model=result.tflops_per_gpu_model, mfu=result.mfu,
        peak_memory_bytes=tuple(int(s.memory.total_bytes) for s in result.stages
                                if s.pipeline == 0),
        fits=result.fits, sources=dict(result.sources))
    from planner import __version__

    provenance = Provenance(tool=f"trainplan {__version__}",
                            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                            command=shlex.join(command),
                            profile=" + ".join(profiles.paths) if profiles and profiles.paths
                            else None)
    return replace(plan, predicted=predicted, provenance=provenance)
