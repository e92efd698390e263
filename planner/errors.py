"""Errors a user can act on."""

from profiler.schema import SpecError

__all__ = ["INTERRUPTED", "InfeasiblePlan", "Interrupted", "SpecError"]

INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C (SIGTERM too, here)


class InfeasiblePlan(ValueError):
    """No configuration satisfies the constraints (memory, budget); the message says how
    close the nearest one came and what would make one fit."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped a command that kept something: `kept` says what, in a
    few words (`plan` prints it in its one line)."""

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept
