"""Which checkpoints a folder holds, without torch: the step folders a save renames into
place (`step-00000050`) and the marker a finished save writes (COMPLETE.json). `plan run`
reads them before launching (executor/checkpoint.py writes and verifies them)."""

from __future__ import annotations

import os
import re

__all__ = ["COMPLETE", "latest_complete", "step_folders"]

COMPLETE = "COMPLETE.json"
_STEP_DIR = re.compile(r"step-(\d{8})")


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
