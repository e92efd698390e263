"""Which kind of spec file a parsed YAML document is, so that a file given to the wrong
flag is named for what it is (not for the first field the expected kind lacks)."""

from __future__ import annotations

from collections.abc import Mapping

from profiler.schema import SpecError

__all__ = ["refuse_other_kind"]

# what only each kind of file has (a plan holds a model and a cluster: it comes first),
# and the flag that takes it
_KINDS = {"plan": (("pipelines",), "--plan"), "cluster": (("node_groups",), "--cluster"),
          "model": (("num_layers",), "--model-file")}


def file_kind(raw: object) -> str | None:
    """'plan', 'cluster' or 'model' by the fields only that kind has; None otherwise."""
    if not isinstance(raw, Mapping):
        return None
    return next((kind for kind, (keys, _) in _KINDS.items() if all(k in raw for k in keys)),
                None)


def refuse_other_kind(raw: object, path: str, expected: str, has: str) -> None:
    """Raise a one-line SpecError where `raw` is a spec file of another kind than
    `expected` (`has`: what a file of the expected kind has)."""
    kind = file_kind(raw)
    if kind is not None and kind != expected:
        raise SpecError(f"{path}: a {kind} file is not allowed here (a {expected} file has "
                        f"{has}; a {kind} goes to {_KINDS[kind][1]})")
