"""`plan profile show`: efficiency as a share of the device's peak (never over 100%),
units on every rate, one small panel per op family."""

import re

from planner.profiling.show import Peaks, _lines, _panels, efficiency, summarise
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
