"""Profiles as Parquet files (profiler/parquet.py): the CSV form's content in typed
columns, one parser for both, and one-line errors."""

import json
import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.schema import SpecError
from profiler.store import ProfileRow, load_profile, load_profiles, profile_text, save_profile
from tests.planner.cli_helpers import run_cli
from tests.planner.profile_helpers import QUICK_PROFILE
from tests.profiler.test_store import META, ROWS, _collective

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_a_parquet_profile_is_the_csv_profile_in_typed_columns(tmp_path):
    csv_path, parquet_path = str(tmp_path / "p.csv"), str(tmp_path / "p.parquet")
    save_profile(csv_path, META, ROWS)
    save_profile(parquet_path, META, ROWS)
    profile, from_csv = load_profile(parquet_path), load_profile(csv_path)
    assert profile.meta == META and profile.rows == ROWS
    assert profile.digest == from_csv.digest  # the same content, whichever form holds it
    table = pq.read_table(parquet_path)
    assert table.schema.field("shape").type == pa.list_(pa.int64())
    assert table.schema.field("time_s").type == pa.float64()
    assert table.schema.field("samples").type == pa.int64()
    assert table.column("time_s").to_pylist() == [r.time_s for r in ROWS]  # every digit
    assert table.column("variant").to_pylist()[3:5] == ["flash", None]
    assert table.schema.metadata[b"trainplan.profile"] == _head()  # the CSV form's lines


def test_a_folder_merges_csv_and_parquet_profiles(tmp_path):
    folder = tmp_path / "profiles"
    (folder / "empty").mkdir(parents=True)
    save_profile(str(folder / "ops.parquet"), META, ROWS[:4])
    save_profile(str(folder / "collectives.csv"), META, ROWS[4:])
    merged = load_profiles([str(folder)], devices=["CPU"], dtype="fp32").get("CPU")
    assert merged is not None and set(merged.rows) == set(ROWS)
    assert merged.collective_time_s("all_reduce", 1024, 2) == 2e-5
    with pytest.raises(SpecError, match=r"it holds no profile \(\*\.csv, \*\.parquet\)"):
        load_profiles([str(folder / "empty")], devices=["CPU"], dtype="fp32")


COLUMNS = ("kind", "name", "variant", "shape", "flops", "bytes", "kernels", "ranks", "time_s",
           "p10_s", "p90_s", "samples", "calls")


def _table(rows, *, head: bytes | None):
    """A table written by hand (pyarrow infers the types), with `head` as metadata."""
    table = pa.table({name: [getattr(r, name) for r in rows] for name in COLUMNS})
    return table.replace_schema_metadata(None if head is None else {b"trainplan.profile": head})


def _head() -> bytes:
    text = profile_text(META, ROWS)
    return text[:text.index("kind,name")].encode()


@pytest.mark.parametrize("table, needle", [
    (lambda: _table(ROWS, head=None),
     "p.parquet: a Parquet file without a trainplan profile's metadata (schema key "
     "'trainplan.profile'); `plan profile -o FILE.parquet` writes one"),
    # the row's number, and no line: the file has none
    (lambda: _table([ROWS[0], replace(ROWS[1], time_s=float("nan"))], head=_head()),
     "p.parquet:row 2:time_s: nan is not allowed (expected a finite number)"),
    (lambda: _table(ROWS, head=None).rename_columns(["kind", "label", *COLUMNS[2:]])
     .replace_schema_metadata({b"trainplan.profile": _head()}),
     "p.parquet: header: "),
    (lambda: _table([replace(ROWS[0], name="x" * 200_000)], head=_head()),
     "p.parquet:row 1: 'unreadable CSV (field larger than field limit (131072))'"),
    # a line break in a cell vanished ('a\nb' read as 'ab')
    (lambda: _table([replace(ROWS[0], name="a\nb")], head=_head()),
     "p.parquet:row 1:name: 'a\\nb' is not allowed (a name or value of one line"),
    (lambda: _table([ROWS[4], _collective(1024, 3e-5)], head=_head()),
     "p.parquet:row 2: 'collective all_reduce 1024 in 3e-05 s' is not allowed (one "
     "measurement of an op and shape a file; row 1 measures it in 2e-05 s)"),
])
def test_bad_parquet_profiles_get_one_line_errors(tmp_path, table, needle):
    path = str(tmp_path / "p.parquet")
    pq.write_table(table(), path)
    with pytest.raises(SpecError) as err:
        load_profile(path)
    assert needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_parquet_says_so(tmp_path):
    (tmp_path / "p.parquet").write_text(profile_text(META, ROWS))  # CSV under the name
    with pytest.raises(SpecError, match=r"p\.parquet: not a Parquet file \("):
        load_profile(str(tmp_path / "p.parquet"))


def test_without_pyarrow_a_parquet_profile_is_refused_before_any_work(tmp_path, capsys,
                                                                      monkeypatch):
    save_profile(str(tmp_path / "p.parquet"), META, ROWS)
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import pyarrow raises ImportError
    with pytest.raises(SpecError, match=r"p\.parquet: cannot read a Parquet profile: it needs "
                       r"pyarrow \(pip install 'trainplan\[parquet\]' \(pyarrow\)\)"):
        load_profile(str(tmp_path / "p.parquet"))
    out = str(tmp_path / "new.parquet")
    code, stdout, err = run_cli(["profile", "--model", "debug-tiny", "-o", out], capsys)
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert f"-o: '{out}' is not allowed (a .csv profile; Parquet needs pyarrow: pip " \
           "install 'trainplan[parquet]' (pyarrow))" in err
    assert not (tmp_path / "new.parquet").exists()


def test_plan_profile_writes_parquet_and_the_planner_prices_from_it(tmp_path, capsys):
    pytest.importorskip("torch")
    path = str(tmp_path / "cpu.parquet")
    code, out, err = run_cli(["profile", "--model", "debug-tiny", *QUICK_PROFILE, "-o", path],
                             capsys)
    assert code == 0 and f"to {path}" in out, err
    code, out, err = run_cli(["profile", "show", path, "--json"], capsys)
    assert code == 0 and json.loads(out)["meta"]["device"] == "CPU", err
    code, out, err = run_cli(["simulate", "--model", "debug-tiny", "--gpus", "CPU:1", "--tp",
                              "1", "--pp", "1", "--dp", "1", "--mbs", "2", "--gbs", "2",
                              "--seq", "32", "--dtype", "fp32", "--profile", str(tmp_path),
                              "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["sources"]["compute"] == (
        f"measured profile {path} (attention, elementwise, gemm, optimizer)")


_times = st.floats(min_value=1e-7, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def _rows(draw):
    """Valid rows of any kind with a one-number shape, names with commas, quotes and
    non-ASCII letters, and times of every digit a double holds."""
    count = draw(st.integers(1, 6))
    rows = []
    for i in range(count):
        low, mid, high = sorted(draw(_times) for _ in range(3))
        size = draw(st.integers(0, 2**40))
        rows.append(ProfileRow(
            kind=draw(st.sampled_from(["elementwise", "optimizer", "collective"])),
            name=f"{i}" + draw(st.text(st.characters(categories=(
                "L", "N", "P", "S", "Zs")), max_size=8).filter(str.isprintable)),
            variant=draw(st.none() | st.sampled_from(["flash", 'a,"b"', "é"])),
            shape=(size,), flops=0.0, bytes=float(size), ranks=draw(st.integers(1, 64)),
            time_s=mid, p10_s=low, p90_s=high, samples=draw(st.integers(1, 10**6)),
            calls=1))
    return tuple(rows)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows())
def test_both_forms_read_back_exactly_what_was_written(tmp_path, rows):
    for name in ("p.csv", "p.parquet"):
        save_profile(path := str(tmp_path / name), META, rows)
        assert load_profile(path).rows == rows, name
