"""Distributed checkpoints with torch.distributed.checkpoint (DCP): in a form every layout
loads, never half-taken, never trusted blindly.

Writing. A checkpoint of step n is written by all ranks into `<dir>/step-<n>.tmp/` in
the layout-independent form of executor/checkpoint_layout.py (whole-model parameter
names, each rank's boxes of them). Once every rank has finished, the ranks hash the files
(SHA-256, each rank a share of them) and rank 0 writes `COMPLETE.json`: the step, the
model, the layout that wrote it, and the size and SHA-256 of every file; it syncs the
marker and renames the folder to `<dir>/step-<n>/`, an atomic operation on one file
system. A folder still named `.tmp` is a save that never finished: never resumed from.

Resuming (`resume`), newest checkpoint first, one is taken only if

1. its marker reads (JSON: nothing is unpickled) and is for this model (a checkpoint of
   another model is refused outright: one line naming what differs);
2. every file the marker lists has its size and SHA-256 (the ranks share the hashing),
   before anything is unpickled: a damaged, truncated or replaced file is found here;
3. DCP's `.metadata`, a pickle, unpickles with nothing but DCP's metadata classes
   allowed (a crafted pickle under a marker made to match it runs nothing) and points
   only into the listed files;
4. it holds every element this layout's ranks ask for.

Else the next older one is tried. Rank 0 says in one line which checkpoint the run
resumes from, which newer ones it skipped and why, and whether it reshards (written under
another layout: DCP reads each rank's boxes from whichever ranks wrote them). When
checkpoints exist but none is intact the run refuses (`CheckpointError`, one line) rather
than start over at step 1: that would overwrite the damaged checkpoints someone may want
to repair or inspect, and a user who asked to resume does not expect to lose the run's
progress silently. Moving the folder away starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from executor.checkpoint_dirs import (
    COMPLETE,
    FORMAT,
    METADATA,
    CheckpointError,
    file_digest,
    file_problems,
    latest_complete,
    model_problem,
    read_marker,
    step_folders,
)
from executor.checkpoint_layout import LoadPieces, Piece, SavePieces, check_pieces
from planner.specs.plan import Plan, describe_layout, plan_to_dict

__all__ = ["COMPLETE", "CheckpointError", "Resumed", "fingerprint", "latest_complete",
           "read_marker", "read_metadata", "resume", "save", "step_folders"]


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


# ---- DCP's metadata, unpickled with an allow-list -------------------------------------
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib._local", "PosixPath"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *((_DCP_METADATA, n) for n in ("Metadata", "MetadataIndex", "ChunkStorageMetadata",
                                   "TensorStorageMetadata", "TensorProperties", "StorageMeta",
                                   "_MEM_FORMAT_ENCODING")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch sizes and dtypes, and nothing else: a pickle
    naming any other callable (os.system, builtins.exec, ...) is refused unrun."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


def read_metadata(path: str, files: dict[str, dict]) -> Metadata:
    """DCP's metadata of a checkpoint whose files were verified against `files`,
    unpickled with the allow-list, and pointing only into those files."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    try:
        with open(os.path.join(path, METADATA), "rb") as fh:
            md = _MetadataUnpickler(fh).load()
    except Exception as err:  # any malformed pickle: refuse it, say how it failed
        raise CheckpointError(f"{METADATA} does not unpickle as DCP metadata "
                              f"({type(err).__name__}: {str(err)[:120]})") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict) \
            or not isinstance(md.storage_data, dict):
        raise CheckpointError(f"{METADATA} is not DCP metadata")
    if not all(isinstance(k, str) and isinstance(v, TensorStorageMetadata)
               for k, v in md.state_dict_metadata.items()):
        raise CheckpointError(f"{METADATA} lists something other than tensors")
    for info in md.storage_data.values():
        if not isinstance(info, _StorageInfo) or info.relative_path not in files:
            where = getattr(info, "relative_path", info)
            raise CheckpointError(f"{METADATA} points at {where!r}, not a file of {COMPLETE}")
    return md


class _VerifiedReader(FileSystemReader):
    """DCP's file reader with the metadata read (and checked) already: DCP unpickles
    nothing itself (the tensors it reads with torch.load(weights_only=True))."""

    def __init__(self, path: str, metadata: Metadata) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError("no rank-local metadata in a trainplan checkpoint")
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


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


def _everyones(obj: object) -> list:
    world = _rank_world()[1]
    if world == 1:
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _barrier() -> None:
    if _rank_world()[1] > 1:
        dist.barrier()


# ---- save -------------------------------------------------------------------------------
def save(root: str, step: int, pieces: list[Piece], *, plan: Plan,
         run: dict[str, float] | None = None) -> str:
    """Write this rank's `pieces` (executor/checkpoint_layout.py) as the checkpoint after
    `step` steps; returns its folder. Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp

    rank, world = _rank_world()
    final = _step_dir(root, step)
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier()
    dcp.save({}, storage_writer=FileSystemWriter(tmp), planner=SavePieces(pieces))
    names = _from_rank0(sorted(os.listdir(tmp)) if rank == 0 else None)
    assert isinstance(names, list)
    digests = _everyones({n: file_digest(os.path.join(tmp, n)) for n in names[rank::world]})
    if rank == 0:
        files = {n: d for share in digests for n, d in share.items()}
        marker = {"format": FORMAT, "step": step, "model": plan_to_dict(plan)["model"],
                  "plan": fingerprint(plan), "layout": describe_layout(plan),
                  "files": dict(sorted(files.items())), **(run or {})}
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


def _intact(path: str, step: int, pieces: list[Piece], plan: Plan
            ) -> tuple[dict, Metadata] | str:
    """The marker and metadata of the checkpoint in `path` if it is intact, else why not
    (collective: the ranks share the hashing and agree)."""
    rank, world = _rank_world()
    try:
        marker: dict | str = read_marker(path, step) if rank == 0 else ""
    except CheckpointError as err:
        marker = str(err)
    marker = _from_rank0(marker)  # type: ignore[assignment]
    if isinstance(marker, str):
        return marker
    refused = model_problem(marker, plan, path)
    if refused:
        raise CheckpointError(refused)
    names = sorted(marker["files"])
    problems = [p for share in _everyones(file_problems(path, marker["files"],
                                                        names[rank::world])) for p in share]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0] + more
    md: Metadata | None = None
    try:  # only now, with every file as written: the metadata pickle
        md = read_metadata(path, marker["files"])
        why = check_pieces(pieces, md)
    except CheckpointError as err:
        why = str(err)
    whys = [w for w in _everyones(why) if w]
    if whys:
        return whys[0]
    assert md is not None
    return marker, md


def resume(root: str, pieces: list[Piece], *, plan: Plan) -> Resumed | None:
    """Load the newest intact checkpoint under `root` into this rank's `pieces` (in
    place); None if there is no checkpoint. Collective. Raises CheckpointError (one line)
    when checkpoints exist but none is intact, or they hold another model."""
    import torch.distributed.checkpoint as dcp

    folders = _from_rank0(step_folders(root) if _rank_world()[0] == 0 else None)
    assert isinstance(folders, list)
    if not folders:
        return None
    skipped = []
    for step, path in folders:
        found = _intact(path, step, pieces, plan)
        if isinstance(found, str):
            skipped.append(f"step {step}: {found}")
            continue
        marker, md = found
        dcp.load({}, storage_reader=_VerifiedReader(path, md), planner=LoadPieces(pieces))
        note = f"resume: from step {step} ({path})"
        if skipped:
            note += f"; skipped {'; '.join(skipped)}"
        if marker["plan"] != fingerprint(plan):
            note += f"; resharded from {marker['layout']}"
        return Resumed(step=step, path=path, note=note)
    raise CheckpointError(f"no intact checkpoint in {root} ({'; '.join(skipped)}); move it "
                          "away to start at step 1")
