"""Distributed checkpoints with torch.distributed.checkpoint (DCP), in a form every layout
loads, never half-taken.

A checkpoint of step n is written by all ranks into `<dir>/step-<n>.tmp/` in the
layout-independent form of executor/checkpoint_layout.py (whole-model parameter names,
each rank's boxes of them). Once every rank has finished, rank 0 writes `COMPLETE.json`
(the step, the model, the layout that wrote it), syncs it, and renames the folder to
`<dir>/step-<n>/`, an atomic operation on one file system. A folder without the marker,
or still named `.tmp`, is never resumed from: a crash while writing leaves the previous
checkpoint the latest complete one.

Resuming (`resume`) loads the newest complete checkpoint under any layout of the same
model (DCP reads each rank's boxes from whichever ranks wrote them); a checkpoint of
another model is refused in one line naming what differs. Rank 0 says in one line which
checkpoint the run resumes from and whether it reshards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from executor.checkpoint_layout import LoadPieces, Piece, SavePieces, check_pieces
from planner.specs.plan import Plan, describe_layout, plan_to_dict

__all__ = ["COMPLETE", "CheckpointError", "Resumed", "fingerprint", "latest_complete",
           "resume", "save", "step_folders"]

COMPLETE = "COMPLETE.json"
FORMAT = "trainplan-checkpoint/2"  # layout-independent
_STEP_DIR = re.compile(r"step-(\d{8})")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, said in one line."""


def fingerprint(plan: Plan) -> str:
    """What a rank's share of a checkpoint depends on: the model, the layout, the
    sharding (equal fingerprints: no resharding)."""
    data = plan_to_dict(plan)
    keep = {k: data.get(k) for k in ("model", "sharding", "stage_sharding")}
    keep["stages"] = [[[*s.layers, s.tp] for s in p.stages] for p in plan.pipelines]
    keep["virtual_stages"] = plan.training.virtual_stages
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def _step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def step_folders(root: str) -> list[tuple[int, str]]:
    """(step, folder) of every finished save under `root` (renamed from `.tmp`; with a
    marker or not), newest first."""
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root)
             if (m := _STEP_DIR.fullmatch(name)) and os.path.isdir(os.path.join(root, name))]
    return sorted(found, reverse=True)


def latest_complete(root: str) -> tuple[int, str] | None:
    """(step, folder) of the newest checkpoint under `root` that has its marker (not yet
    verified: `resume` does that)."""
    return next(((s, p) for s, p in step_folders(root)
                 if os.path.isfile(os.path.join(p, COMPLETE))), None)


def _read_marker(path: str) -> dict:
    with open(os.path.join(path, COMPLETE), encoding="utf-8") as fh:
        marker = json.load(fh)
    if marker.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} checkpoint (written by an older "
                              "trainplan, or not by it)")
    return marker


# ---- collectives (one process without a process group: world 1) -------------------------
def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _from_rank0(obj: object) -> object:
    if _rank_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    if _rank_world()[1] > 1:
        dist.barrier()


# ---- save -------------------------------------------------------------------------------
def save(root: str, step: int, pieces: list[Piece], *, plan: Plan) -> str:
    """Write this rank's `pieces` (executor/checkpoint_layout.py) as the checkpoint after
    `step` steps; returns its folder. Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp

    rank = _rank_world()[0]
    final = _step_dir(root, step)
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    dcp.save({}, storage_writer=FileSystemWriter(tmp), planner=SavePieces(pieces))
    _barrier()
    if rank == 0:
        marker = {"format": FORMAT, "step": step, "model": plan_to_dict(plan)["model"],
                  "plan": fingerprint(plan), "layout": describe_layout(plan)}
        with open(os.path.join(tmp, COMPLETE), "w", encoding="utf-8") as fh:
            json.dump(marker, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(root)
    _barrier()
    return final


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- resume -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Resumed:
    step: int  # steps the checkpoint had done
    path: str
    note: str  # the one line the run says


def _model_problem(marker: dict, plan: Plan, path: str) -> str | None:
    """One line if the checkpoint holds another model than the plan trains."""
    theirs, ours = marker["model"], plan_to_dict(plan)["model"]
    differ = [f"{k} {theirs.get(k)!r} there, {ours.get(k)!r} here"
              for k in sorted(set(theirs) | set(ours)) if k != "name"
              and theirs.get(k) != ours.get(k)]
    if not differ:
        return None
    return (f"{path} holds model {theirs.get('name')!r}, this plan trains "
            f"{ours.get('name')!r} ({'; '.join(differ)}): resume with the model it was "
            "written for, or another --checkpoint-dir")


def resume(root: str, pieces: list[Piece], *, plan: Plan) -> Resumed | None:
    """Load the newest complete checkpoint under `root` into this rank's `pieces` (in
    place); None if there is none. Collective. Raises CheckpointError (one line) when it
    holds another model."""
    import torch.distributed.checkpoint as dcp

    found = _from_rank0(latest_complete(root) if _rank_world()[0] == 0 else None)
    if found is None:
        return None
    assert isinstance(found, tuple)
    step, path = found
    marker = _read_marker(path)
    refused = _model_problem(marker, plan, path)
    if refused:
        raise CheckpointError(refused)
    reader = FileSystemReader(path)
    why = check_pieces(pieces, reader.read_metadata())
    if why:
        raise CheckpointError(f"{path} cannot be loaded: {why}")
    dcp.load({}, storage_reader=reader, planner=LoadPieces(pieces))
    note = f"resume: from step {step} ({path})"
    if marker["plan"] != fingerprint(plan):
        note += f"; resharded from {marker['layout']}"
    return Resumed(step=step, path=path, note=note)
