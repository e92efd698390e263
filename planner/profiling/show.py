"""`plan profile show`: what a profile measured, as achieved FLOP/s and bandwidth.

Per op series (name and implementation): rows, time range, best achieved FLOP/s and DRAM
bandwidth, and their fraction of the device's datasheet peak. Per collective: the bus
bandwidth of the largest size (nccl-tests' convention: the bytes each rank's links carry,
algorithm bandwidth x 2(n-1)/n for an all-reduce, (n-1)/n for all-gather, reduce-scatter
and all-to-all) and the time of the smallest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.outputs import PICTURE_SUFFIXES, atomic_path, check_output_file
from planner.profiling.cases import op_dtype
from profiler.devices import device
from profiler.store import Profile, ProfileRow, load_profile

__all__ = ["SeriesSummary", "bus_factor", "show_profile", "summarise"]


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth / algorithm bandwidth for a collective over `ranks`."""
    n = ranks
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n}.get(kind, 1.0)


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
    best_bytes_per_s: float  # DRAM traffic, or bus bandwidth for collectives
    smallest_bytes: float
    largest_bytes: float


def _summary(rows: list[ProfileRow]) -> SeriesSummary:
    r0 = rows[0]
    if r0.kind == "collective":
        largest = max(rows, key=lambda r: r.bytes)
        bw = largest.bytes / largest.time_s * bus_factor(r0.name, r0.ranks)
        flops = 0.0
    else:
        bw = max(r.bytes / r.time_s for r in rows)
        flops = max(r.flops / r.time_s for r in rows)
    return SeriesSummary(kind=r0.kind, name=r0.name, variant=r0.variant or "", ranks=r0.ranks,
                         rows=len(rows), min_time_s=min(r.time_s for r in rows),
                         max_time_s=max(r.time_s for r in rows), best_flops_per_s=flops,
                         best_bytes_per_s=bw, smallest_bytes=min(r.bytes for r in rows),
                         largest_bytes=max(r.bytes for r in rows))


def summarise(profile: Profile) -> list[SeriesSummary]:
    """One summary per series, in the order the profile first lists them."""
    series: dict[tuple, list[ProfileRow]] = {}
    for r in profile.rows:
        series.setdefault((r.kind, r.name, r.variant, r.ranks), []).append(r)
    return [_summary(rows) for rows in series.values()]


def _size(b: float) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if b >= scale:
            return f"{b / scale:g}{unit}"
    return f"{b:g}B"


def _lines(profile: Profile, summaries: list[SeriesSummary]) -> list[str]:
    m = profile.meta
    dev = device(m.device)
    peaks: dict[str, float] = {str(k): v for k, v in dev.peak_tflops.items()}

    def peak(name: str) -> float:  # an fp8 profile's ops ran in fp8 or bf16
        return peaks.get(op_dtype(m.dtype, name), peaks.get("fp32", 0.0)) * 1e12

    dram = dev.memory_bandwidth_bytes_per_s
    lines = [f"{profile.path}: {m.device} ({m.device_detail}), {m.dtype}, torch {m.torch_version}"
             f"{', CUDA ' + m.cuda_version if m.cuda_version else ''}, {m.num_threads} "
             f"thread(s), {m.created} on {m.host}"]
    if profile.op_rows:
        lines.append(f"{'op':22} {'variant':9} {'rows':>4} {'time':>19}  {'best FLOP/s':>18}  "
                     f"{'best DRAM B/s':>18}")
    for s in summaries:
        if s.kind == "collective":
            continue
        flops = (f"{s.best_flops_per_s / 1e9:8.1f} G ({s.best_flops_per_s / peak(s.name):4.0%})"
                 if s.best_flops_per_s and peak(s.name) else "")
        bw = f"{s.best_bytes_per_s / 1e9:8.2f} G ({s.best_bytes_per_s / dram:4.0%})"
        times = f"{s.min_time_s * 1e3:.3g}..{s.max_time_s * 1e3:.3g} ms"
        lines.append(f"{s.name:22} {s.variant:9} {s.rows:4d} {times:>19}  {flops:>18}  {bw:>18}")
    colls = [s for s in summaries if s.kind == "collective"]
    if colls:
        lines.append(f"{'collective':16} {'ranks':>5} {'sizes':>16}  {'at smallest':>10}  "
                     f"{'bus bandwidth at largest':>24}")
        for s in colls:
            lines.append(f"{s.name:16} {s.ranks:5d} {_size(s.smallest_bytes):>7}.."
                         f"{_size(s.largest_bytes):<7}  {s.min_time_s * 1e3:7.3f} ms  "
                         f"{s.best_bytes_per_s / 1e9:18.2f} GB/s")
    return lines


def _plot(profile: Profile, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple, list[ProfileRow]] = {}
    for r in profile.rows:
        series.setdefault((r.kind, r.name, r.variant, r.ranks), []).append(r)
    panels = [bool(profile.op_rows), bool(profile.op_rows), bool(profile.collective_rows)]
    fig, used = plt.subplots(1, sum(panels), figsize=(5.5 * sum(panels), 4.5), squeeze=False)
    slots = iter(used[0])
    axes: list = [next(slots) if shown else None for shown in panels]
    for (kind, name, variant, ranks), rows in series.items():
        rows = sorted(rows, key=lambda r: r.size)
        label = f"{name} {variant or ''}".strip()
        if kind in ("gemm", "attention"):
            axes[0].plot([r.flops for r in rows], [r.flops / r.time_s / 1e9 for r in rows],
                         "o-", label=label, ms=3)
        elif kind == "collective":
            axes[2].plot([r.bytes for r in rows], [r.bytes / r.time_s * bus_factor(name, ranks)
                                                   / 1e9 for r in rows], "o-", ms=3,
                         label=f"{name} x{ranks}")
        else:
            axes[1].plot([r.bytes for r in rows], [r.bytes / r.time_s / 1e9 for r in rows],
                         "o-", label=label, ms=3)
    titles = (("achieved GFLOP/s", "FLOPs"), ("achieved DRAM GB/s", "bytes moved"),
              ("collective bus GB/s", "bytes per rank"))
    for ax, (ylabel, xlabel) in zip(axes, titles, strict=True):
        if ax is None:
            continue
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ax.has_data():
            ax.legend(fontsize=6, ncol=2)
    m = profile.meta
    fig.suptitle(f"{m.device} ({m.device_detail}), {m.dtype}, torch {m.torch_version}")
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)


def show_profile(path: str, *, plot: str | None = None, as_json: bool = False) -> int:
    check_output_file(plot, flag="--plot", suffixes=PICTURE_SUFFIXES)
    profile = load_profile(path)
    summaries = summarise(profile)
    if as_json:
        from planner.commands.args import print_json
        from profiler.schema import dump

        print_json({"meta": dump(profile.meta), "series": [asdict(s) for s in summaries]})
    else:
        print("\n".join(_lines(profile, summaries)))
    if plot:
        _plot(profile, plot)
    return 0
