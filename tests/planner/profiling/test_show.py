"""`plan profile show`: efficiency as a share of the device's peak (never over 100%),
units on every rate, one small panel per op family."""

import re

from planner.profiling.show import Peaks, _figure, _lines, _panels, efficiency, summarise
from profiler.devices import device
from profiler.store import load_profile

OPS = "profiles/cpu-debug-tiny.csv"


def test_efficiency_is_a_share_of_the_roofline_at_most_one():
    profile = load_profile(OPS)
    peaks = Peaks.of(device(profile.meta.device), profile.meta.dtype)
    for row in profile.op_rows:
        share, bound, cached = efficiency(row, peaks)
        assert 0 < share <= 1 and bound in ("compute", "memory")
        # beating the DRAM roofline is said, not shown as a share over 100%
        assert cached == (max(row.flops / peaks.flops_per_s,
                              row.bytes / peaks.bytes_per_s) > row.time_s)


def test_text_gives_units_and_no_share_over_100_percent():
    profile = load_profile(OPS)
    text = "\n".join(_lines(profile, summarise(profile)))
    assert "GB/s" in text and "GFLOP/s" in text
    assert not re.search(r"\b\d{3,}%", text.replace("100%", ""))
    assert "above DRAM peak (cache)" in text  # residual backward moves no data on a CPU


def test_panels_hold_a_few_series_each():
    panels = _panels(load_profile(OPS))
    assert len(panels) >= 6 and all(1 <= len(series) <= 8 for series in panels.values())
    assert set(panels["norms"]) == {"forward", "backward"}  # one norm, not one per layer part


def _extent(artist, renderer):
    e = artist.get_window_extent(renderer)
    return e.x0, e.y0, e.x1, e.y1


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def test_the_plot_keeps_keys_off_the_data_and_draws_no_vertical_strokes():
    """Issue 19: legends over data, a tangle of lines, efficiency over 100%. Each key sits
    beside its panel, each series' line runs left to right (rows of one size share a
    point: its best), an efficiency is at most 100%, and sizes spanning a decade or more
    get a log axis."""
    import matplotlib.pyplot as plt

    for path in (OPS, "profiles/cpu-collectives.csv"):
        fig = _figure(load_profile(path))
        try:
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                if not ax.axison:
                    continue
                legend = ax.get_legend()
                assert legend is not None
                assert not _overlap(_extent(legend, renderer), _extent(ax, renderer)), \
                    ax.get_title()
                xs_all = [x for line in ax.get_lines() for x in line.get_xdata()]
                for line in ax.get_lines():
                    xs, ys = list(line.get_xdata()), list(line.get_ydata())
                    if line.get_linestyle() not in ("None", ""):
                        assert xs == sorted(set(xs)), ax.get_title()  # no vertical stroke
                    if not ax.get_title().startswith("collective"):
                        assert max(ys) <= 1.0, ax.get_title()
                if max(xs_all) / min(xs_all) >= 10:
                    assert ax.get_xscale() == "log", ax.get_title()
        finally:
            plt.close(fig)


def test_a_collectives_cpu_share_is_one_column_not_a_row_per_size():
    """gloo's `cpu.<collective>` rows (one per size) read as the collective's median CPU
    share, beside its bandwidth; the other host costs stay listed."""
    profile = load_profile("benchmarks/results/profiles-debug-small-2026-12-02T1235/"
                           "cpu-collectives.csv")
    lines = _lines(profile, summarise(profile))
    assert "CPU busy (median)" in lines[2]
    row = next(line for line in lines if line.startswith("all_reduce "))
    assert re.search(r"GB/s\s+\d{1,3}%$", row)
    assert not any(line.startswith("cpu.") for line in lines)
    assert any(line.startswith("gemm_shared") for line in lines)


def test_an_interrupted_profile_says_so(tmp_path, capsys):
    """Ctrl-C keeps the rows measured so far and marks the profile's command; `plan profile
    show` printed such a profile as if whole."""
    import json
    from dataclasses import replace

    from planner.profiling.show import show_profile
    from profiler.store import INTERRUPTED_NOTE, save_profile

    profile = load_profile(OPS)
    whole = "\n".join(_lines(profile, summarise(profile)))
    assert "interrupted" not in whole
    meta = replace(profile.meta, command=f"plan profile measure{INTERRUPTED_NOTE}12 rows")
    path = str(tmp_path / "cut.csv")
    save_profile(path, meta, list(profile.rows[:12]))
    assert show_profile(path) == 0
    assert "! interrupted: holds the 12 rows measured" in capsys.readouterr().out
    assert show_profile(path, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["interrupted_rows"] == 12
