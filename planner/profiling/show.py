"""`plan profile show`: what a profile measured, as achieved FLOP/s and bandwidth.

Per op series (name and implementation): rows, time range, best achieved FLOP/s and
bytes per second, and its efficiency: the share of the device's datasheet peak the op
reached, against the roofline at its arithmetic intensity (the time its FLOPs take at peak
FLOP/s or its bytes at peak DRAM bandwidth, whichever is longer, over the measured time).
That is never over 100%: an op faster than its DRAM roofline had its data in cache (or
moved none: a residual's backward passes its gradient on), which it says instead. Per
collective: the bus bandwidth of the largest size (nccl-tests' convention: the bytes each
rank's links carry, algorithm bandwidth x 2(n-1)/n for an all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all) and the time of the smallest.

The plot draws one small panel per op family (a few series each), efficiency against
size, log axes where sizes span decades.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from planner.outputs import PICTURE_SUFFIXES, atomic_path, check_output_file
from planner.profiling.cases import op_dtype
from profiler.devices import DeviceSpec, device
from profiler.store import Profile, ProfileRow, crowd_of, interrupted_rows, load_profile

__all__ = ["SeriesSummary", "bus_factor", "efficiency", "family", "show_profile", "summarise"]


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth / algorithm bandwidth for a collective over `ranks`."""
    n = ranks
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n}.get(kind, 1.0)


@dataclass(frozen=True)
class Peaks:
    """The device's datasheet peaks for the profile's dtype."""

    flops_per_s: float
    bytes_per_s: float

    @classmethod
    def of(cls, dev: DeviceSpec, dtype: str, op: str | None = None) -> Peaks:
        """In the dtype op `op` of a `dtype` profile ran in (an fp8 profile's GEMMs in
        fp8, its other ops in bf16: `op_dtype`)."""
        if op is not None:
            dtype = op_dtype(dtype, op)
        by_dtype = {str(k): v for k, v in dev.peak_tflops.items()}
        tflops = by_dtype.get(dtype, by_dtype.get("fp32", 0.0))
        return cls(tflops * 1e12, dev.memory_bandwidth_bytes_per_s)


def efficiency(row: ProfileRow, peaks: Peaks) -> tuple[float, str, bool]:
    """(share of the roofline reached, capped at 1; what bounds the op: 'compute' or
    'memory'; whether it beat its roofline: data in cache, or no data moved)."""
    compute_s = row.flops / peaks.flops_per_s if peaks.flops_per_s else 0.0
    memory_s = row.bytes / peaks.bytes_per_s if peaks.bytes_per_s else 0.0
    bound = "compute" if compute_s >= memory_s else "memory"
    ideal = max(compute_s, memory_s)
    return min(1.0, ideal / row.time_s), bound, ideal > row.time_s


@dataclass(frozen=True)
class SeriesSummary:
    kind: str
    name: str
    variant: str
    ranks: int
    rows: int
    min_time_s: float
    max_time_s: float
    best_flops_per_s: float  # 0 for collectives and ops without FLOPs
    best_bytes_per_s: float  # bytes moved per second, or bus bandwidth for collectives
    smallest_bytes: float
    largest_bytes: float
    best_efficiency: float = 0.0  # of the device's roofline, at most 1 (ops only)
    bound: str = ""  # compute | memory: the roof of the best row
    beats_roofline: bool = False  # every row faster than DRAM allows: in cache, or no data


def _summary(rows: list[ProfileRow], peaks: Peaks) -> SeriesSummary:
    r0 = rows[0]
    eff, bound, cached = 0.0, "", False
    if r0.kind == "collective":
        largest = max(rows, key=lambda r: r.bytes)
        bw = largest.bytes / largest.time_s * bus_factor(r0.name, r0.ranks)
        flops = 0.0
    else:
        bw = max(r.bytes / r.time_s for r in rows)
        flops = max(r.flops / r.time_s for r in rows)
        measured = [efficiency(r, peaks) for r in rows]
        honest = [e for e in measured if not e[2]]  # rows within their roofline
        eff, bound, _ = max(honest or measured, key=lambda e: e[0])
        cached = not honest
    return SeriesSummary(kind=r0.kind, name=r0.name, variant=r0.variant or "", ranks=r0.ranks,
                         rows=len(rows), min_time_s=min(r.time_s for r in rows),
                         max_time_s=max(r.time_s for r in rows), best_flops_per_s=flops,
                         best_bytes_per_s=bw, smallest_bytes=min(r.bytes for r in rows),
                         largest_bytes=max(r.bytes for r in rows), best_efficiency=eff,
                         bound=bound, beats_roofline=cached)


def _series(profile: Profile) -> dict[tuple, list[ProfileRow]]:
    series: dict[tuple, list[ProfileRow]] = {}
    for r in profile.rows:
        series.setdefault((r.kind, r.name, r.variant, r.ranks), []).append(r)
    return series


def summarise(profile: Profile) -> list[SeriesSummary]:
    """One summary per series, in the order the profile first lists them."""
    dev, dtype = device(profile.meta.device), profile.meta.dtype
    return [_summary(rows, Peaks.of(dev, dtype, rows[0].name))
            for rows in _series(profile).values()]


def _size(b: float) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if b >= scale:
            return f"{b / scale:g}{unit}"
    return f"{b:g}B"


def _efficiency_cell(s: SeriesSummary) -> str:
    if s.beats_roofline:
        return "above DRAM peak (cache)"
    roof = "peak FLOP/s" if s.bound == "compute" else "DRAM bandwidth"
    return f"{s.best_efficiency:4.0%} of {roof}"


def _lines(profile: Profile, summaries: list[SeriesSummary]) -> list[str]:
    m = profile.meta
    peaks = Peaks.of(device(m.device), m.dtype)
    lines = [f"{profile.path}: {m.device} ({m.device_detail}), {m.dtype}, torch {m.torch_version}"
             f"{', CUDA ' + m.cuda_version if m.cuda_version else ''}, {m.num_threads} "
             f"thread(s), {m.created} on {m.host}",
             f"device peaks (datasheet): {peaks.flops_per_s / 1e9:,.0f} GFLOP/s {m.dtype}, "
             f"{peaks.bytes_per_s / 1e9:,.1f} GB/s DRAM"]
    kept = interrupted_rows(m.command)
    if kept is not None:
        lines.append(f"! interrupted: holds the {kept} rows measured before it was stopped; "
                     "measure again for the whole profile")
    if profile.op_rows:
        lines.append(f"{'op':20} {'variant':9} {'rows':>4} {'time':>19}  {'best FLOP/s':>13}  "
                     f"{'best bytes/s':>12}  efficiency (best)")
    for s in summaries:
        if s.kind in ("collective", "host"):
            continue
        flops = f"{s.best_flops_per_s / 1e9:7.1f} GFLOP/s" if s.best_flops_per_s else ""
        bw = f"{s.best_bytes_per_s / 1e9:7.2f} GB/s"
        times = f"{s.min_time_s * 1e3:.3g}..{s.max_time_s * 1e3:.3g} ms"
        lines.append(f"{s.name:20} {s.variant:9} {s.rows:4d} {times:>19}  {flops:>13}  "
                     f"{bw:>12}  {_efficiency_cell(s)}")
    colls = [s for s in summaries if s.kind == "collective"]
    busy = {key: statistics.median(v) for key, v in profile.collective_cpu_shares.items()}
    if colls:
        ranks = [f"{s.ranks}" + (f" ({crowd_of(s.variant)} at once)" if crowd_of(s.variant)
                                 else "") for s in colls]
        w = max(5, *map(len, ranks))
        lines.append(f"{'collective':16} {'ranks':>{w}} {'sizes':>16}  {'at smallest':>10}  "
                     f"{'bus bandwidth at largest':>24}" + ("  CPU busy (median)" if busy else ""))
        for s, n in zip(colls, ranks, strict=True):
            share = None if s.variant else busy.get((s.name, s.ranks))
            lines.append(f"{s.name:16} {n:>{w}} {_size(s.smallest_bytes):>7}.."
                         f"{_size(s.largest_bytes):<7}  {s.min_time_s * 1e3:7.3f} ms  "
                         f"{s.best_bytes_per_s / 1e9:18.2f} GB/s"
                         + (f"  {share:17.0%}" if share is not None else ""))
    # the per-size CPU seconds of each collective are summed up in its row above
    hosts = [r for r in profile.rows if r.kind == "host" and not r.name.startswith("cpu.")]
    if hosts:  # profiler/hostcost.py: seconds each, not ops with a roofline
        lines.append(f"{'host cost':24} {'variant':8} {'ranks':>5}  {'median':>10}")
        lines += [f"{r.name:24} {r.variant or '':8} {r.ranks:5d}  {r.time_s * 1e3:7.3f} ms"
                  for r in hosts]
    if any(s.beats_roofline for s in summaries if s.kind != "host"):
        lines.append("above DRAM peak (cache): faster than the device's DRAM bandwidth allows "
                     "for the bytes the op is counted to move; its data stayed in cache (or "
                     "it moves none)")
    return lines


# --- the plot ----------------------------------------------------------------------------

_STRIP = (".bwd", ".dgrad", ".wgrad")


def family(row: ProfileRow) -> str:
    """The panel an op's series goes in: its kind of work, a few series each."""
    if row.kind == "collective":
        return f"collective: {row.name.replace('_', ' ')}"
    base = row.name
    for suffix in _STRIP:
        base = base.removesuffix(suffix)
    part, _, op = base.partition(".")
    if row.kind == "gemm":
        if op in ("qkv", "proj"):
            return "attention projection GEMMs"
        if part == "attn":
            return "attention score GEMMs (unfused)"
        return "MLP GEMMs" if part == "mlp" else f"{part} GEMMs"
    if row.kind == "attention":
        return "attention kernels"
    if row.kind == "optimizer":
        return "optimizer step"
    if op == "norm":
        return "norms"
    if part in ("embed",) or op == "loss":
        return "embedding and loss"
    return "other element-wise"


def _label(row: ProfileRow) -> str:
    """A series' name within its panel (norms of every layer part are one op)."""
    name = row.name.split(".", 1)[-1] if row.kind != "collective" else f"{row.ranks} ranks"
    return f"{name} {row.variant or ''}".strip()


def _panels(profile: Profile) -> dict[str, dict[str, list[ProfileRow]]]:
    """family -> series label -> rows by size; a label met twice (the same norm in every
    layer part) keeps its first series."""
    panels: dict[str, dict[str, list[ProfileRow]]] = {}
    for rows in _series(profile).values():
        fam = family(rows[0])
        label = _label(rows[0])
        if fam == "norms":
            label = "backward" if rows[0].name.endswith(".bwd") else "forward"
        panels.setdefault(fam, {}).setdefault(label, sorted(rows, key=lambda r: r.size))
    return panels


def _best_per_size(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """The highest y at each distinct x, by x: a series' line where rows of several shapes
    share a size."""
    best: dict[float, float] = {}
    for x, y in zip(xs, ys, strict=True):
        best[x] = max(y, best.get(x, y))
    keys = sorted(best)
    return keys, [best[x] for x in keys]


def _plot(profile: Profile, path: str) -> None:
    import matplotlib.pyplot as plt

    fig = _figure(profile)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)


def _figure(profile: Profile) -> Any:
    """The plot as a matplotlib Figure: a panel per op family, each key beside its panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import (
        EngFormatter,
        LogLocator,
        MaxNLocator,
        NullFormatter,
        PercentFormatter,
    )

    m = profile.meta
    dev = device(m.device)
    peaks = Peaks.of(dev, m.dtype)
    panels = _panels(profile)
    cols = min(3, len(panels))
    rows_n = math.ceil(len(panels) / cols)
    # each panel's key sits to its right, over no data
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.0 * cols, 3.4 * rows_n), squeeze=False)
    for ax, (fam, series) in zip(axes.flat, panels.items(), strict=False):
        sizes: list[float] = []
        collective = fam.startswith("collective")
        for label, rows in series.items():
            xs = [r.size for r in rows]
            sizes += xs
            if collective:
                ys = [r.bytes / r.time_s * bus_factor(r.name, r.ranks) / 1e9 for r in rows]
            else:
                effs = [efficiency(r, Peaks.of(dev, m.dtype, r.name)) for r in rows]
                ys = [e[0] for e in effs]
            # every row a dot; the line through the best at each size (shapes of one size
            # drew vertical strokes)
            line, = ax.plot(*_best_per_size(xs, ys), "-", lw=1.2, label=label)
            ax.plot(xs, ys, "o", ms=3, color=line.get_color())
            if collective:
                continue
            cached = [(x, e[0]) for x, e in zip(xs, effs, strict=True) if e[2]]
            if cached:  # faster than the roofline: drawn at 100%, hollow
                ax.plot(*zip(*cached, strict=True), "o", ms=6, mfc="white",
                        mec=line.get_color())
        if max(sizes) / max(min(sizes), 1e-30) >= 10:  # sizes span a decade or more
            ax.set_xscale("log")
            decades = math.log10(max(sizes) / min(sizes))
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)
                                                  if decades < 3 else (1.0,)))
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 400k, 1.2M, not 1e6 offsets
        if collective:
            ax.set_ylabel("bus bandwidth (GB/s)", fontsize=8)
            ax.set_ylim(bottom=0)
        else:
            ax.set_ylim(0, 1.05)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_ylabel("of device peak (roofline)", fontsize=8)
        kinds = {r.kind for rows in series.values() for r in rows}
        ax.set_xlabel("FLOPs per call" if kinds <= {"gemm", "attention"} else
                      "bytes per rank" if collective else "bytes moved per call", fontsize=8)
        ax.set_title(fam, fontsize=10)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, which="major")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
                  frameon=False)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    what = ("collective bus bandwidth" if not profile.op_rows else
            f"efficiency against the roofline (peaks {peaks.flops_per_s / 1e9:,.0f} GFLOP/s, "
            f"{peaks.bytes_per_s / 1e9:,.0f} GB/s); hollow: above the DRAM peak (in cache)")
    fig.suptitle(f"{m.device} ({m.device_detail}), {m.dtype}, torch {m.torch_version}: {what}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def show_profile(path: str, *, plot: str | None = None, as_json: bool = False) -> int:
    check_output_file(plot, flag="--plot", suffixes=PICTURE_SUFFIXES)
    profile = load_profile(path)
    summaries = summarise(profile)
    if as_json:
        from planner.commands.args import print_json
        from profiler.schema import dump

        print_json({"meta": dump(profile.meta),
                    "interrupted_rows": interrupted_rows(profile.meta.command),
                    "series": [asdict(s) for s in summaries]})
    else:
        print("\n".join(_lines(profile, summaries)))
    if plot:
        _plot(profile, plot)
    return 0
