"""The what-if report's pictures (matplotlib, written as PNG files)."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from planner.outputs import atomic_path
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


def _cost_vs_time(rows: Sequence[Row], path: str) -> bool:
    """Each planned scenario as a numbered point (the key lists the numbers), the Pareto
    front dashed; log axes when the scenarios span a wide range."""
    import matplotlib.pyplot as plt

    planned = [(i, r) for i, r in enumerate(rows, 1) if r.time_to_train_s is not None]
    if not planned:
        return False
    fig, (ax, key) = plt.subplots(1, 2, figsize=(12, 5.5), gridspec_kw={"width_ratios": [3, 1]})
    days = [r.time_to_train_s / 86400 for _, r in planned]  # type: ignore[operator]  # planned rows have a time
    costs = [None if r.total_usd is None else r.total_usd / 1e3 for _, r in planned]
    if all(c is not None for c in costs):
        pts = list(zip(days, costs, strict=True))
        front = sorted(_pareto(pts), key=lambda j: pts[j][0])  # type: ignore[arg-type]  # points of planned rows
        ax.plot([pts[j][0] for j in front], [pts[j][1] for j in front], "--", color="tab:red",
                zorder=2)
        # the key shows the red points (a frontier of one point draws no line)
        ax.scatter([], [], s=80, color="tab:red", label="no other scenario is both faster "
                   "and cheaper")
        ax.scatter(days, costs, s=220, color=["tab:red" if j in front else "tab:blue"
                                              for j in range(len(pts))], zorder=3)
        for (i, _), x, y in zip(planned, days, costs, strict=True):
            ax.annotate(str(i), (x, y), ha="center", va="center", color="white", fontsize=9,
                        fontweight="bold", zorder=4)
        ax.set_ylabel("total cost (thousand $)")
        if _wide(costs):  # type: ignore[arg-type]  # priced rows only
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
        ax.margins(0.08)
        ax.legend(fontsize=8, loc="best", framealpha=0.9)
    else:  # some scenario has no prices: time only
        ax.barh([str(i) for i, _ in planned], days)
        ax.invert_yaxis()
    if _wide(days):
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("time to train (days)")
    ax.set_title(f"Cost against time to train ({planned[0][1].setting.tokens:.3g} tokens)")
    ax.grid(alpha=0.3, which="both")
    key.axis("off")
    lines = [f"{i:>2}  {r.label}" + ("" if r.time_to_train_s is not None else "  (no plan)")
             for i, r in enumerate(rows, 1)]
    key.text(0, 1, "\n".join(lines), va="top", fontsize=8, family="monospace", wrap=True)
    return _save(fig, path)


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
    import matplotlib.pyplot as plt

    planned = [r for r in rows if r.result is not None]
    if not planned:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(planned) + 2.4))
    labels = [r.label for r in planned]
    left = [0.0] * len(planned)
    for name, field, colour in _PARTS:
        if field is None:  # recomputation: the part of compute spent on it
            widths = [r.recompute_s for r in planned]
        else:
            widths = [getattr(r.result.breakdown, field) for r in planned]  # type: ignore[union-attr]  # planned rows have a result
        if field == "compute_s":
            widths = [w - r.recompute_s for w, r in zip(widths, planned, strict=True)]
        if any(widths):
            ax.barh(labels, widths, left=left, color=colour, label=name)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds per iteration (event simulation, slowest stage)")
    ax.set_title("Where each scenario's iteration goes")
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2 - 0.6 /
                                                                        (len(planned) + 3)))
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
    ax.set_xticks(x, [f"stage {s.stage}\n{s.device.split('-')[0]}" for s in stages],
                  fontsize=8)
    if len(firsts) > 1:
        starts = [i for i, s in enumerate(stages) if s.stage == 0]
        for i in starts[1:]:
            ax.axvline(i - 0.5, color="gray", linestyle=":")
        ax.set_xlabel(f"pipeline stage and GPU type, one group per kind of replica "
                      f"({len(firsts)} kinds)")
    else:
        ax.set_xlabel("pipeline stage and GPU type")
    ax.set_ylabel("GiB per GPU at the peak")
    ax.set_title(f"Memory per GPU, best plan ({best.label})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


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
