"""Progress of long work on stderr, drawn by tqdm (pinned in pyproject.toml).

Shown only on a terminal, and only once the work has run for a second (short commands
stay quiet); never under `--json` (`silence`), in pipes or CI logs.
TRAINPLAN_PROGRESS=always draws it anywhere (tqdm's plain lines off a terminal),
=never silences it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

__all__ = ["PROGRESS_MODES", "ProgressBar", "silence"]

DELAY_S = 1.0  # work shorter than this shows no bar
FALLBACK_COLUMNS = 80  # where the terminal reports no width
PROGRESS_MODES = ("auto", "always", "never")  # TRAINPLAN_PROGRESS
_silenced = False


def silence(on: bool = True) -> None:
    """No progress from here on (a command printing JSON); `silence(False)` undoes it
    (the next command of the same process, e.g. in tests)."""
    global _silenced
    _silenced = on


def _shown(stream: TextIO) -> bool:
    mode = os.environ.get("TRAINPLAN_PROGRESS", "auto")
    if mode not in PROGRESS_MODES:  # a typo silently meant "auto"
        from profiler.schema import fail

        fail("TRAINPLAN_PROGRESS", mode, f"one of {', '.join(PROGRESS_MODES)}")
    if mode == "never" or (_silenced and mode != "always"):
        return False
    return mode == "always" or stream.isatty()


def _columns(stream: TextIO) -> int:
    """The width the stream's terminal reports; 0 where it reports none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


class ProgressBar:
    """`bar(done, label)` reports `done` of `total` units (`label`: what is being done);
    `bar.advance(n)` adds n; `bar.close()` ends the line."""

    def __init__(self, total: int | None, *, title: str, unit: str = "it",
                 stream: TextIO | None = None, delay_s: float | None = None) -> None:
        """`total` None: a count without an end (work whose size is not known ahead);
        `delay_s`: how long before the bar shows (default DELAY_S; 0 for steps that are
        each slow, so the step under way is named at once)."""
        self.total = None if total is None else max(total, 1)
        self.done = 0
        self._bar: Any = None
        stream = stream or sys.stderr
        if _shown(stream):
            from tqdm import tqdm

            shape = ("{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
                     "[{elapsed}<{remaining}] {postfix}" if self.total is not None else
                     "{desc}: {n_fmt} {unit} [{elapsed}] {postfix}")
            # a terminal that reports no width (CI's and editors' ptys) drew nothing
            width: dict[str, Any] = ({"dynamic_ncols": True} if _columns(stream)
                                     else {"ncols": FALLBACK_COLUMNS})
            self._bar = tqdm(total=self.total, desc=title, unit=unit, file=stream,
                             delay=DELAY_S if delay_s is None else delay_s,
                             leave=False, bar_format=shape, **width)

    def __call__(self, done: int, label: str = "") -> None:
        if self.total is not None:
            done = min(done, self.total)
        if self._bar is not None:
            if label:
                self._bar.set_postfix_str(label[:40], refresh=False)
            self._bar.update(max(0, done - self.done))
            if label and done == self.done:
                self._bar.refresh()  # a new step's name, before it runs
        self.done = done

    def advance(self, n: int = 1, label: str = "") -> None:
        self(self.done + n, label)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
