"""Where outputs go. Every output path is checked before any work starts (so a refused
run never touches an existing file), and every file is written under a temporary name in
its own folder, then renamed over the target: a reader, an interrupted run or a run that
fails half-way never leaves half a file, and an old file stays until the new one is whole.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping

from profiler.schema import NAME_MAX_BYTES, atomic_path, fail

__all__ = ["PICTURE_SUFFIXES", "PLAN_SUFFIXES", "atomic_path", "check_distinct",
           "check_output_dir", "check_output_file", "write_text"]

PLAN_SUFFIXES = (".yaml", ".yml", ".json")
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")  # what matplotlib writes by extension


def check_output_file(path: str | None, *, flag: str,
                      suffixes: tuple[str, ...] | None = None) -> None:
    """A file we may write: a name with an allowed suffix, in a folder that exists and is
    writable, not a folder itself nor a device or other special file."""
    if path is None:
        return
    if not path or "\0" in path:
        fail(flag, path, "a file name")
    _check_name_lengths(path, flag)
    if suffixes and os.path.splitext(path)[1].lower() not in suffixes:
        fail(flag, path, f"a {', '.join(suffixes)} file")
    if os.path.isdir(path):
        fail(flag, path, "a file, not a folder")
    if os.path.lexists(path) and not os.path.isfile(path):
        fail(flag, path, "a regular file (this is a special file or a broken link)")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        fail(flag, path, f"folder {folder!r} does not exist")
    _check_writable(folder, flag, path)


def check_output_dir(path: str | None, *, flag: str) -> None:
    """A folder we may write into (created if missing): not a file, and its nearest
    existing ancestor is a writable folder."""
    if path is None:
        return
    if not path or "\0" in path:
        fail(flag, path, "a folder name")
    _check_name_lengths(path, flag)
    if os.path.lexists(path) and not os.path.isdir(path):
        fail(flag, path, "a folder, not a file")
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        fail(flag, path, f"{existing!r} is a file, not a folder")
    _check_writable(existing, flag, path)


def _check_name_lengths(path: str, flag: str) -> None:
    """Every name along `path` within the file system's limit: a longer one failed with
    a traceback once the work was done."""
    for name in path.split(os.sep):
        if len(name.encode(errors="surrogateescape")) > NAME_MAX_BYTES:
            fail(flag, path, f"names of at most {NAME_MAX_BYTES} bytes each, the file "
                 f"system's limit; one here has {len(name.encode(errors='surrogateescape'))}")


def _check_writable(folder: str, flag: str, path: str) -> None:
    """That a file can be made in `folder`, tried (a temporary file, removed at once):
    permission bits do not tell a pseudo file system (/proc, /sys), a read-only mount or a
    full disk, where the write failed after all the work with a traceback."""
    if not os.access(folder, os.W_OK | os.X_OK):
        fail(flag, path, f"folder {folder!r} is not writable")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".trainplan-probe-")
    except OSError as err:
        fail(flag, path, f"folder {folder!r} is not writable ({err.strerror or err})")
    os.close(fd)
    with contextlib.suppress(OSError):
        os.remove(probe)


def check_distinct(paths: Mapping[str, str | None]) -> None:
    """No two outputs (flag -> path) name the same file."""
    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen:
            fail(flag, path, f"the same file as {seen[real]}")
        seen[real] = flag


def write_text(path: str, text: str) -> None:
    """Write a text file atomically (UTF-8)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
