"""Distributed checkpoints with torch.distributed.checkpoint (DCP), never half-taken.

A checkpoint of step n is written by all ranks into `<dir>/step-<n>.tmp/`; once every rank
has finished, rank 0 writes `COMPLETE.json` (step and plan fingerprint) into it, syncs it,
and renames the folder to `<dir>/step-<n>/`, an atomic operation on one file system. A
folder without the marker, or still named `.tmp`, is never resumed from: a crash while
writing leaves the previous checkpoint the latest complete one.

What is saved is each rank's optimizer shard (master weights and AdamW moments, see
executor/data_parallel.py): replicas holding the same shard save it once (DCP keeps one
copy of equal keys). A checkpoint resumes the plan it was written by (the fingerprint is
checked), on any number of restarts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable

import torch

from planner.specs.plan import Plan, plan_to_dict

__all__ = ["COMPLETE", "fingerprint", "latest_complete", "load", "save"]

COMPLETE = "COMPLETE.json"
_STEP_DIR = re.compile(r"step-(\d{8})")


def fingerprint(plan: Plan) -> str:
    """What a checkpoint's layout depends on: the model, the layout, the sharding."""
    data = plan_to_dict(plan)
    keep = {k: data[k] for k in ("model", "pipelines", "sharding")}
    keep["virtual_stages"] = plan.training.virtual_stages
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def _step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def latest_complete(root: str) -> tuple[int, str] | None:
    """(step, folder) of the newest complete checkpoint under `root`, if any."""
    best: tuple[int, str] | None = None
    if not os.path.isdir(root):
        return None
    for name in os.listdir(root):
        m = _STEP_DIR.fullmatch(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, COMPLETE)):
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, path)
    return best


def read_marker(path: str) -> dict:
    with open(os.path.join(path, COMPLETE), encoding="utf-8") as fh:
        return json.load(fh)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(root: str, step: int, state: dict[str, torch.Tensor], *, rank: int, plan_id: str,
         barrier: Callable[[], None]) -> str:
    """Write `state` (every rank's) as the checkpoint after `step` steps; returns its
    folder. Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp

    final = _step_dir(root, step)
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    barrier()
    dcp.save(state, checkpoint_id=tmp)
    barrier()
    if rank == 0:
        with open(os.path.join(tmp, COMPLETE), "w", encoding="utf-8") as fh:
            json.dump({"step": step, "plan": plan_id}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(root)
    barrier()
    return final


def load(path: str, state: dict[str, torch.Tensor], *, plan_id: str) -> int:
    """Load a complete checkpoint into `state`'s tensors in place; returns its step."""
    import torch.distributed.checkpoint as dcp

    marker = read_marker(path)
    if marker["plan"] != plan_id:
        raise ValueError(f"{path} was written by another plan (fingerprint {marker['plan']},"
                         f" this plan's is {plan_id}); resume with the plan that wrote it")
    dcp.load(state, checkpoint_id=path)
    return int(marker["step"])
