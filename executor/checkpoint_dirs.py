"""Which checkpoints a folder holds, without torch: the step folders a save renames into
place (`step-00000050`), the marker a finished save writes (COMPLETE.json) with the model,
the run's seed and learning rate and each file's SHA-256. `plan run` reads them before
launching (`resume_point`); executor/checkpoint.py writes them and verifies them again on
every rank."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from planner.specs.plan import Plan, plan_to_dict

__all__ = ["COMPLETE", "CheckpointError", "ResumePoint", "file_digest", "file_problems",
           "latest_complete", "model_problem", "read_marker", "resume_point", "step_folders"]

COMPLETE = "COMPLETE.json"
_STEP_DIR = re.compile(r"step-(\d{8})")
FORMAT = "trainplan-checkpoint/2"  # layout-independent, with file hashes
METADATA = ".metadata"  # DCP's (a pickle)
MAX_MARKER_BYTES = 16 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILE = re.compile(r"[A-Za-z0-9_.-]+")  # a plain name inside the folder


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, said in one line."""


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


def file_digest(path: str) -> dict[str, int | str]:
    """The SHA-256 and size of the file at `path`, as the marker records them."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            sha.update(block)
            size += len(block)
    return {"sha256": sha.hexdigest(), "bytes": size}


def read_marker(path: str, step: int) -> dict:
    """The marker of the checkpoint of `step` in `path`, checked; CheckpointError says
    what is wrong with it."""
    file = os.path.join(path, COMPLETE)
    if not os.path.isfile(file):
        raise CheckpointError(f"no {COMPLETE}")
    if os.path.getsize(file) > MAX_MARKER_BYTES:
        raise CheckpointError(f"{COMPLETE} is over {MAX_MARKER_BYTES} bytes")
    try:
        with open(file, encoding="utf-8") as fh:
            marker = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{COMPLETE} does not read ({type(err).__name__})") from None
    problem = _marker_problem(marker, step)
    if problem:
        raise CheckpointError(f"{COMPLETE}: {problem}")
    return marker


def _marker_problem(marker: object, step: int) -> str | None:
    if not isinstance(marker, dict) or marker.get("format") != FORMAT:
        return f"not a {FORMAT} marker (written by an older trainplan, or not by it)"
    if marker.get("step") != step:
        return f"step {marker.get('step')!r}, the folder's is {step}"
    if not isinstance(marker.get("model"), dict) or not isinstance(marker.get("plan"), str) \
            or not isinstance(marker.get("layout"), str):
        return "model, plan or layout missing"
    files = marker.get("files")
    if not isinstance(files, dict) or METADATA not in files:
        return f"no file list with {METADATA}"
    for name, info in files.items():
        if not _FILE.fullmatch(name) or name in (".", "..", COMPLETE):
            return f"file name {name!r} is not a plain name in the folder"
        if not isinstance(info, dict) or not _SHA256.fullmatch(str(info.get("sha256"))) \
                or type(info.get("bytes")) is not int or info["bytes"] < 0:
            return f"{name}: no SHA-256 and size"
    return None


def file_problems(path: str, files: dict[str, dict], names: list[str]) -> list[str]:
    """What differs, among `names`, between the folder's files and the marker's `files`."""
    out = []
    for name in names:
        file, want = os.path.join(path, name), files[name]
        if os.path.islink(file) or not os.path.isfile(file):
            out.append(f"{name} is missing")
        elif (size := os.path.getsize(file)) != want["bytes"]:
            out.append(f"{name} is {size} bytes, {COMPLETE} says {want['bytes']}")
        elif file_digest(file)["sha256"] != want["sha256"]:
            out.append(f"{name} differs from its SHA-256 in {COMPLETE}")
    return out


def model_problem(marker: dict, plan: Plan, path: str) -> str | None:
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


@dataclass(frozen=True)
class ResumePoint:
    step: int
    path: str
    marker: dict


def resume_point(root: str, plan: Plan, *, verify: Callable[[int], bool]) -> ResumePoint | None:
    """The checkpoint under `root` that a resume of `plan` takes, chosen as the ranks
    choose it: newest first, one whose marker does not read skipped, one of another model
    refused (CheckpointError), its files hashed only where `verify(step)` (the ranks hash
    every one they load; `plan run` hashes before refusing a run by that step). None:
    nothing to resume."""
    for step, path in step_folders(root):
        try:
            marker = read_marker(path, step)
        except CheckpointError:
            continue
        refused = model_problem(marker, plan, path)
        if refused:
            raise CheckpointError(refused)
        if verify(step) and file_problems(path, marker["files"], sorted(marker["files"])):
            continue
        return ResumePoint(step, path, marker)
    return None
