"""The what-if report's pictures (matplotlib, written as PNG files)."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from planner.describe import count_words, gpu_short_names
from planner.outputs import atomic_path
from planner.predict.results import StageSummary
from planner.specs.plan import Plan
from planner.whatif.report import Row, best_row, replica_kinds
from profiler.store import Profiles

__all__ = ["draw_all"]

GIB = 1024**3


def draw_all(rows: Sequence[Row], out_dir: str, *, profiles: Profiles | None = None
             ) -> dict[str, str]:
    """The figures that have something to show, as {name: path}; `profiles` price the
    best plan's timeline as they priced the search."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    for name, draw in (("cost_vs_time", _cost_vs_time), ("breakdown", _breakdown),
                       ("memory", _memory),
                       ("gantt", functools.partial(_gantt, profiles=profiles))):
        path = os.path.join(out_dir, f"{name}.png")
        try:
            if draw(rows, path):
                paths[name] = path
            elif os.path.exists(path):  # an earlier report's figure would not be this one's
                os.remove(path)
        finally:
            plt.close("all")  # a figure left open by an error is not kept
    return paths


def _save(fig: object, path: str) -> bool:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]  # matplotlib's Figure
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)  # type: ignore[attr-defined]  # matplotlib's Figure
    finally:
        plt.close(fig)  # type: ignore[arg-type]  # matplotlib's Figure
    return True


def _wide(values: Sequence[float]) -> bool:
    """Whether values span more than 5x (a log axis); never with a zero (free GPUs cost
    $0, and a log axis has no 0)."""
    return min(values) > 0 and max(values) / min(values) > 5


def _pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better)."""
    return [i for i, (x, y) in enumerate(points)
            if not any(a <= x and b <= y and (a, b) != (x, y) for a, b in points)]


def _plain_log_ticks(axis: object) -> None:
    """A log axis labelled with plain numbers (20, 30, 100), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    def plain(value: float, _pos: object) -> str:
        return f"{value:,.0f}" if value >= 10 else f"{value:g}"

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))  # type: ignore[attr-defined]  # a matplotlib Axis
    axis.set_major_formatter(FuncFormatter(plain))  # type: ignore[attr-defined]  # a matplotlib Axis
    axis.set_minor_formatter(FuncFormatter(lambda *_: ""))  # type: ignore[attr-defined]  # a matplotlib Axis


def costs_plotted(rows: Sequence[Row]) -> bool:
    """Whether the cost figure plots cost against time to train (every planned row has a
    price), else bars of time alone."""
    return all(r.total_usd is not None for r in rows if r.time_to_train_s is not None)


def _cost_vs_time(rows: Sequence[Row], path: str) -> bool:
    """Each planned scenario as a point labelled with its number (the key lists the
    numbers), labels placed where they cover no other label or point (points that
    coincide share one label, '1, 5'), the Pareto front red; log axes when the scenarios
    span a wide range. What the colours mean is in the key, not over the data."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    planned = [(i, r) for i, r in enumerate(rows, 1) if r.time_to_train_s is not None]
    if not planned:
        return False
    height = max(5.5, 0.17 * len(rows) + 2.5)  # the key's lines fit beside the plot
    fig, (ax, key) = plt.subplots(1, 2, figsize=(12, height),
                                  gridspec_kw={"width_ratios": [3, 1]})
    days = [r.time_to_train_s / 86400 for _, r in planned]  # type: ignore[operator]  # planned rows have a time
    costs = [None if r.total_usd is None else r.total_usd / 1e3 for _, r in planned]
    handles: list[object] = []
    priced = costs_plotted(rows)
    if priced:
        pts = list(zip(days, costs, strict=True))
        front = sorted(_pareto(pts), key=lambda j: pts[j][0])  # type: ignore[arg-type]  # points of planned rows
        if len(front) > 1:
            ax.plot([pts[j][0] for j in front], [pts[j][1] for j in front], "--",
                    color="tab:red", zorder=2)
        ax.set_ylabel("total cost (thousand $)")
        if _wide(costs):  # type: ignore[arg-type]  # priced rows only
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
        if _wide(days):
            ax.set_xscale("log")
            _plain_log_ticks(ax.xaxis)
        colours = ["tab:red" if j in front else "tab:blue" for j in range(len(pts))]
        ax.scatter(days, costs, s=MARKER_AREA, color=colours, zorder=3)
        ax.margins(0.12)
        ax.set_xlabel("time to train (days)")
        ax.grid(alpha=0.3, which="both")
        fig.tight_layout()  # the axes' final place, so labels are placed in it
        numbered_labels(ax, [(x, y, str(i)) for (i, _), x, y in  # type: ignore[misc]  # priced rows only
                             zip(planned, days, costs, strict=True)])
        handles = [Line2D([], [], ls="--" if len(front) > 1 else "", marker="o",
                          color="tab:red", label="no other scenario is both\nfaster and "
                          "cheaper"),
                   Line2D([], [], ls="", marker="o", color="tab:blue",
                          label="another scenario is at\nleast as fast and as\ncheap")]
    else:  # some scenario has no prices: time only
        ax.barh([str(i) for i, _ in planned], days)
        ax.invert_yaxis()
        ax.set_ylabel("scenario")
        if _wide(days):
            ax.set_xscale("log")
            _plain_log_ticks(ax.xaxis)
        ax.set_xlabel("time to train (days)")
        ax.grid(alpha=0.3, which="both", axis="x")
    budgets = {r.setting.tokens for _, r in planned}
    ax.set_title(("Cost against time to train" if priced else "Time to train") + (
        f" ({count_words(budgets.pop())} tokens)" if len(budgets) == 1
        else " (token budgets differ: see the key)"))
    key.axis("off")
    base_tokens = rows[0].setting.tokens
    lines = [f"{i:>2}  {r.label}" + ("" if r.time_to_train_s is not None else "  (no plan)")
             + ("" if r.setting.tokens == base_tokens
                else f"  ({count_words(r.setting.tokens)} tokens)")
             for i, r in enumerate(rows, 1)]
    key.text(0, 1, "\n".join(lines), va="top", fontsize=8, family="monospace", wrap=True)
    if handles:
        key.legend(handles=handles, loc="lower left", fontsize=8, frameon=False,
                   borderaxespad=0)
    return _save(fig, path)


MARKER_AREA = 45  # points^2: a dot, its number beside it


def numbered_labels(ax: object, points: Sequence[tuple[float, float, str]]) -> list[object]:
    """Write each point's label beside it, where it covers no other label, no point and
    stays in the axes if it can (else where it covers least); points whose markers touch
    share one label ('1, 5'). Returns the labels (matplotlib Annotations)."""
    fig = ax.figure  # type: ignore[attr-defined]  # a matplotlib Axes
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform  # type: ignore[attr-defined]  # a matplotlib Axes
    px = [tuple(to_px((x, y))) for x, y, _ in points]
    radius = (MARKER_AREA ** 0.5) / 2 * fig.dpi / 72  # a marker's radius in pixels
    groups: list[list[int]] = []  # points whose markers touch, transitively
    for i, (a, b) in enumerate(px):
        near = [g for g in groups if any((a - px[j][0]) ** 2 + (b - px[j][1]) ** 2
                                         < (2.2 * radius) ** 2 for j in g)]
        merged = [i] + [j for g in near for j in g]
        groups = [g for g in groups if g not in near] + [sorted(merged)]
    markers = [(a - radius, b - radius, a + radius, b + radius) for a, b in px]
    frame = ax.get_window_extent(renderer)  # type: ignore[attr-defined]  # a matplotlib Axes
    placed: list[tuple[float, float, float, float]] = []
    labels = []
    gap = 2 + (MARKER_AREA ** 0.5) / 2  # points from the centre: beside the marker
    offsets = [(dx * gap * k, dy * gap * k) for k in (1, 2, 3, 4)
               for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1),
                              (-1, -1))]
    for g in sorted(groups, key=lambda g: min(g)):
        x = sum(points[j][0] for j in g) / len(g) if len(g) > 1 else points[g[0]][0]
        y = sum(points[j][1] for j in g) / len(g) if len(g) > 1 else points[g[0]][1]
        text = ", ".join(points[j][2] for j in g)
        best: tuple[float, object, tuple[float, float, float, float]] | None = None
        for dx, dy in offsets:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",  # type: ignore[attr-defined]  # a matplotlib Axes
                              ha=ha, va=va, fontsize=9, fontweight="bold", zorder=4)
            e = ann.get_window_extent(renderer)
            box = (e.x0, e.y0, e.x1, e.y1)
            own = {j for j in g}
            cover = sum(_overlap(box, o) for o in placed) + sum(
                _overlap(box, m) for j, m in enumerate(markers) if j not in own)
            outside = (e.x1 - e.x0) * (e.y1 - e.y0) - _overlap(
                box, (frame.x0, frame.y0, frame.x1, frame.y1))
            score = cover + outside
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()  # type: ignore[attr-defined]  # a matplotlib Annotation
                best = (score, ann, box)
            else:
                ann.remove()
            if score == 0:
                break
        assert best is not None
        placed.append(best[2])
        labels.append(best[1])
    return labels


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]
             ) -> float:
    """The area two boxes (x0, y0, x1, y1) share."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


_PARTS = [("compute", "compute_s", "tab:blue"),
          ("recomputation", None, "lightsteelblue"),
          ("kernel-launch waits", "host_overhead_s", "tab:gray"),
          ("tensor-parallel comm.", "tp_comm_s", "tab:orange"),
          ("context-parallel comm.", "cp_comm_s", "tab:brown"),
          ("expert-parallel all-to-all", "ep_comm_s", "tab:cyan"),
          ("pipeline comm.", "pp_comm_s", "tab:pink"),
          ("data-parallel comm.", "dp_comm_s", "tab:red"),
          ("pipeline bubble", "bubble_s", "tab:olive"), ("optimizer", "optimizer_s", "tab:purple")]


def _breakdown(rows: Sequence[Row], path: str) -> bool:
    """A bar per scenario (one without a plan says so), split into what its iteration
    spends; the key beside the plot."""
    import matplotlib.pyplot as plt

    planned = [r for r in rows if r.result is not None]
    if not planned:
        return False
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.8))
    labels = [r.label for r in rows]
    left = [0.0] * len(rows)
    for name, field, colour in _PARTS:
        widths = []
        for r in rows:
            if r.result is None:
                widths.append(0.0)
            elif field is None:  # recomputation: the part of compute spent on it
                widths.append(r.recompute_s)
            elif field == "compute_s":
                widths.append(r.result.breakdown.compute_s - r.recompute_s)
            else:
                widths.append(getattr(r.result.breakdown, field))
        if any(widths):
            ax.barh(labels, widths, left=left, color=colour, label=name)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, r in enumerate(rows):
        if r.result is None:
            ax.text(0, i, "  no plan (see the table)", va="center", fontsize=8, color="gray")
    ax.invert_yaxis()
    ax.set_xlabel("seconds per iteration (event simulation, slowest stage)")
    ax.set_title("Where each scenario's iteration goes")
    ax.grid(alpha=0.3, axis="x")
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


_KINDS = [("parameters", "params_bytes"), ("gradients", "grads_bytes"),
          ("optimizer states", "optimizer_bytes"), ("activations", "activations_bytes"),
          ("buffers", "buffers_bytes"), ("runtime reserve", "reserve_bytes")]


def _memory(rows: Sequence[Row], path: str) -> bool:
    import matplotlib.pyplot as plt

    best = best_row(rows)
    if best is None:
        return False
    firsts = {first: n for first, n, _ in replica_kinds(best.ranked.plan)}  # type: ignore[union-attr]  # the best row is planned
    stages = [s for s in best.result.stages if s.pipeline in firsts]  # type: ignore[union-attr]  # the best row is planned
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(stages) + 4.5), 4.8))
    x = list(range(len(stages)))
    width = 0.6 if len(stages) > 1 else 0.4
    ax.set_xlim(-0.7, len(stages) - 0.3)
    bottom = [0.0] * len(stages)
    for name, field in _KINDS:
        h = [getattr(s.memory, field) / GIB for s in stages]
        ax.bar(x, h, bottom=bottom, width=width, label=name)
        bottom = [a + b for a, b in zip(bottom, h, strict=True)]
    caps = [s.memory.capacity_bytes / GIB for s in stages]
    wanted = best.headroom_wanted_bytes / GIB
    ax.hlines(caps, [i - 0.45 for i in x], [i + 0.45 for i in x], color="black", linewidth=2,
              label="GPU memory", zorder=3)
    if wanted > 0:
        ax.hlines([c - wanted for c in caps], [i - 0.45 for i in x], [i + 0.45 for i in x],
                  color="black", linestyle="--", linewidth=1,
                  label=f"less {wanted:g} GiB headroom", zorder=3)
    ax.set_ylim(0, max(caps) * 1.08)
    ax.set_xticks(x, [_stage_tick(s, best.ranked.plan, firsts) for s in stages],  # type: ignore[union-attr]  # the best row is planned
                  fontsize=8)
    if len(firsts) > 1:
        starts = [i for i, s in enumerate(stages) if s.stage == 0]
        for i in starts[1:]:
            ax.axvline(i - 0.5, color="gray", linestyle=":")
    staged = any(s.stage > 0 for s in stages)  # a replica of several pipeline stages
    what = ("pipeline stage and GPU type" if staged else
            "GPU type, a bar per kind of replica (each one stage, no pipeline)")
    if staged and len(firsts) > 1:
        what += f", one group per kind of replica ({len(firsts)} kinds)"
    ax.set_xlabel(what)
    ax.set_ylabel("GiB per GPU at the peak")
    ax.set_title(f"Memory per GPU, best plan ({best.label})")
    # the key lists the lines, then the parts top to bottom as they are stacked
    handles, names = ax.get_legend_handles_labels()
    lines = [k for k, n in enumerate(names) if n not in dict(_KINDS)]
    order = lines + [k for k in reversed(range(len(names))) if k not in lines]
    ax.legend([handles[k] for k in order], [names[k] for k in order], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


def _stage_tick(s: StageSummary, plan: Plan, replicas: dict[int, int]) -> str:
    """A memory bar's label: the GPU type, the stage counted from 1 where the replica has
    several, and how many replicas are of that kind on a replica's first bar."""
    pp = len(plan.pipelines[s.pipeline].stages)
    n = replicas[s.pipeline]
    count = f"{n} replica{'s' if n > 1 else ''}"
    gpu = gpu_short_names(plan).get(s.device, s.device)
    if pp == 1:
        return f"{gpu}\n{count}"
    text = f"stage {s.stage + 1} of {pp}\n{gpu}"
    return text + f"\n{count}" if s.stage == 0 else text


def _gantt(rows: Sequence[Row], path: str, *, profiles: Profiles | None = None) -> bool:
    """The best plan's pipeline timeline; none for a plan without a pipeline (one stage
    per replica has nothing to show)."""
    from planner.simulator import simulate_detailed, write_gantt

    best = best_row(rows)
    if best is None or max(len(p.stages) for p in best.ranked.plan.pipelines) < 2:  # type: ignore[union-attr]  # the best row is planned
        return False
    _, sim = simulate_detailed(best.ranked.plan, profiles=profiles)  # type: ignore[union-attr]  # the best row is planned
    with atomic_path(path) as tmp:
        write_gantt(sim, tmp)
    return True
