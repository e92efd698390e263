"""The what-if report's figures are readable (issue 19): numbers of scenarios that land on
the same spot do not print over each other, and no key covers the data."""

from __future__ import annotations

import pytest

from planner.specs.choices import DType
from planner.specs.cluster import load_cluster
from planner.specs.model import preset
from planner.whatif import figures
from planner.whatif.report import plan_scenarios
from planner.whatif.scenarios import Setting, parse_scenario


def _box(artist, renderer) -> tuple[float, float, float, float]:
    e = artist.get_window_extent(renderer)
    return e.x0, e.y0, e.x1, e.y1


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def test_numbers_of_close_points_cover_no_other_number_or_point() -> None:
    """The example report's baseline and its '2x NIC' scenario differ by 0.4% in time and
    cost (their numbers printed as one blot); four more points crowd one corner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(28.97, 231.4, "1"), (16.57, 168.0, "2"), (32.91, 182.0, "3"), (16.58, 183.4, "4"),
           (28.86, 230.5, "5"), (28.97, 195.8, "6"), (146.5, 1169.8, "7"), (17.0, 175.0, "8"),
           (16.9, 190.0, "9")]
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=figures.MARKER_AREA)
        ax.margins(0.12)
        fig.tight_layout()
        labels = figures.numbered_labels(ax, pts)
        renderer = fig.canvas.get_renderer()
        texts = [t.get_text() for t in labels]
        assert "1, 5" in texts  # markers that touch share a label
        assert sorted(n for t in texts for n in t.split(", ")) == sorted(p[2] for p in pts)
        boxes = [_box(t, renderer) for t in labels]
        for i, a in enumerate(boxes):
            assert not any(_overlap(a, b) for b in boxes[i + 1:]), texts[i]
        to_px = ax.transData.transform
        r = figures.MARKER_AREA ** 0.5 / 2 * fig.dpi / 72
        for text, box in zip(texts, boxes, strict=True):
            for x, y, name in pts:
                if name in text.split(", "):
                    continue
                cx, cy = to_px((x, y))
                assert not _overlap(box, (cx - r, cy - r, cx + r, cy + r)), (text, name)
    finally:
        plt.close(fig)


CLUSTER = """\
name: two-types
node_groups:
  - {name: a100, gpu: A100-80GB-SXM, num_nodes: 1, island: ib, price_per_gpu_hour_usd: 1.8}
  - {name: v100, gpu: V100-32GB-SXM2, num_nodes: 1, island: ib, price_per_gpu_hour_usd: 0.8}
"""


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list:
    path = tmp_path_factory.mktemp("figures") / "cluster.yaml"
    path.write_text(CLUSTER)
    base = Setting("baseline", preset("gpt3-1.3b"), load_cluster(str(path)), 1e10)
    return plan_scenarios(base, [parse_scenario("A100s only: remove V100-32GB-SXM2 8"),
                                 parse_scenario("too big: model gpt3-175b")],
                          gbs=64, seq_len=None, objective="time-to-train", dtype=DType.FP16)


@pytest.mark.parametrize("name", ["cost_vs_time", "breakdown", "memory"])
def test_no_key_covers_the_plot(rows: list, name: str, tmp_path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    kept: list = []

    def keep(fig, path):
        kept.append(fig)
        return True

    monkeypatch.setattr(figures, "_save", keep)
    assert getattr(figures, f"_{name}")(rows, str(tmp_path / f"{name}.png"))
    fig = kept[0]
    try:
        fig.tight_layout()
        renderer = fig.canvas.get_renderer()
        plots = [ax for ax in fig.axes if ax.axison]
        keys = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        keys += list(fig.legends)
        assert plots and keys
        for key in keys:
            for ax in plots:
                assert not _overlap(_box(key, renderer), _box(ax, renderer)), name
    finally:
        plt.close(fig)


def test_a_scenario_without_a_plan_is_named_in_the_breakdown(rows: list, tmp_path,
                                                             monkeypatch) -> None:
    import matplotlib.pyplot as plt

    kept: list = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: kept.append(fig) or True)
    figures._breakdown(rows, str(tmp_path / "b.png"))
    ax = kept[0].axes[0]
    try:
        assert [t.get_text() for t in ax.get_yticklabels()] == [r.label for r in rows]
        assert any("no plan" in t.get_text() for t in ax.texts)
    finally:
        plt.close(kept[0])
