"""Typed specs from plain data: one loader and one writer for every artifact.

A spec is a frozen dataclass whose fields carry their constraints as metadata
(`spec_field(min=1, ...)`). `parse(cls, data, where=...)` builds it from a YAML/JSON
mapping and rejects unknown keys, missing keys, wrong types and out-of-range values
with a `SpecError` that names the field path, the value and what is allowed.
`dump(obj)` writes it back as plain data; `parse(cls, dump(x)) == x`.

Cross-field rules live in a spec's `check(self, where)` method, which `parse` calls
after the fields are valid. Validation is pure: it never touches a device.

Nothing read is trusted: every number must be finite (NaN and ±inf are refused wherever a
number is expected), a file is read only up to `MAX_FILE_BYTES` and must be UTF-8, and
YAML whose aliases would expand past `MAX_YAML_NODES` nodes (or past the file's length in
characters, which bounds the values of a file without aliases) is refused before it is
built. Values quoted in messages are cut to `MAX_REPR_CHARS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import os
import re
import secrets
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar

__all__ = ["MAX_FILE_BYTES", "MAX_YAML_NODES", "NAME_MAX_BYTES", "SpecError", "at", "atomic_path", "cached_hash", "coerce_choices",
           "dump", "fail", "load_json_text", "load_yaml", "load_yaml_text", "one_line", "parse",
           "read_bytes", "read_text", "short_repr", "spec_field"]

T = TypeVar("T")

MAX_FILE_BYTES = 64 * 1024**2  # a spec, plan or profile is kilobytes; refuse more than 64 MiB
NAME_MAX_BYTES = 255  # a file name's length on Linux and macOS file systems (NAME_MAX)
MAX_YAML_NODES = 1_000_000  # values after alias expansion ("billion laughs" stops here)
MAX_REPR_CHARS = 120  # of a value quoted in an error message


class SpecError(ValueError):
    """Bad input a user can fix: the message names the field, the value and what is allowed."""


YAML_WORDS: dict[object, str] = {True: "true", False: "false", None: "null"}


def short_repr(value: object, limit: int = MAX_REPR_CHARS) -> str:
    """repr(value), cut to `limit` characters. It stops formatting once it has `limit`
    characters, so a huge (or alias-expanded, or self-containing) value costs nothing."""
    parts: list[str] = []
    _repr_into(value, parts, [limit + 1], depth=0)
    text = "".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _repr_into(value: object, parts: list[str], budget: list[int], *, depth: int) -> None:
    """Append the repr of `value` to `parts` until `budget[0]` characters are spent."""
    if budget[0] <= 0:
        return
    if depth > 20:
        text = "..."
    elif isinstance(value, list | tuple | dict):
        items = value.items() if isinstance(value, dict) else value
        opening, closing = ("{}" if isinstance(value, dict) else
                            "()" if isinstance(value, tuple) else "[]")
        parts.append(opening)
        budget[0] -= 1
        for i, item in enumerate(items):
            if budget[0] <= 0:
                return
            if i:
                parts.append(", ")
                budget[0] -= 2
            if isinstance(value, dict):
                key, val = item
                _repr_into(key, parts, budget, depth=depth + 1)
                parts.append(": ")
                budget[0] -= 2
                _repr_into(val, parts, budget, depth=depth + 1)
            else:
                _repr_into(item, parts, budget, depth=depth + 1)
        parts.append(closing)
        budget[0] -= 1
        return
    elif isinstance(value, bool) or value is None:  # as a YAML or JSON file spells them
        text = YAML_WORDS[value]
    elif isinstance(value, str):
        text = repr(value[:budget[0]])
    elif isinstance(value, int) and value.bit_length() > 256:  # bools are taken above
        text = f"<an integer of {value.bit_length()} bits>"
    else:
        text = repr(value)[:budget[0] + 1]
    parts.append(text)
    budget[0] -= len(text)


def one_line(text: str) -> str:
    """`text` with control and format characters escaped (a newline, a carriage return or
    a right-to-left override from a file's key or name never breaks or disguises a
    message)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def fail(where: str, value: object, allowed: str) -> typing.NoReturn:
    """Raise a SpecError in the one format every message uses."""
    if isinstance(value, enum.Enum):  # a choice reads as the user wrote it
        value = value.value
    # a command-line flag left out reads as missing; true / false / null as in a file
    text = "missing" if value is None and where.startswith("--") else short_repr(value)
    raise SpecError(f"{one_line(where)}: {text} is not allowed ({allowed})")


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
        # a list or mapping is no choice (and cannot be looked up: unhashable)
        if isinstance(value, bool) or not isinstance(value, str | int | float) \
                or value not in values:
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
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 4e2 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, int | float):
            fail(where, value, "expected a number")
        try:
            number = float(value)
        except OverflowError:
            fail(where, value, "expected a finite number")
        if not math.isfinite(number):
            fail(where, value, "expected a finite number")
        return number
    if tp is str:
        if not isinstance(value, str) or not value:
            fail(where, value, "expected a non-empty string")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {where}")


# a number in e-notation without a dot, which YAML 1.1 (PyYAML) leaves a string
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def _check_value(meta: Mapping[str, Any], value: Any, where: str, one_line_text: bool) -> None:
    """A field's value (or one item of a tuple field): a number within its bounds, and,
    where `one_line_text`, text without a newline or other control character."""
    if one_line_text and isinstance(value, str) and not value.isprintable():
        fail(where, value, "a name or value of one line without control characters")
    _check_bounds(meta, value, where)


def _check_bounds(meta: Mapping[str, Any], value: Any, where: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        fail(where, value, "expected a finite number")
    if meta.get("min") is not None and value < meta["min"]:
        fail(where, value, f"must be ≥ {_bound(meta['min'])}")
    if meta.get("gt") is not None and value <= meta["gt"]:
        fail(where, value, f"must be > {_bound(meta['gt'])}")
    if meta.get("max") is not None and value > meta["max"]:
        fail(where, value, f"must be ≤ {_bound(meta['max'])}")


def _bound(value: float) -> str:
    """A bound as people write it: 65,536 and 0.1, not 6.5536e+04."""
    return f"{value:,}" if float(value).is_integer() else f"{value:g}"


# Text fields that may span lines (a cluster's description, a GPU type's or a profile's
# source and command); every other string is a name or a value that reports and plan files
# print on one line, so a newline or other control character in it is refused.
FREE_TEXT_FIELDS = frozenset({"description", "source", "command"})


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
        one_line_text = name not in FREE_TEXT_FIELDS
        _check_value(f.metadata, value, path, one_line_text)
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                _check_value(f.metadata, item, f"{path}[{i}]", one_line_text)
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
    """YAML text to plain data (safe tags only); malformed YAML, a python tag, or aliases
    that would expand past `MAX_YAML_NODES` values are a SpecError naming the file."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)  # the C loader is 5x faster
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        # an alias-free document holds fewer values than characters: only aliases make
        # more, and only beyond the file's own size are they refused
        _check_expanded_size(node, where, max(MAX_YAML_NODES, len(text) + 1))
        return loader.construct_document(node)
    except SpecError:
        raise
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(f"{where}:{line}: malformed YAML ({short_repr(problem)[1:-1]})"
                        ) from None
    except (ValueError, OverflowError, RecursionError) as err:  # e.g. a 5,000-digit integer
        raise SpecError(f"{where}: unreadable YAML value "
                        f"({short_repr(str(err).splitlines()[0])[1:-1]})") from None
    finally:
        loader.dispose()


def _check_expanded_size(root: Any, where: str, limit: int) -> None:
    """Refuse YAML whose aliases expand to more than `limit` values, or to a value that
    contains itself, or a mapping with a key given twice (`_check_keys`), before
    anything is built (each node is sized once)."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > limit:
                raise SpecError(f"{where}: YAML aliases expand to more than "
                                f"{limit:,} values (not allowed)")
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise SpecError(f"{where}: a YAML alias refers to a value that contains it "
                            "(not allowed)")
        _check_keys(node, where)  # each node is opened once
        _check_yaml11_scalar(node, where)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)


def _check_keys(node: Any, where: str) -> None:
    """Refuse a mapping that gives a key twice: YAML loaders keep the last one silently
    (a node group's `num_nodes: 16` then `num_nodes: 1` ran on 1 node)."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return
    keys: set[str] = set()
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            if key.value in keys:
                raise SpecError(f"{where}: line {key.start_mark.line + 1}: "
                                f"{short_repr(key.value)} is given twice in one "
                                "mapping (not allowed: which one was meant?)")
            keys.add(key.value)


# Plain scalars YAML 1.1 (PyYAML) reads as something other than what they look like, where
# YAML 1.2 (2009) reads them as written: base 60 (`1:30` is 90), a leading 0 for octal
# (`010` is 8), yes / no / on / off as booleans (`island: off` is false), and dates
# (`name: 2024-01-01` is a date; a name then printed as datetime.date(2024, 1, 1)). Refused, so a
# spec file never means something its author did not write (YAML 1.2 spec, "Changes",
# 10.3.2 "Tag Resolution": only true/false are booleans, octal is 0o, no sexagesimal).
_YAML11_BOOL_WORDS = frozenset({"yes", "no", "on", "off"})
_YAML11_INT = "tag:yaml.org,2002:int"
_YAML11_FLOAT = "tag:yaml.org,2002:float"


def _check_yaml11_scalar(node: Any, where: str) -> None:
    """Refuse a plain scalar YAML 1.1 reads otherwise than it looks (`_YAML11_BOOL_WORDS`,
    base 60, a leading-zero octal, a date), naming the line and what to write instead."""
    import yaml

    if not isinstance(node, yaml.ScalarNode) or node.style:  # None or '' for plain
        return  # quoted and block scalars are strings, as written
    text, tag = node.value, node.tag
    digits = text.lstrip("+-").replace("_", "")
    if tag == "tag:yaml.org,2002:bool" and text.lower() in _YAML11_BOOL_WORDS:
        reading = "true" if text.lower() in ("yes", "on") else "false"
        fix = f"write {reading}, or quote {text!r} for text"
    elif tag in (_YAML11_INT, _YAML11_FLOAT) and ":" in text:
        value = 0.0
        for part in digits.split(":"):
            value = value * 60 + float(part)
        value = -value if text.startswith("-") else value
        reading = f"{value:g}"
        fix = "base 60; write the number itself, or quote it for text"
    elif (tag == _YAML11_INT and digits[:1] == "0" and digits.isdigit()
          and int(digits, 8) != int(digits)):
        reading = f"{int(digits, 8) * (-1 if text.startswith('-') else 1)}"
        fix = "octal; write the number without the leading 0, or quote it for text"
    elif tag == "tag:yaml.org,2002:timestamp":
        reading = "a date"
        fix = "quote it for text"
    else:
        return
    raise SpecError(f"{where}: line {node.start_mark.line + 1}: {text!r} is read as "
                    f"{reading} by YAML 1.1 ({fix}; not allowed)")


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary name beside `path` (same folder, same extension, so writers that go by
    the extension still do); renamed over `path` when the block ends without an error,
    removed otherwise."""
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    tag = f".{os.getpid()}-{secrets.token_hex(4)}.tmp{ext}"
    excess = len(f".{stem}{tag}".encode()) - NAME_MAX_BYTES
    if excess > 0:  # a name the system allows, kept so by its temporary name too
        if excess > len(stem.encode()):  # an extension of most of the name: left out
            tag, excess = tag.removesuffix(ext), excess - len(ext.encode())
        kept = stem.encode()[:max(0, len(stem.encode()) - excess)]
        stem = kept.decode(errors="ignore")  # not half a character
    tmp = os.path.join(folder, f".{stem}{tag}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def read_text(path: str) -> str:
    """A UTF-8 text file's contents (at most MAX_FILE_BYTES); one that cannot be read, is
    too large or is not UTF-8 is a SpecError naming it."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                        f"{err.start})") from None


def read_bytes(path: str) -> bytes:
    """A file's contents (at most MAX_FILE_BYTES); one that cannot be read or is too large
    is a SpecError naming it."""
    if not path:
        raise SpecError("'': not allowed (an empty file name)")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SpecError(f"{path}: cannot read ({err.strerror or err})") from None
    except ValueError as err:  # e.g. a NUL byte in the name
        raise SpecError(f"{short_repr(path)}: cannot read ({err})") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"{path}: larger than {MAX_FILE_BYTES // 1024**2} MiB (not allowed)")
    return data


def load_json_text(text: str, *, where: str) -> Any:
    """JSON text to plain data. Not through the YAML loader: YAML 1.1 reads a JSON number
    without a dot (`1e-05`, `5e-324`) as a string, so a JSON file we wrote would not read
    back. NaN and Infinity become floats here and are refused where a number is read."""
    import json

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise SpecError(f"{where}: {short_repr(key)} is given twice in one object "
                                "(not allowed: which one was meant?)")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=unique)
    except SpecError:
        raise
    except json.JSONDecodeError as err:
        raise SpecError(f"{where}: line {err.lineno}: malformed JSON ({err.msg})") from None
    except (ValueError, RecursionError) as err:  # a 5,000-digit integer, deep nesting
        raise SpecError(f"{where}: unreadable JSON value "
                        f"({short_repr(str(err).splitlines()[0])[1:-1]})") from None


def load_yaml(path: str) -> Any:
    """Read a YAML file (or a JSON file, by its .json extension); a missing file or
    malformed content is a SpecError."""
    if path.lower().endswith(".json"):
        return load_json_text(read_text(path), where=path)
    return load_yaml_text(read_text(path), where=path)
