"""Typed specs from plain data: one loader and one writer for every artifact.

A spec is a frozen dataclass whose fields carry their constraints as metadata
(`spec_field(min=1, ...)`). `parse(cls, data, where=...)` builds it from a YAML/JSON
mapping and rejects unknown keys, missing keys, wrong types and out-of-range values
with a `SpecError` that names the field path, the value and what is allowed.
`dump(obj)` writes it back as plain data; `parse(cls, dump(x)) == x`.

Cross-field rules live in a spec's `check(self, where)` method, which `parse` calls
after the fields are valid. Validation is pure: it never touches a device.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

__all__ = ["SpecError", "at", "cached_hash", "coerce_choices", "dump", "fail", "load_yaml", "load_yaml_text", "parse", "read_text",
           "spec_field"]

T = TypeVar("T")


class SpecError(ValueError):
    """Bad input a user can fix: the message names the field, the value and what is allowed."""


def fail(where: str, value: object, allowed: str) -> typing.NoReturn:
    """Raise a SpecError in the one format every message uses."""
    if isinstance(value, enum.Enum):  # a choice reads as the user wrote it
        value = value.value
    raise SpecError(f"{where}: {value!r} is not allowed ({allowed})")


def at(where: str, name: str) -> str:
    """The path of field `name` under `where`: "" for top level, "file.yaml:" for a file,
    "--" for command-line flags (`at("--", "tp")` is "--tp")."""
    if not where:
        return name
    if where == "--":
        return "--" + name.replace("_", "-")
    return f"{where}{name}" if where.endswith(":") else f"{where}.{name}"


def cached_hash(cls: type[T]) -> type[T]:
    """Class decorator (after @dataclass(frozen=True)): remember each instance's hash.
    Specs used as cache keys (clusters, models, stage specs) are hashed millions of times
    in a search; their fields never change. The remembered value is left out of pickles
    (string hashes differ between processes)."""
    generated = cls.__hash__

    def __hash__(self: Any) -> int:
        state = self.__dict__
        if "_hash" not in state:
            state["_hash"] = generated(self)
        return int(state["_hash"])

    def __getstate__(self: Any) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    setattr(cls, "__hash__", __hash__)  # noqa: B010 (a method replaced on the class)
    setattr(cls, "__getstate__", __getstate__)  # noqa: B010
    return cls


def coerce_choices(obj: object) -> None:
    """In a frozen dataclass's `__post_init__`: turn strings given for its enum fields
    into the enum's members (code and tests may write `schedule="zb-h1"`)."""
    for name, tp in _enum_fields(type(obj)):
        value = getattr(obj, name)
        if not isinstance(value, tp):
            object.__setattr__(obj, name, tp(value))


_ENUM_FIELDS: dict[Any, tuple[tuple[str, type], ...]] = {}


def _enum_fields(cls: Any) -> tuple[tuple[str, type], ...]:
    """A class's enum-typed fields (asked for every stage a search builds)."""
    if cls not in _ENUM_FIELDS:
        _ENUM_FIELDS[cls] = tuple((name, tp) for name, tp in _hints(cls).items()
                                  if isinstance(tp, type) and issubclass(tp, enum.Enum))
    return _ENUM_FIELDS[cls]


def spec_field(
    *,
    default: Any = dataclasses.MISSING,
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    help: str = "",
) -> Any:
    """A dataclass field with bounds; `default=None` makes an optional field."""
    meta = {"min": min, "max": max, "gt": gt, "help": help}
    if isinstance(default, list | dict):
        raise TypeError("use tuples / frozen values for defaults")
    return dataclasses.field(default=default, metadata=meta)


_HINTS: dict[Any, dict[str, Any]] = {}


def _hints(cls: Any) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(str(m.value) for m in tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of {_type_name(typing.get_args(tp)[1])}"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            type(None): "null"}.get(tp, str(tp))


def _convert(tp: Any, value: Any, where: str) -> Any:
    """Check `value` against annotation `tp`, returning the typed value."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except SpecError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        fail(where, value, f"expected {_type_name(tp)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            fail(where, value, "allowed: " + ", ".join(str(c) for c in choices))
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = {m.value: m for m in tp}
        if isinstance(value, bool) or value not in values:
            fail(where, value, "allowed: " + ", ".join(str(v) for v in values))
        return values[value]
    if origin is tuple:
        (item_tp, *_rest) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            fail(where, value, f"expected {_type_name(tp)}")
        return tuple(_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            fail(where, value, f"expected {_type_name(tp)}")
        return {_convert(key_tp, k, where): _convert(val_tp, v, at(where, str(k)))
                for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return parse(tp, value, where=where)
    if tp is bool:
        if not isinstance(value, bool):
            fail(where, value, "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(where, value, "expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            fail(where, value, "expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            fail(where, value, "expected a non-empty string")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {where}")


def _check_bounds(meta: Mapping[str, Any], value: Any, where: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    if meta.get("min") is not None and value < meta["min"]:
        fail(where, value, f"must be ≥ {meta['min']:g}")
    if meta.get("gt") is not None and value <= meta["gt"]:
        fail(where, value, f"must be > {meta['gt']:g}")
    if meta.get("max") is not None and value > meta["max"]:
        fail(where, value, f"must be ≤ {meta['max']:g}")


def parse(cls: type[T], data: Any, *, where: str = "") -> T:
    """Build spec `cls` from a mapping, validating every field and then `cls.check`."""
    label = where.rstrip(":-") or cls.__name__
    if not isinstance(data, Mapping):
        fail(label, data, f"expected a mapping with fields of {cls.__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # cls is a dataclass type
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        fail(at(where, str(unknown[0])), data[unknown[0]],
             "unknown field; known: " + ", ".join(fields))
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        path = at(where, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{path}: missing (required field of {cls.__name__})")
            continue
        value = _convert(hints[name], data[name], path)
        _check_bounds(f.metadata, value, path)
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                _check_bounds(f.metadata, item, f"{path}[{i}]")
        kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(where)
    return obj


def dump(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) from a spec; fields left at None are omitted."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None:
                continue
            out[f.name] = dump(value)
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, tuple | list):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {dump(k): dump(v) for k, v in obj.items()}
    return obj


def load_yaml_text(text: str, *, where: str) -> Any:
    """YAML text to plain data; malformed YAML is a SpecError naming the line."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is 5x faster
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(f"{where}:{line}: malformed YAML ({problem})") from None


def read_text(path: str) -> str:
    """A text file's contents; one that cannot be read is a SpecError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as err:
        raise SpecError(f"{path}: cannot read ({err.strerror})") from None


def load_yaml(path: str) -> Any:
    """Read a YAML file; a missing file or malformed YAML is a SpecError."""
    return load_yaml_text(read_text(path), where=path)
