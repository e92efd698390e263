"""Collectives across two local processes (gloo): the profile predicts a size it lacks."""

import pytest

pytest.importorskip("torch")

from planner.costs.comm import collective_time_s, group_tiers
from planner.costs.host import collective_cpu_share
from planner.specs.cluster import load_cluster
from profiler.collectives import COLLECTIVES, CollectiveSettings, measure_collectives
from profiler.devices import device
from profiler.store import load_profiles, save_profile
from tests.planner.profile_helpers import meta

MB = 1024**2
ATTEMPTS = 3


@pytest.mark.multiprocess
def test_all_reduce_between_profiled_sizes_is_predicted_within_15_percent(tmp_path):
    """Sizes are measured in interleaved rounds in one process group, so the fresh 3 MB
    measurement and the profile's points see the same machine; an attempt that loses to
    a burst of load is retried (the bound stays 15%). Gloo's all-reduce on this 2-core
    host spreads 4x between its 10th and 90th percentile, so a row needs 201 samples:
    with 41, 3 of 6 attempts missed 15% (up to +47%) on an idle machine; with 201, 1 of
    6 (+16%), about 9 s an attempt (medians then; the rows are the samples' mean since
    2026-12-05: `test_gloo_rows_are_priced_at_their_samples_mean_and_nccl_rows_at_...`)."""
    tiers = group_tiers(load_cluster("cluster_specs/local-cpu.yaml"), (0, 1))
    target = 3 * MB
    errors = []
    for attempt in range(ATTEMPTS):
        settings = CollectiveSettings(nprocs=2, kinds=("all_reduce",), repeats=201,
                                      sizes_bytes=(1 * MB, 2 * MB, target, 4 * MB, 8 * MB))
        measured, interrupted = measure_collectives(settings)
        rows = [r for r in measured if r.kind == "collective"]
        assert not interrupted and len(rows) == 5
        fresh = next(r.time_s for r in rows if r.bytes == target)
        path = str(tmp_path / f"coll-{attempt}.csv")
        save_profile(path, meta(world_size=2), [r for r in rows if r.bytes != target])
        profiles = load_profiles([path], devices=["CPU"], dtype="fp32")
        predicted = collective_time_s("all_reduce", target, tiers, profiles=profiles)
        assert predicted != collective_time_s("all_reduce", target, tiers)  # the profile's
        errors.append(round(predicted / fresh - 1, 3))
        if abs(errors[-1]) < 0.15:
            break
    assert abs(errors[-1]) < 0.15, f"predicted / measured - 1 per attempt: {errors}"


@pytest.mark.multiprocess
def test_every_collective_is_measured_from_the_command_line(tmp_path, capsys):
    from planner.cli import main
    from profiler.store import load_profile

    path = str(tmp_path / "coll.csv")
    code = main(["profile", "--collectives", "--nprocs", "2", "--max-bytes", "16KB",
                 "--repeats", "5", "-o", path])
    _, err = capsys.readouterr()
    assert code == 0, err
    profile = load_profile(path)
    assert profile.meta.world_size == 2 and not profile.op_rows
    assert {r.name for r in profile.collective_rows} == set(COLLECTIVES)
    assert {r.bytes for r in profile.rows} == {1024.0, 2048.0, 4096.0, 8192.0, 16384.0}
    assert all(r.ranks == 2 and r.time_s > 0 for r in profile.rows)
    # gloo runs each collective on the ranks' cores: their CPU seconds per call, beside
    # each collective row, busy for part of the call (waiting for the peer is not CPU)
    cpu = {(r.name, r.bytes): r for r in profile.host_rows}
    assert set(cpu) == {(f"cpu.{r.name}", r.bytes) for r in profile.collective_rows}
    assert all(r.variant == "gloo" and r.ranks == 2 for r in cpu.values())
    share = collective_cpu_share(device("CPU"), profile, 2)
    assert share is not None and 0.0 < share <= 1.0


@pytest.mark.multiprocess
def test_smaller_groups_are_also_timed_all_at_once_on_the_cpu():
    """4 processes: besides the 4-rank rows, all-reduce, all-gather and reduce-scatter in
    the two groups of 2 at once (`crowd4`, ranks 2), as a plan's data-parallel groups of 2
    reduce together after the backward; no CPU-share rows for them (the shares are the
    alone measurement's) and none for the pairs of send/recv, which are pairs already."""
    from profiler.collectives import CROWDED, crowd_sizes

    assert crowd_sizes(4) == (2,) and crowd_sizes(8) == (2, 4) and crowd_sizes(2) == ()
    settings = CollectiveSettings(nprocs=4, kinds=(*CROWDED, "send_recv"), repeats=5,
                                  sizes_bytes=(4096, 65536))
    rows, interrupted = measure_collectives(settings)
    assert not interrupted
    crowd = [r for r in rows if r.variant == "crowd4"]
    assert {(r.kind, r.name, r.ranks, r.bytes) for r in crowd} == {
        ("collective", k, 2, b) for k in CROWDED for b in (4096.0, 65536.0)}
    whole = [r for r in rows if r.kind == "collective" and not r.variant]
    assert {r.name for r in whole} == {*CROWDED, "send_recv"}
    assert all(r.ranks == 4 for r in whole) and all(r.time_s > 0 for r in crowd)
    assert all(r.variant == "gloo" and r.ranks == 4 for r in rows if r.kind == "host")


@pytest.mark.parametrize("device,expected_s", [("cpu", 5e-4), ("cuda:0", 1e-4)])
def test_gloo_rows_are_priced_at_their_samples_mean_and_nccl_rows_at_their_median(
        monkeypatch, device, expected_s):
    """A 477 KB all-reduce between 2 gloo ranks on the development VM: 0.67-0.81 ms median
    but 1.97-2.17 ms mean in 55 calls (2026-12-05), a transport thread now and then
    waiting a scheduler slice for a core. A step pays every call, so a gloo row prices the
    samples' mean, wall and CPU time alike (their ratio is the call's CPU share); NCCL's
    rows keep the median. Nine quick samples and one slow: the mean is five times the
    median (the median priced the gradient reduction of a 2-rank debug-tiny step at
    1.3-1.8 ms where the ranks spent 2.3-3.1 in it)."""
    import profiler.collectives as coll

    walls = iter([1e-4] * 4 + [1e-4] * 9 + [4.1e-3])  # 4 warm-up samples, then 10 rounds
    monkeypatch.setattr(coll, "_ops", lambda *a, **k: (lambda: None))
    monkeypatch.setattr(coll, "_sample_s", lambda fn, calls, dev: (w := next(walls), w / 2))
    settings = CollectiveSettings(nprocs=2, device=device, sizes_bytes=(1 << 19,), repeats=10,
                                  warmup=4, min_sample_s=0.0)
    rows = coll._timed_rows("all_reduce", 0, 2, device, settings, None)
    wall = next(r for r in rows if r.kind == "collective")
    assert wall.time_s == pytest.approx(expected_s)
    assert wall.p10_s <= wall.time_s <= wall.p90_s
    if device == "cpu":
        (cpu,) = (r for r in rows if r.kind == "host")
        assert cpu.name == "cpu.all_reduce" and cpu.time_s == pytest.approx(expected_s / 2)
    else:
        assert all(r.kind == "collective" for r in rows)


class _DeadRank:
    """A measuring process that has died with `exitcode` (negative: killed by that signal)."""

    def __init__(self, exitcode: int) -> None:
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return False

    def join(self) -> None:
        pass


def test_a_rank_killed_by_a_signal_is_said_so_by_name():
    """`plan profile --collectives` said 'exit codes [-6]' when a rank aborted
    (2026-12-06): the message names the signal, and points at the rank's own error."""
    import queue

    from profiler.collectives import _exits, _next_rows

    with pytest.raises(RuntimeError) as err:
        _next_rows(queue.Queue(), [_DeadRank(-6)])
    assert "killed by SIGABRT" in str(err.value) and "-6" not in str(err.value)
    assert "above" in str(err.value)
    assert _exits([1, -9, None]) == "exit code 1, killed by SIGKILL, exit code None"
    assert _exits([-999]) == "exit code -999"  # no such signal: the code as it is
