"""The framework's host-side costs measured across two local processes (gloo)."""

import pytest

torch = pytest.importorskip("torch")

from profiler.hostcost import SKEW_SEGMENTS, _skew_rows  # noqa: E402


def _worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    rows = _skew_rows(rank, world, repeats=3)
    if rank == 0:
        torch.save([(r.name, r.shape, r.ranks, r.time_s, r.samples) for r in rows], out)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_the_last_ranks_lateness_is_measured_per_segment_of_compute(tmp_path):
    """Per segment of K GEMMs: its duration (longer for more GEMMs) and how much later
    than the ranks' mean the last one arrives (never negative: the latest is at least
    the mean)."""
    out = str(tmp_path / "rows.pt")
    torch.multiprocessing.spawn(_worker, args=(2, str(tmp_path / "store"), out), nprocs=2)
    rows = torch.load(out)
    assert {(n, s) for n, s, *_ in rows} == {(n, (k,)) for k in SKEW_SEGMENTS
                                            for n in ("arrival_segment", "arrival_skew")}
    assert all(ranks == 2 and samples == 3 for _, _, ranks, _, samples in rows)
    segment = [t for n, _, _, t, _ in rows if n == "arrival_segment"]
    assert segment == sorted(segment) and segment[-1] > 4 * segment[0]
    assert all(t >= 0.0 for n, _, _, t, _ in rows if n == "arrival_skew")
