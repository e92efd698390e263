"""A progress bar on stderr for long measurements (no dependencies).

On a terminal it redraws one line; elsewhere (CI logs, pipes) it prints a line at every
tenth of the work, once the work has run for a few seconds, so logs stay short.
TRAINPLAN_PROGRESS=always prints those lines from the start, =never silences the bar.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]

QUIET_S = 2.0  # off a terminal, say nothing about work shorter than this


class ProgressBar:
    """`bar(done, label)` reports progress out of `total`; `bar.close()` ends the line."""

    def __init__(self, total: int, *, title: str, stream: TextIO | None = None,
                 width: int = 30) -> None:
        self.total, self.title, self.width = max(total, 1), title, width
        self.stream = stream or sys.stderr
        self.mode = os.environ.get("TRAINPLAN_PROGRESS", "auto")
        self.tty = self.stream.isatty() and self.mode != "always"
        self.start = time.perf_counter()
        self.last_tenth = -1

    def __call__(self, done: int, label: str) -> None:
        if self.mode == "never":
            return
        frac = min(done / self.total, 1.0)
        elapsed = time.perf_counter() - self.start
        if self.tty:
            filled = int(frac * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r{self.title} [{bar}] {done}/{self.total} {elapsed:5.1f}s "
                              f"{label[:28]:28}")
            self.stream.flush()
        elif int(frac * 10) > self.last_tenth and (elapsed >= QUIET_S or self.mode == "always"):
            self.last_tenth = int(frac * 10)
            self.stream.write(f"{self.title}: {done}/{self.total} ({elapsed:.1f}s) {label}\n")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
