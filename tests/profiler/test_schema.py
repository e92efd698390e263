"""The one spec loader: every error names the field, the value and what is allowed."""

from dataclasses import dataclass
from typing import Literal

import pytest

from profiler.schema import SpecError, dump, load_yaml_text, parse, spec_field


@dataclass(frozen=True, kw_only=True)
class Inner:
    size: int = spec_field(min=1)


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    kind: Literal["a", "b"] = "a"
    ratio: float = spec_field(default=0.5, gt=0, max=1)
    inner: Inner
    items: tuple[Inner, ...] = ()
    extra: int | None = None
    table: dict[str, float] | None = None


GOOD = {"name": "x", "kind": "b", "ratio": 1, "inner": {"size": 3},
        "items": [{"size": 1}, {"size": 2}], "table": {"k": 2.5}}


def test_round_trip_is_exact():
    obj = parse(Outer, GOOD)
    assert obj.items == (Inner(size=1), Inner(size=2))
    assert parse(Outer, dump(obj)) == obj
    assert dump(obj)["ratio"] == 1.0


@pytest.mark.parametrize("patch, message", [
    ({"inner": {"size": 0}}, "inner.size: 0 is not allowed (must be ≥ 1)"),
    ({"kind": "c"}, "kind: 'c' is not allowed (allowed: a, b)"),
    ({"ratio": 0}, "ratio: 0.0 is not allowed (must be > 0)"),
    ({"ratio": "big"}, "ratio: 'big' is not allowed (expected a number)"),
    ({"items": [{"size": 1}, {"size": -2}]}, "items[1].size: -2 is not allowed (must be ≥ 1)"),
    ({"inner": {"size": True}}, "inner.size: True is not allowed (expected an integer)"),
    ({"colour": "red"}, "colour: 'red' is not allowed (unknown field; known: name,"),
    ({"table": {"k": "v"}}, "table.k: 'v' is not allowed (expected a number)"),
])
def test_errors_name_field_value_and_rule(patch, message):
    with pytest.raises(SpecError) as err:
        parse(Outer, {**GOOD, **patch})
    assert str(err.value).startswith(message)


def test_missing_field_is_named():
    data = dict(GOOD)
    del data["inner"]
    with pytest.raises(SpecError, match=r"^inner: missing \(required field of Outer\)"):
        parse(Outer, data)


def test_file_paths_prefix_fields():
    with pytest.raises(SpecError, match=r"^m.yaml:inner.size: 0 "):
        parse(Outer, {**GOOD, "inner": {"size": 0}}, where="m.yaml:")


def test_malformed_yaml_names_the_line():
    with pytest.raises(SpecError, match=r"^f.yaml: line 2: malformed YAML"):
        load_yaml_text("a: 1\nb: c: d\n", where="f.yaml")
