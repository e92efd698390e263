"""The profile store: measured op and collective times of one device type, on disk and
in memory, with lookup by interpolation.

A profile file is CSV: a `## ` title line, `# ` lines holding the metadata as YAML
(`ProfileMeta`), then one row per measured op or collective (`ProfileRow`); times are
written with full precision so that a file reads back exactly. A `.parquet` file holds the
same in typed columns (`profiler/parquet.py`). The schema is documented in
docs/profiles.md and versioned by `PROFILE_SCHEMA_VERSION`; both are validated by the
one spec loader (`profiler/schema.py`), so a bad file gets a one-line `SpecError`.

Lookup: each op's series (same name, variant and group size) is made non-decreasing in
size (pool-adjacent-violators on log time, Barlow et al. 1972), so a bigger op is never
predicted faster than a smaller one; size is FLOPs (GEMMs, attention) or bytes
(everything else). An exact shape answers with its own median moved as the fit moved its
size's mean (shapes of one size keep their measured order). Other sizes inside the
measured range interpolate piecewise-linearly in log-log space. Outside it the profile
does not answer: `Profile.edge` gives the nearest measured size, and the reader scales its
analytic model by what the profile measured there (planner/costs/compute.py, comm.py).
Rows of the same op and shape from several files are pooled (geometric mean), so the
order of `--profile` flags changes nothing.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import hashlib
import io
import math
import os
import statistics
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from profiler.devices import device
from profiler.parquet import ColumnKind
from profiler.schema import (
    at,
    atomic_path,
    dump,
    fail,
    load_yaml_text,
    parse,
    read_text,
    spec_field,
)

__all__ = ["INTERRUPTED_NOTE", "PEAK_MARGIN", "PROFILE_SCHEMA_VERSION", "SHAPE_LENGTHS",
           "MonotoneCurve", "Profile", "ProfileMeta", "ProfileRow", "Profiles", "crowd_of",
           "crowd_variant", "interrupted_rows", "is_parquet", "load_profile", "load_profiles",
           "parse_profile_text", "profile_text", "row_peak_flops", "save_profile",
           "summary_row"]

PROFILE_SCHEMA_VERSION = 1
# The least seconds an op or collective call can take (a GPU kernel launch takes ~2-5 us,
# an eager op's dispatch on the CPU ~1-4 us: the `dispatch_*` host rows measure 3.4 us
# here): a faster row is an edit or a unit slip, not a measurement
MIN_CALL_S = 1e-7
_SAME_SIZE = 1e-9  # log-size tolerance: a size computed again (2 x a half) is the same size
RowKind = Literal["gemm", "attention", "elementwise", "embedding", "optimizer", "collective",
                  "host"]
_BY_FLOPS = ("gemm", "attention")  # time grows with FLOPs; other kinds with bytes moved
# How many numbers each kind's shape holds (planner/costs/workload.py: a GEMM's (batch, m,
# n, k), attention's five; an elementwise op's, an optimizer's, a collective's and a host
# cost's one size); an embedding's shape is its case's (planner/profiling/cases.py).
SHAPE_LENGTHS = {"gemm": 4, "attention": 5, "elementwise": 1, "optimizer": 1,
                 "collective": 1, "host": 1}


# what `plan profile` appends to an interrupted profile's command (metadata `command`), so
# that nothing reuses it as the whole measurement and readers can say so
INTERRUPTED_NOTE = "  # interrupted: "


def interrupted_rows(command: str | None) -> int | None:
    """The rows an interrupted profile kept (from its command), or None if it ran whole."""
    if not command or INTERRUPTED_NOTE not in command:
        return None
    words = command.rsplit(INTERRUPTED_NOTE, 1)[1].split()
    return int(words[0]) if words and words[0].isdigit() else 0


@dataclass(frozen=True, kw_only=True)
class ProfileMeta:
    """Where and how a profile was measured."""

    schema_version: int = spec_field(min=1, help="PROFILE_SCHEMA_VERSION of the writer")
    device: str = spec_field(help="device catalog name (`plan gpus`) the profile stands for")
    device_detail: str = spec_field(help="what the hardware calls itself")
    dtype: Literal["fp32", "tf32", "fp16", "bf16", "fp8"] = spec_field(help="op dtype")
    precision: str | None = spec_field(default=None, help="how the dtype ran where it is not "
                                       "plain: TF32 or not, which GEMMs ran in FP8 (files "
                                       "written before it read as null)")
    torch_version: str = spec_field()
    cuda_version: str | None = spec_field(default=None, help="CUDA runtime; null on CPU")
    driver: str | None = spec_field(default=None, help="GPU driver; null on CPU")
    host: str = spec_field()
    created: str = spec_field(help="ISO 8601 UTC date of the measurement")
    num_threads: int = spec_field(min=1, help="torch intra-op threads per process")
    world_size: int = spec_field(default=1, min=1, help="processes (collective profiles)")
    warmup: int = spec_field(min=0, help="untimed calls before sampling")
    repeats: int = spec_field(min=1, help="timed samples per row")
    command: str | None = spec_field(default=None, help="the command that measured it")

    def check(self, where: str) -> None:
        device(self.device, where=at(where, "device"))


@dataclass(frozen=True, kw_only=True)
class ProfileRow:
    """One measured op or collective: its key, size and seconds per call."""

    kind: RowKind
    name: str = spec_field(help="the planner's op name (planner/costs/workload.py) or collective")
    variant: str | None = spec_field(default=None, help="attention backend / optimizer "
                                     "implementation; empty for ops without alternatives")
    # Bounds: finite (no NaN: a NaN time would price a plan at NaN), and far past anything
    # one op measures (a day per call, 1e24 FLOPs, an exabyte).
    shape: tuple[int, ...] = spec_field(min=0, max=2**40, help="the planner's op shape; "
                                        "(bytes,) for collectives")
    flops: float = spec_field(min=0, max=1e24)
    bytes: float = spec_field(min=0, max=1e18, help="DRAM traffic; the per-rank buffer for "
                              "collectives")
    kernels: int = spec_field(default=1, min=1, max=1_000_000,
                              help="launches the planner counts for it")
    ranks: int = spec_field(default=1, min=1, max=131_072,
                            help="group size of a collective; 1 for ops")
    time_s: float = spec_field(gt=0, max=86_400, help="seconds per call: the samples' median, "
                               "or their mean where a step pays every call and the samples "
                               "are skewed (`summary_row`)")
    p10_s: float = spec_field(min=0, max=86_400)
    p90_s: float = spec_field(min=0, max=86_400)
    samples: int = spec_field(min=1, max=1_000_000_000)
    calls: int = spec_field(min=1, max=1_000_000_000, help="back-to-back calls per timed sample")

    def check(self, where: str) -> None:
        """A shape as the planner writes its kind's (`SHAPE_LENGTHS`), and percentiles in
        order (a p10 above the median or the p90 is not a measurement's)."""
        length = SHAPE_LENGTHS.get(self.kind)
        if length is not None and len(self.shape) != length:
            fail(at(where, "shape"), "x".join(map(str, self.shape)),
                 f"a {self.kind} row's shape has {length} numbers joined by x")
        if self.kind != "host" and self.time_s < MIN_CALL_S:
            fail(at(where, "time_s"), f"{self.time_s:g} s",
                 f"at least {MIN_CALL_S:g} s: no op or collective call takes less on any "
                 "device (a kernel launch, or an op's dispatch on the CPU, takes longer)")
        if not self.p10_s <= self.time_s <= self.p90_s:
            fail(at(where, "time_s"), f"p10 {self.p10_s:g} s, median {self.time_s:g} s, "
                 f"p90 {self.p90_s:g} s", "p10_s <= time_s <= p90_s")

    @property
    def size(self) -> float:
        """What its time is interpolated against: FLOPs or bytes."""
        return self.flops if self.kind in _BY_FLOPS else self.bytes


def summary_row(kind: RowKind, name: str, samples: Sequence[float], *,
                variant: str | None = None, ranks: int = 1, size_bytes: int = 0,
                calls: int = 1, mean: bool = False, floor_s: float = 0.0) -> ProfileRow:
    """A row of a collective or a host cost from its samples of seconds per call (size
    `size_bytes`): their median, or with `mean` their mean, never below `floor_s`, with
    the percentiles kept on either side of it, as a row's must be.

    The mean is for a cost a step pays at every call whose samples are skewed far to the
    right: the sum over many calls is the count times the mean (linearity of expectation),
    which a median of such samples prices low. On the 2-core CPU hosts a gloo call now
    and then waits a scheduler slice for a transport thread to get a core: a 477 KB
    all-reduce between 2 ranks took 0.67-0.81 ms median but 1.97-2.17 ms mean (p90 3.9-4.5
    ms) in 55 calls after a barrier, 0.82-1.41 / 1.79-2.50 ms right after both ranks had
    computed (2026-12-05; docs/profiles.md)."""
    ts = sorted(samples)
    time_s = max(statistics.fmean(ts) if mean else statistics.median(ts), floor_s)
    return ProfileRow(kind=kind, name=name, variant=variant, shape=(size_bytes,), flops=0.0,
                      bytes=float(size_bytes), ranks=ranks, time_s=time_s,
                      p10_s=min(max(ts[len(ts) // 10], 0.0), time_s),
                      p90_s=max(ts[-1 - len(ts) // 10], time_s), samples=len(ts),
                      calls=calls)


class MonotoneCurve:
    """Non-decreasing piecewise-linear interpolation in log-log space, over the measured
    range only."""

    def __init__(self, points: Iterable[tuple[float, float]]) -> None:
        by_size: dict[float, list[float]] = {}
        for size, t in points:
            by_size.setdefault(math.log(max(size, 1.0)), []).append(math.log(t))
        xs = sorted(by_size)
        self.raw = [sum(by_size[x]) / len(by_size[x]) for x in xs]  # mean log time
        self.xs, self.ys = xs, _isotonic(self.raw, [len(by_size[x]) for x in xs])

    def __call__(self, size: float) -> float | None:
        """The fitted time, or None outside the measured range."""
        x = math.log(max(size, 1.0))
        xs, ys = self.xs, self.ys
        if x < xs[0] - _SAME_SIZE or x > xs[-1] + _SAME_SIZE:
            return None
        i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
        if len(xs) == 1 or x <= xs[0]:
            return math.exp(ys[0])
        w = min((x - xs[i - 1]) / (xs[i] - xs[i - 1]), 1.0)
        return math.exp(ys[i - 1] + w * (ys[i] - ys[i - 1]))

    def moved(self, size: float) -> float:
        """How much the monotone fit moved the mean of a measured size (1 where the
        measurements were already in order)."""
        i = self._index(math.log(max(size, 1.0)))
        return 1.0 if i is None or self.ys[i] == self.raw[i] else math.exp(self.ys[i] - self.raw[i])

    def edge(self, size: float) -> tuple[float, float]:
        """The measured size nearest to `size` outside the range (the smallest or the
        largest), and the fitted time there."""
        i = 0 if math.log(max(size, 1.0)) < self.xs[0] else len(self.xs) - 1
        return math.exp(self.xs[i]), math.exp(self.ys[i])

    def _index(self, x: float) -> int | None:
        i = bisect.bisect_left(self.xs, x - _SAME_SIZE)
        return i if i < len(self.xs) and abs(self.xs[i] - x) <= _SAME_SIZE else None


def _isotonic(ys: Sequence[float], weights: Sequence[int]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for y, w in zip(ys, weights, strict=True):
        blocks.append([y, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, n2 = blocks.pop()
            y1, w1, n1 = blocks[-1]
            blocks[-1] = [(y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [b[0] for b in blocks for _ in range(int(b[2]))]


SeriesKey = tuple[str, str, str, int]  # kind, name, variant, ranks


@dataclass(frozen=True, eq=False)
class Profile:
    """A loaded profile. Equal (and hashed) by content, so caches keyed on it never mix
    two different profiles and never miss for a reloaded one."""

    path: str
    meta: ProfileMeta
    rows: tuple[ProfileRow, ...]
    digest: str = ""
    # merged profiles (`_merge`): the files that hold collective rows ("" : `path`)
    collective_path: str = ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    @cached_property
    def _exact(self) -> dict[tuple[SeriesKey, tuple[int, ...]], float]:
        times: dict[tuple[SeriesKey, tuple[int, ...]], list[float]] = {}
        for r in self.rows:  # one row a shape in a file; several files may each have one
            times.setdefault((_key(r), r.shape), []).append(r.time_s)
        return {k: v[0] if len(v) == 1 else math.exp(sum(map(math.log, v)) / len(v))
                for k, v in times.items()}

    @cached_property
    def _by_series(self) -> dict[SeriesKey, list[ProfileRow]]:
        rows: dict[SeriesKey, list[ProfileRow]] = {}
        for r in self.rows:
            rows.setdefault(_key(r), []).append(r)
        return rows

    @cached_property
    def _series(self) -> dict[SeriesKey, MonotoneCurve]:
        return {k: MonotoneCurve((r.size, r.time_s) for r in rows)
                for k, rows in self._by_series.items()}

    def time_s(self, *, kind: str, name: str, variant: str | None, shape: tuple[int, ...],
               size: float, ranks: int = 1) -> float | None:
        """Seconds per call of an op (or collective) from this profile, or None where it
        has no series for it or the size is outside the measured range (`edge`)."""
        key = (kind, name, variant or "", ranks)
        curve = self._series.get(key)
        if curve is None:
            return None
        exact = self._exact.get((key, tuple(shape)))
        if exact is not None:
            return exact * curve.moved(size)
        return curve(size)

    def edge(self, *, kind: str, name: str, variant: str | None, size: float,
             ranks: int = 1) -> tuple[ProfileRow, float] | None:
        """For a size outside the measured range of the op's series: the row measured at
        the nearest end of the range (the first of its size) and the series' fitted time
        there, or None where the profile has no such series."""
        key = (kind, name, variant or "", ranks)
        curve = self._series.get(key)
        if curve is None:
            return None
        edge_size, fitted = curve.edge(size)
        row = min(self._by_series[key],
                  key=lambda r: abs(math.log(max(r.size, 1.0) / edge_size)))
        return row, fitted

    def scaled_s(self, *, kind: str, name: str, variant: str | None, size: float,
                 model_s: Callable[[ProfileRow | None], float], ranks: int = 1
                 ) -> float | None:
        """A size outside the series' measured range: the reader's model time of it
        (`model_s(None)`) times the profile's fitted / model time at the nearest measured
        row (`model_s(row)`); None where the profile has no such series."""
        found = self.edge(kind=kind, name=name, variant=variant, size=size, ranks=ranks)
        if found is None:
            return None
        row, fitted_s = found
        at_edge = model_s(row)
        return None if at_edge <= 0 else fitted_s / at_edge * model_s(None)

    def collective_time_s(self, kind: str, size_bytes: float, ranks: int,
                          variant: str | None = None) -> float | None:
        return self.time_s(kind="collective", name=kind, variant=variant,
                           shape=(int(size_bytes),), size=size_bytes, ranks=ranks)

    @cached_property
    def crowds(self) -> dict[tuple[str, int], frozenset[int]]:
        """Per (collective, group size): the numbers of the host's processes that ran it at
        once in groups of that size (`crowd<N>` rows, profiler/collectives.py)."""
        out: dict[tuple[str, int], set[int]] = {}
        for r in self.collective_rows:
            n = crowd_of(r.variant)
            if n:
                out.setdefault((r.name, r.ranks), set()).add(n)
        return {k: frozenset(v) for k, v in out.items()}

    def variants(self, name: str) -> frozenset[str]:
        """The alternatives measured for an op name (attention backends, optimizers)."""
        return frozenset(r.variant for r in self.rows if r.name == name and r.variant)

    def host_s(self, name: str, *, variant: str | None = None, ranks: int = 1) -> float | None:
        """A measured host cost (profiler/hostcost.py), or None where the profile has
        none: of group size `ranks`, else of the nearest group size measured (the fixed
        costs change little between neighbouring sizes; the nearest is the best guess)."""
        row = self.host_row(name, variant=variant, ranks=ranks)
        return None if row is None else row.time_s

    def host_row(self, name: str, *, variant: str | None = None, ranks: int = 1
                 ) -> ProfileRow | None:
        """The host row `host_s` reads (its size too; the smallest measured), or None."""
        rows = self.sized_host_rows(name, variant=variant, ranks=ranks)
        return rows[0] if rows else None

    def sized_host_rows(self, name: str, *, variant: str | None = None, ranks: int = 1
                        ) -> list[ProfileRow]:
        """The host rows `name` (of `variant`) at group size `ranks`, else at the nearest
        measured (the smaller of two as near), smallest size first."""
        found = [r for r in self.host_rows if r.name == name
                 and (r.variant or "") == (variant or "")]
        if not found:
            return []
        nearest = min({r.ranks for r in found}, key=lambda g: (abs(g - ranks), g))
        return sorted((r for r in found if r.ranks == nearest), key=lambda r: r.bytes)

    @property
    def op_rows(self) -> tuple[ProfileRow, ...]:
        return tuple(r for r in self.rows if r.kind not in ("collective", "host"))

    @cached_property
    def host_rows(self) -> tuple[ProfileRow, ...]:
        return tuple(r for r in self.rows if r.kind == "host")

    @property
    def collective_rows(self) -> tuple[ProfileRow, ...]:
        return tuple(r for r in self.rows if r.kind == "collective")

    @cached_property
    def collective_cpu_shares(self) -> dict[tuple[str, int], list[float]]:
        """Per (collective, group size), for each size measured: the share of the
        collective's seconds per call that a rank's process was busy on the CPU, its
        `cpu.<collective>` host row against its collective row (written for gloo,
        profiler/collectives.py). Uncapped: threads beside the caller may add up past 1."""
        cpu = {(r.name[len("cpu."):], r.shape, r.ranks): r.time_s for r in self.host_rows
               if r.name.startswith("cpu.")}
        shares: dict[tuple[str, int], list[float]] = {}
        for r in self.collective_rows:
            if r.variant:  # measured in a crowd (`crowds`): the shares are the alone ones
                continue
            busy = cpu.get((r.name, r.shape, r.ranks))
            if busy is not None:
                shares.setdefault((r.name, r.ranks), []).append(busy / r.time_s)
        return shares


def crowd_variant(nprocs: int) -> str:
    """The variant of collective rows measured with `nprocs` processes of the host in the
    collective at once, in groups of the row's `ranks` (profiler/collectives.py)."""
    return f"crowd{nprocs}"


def crowd_of(variant: str | None) -> int:
    """The processes at once of a `crowd_variant` (0 for any other variant)."""
    if variant and variant.startswith("crowd") and variant[5:].isdigit():
        return int(variant[5:])
    return 0


def _key(r: ProfileRow) -> SeriesKey:
    return (r.kind, r.name, r.variant or "", r.ranks)


_COLUMNS = tuple(f.name for f in dataclasses.fields(ProfileRow))


def _cell_text(value: object) -> str:
    """A value as its CSV cell: empty for None, a shape's numbers joined by x, a float
    with every digit it holds (`repr`), so that a file reads back exactly."""
    if value is None:
        return ""
    if isinstance(value, tuple | list):
        return "x".join(str(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def _head(meta: ProfileMeta) -> str:
    """The title line and the metadata as `# ` YAML lines."""
    import yaml

    lines = yaml.safe_dump(dump(meta), sort_keys=False, width=1000).splitlines()
    return "## trainplan profile (schema: docs/profiles.md)\n" + "".join(
        f"# {line}\n" for line in lines)


def _table_text(head: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    buf = io.StringIO()
    buf.write(head)
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell_text(v) for v in row] for row in rows)
    return buf.getvalue()


def _values(row: ProfileRow) -> list[object]:
    return [getattr(row, name) for name in _COLUMNS]


def profile_text(meta: ProfileMeta, rows: Iterable[ProfileRow]) -> str:
    """The CSV form: metadata as `# ` YAML lines, then the table."""
    return _table_text(_head(meta), _COLUMNS, map(_values, rows))


def is_parquet(path: str) -> bool:
    """Whether `path` names a profile's Parquet form (by its extension); else CSV."""
    return path.lower().endswith(".parquet")


def save_profile(path: str, meta: ProfileMeta, rows: Iterable[ProfileRow]) -> None:
    """Write a profile atomically (a reader never sees half a file), as Parquet where
    `path` ends in .parquet (`profiler/parquet.py`), else as CSV."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    if is_parquet(path):
        from profiler.parquet import write_parquet

        with atomic_path(path) as tmp:
            write_parquet(tmp, head=_head(meta), columns=_PARQUET_COLUMNS,
                          rows=[_values(r) for r in rows])
        return
    text = profile_text(meta, rows)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


_HINTS = typing.get_type_hints(ProfileRow)
# each column's Parquet type: a shape a list of integers; text where the field is one
_PARQUET_COLUMNS: dict[str, ColumnKind] = {
    name: "ints" if name == "shape" else "int" if _HINTS[name] is int
    else "float" if _HINTS[name] is float else "str" for name in _COLUMNS}


def _cell(name: str, text: str, where: str) -> object:
    """A CSV cell as the type its field wants (the spec loader checks it after)."""
    hint = _HINTS[name]
    if text == "":
        return None
    try:
        if hint is int:
            return int(text)
        if hint is float:
            return float(text)
        if name == "shape":
            return [int(v) for v in text.split("x")]
    except ValueError:
        fail(where, text, f"expected {'integers joined by x' if name == 'shape' else hint.__name__}")
    return text


def _records(lines: list[str], path: str) -> Iterator[list[str]]:
    """The CSV records of `lines`; one the csv module cannot read (a cell past its
    131,072-character limit) is a SpecError naming the record."""
    reader = csv.reader(lines)
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            where = "header" if reader.line_num <= 1 else f"row {reader.line_num - 1}"
            fail(f"{path}:{where}", f"unreadable CSV ({err})",
                 "cells of at most 131,072 characters")
        yield record


def parse_profile_text(text: str, *, path: str, own_lines: bool = True) -> Profile:
    """A Profile from its CSV form; every problem is a SpecError naming file, row, field
    (and the line, where `own_lines`: the text is the file's own, not a Parquet file's)."""
    lines = text.removeprefix("\ufeff").splitlines()  # a spreadsheet's byte-order mark
    if not lines or not lines[0].startswith("#"):
        fail(path, lines[0][:60] if lines else "an empty file",
             "a trainplan profile (`## trainplan profile` and `# ` metadata lines, then the "
             "table; `plan profile measure` writes one)")
    numbered = [(n, ln) for n, ln in enumerate(lines, start=1)
                if ln.strip()]  # blank lines (a hand edit) hold nothing
    head = [ln[2:] if ln.startswith("# ") else ln[1:] for _, ln in numbered
            if ln.startswith("#") and not ln.startswith("##")]  # "##": a title, not YAML
    body = [ln for _, ln in numbered if not ln.startswith("#")]
    line_of = [n for n, ln in numbered if not ln.startswith("#")]  # body index -> file line
    raw = load_yaml_text("\n".join(head), where=path) or {}
    if not isinstance(raw, dict):
        fail(path, raw, "expected `# key: value` metadata lines before the table")
    version = raw.get("schema_version")
    if version != PROFILE_SCHEMA_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) \
            and version > PROFILE_SCHEMA_VERSION
        fail(at(f"{path}:", "schema_version"), version,
             f"this trainplan reads profile schema version {PROFILE_SCHEMA_VERSION}; "
             + ("the file was written by a newer trainplan: update this one"
                if newer else "re-measure with `plan profile`"))
    meta = parse(ProfileMeta, raw, where=f"{path}:")
    reader = _records(body, path)
    header = next(reader, None)
    if header is None or tuple(header) != _COLUMNS:
        fail(f"{path}: header", header, "expected columns " + ",".join(_COLUMNS))
    rows: list[ProfileRow] = []
    first_row: dict[tuple, int] = {}
    for i, record in enumerate(reader, start=1):
        # csv reads one record a line here (the writer quotes no newlines)
        where = f"{path}:row {i}" + (
            f" (line {line_of[i] if i < len(line_of) else '?'})" if own_lines else "")
        if len(record) != len(_COLUMNS):
            fail(where, record, f"{len(_COLUMNS)} columns; it has {len(record)}")
        data = {name: _cell(name, cell, at(where + ":", name))
                for name, cell in zip(_COLUMNS, record, strict=True)}
        row = parse(ProfileRow, {k: v for k, v in data.items() if v is not None},
                    where=where + ":")
        # an op or collective priced by lookup (host rows of several runs are combined by
        # their readers: `planner.costs.host.shared_cores` takes the least)
        first = first_row.setdefault((_key(row), row.shape), i) if row.kind != "host" else i
        # the lookup would take one of two times (the same time twice prices alike)
        if first != i and rows[first - 1].time_s != row.time_s:
            fail(where, f"{row.kind} {row.name} {'x'.join(map(str, row.shape))} in "
                 f"{row.time_s:g} s", f"one measurement of an op and shape a file; row "
                 f"{first}{f' (line {line_of[first]})' if own_lines else ''} measures it in "
                 f"{rows[first - 1].time_s:g} s")
        rows.append(row)
    if not rows:  # it would price nothing, and the sources would still name it
        fail(path, "a header and no rows", "a profile with measured rows (plan profile "
             "measure writes them)")
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Profile(path=path, meta=meta, rows=tuple(rows), digest=digest)


def load_profile(path: str) -> Profile:
    """Read and validate one profile file, CSV or (by its extension) Parquet."""
    if is_parquet(path):
        from profiler.parquet import read_parquet

        head, columns, rows = read_parquet(path)
        for i, row in enumerate(rows, start=1):  # a line break would split the CSV form's row
            for name, value in zip(columns, row, strict=True):
                if isinstance(value, str) and not value.isprintable():
                    fail(f"{path}:row {i}:{name}", value,
                         "a name or value of one line without control characters")
        return parse_profile_text(_table_text(head, columns, rows), path=path,
                                  own_lines=False)
    return parse_profile_text(read_text(path), path=path)


@dataclass(frozen=True)
class Profiles:
    """The profiles a plan is priced with, at most one per device type (a file's op rows
    and another file's collective rows of the same device are merged). Hashable by
    content, so cost caches keyed on it stay apart from those without it."""

    by_device: tuple[tuple[str, Profile], ...] = ()
    # what a reader should be told about them (an interrupted file, files that disagree)
    notes: tuple[str, ...] = ()

    def get(self, device_name: str) -> Profile | None:
        for name, profile in self.by_device:
            if name == device_name:
                return profile
        return None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p.path for _, p in self.by_device)


def _merge(profiles: Sequence[Profile]) -> Profile:
    if len(profiles) == 1:
        return profiles[0]
    profiles = sorted(profiles, key=lambda p: not p.op_rows)  # op profiles first
    first = profiles[0]
    rows = tuple(r for p in profiles for r in p.rows)
    return Profile(path=" + ".join(p.path for p in profiles), meta=first.meta, rows=rows,
                   digest=hashlib.sha256("".join(p.digest for p in profiles).encode()).hexdigest(),
                   collective_path=" + ".join(p.path for p in profiles if p.collective_rows))


# A GEMM or attention row faster than this many times the datasheet peak of the precision
# it ran in is not a measurement of that GPU (a hand edit, a mislabelled device or dtype):
# the fastest kernels in the measured tables here reach 0.82 of their peak (OpenXLA's
# sm_90 / sm_100 matmul tables: bf16 809 of 989 TFLOP/s on H100, FP8 3,280 of 4,500 on
# B200; planner/data/reference/README.md); the margin allows for a timer's error.
PEAK_MARGIN = 1.1


def row_peak_flops(profile: Profile) -> float:
    """The datasheet peak FLOP/s of the precision a GPU profile's compute rows ran in: its
    dtype's (fp16 where the GPU has no bf16; under fp8 the fp8 peak, the fastest its rows
    may reach). An fp32 profile measured GEMMs without TF32 (PyTorch's default), so its
    peak is the fp32 one."""
    from profiler.analytic import math_dtype

    dev = device(profile.meta.device)
    return dev.peak_flops(math_dtype(dev, profile.meta.dtype))


def _check_measured_on(profile: Profile, where: str) -> None:
    """Refuse a profile whose metadata says it was measured elsewhere than its device: a
    GPU's without a CUDA runtime (`plan profile` writes one for every GPU measurement,
    and null on the CPU), or the CPU's with one."""
    meta = profile.meta
    on_cpu = device(meta.device).vendor == "cpu"
    if not on_cpu and meta.cuda_version is None:
        fail(f"{where}: device", meta.device,
             f"a profile measured on that GPU; this one has no CUDA runtime (cuda_version "
             f"null, torch {meta.torch_version}, {meta.device_detail}): measured on a CPU")
    if on_cpu and meta.cuda_version is not None:
        fail(f"{where}: device", meta.device,
             f"a profile measured on the CPU; this one ran on a GPU (cuda_version "
             f"{meta.cuda_version}, {meta.device_detail})")


def _check_rates(profile: Profile, where: str) -> None:
    """Refuse a GPU profile's compute row beyond `PEAK_MARGIN` x the peak of the
    precision it ran in (CPU entries stand for any host's cores: their peak is a
    template's)."""
    dev = device(profile.meta.device)
    if dev.vendor == "cpu":
        return
    peak = row_peak_flops(profile)
    for r in profile.op_rows:
        if r.kind in _BY_FLOPS and r.flops / r.time_s > PEAK_MARGIN * peak:
            fail(where, f"{r.kind} {r.name} {'x'.join(map(str, r.shape))} at "
                 f"{r.flops / r.time_s / 1e12:,.0f} TFLOP/s",
                 f"at most {PEAK_MARGIN} x {dev.name}'s {profile.meta.dtype} datasheet peak "
                 f"({peak / 1e12:,.0f} TFLOP/s): not a measurement of this GPU in "
                 f"{profile.meta.dtype}")


def load_profiles(paths: Sequence[str], *, devices: Sequence[str], dtype: str,
                  where: str = "--profile") -> Profiles:
    """The profiles in `paths` (files, or folders of *.csv and *.parquet) for the plan's
    device types trained in `dtype`. A file named explicitly must fit (its device is one of `devices`,
    its op rows are of `dtype`, a CPU profile's ops measured with one thread as CPU ranks
    run); files in a folder that do not fit are skipped. A file reached twice (named and
    in a named folder) counts once. `Profiles.notes` says what a reader should know: an
    interrupted file, files of one device whose measurements of the same op disagree."""
    chosen: dict[str, list[Profile]] = {}
    skipped: list[str] = []  # what the folders held that did not fit: "device dtype"
    seen: set[str] = set()
    notes: list[str] = []
    for path in paths:
        explicit = not os.path.isdir(path)
        files = [path] if explicit else sorted(
            os.path.join(path, f) for f in os.listdir(path)
            if f.endswith(".csv") or is_parquet(f))
        for file in files:
            real = os.path.realpath(file)
            if real in seen:
                continue
            seen.add(real)
            profile = load_profile(file)
            meta = profile.meta
            if meta.device not in devices:
                if explicit:
                    fail(f"{where} {file}: device", meta.device,
                         f"the plan's GPUs are {', '.join(devices)}")
                skipped.append(f"{meta.device} {meta.dtype}")
                continue
            if profile.op_rows and meta.dtype != dtype:
                if explicit:
                    fail(f"{where} {file}: dtype", meta.dtype,
                         f"the plan trains in {dtype} (--dtype); profile that dtype")
                skipped.append(f"{meta.device} {meta.dtype}")
                continue
            if profile.op_rows and device(meta.device).vendor == "cpu" and meta.num_threads != 1:
                if explicit:
                    fail(f"{where} {file}: num_threads", meta.num_threads,
                         "1: CPU ranks run one thread each (executor/runtime.py); measure "
                         "with `plan profile measure --threads 1`")
                skipped.append(f"{meta.device} {meta.dtype} with {meta.num_threads} threads")
                continue
            _check_measured_on(profile, f"{where} {file}")
            _check_rates(profile, f"{where} {file}")
            kept = interrupted_rows(meta.command)
            if kept is not None:
                notes.append(f"{file} is an interrupted profile: it holds the {kept} rows "
                             "measured before it was stopped; what it lacks is priced by the "
                             "analytic model")
            chosen.setdefault(meta.device, []).append(profile)
    if paths and not chosen:  # folders only, none of it fits: the flag would do nothing
        held = ", ".join(sorted(set(skipped))) or "no profile (*.csv, *.parquet)"
        fail(where, ", ".join(paths), f"a profile of {' or '.join(devices)} in {dtype}; "
             f"it holds {held}")
    for name, ps in sorted(chosen.items()):
        notes.extend(_disagreements(name, ps))
    return Profiles(tuple((name, _merge(ps)) for name, ps in sorted(chosen.items())),
                    notes=tuple(notes))


# Two files of one device whose times of the same op and shape differ by more than this
# factor are said to disagree (the same host measured minutes apart varies by 10-30%,
# docs/executor.md; a profile of another host or setting differs by more)
DISAGREE_FACTOR = 1.5


def _disagreements(name: str, profiles: Sequence[Profile]) -> list[str]:
    """A note for each pair of `profiles` (of device `name`) whose rows of the same op,
    shape and group size differ by more than DISAGREE_FACTOR; their prices pool them."""
    out = []
    for i, a in enumerate(profiles):
        times = {(_key(r), r.shape): r.time_s for r in a.rows if r.kind != "host"}
        for b in profiles[i + 1:]:
            ratios = [r.time_s / times[k] for r in b.rows if r.kind != "host"
                      and (k := (_key(r), r.shape)) in times]
            if not ratios:
                continue
            worst = max(ratios, key=lambda x: abs(math.log(x)))
            if abs(math.log(worst)) > math.log(DISAGREE_FACTOR):
                apart = sum(abs(math.log(x)) > math.log(DISAGREE_FACTOR) for x in ratios)
                out.append(f"{a.path} and {b.path} ({name}) measure {len(ratios)} of the same "
                           f"rows; {apart} differ by more than {DISAGREE_FACTOR}x (up to "
                           f"{max(worst, 1 / worst):.3g}x): the prices take their geometric "
                           "mean, so one of them may not be of this host or setting")
    return out
