"""A profile as a Parquet file: the CSV form's metadata and rows, in typed columns
(docs/profiles.md, "Parquet").

pyarrow is an optional dependency (`pip install 'trainplan[parquet]'`), imported here
only when a .parquet profile is read or written, so that nothing else pays for it. The
file's schema metadata holds the CSV form's title and `# ` metadata lines under
`META_KEY`; `profiler/store.py` turns what `read_parquet` returns back into the CSV form's
text, so that one parser validates both forms and a profile's digest does not depend on
which form holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from profiler.schema import SpecError, fail, one_line, read_bytes

__all__ = ["INSTALL", "META_KEY", "ColumnKind", "read_parquet", "require_pyarrow",
           "write_parquet"]

META_KEY = b"trainplan.profile"
INSTALL = "pip install 'trainplan[parquet]' (pyarrow)"
ColumnKind = Literal["int", "float", "str", "ints"]


def require_pyarrow(where: str, path: str) -> None:
    """Refuse a Parquet profile before any work where pyarrow is not installed."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        fail(where, path, f"a .csv profile; Parquet needs pyarrow: {INSTALL}")


def write_parquet(path: str, *, head: str, columns: dict[str, ColumnKind],
                  rows: Sequence[Sequence[object]]) -> None:
    """`rows` (values in `columns`' order; None where empty) as one table whose schema
    types each column by its kind and holds `head` as metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(),
             "ints": pa.list_(pa.int64())}
    schema = pa.schema([(name, types[kind]) for name, kind in columns.items()],
                       metadata={META_KEY: head.encode()})
    data = {name: [row[i] for row in rows] for i, name in enumerate(columns)}
    pq.write_table(pa.table(data, schema=schema), path)


def read_parquet(path: str) -> tuple[str, list[str], list[tuple[object, ...]]]:
    """The metadata lines, column names and rows (Python values) of a Parquet profile;
    a file that is not one is a SpecError naming it."""
    data = read_bytes(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError(f"{path}: cannot read a Parquet profile: it needs pyarrow "
                        f"({INSTALL}); or give its .csv form") from None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as err:
        raise SpecError(f"{path}: not a Parquet file ({one_line(str(err))[:200]})") from None
    head = (table.schema.metadata or {}).get(META_KEY)
    if head is None:
        raise SpecError(f"{path}: a Parquet file without a trainplan profile's metadata (schema "
                        f"key {META_KEY.decode()!r}); `plan profile -o FILE.parquet` writes one")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: metadata {META_KEY.decode()!r} is not UTF-8 text (byte "
                        f"0x{head[err.start]:02x} at offset {err.start})") from None
    columns = [column.to_pylist() for column in table.columns]
    return text, list(table.column_names), list(zip(*columns, strict=True))
