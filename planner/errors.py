"""Errors a user can act on."""

from profiler.schema import SpecError

__all__ = ["InfeasiblePlan", "SpecError"]


class InfeasiblePlan(ValueError):
    """No configuration satisfies the constraints (memory, budget); the message says how
    close the nearest one came and what would make one fit."""
