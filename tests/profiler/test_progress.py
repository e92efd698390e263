"""Progress bars: on a terminal only, quiet under --json and in logs (tqdm)."""

import io

import pytest

from profiler import progress
from profiler.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _no_delay(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0)
    monkeypatch.setattr(progress, "_silenced", False)
    monkeypatch.delenv("TRAINPLAN_PROGRESS", raising=False)


def _draw(stream, total=20):
    with ProgressBar(total, title="ops", unit="ops", stream=stream) as bar:
        for i in range(total + 1):
            bar(i, f"op{i}")
    return stream.getvalue()


def test_a_terminal_gets_a_bar_with_counts_and_the_current_item():
    stream = Terminal()
    bar = ProgressBar(20, title="ops", unit="ops", stream=stream)
    for i in range(21):
        bar(i, f"op{i}")
    assert bar._bar.n == 20 and "op20" in bar._bar.postfix
    bar._bar.refresh()
    assert "20/20 ops" in stream.getvalue()
    bar.close()
    assert stream.getvalue().endswith("\r")  # the line is cleared (leave=False)


def test_logs_and_pipes_get_nothing():
    assert _draw(io.StringIO()) == ""


def test_json_output_silences_it(monkeypatch):
    progress.silence()
    assert _draw(Terminal()) == ""


@pytest.mark.parametrize("mode, shown", [("never", False), ("always", True)])
def test_environment_overrides(monkeypatch, mode, shown):
    monkeypatch.setenv("TRAINPLAN_PROGRESS", mode)
    assert bool(_draw(Terminal() if mode == "never" else io.StringIO())) == shown


def test_unknown_totals_count_up():
    stream = Terminal()
    bar = ProgressBar(None, title="simulating", unit="plans", stream=stream)
    for _ in range(3):
        bar.advance()
    bar._bar.refresh()
    assert "simulating: 3 plans" in stream.getvalue()
    bar.close()


def test_the_cli_silences_progress_for_json(capsys):
    from planner.cli import main

    assert main(["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--gbs",
                 "16", "--json"]) == 0
    assert progress._silenced and capsys.readouterr().err == ""


def test_a_terminal_without_a_width_still_gets_a_bar():
    """A pty that reports 0 x 0 (CI's, editors') drew nothing: tqdm's dynamic width was 0
    (CLI audit, 2026-12-06)."""
    import os
    import select
    import time

    master, slave = os.openpty()  # a new pty reports no size
    try:
        with open(slave, "w", closefd=False) as stream:
            assert stream.isatty() and os.get_terminal_size(slave).columns == 0
            bar = ProgressBar(20, title="ops", unit="ops", stream=stream)
            bar(20, "op20")
            bar._bar.refresh()
            stream.flush()
            # the kernel hands a pty's output to the master side in pieces (CI read the
            # first draw alone once): read until the final draw arrives or 2 s pass; a
            # piece may end inside a bar character, so decode the bytes once, at the end
            raw, deadline = b"", time.monotonic() + 2.0
            while b"op20" not in raw and time.monotonic() < deadline:
                left = max(0.0, deadline - time.monotonic())
                if select.select([master], [], [], left)[0]:
                    raw += os.read(master, 4096)
            drawn = raw.decode()
            bar.close()
        assert "20/20 ops" in drawn and "op20" in drawn
    finally:
        os.close(master)
        os.close(slave)
