"""The watchdog's report when a rank stops (executor/watchdog.py), without processes."""

from __future__ import annotations

import json
import os
import threading
import time

from executor import watchdog


class _Exited(Exception):
    """os._exit, in a test: ends the thread that called it."""


def test_a_rank_stopped_twice_at_once_reports_once(tmp_path, monkeypatch, capsys):
    """The watchdog thread and the main thread can both stop a rank at once (a clean
    clone's make test: rank 1 printed "stopping" twice and its note read
    '{..."cause": "..."}"}', two writers' halves). The first reports and exits; the
    second waits for that exit."""
    exits: list[int] = []

    def exit_here(code: int) -> None:
        exits.append(code)
        raise _Exited

    monkeypatch.setattr(watchdog.os, "_exit", exit_here)
    dog = watchdog.Watchdog(rank=1, names=["rank 0", "rank 1", "rank 2"],
                            run_dir=str(tmp_path), hang_timeout_s=5.0)
    both = threading.Barrier(2)

    def stop(reason: str) -> None:
        both.wait()
        try:
            dog._stop(2, reason)
        except _Exited:
            pass

    threads = [threading.Thread(target=stop, args=(reason,), daemon=True)
               for reason in ("made no progress for 5 s", "exited (pid 1)")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5.0
    while not exits and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # time for a second report, were there one
    try:
        assert exits == [watchdog.EXIT_PEER_FAILED]
        assert sum(t.is_alive() for t in threads) == 1  # the second waits for the exit
        assert capsys.readouterr().err.count("stopping: rank 2 ") == 1
        with open(tmp_path / "stop-rank1.json", encoding="utf-8") as fh:
            note = json.load(fh)
        assert note["rank"] == 1 and note["cause"].startswith("rank 2 ")
    finally:
        dog._exiting.release()  # let the waiting thread end
        for t in threads:
            t.join(timeout=5.0)
        os.close(dog._wake_r)
        os.close(dog._wake_w)
