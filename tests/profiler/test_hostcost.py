"""The framework's host-side costs measured across two local processes (gloo)."""

import gc
import multiprocessing

import pytest

torch = pytest.importorskip("torch")

from planner.specs.model import preset  # noqa: E402
from profiler.hostcost import (  # noqa: E402
    P2P_MIN_SAMPLES,
    P2P_SIZES,
    SKEW_SEGMENTS,
    Lateness,
    _fsdp_blocks,
    _p2p_rows,
)

# The ranks are forked from one server process that has imported torch and this module
# once, instead of spawned, each importing them again: these tests 76 -> 44 s on 2 cores
# (2026-12-08). The server forks before anything has run in it (no threads, no OpenMP
# pool), which is what spawn guarded against.
multiprocessing.set_forkserver_preload([__name__])


def _spawn(fn, args, nprocs: int) -> None:
    """`torch.multiprocessing.spawn`, from the fork server."""
    torch.multiprocessing.start_processes(fn, args=args, nprocs=nprocs,
                                          start_method="forkserver")


def _worker(rank: int, world: int, store: str, out: str, kind: str = "skew") -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    if kind == "shares":  # 5 rounds in 3 shares: the samples after each take, the rows
        late = Lateness(rank, world, rounds=5, shares=3)
        taken = []
        for _ in range(4):
            late.take()
            taken.append(len(late.skew[SKEW_SEGMENTS[-1]]))
        rows = late.rows()
        if rank == 0:
            torch.save((taken, [(r.name, r.samples) for r in rows]), out)
    else:
        rows = (Lateness(rank, world, rounds=3).rows() if kind == "skew"
                else _p2p_rows(rank, world, backend="gloo", repeats=3))
        if rank == 0:
            torch.save([(r.name, r.shape, r.ranks, r.time_s, r.samples) for r in rows], out)
    gc.collect()  # before destroy: gloo's exit-time abort otherwise (profiler/collectives.py)
    dist.destroy_process_group()


class _NoLateness:
    """`Lateness` for tests of what else a collectives run measures: takes nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def take(self) -> None:
        pass

    def rows(self) -> list:
        return []


@pytest.mark.multiprocess
def test_the_last_ranks_lateness_is_measured_per_segment_of_compute(tmp_path):
    """Per segment of K GEMMs: its duration (longer for more GEMMs) and how much later
    than the ranks' mean the last one arrives (never negative: the latest is at least
    the mean)."""
    out = str(tmp_path / "rows.pt")
    _spawn(_worker, args=(2, str(tmp_path / "store"), out), nprocs=2)
    rows = torch.load(out)
    assert {(n, s) for n, s, *_ in rows} == {(n, (k,)) for k in SKEW_SEGMENTS
                                            for n in ("arrival_segment", "arrival_skew")}
    assert all(ranks == 2 and samples == 3 for _, _, ranks, _, samples in rows)
    segment = [t for n, _, _, t, _ in rows if n == "arrival_segment"]
    assert segment == sorted(segment) and segment[-1] > 4 * segment[0]
    assert all(t >= 0.0 for n, _, _, t, _ in rows if n == "arrival_skew")


@pytest.mark.multiprocess
def test_the_lateness_rounds_are_taken_in_shares_between_other_work(tmp_path):
    """A collectives run takes the lateness probe's rounds a share at a time between its
    other measurements (framework_rows), so that its rows are medians over the run's
    minutes, not one burst's: 5 rounds in 3 shares are 2, 2 and 1, a take after the last
    share takes nothing, and the rows hold every round once."""
    out = str(tmp_path / "rows.pt")
    _spawn(_worker, args=(2, str(tmp_path / "store"), out, "shares"), nprocs=2)
    taken, rows = torch.load(out)
    assert taken == [2, 4, 5, 5]
    assert len(rows) == 2 * len(SKEW_SEGMENTS) and all(n == 5 for _, n in rows)


@pytest.mark.multiprocess
def test_a_pipeline_transfers_calls_on_the_compute_thread_are_timed_per_size(tmp_path):
    """`p2p_send` / `p2p_recv`: what a rank's compute thread spends issuing a send and
    waiting on it once gone, and posting a receive and taking it once arrived, per
    message size; with 3 ranks the third idles. Each is a few calls' host time (0.1-0.3
    ms on the development VM, the mean of P2P_MIN_SAMPLES samples at least, taken with
    both ranks computing between the calls), not the P2P_SETTLE_S the message was given
    to move between them (the waits find it done)."""
    out = str(tmp_path / "rows.pt")
    _spawn(_worker, args=(3, str(tmp_path / "store"), out, "p2p"), nprocs=3)
    rows = torch.load(out)
    assert {(n, s) for n, s, *_ in rows} == {(n, (size,)) for size in P2P_SIZES
                                            for n in ("p2p_send", "p2p_recv")}
    assert all(ranks == 3 and samples == P2P_MIN_SAMPLES for _, _, ranks, _, samples in rows)
    assert all(0.0 < t < 0.02 for *_, t, _ in rows)


def _hand_off_worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from executor.model import GPT
    from executor.tensor_parallel import apply_tensor_parallel
    from profiler.hostcost import _tiny, grad_hand_off

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    spec = _tiny("debug-tiny", 2)
    model = GPT(spec, attention="math")
    apply_tensor_parallel(model, init_device_mesh("cpu", (world,)), sequence_parallel=True)
    tokens = torch.randint(spec.vocab_size, (1, 16))
    with loss_parallel():
        model(tokens, tokens).backward()
    names = [n for n, _ in model.named_parameters()]
    partial = [n for n, p in model.named_parameters()
               if isinstance(p.grad, DTensor) and p.grad.placements != p.placements]
    before = {n: p.grad.to_local().clone() for n, p in model.named_parameters() if n in partial}
    after = dict(zip(names, grad_hand_off(model), strict=True))
    gathered: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, {"partial": partial, "before": before,
                                      "after": {n: after[n] for n in partial}})
    if rank == 0:
        torch.save(gathered, out)
    gc.collect()  # before destroy: gloo's exit-time abort otherwise (profiler/collectives.py)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_the_gradient_hand_off_reduces_sequence_parallel_norm_gradients(tmp_path):
    """Under sequence parallelism each norm's weight and bias gradient leaves the
    backward as a partial sum over the ranks' sequence shards; the hand-off the DTensor
    rows time (the executor's `local_grad` on every parameter) all-reduces each one, so
    the ranks' partial gradients differ before it and agree after it, equal to their sum."""
    out = str(tmp_path / "grads.pt")
    _spawn(_hand_off_worker, args=(2, str(tmp_path / "store"), out), nprocs=2)
    r0, r1 = torch.load(out)
    # two blocks of two LayerNorms and the final one: weight and bias each
    assert sorted(r0["partial"]) == sorted(r1["partial"]) and len(r0["partial"]) == 10
    assert all("norm" in n for n in r0["partial"])
    for n in r0["partial"]:
        assert not torch.allclose(r0["before"][n], r1["before"][n])
        torch.testing.assert_close(r0["after"][n], r1["after"][n])
        torch.testing.assert_close(r0["after"][n], r0["before"][n] + r1["before"][n])


def _pass_worker(rank: int, world: int, store: str, out: str) -> None:
    import time

    import torch.distributed as dist

    from profiler.hostcost import _models, _pass_times

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    models = _models("debug-tiny", lambda _model: None)
    plain = _pass_times(models, 3)
    handed = _pass_times(models, 3, hand_off=lambda _model: time.sleep(0.05))
    if rank == 0:
        torch.save({k: (min(plain[k][1]), min(handed[k][1])) for k in models}, out)
    gc.collect()  # before destroy: gloo's exit-time abort otherwise (profiler/collectives.py)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_the_gradient_hand_off_is_timed_as_part_of_the_backward(tmp_path):
    """What the executor does with the gradients after a backward counts in the
    backward's time (a 50 ms hand-off: every backward sample about that much longer)."""
    out = str(tmp_path / "times.pt")
    _spawn(_pass_worker, args=(1, str(tmp_path / "store"), out), nprocs=1)
    for plain, handed in torch.load(out).values():
        assert handed >= plain + 0.04


def test_a_host_row_of_noisy_differences_keeps_its_percentiles_around_its_floor():
    """A host cost is a difference of two timings, which noise can push below zero: the
    median is floored at 0.1 us, and its percentiles were floored at 0 apart from it (p90
    0 below a median of 1e-7), which a profile row refuses, so the file it wrote would not
    load."""
    from profiler.hostcost import host_row
    from profiler.store import PROFILE_SCHEMA_VERSION, ProfileMeta, parse_profile_text, profile_text

    row = host_row("dtensor_layer_forward", [-3e-6, -2e-6, -1e-6], variant="gloo", ranks=2)
    assert row.p10_s <= row.time_s == 1e-7 <= row.p90_s
    meta = ProfileMeta(schema_version=PROFILE_SCHEMA_VERSION, device="CPU", device_detail="cpu",
                       dtype="fp32", torch_version="2.13.0", host="h",
                       created="2026-01-01T00:00:00Z", num_threads=1, warmup=1, repeats=3)
    assert parse_profile_text(profile_text(meta, [row]), path="p.csv").rows == (row,)


def test_a_cost_paid_at_every_call_is_its_samples_mean():
    """A pipeline send's calls on a busy host: most take 0.09 ms, a few wait ms for the
    peer's transport thread (the development VM, 256 KB: median 0.09, mean 0.28, p90
    1.1 ms). A step pays every call, so the row says the mean: 0.5 ms here, where the
    median (0.1 ms) would price the step's sends at a fifth of what they cost."""
    from profiler.hostcost import host_row

    samples = [1e-4] * 9 + [4.1e-3]
    row = host_row("p2p_send", samples, variant="gloo", ranks=2, size_bytes=1 << 18, mean=True)
    assert row.time_s == pytest.approx(5e-4)
    assert row.p10_s == 1e-4 and row.p90_s == 5e-4  # kept on either side of the mean
    assert host_row("p2p_send", samples, variant="gloo", ranks=2).time_s == 1e-4


def _fsdp_worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from profiler.hostcost import _dtensor_rows, _fsdp_rows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    rows = _fsdp_rows(rank, world, backend="gloo", family_model="debug-tiny", repeats=3)
    rows += _fsdp_rows(rank, world, backend="gloo", family_model=preset("debug-small"),
                       repeats=3, batch=(1, 16))
    rows += _dtensor_rows(rank, world, backend="gloo", family_model="debug-tiny",
                          sequence_parallel=True, repeats=3)
    if rank == 0:
        torch.save([(r.name, r.variant, r.shape, r.ranks, r.time_s) for r in rows], out)
    gc.collect()  # before destroy: gloo's exit-time abort otherwise (profiler/collectives.py)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_fsdp2_units_and_dtensor_blocks_are_measured_whole_with_their_sizes(tmp_path):
    """FSDP2's unit rows and DTensor's block rows hold the block's collectives (the
    planner takes them out at the profile's own price, planner/costs/stages.py `dp_sync`,
    `layer_parts`), so they carry the size those were measured at: a debug-tiny block,
    49,408 fp32 parameters, its root (embedding, 16 positions, final norm, tied head)
    17,536; a debug-small block (the plan model's own) 197,120, its root at 16 positions
    35,072; a debug-tiny block's activation, 16 tokens x 64 in fp32."""
    out = str(tmp_path / "rows.pt")
    _spawn(_fsdp_worker, args=(2, str(tmp_path / "store"), out), nprocs=2)
    rows = torch.load(out)
    fsdp = [(f"fsdp_{part}_total_{p}", "gloo", (4 * n,), 2)
            for block, root in ((49408, 17536), (197120, 35072))
            for part, n in (("unit", block), ("root", root))
            for p in ("forward", "backward")]
    assert [(n, v, s, k) for n, v, s, k, _ in rows] == [
        *fsdp,
        *((f"{cpu}dtensor_{n}", "gloo+sp", (4 * 16 * 64,), 2) for cpu in ("", "cpu.")
          for n in ("layer_total_forward", "layer_total_backward", "root_forward",
                    "root_backward"))]
    assert all(t > 0.0 for *_, t in rows)
    # the `cpu.` twins: the CPU seconds the ranks' processes used in the same marginals
    # (planner/costs/host.py `dtensor_cpu_share`), of the order of the wall time's
    wall = {n: t for n, v, _, _, t in rows if n.startswith("dtensor_layer")}
    used = {n[4:]: t for n, v, _, _, t in rows if n.startswith("cpu.dtensor_layer")}
    assert 0.0 < sum(used.values()) < 3.0 * sum(wall.values())


@pytest.mark.serial  # it times a difference of milliseconds: with the other tests on every
# core, a hiccup of the bare loop hid a 2 ms one (clean-clone CI of 2026-12-06: 0.39 ms; of
# 2026-12-07, serial but beside other load: 1.42 ms), so it injects 10 ms
def test_the_runner_row_is_what_the_runner_adds_per_micro_batch(monkeypatch):
    """`runner_microbatch` times the executor's StageRunner against the bare forward and
    backward of the same module and batches: a runner that does 10 ms more per micro-batch
    (its data draw made slow) measures about that much more; the runner as it is adds well
    under a millisecond on this tiny model."""
    import time

    import executor.pipeline as pipeline
    from profiler.hostcost import runner_rows

    torch.set_num_threads(1)
    (row,) = runner_rows(repeats=5)
    assert row.name == "runner_microbatch" and 0 < row.time_s < 1e-3
    samples = pipeline.MicroBatches.samples

    def slow(self, step, j):
        time.sleep(10e-3)
        return samples(self, step, j)

    monkeypatch.setattr(pipeline.MicroBatches, "samples", slow)
    (slowed,) = runner_rows(repeats=5)
    assert 8e-3 < slowed.time_s - row.time_s < 14e-3


def _rank_spec_worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from executor.model import GPT
    from executor.tensor_parallel import apply_tensor_parallel
    from planner.specs.model import preset
    from profiler.hostcost import _dtensor_rows, tp_rank_spec

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    found = {}
    for name in ("debug-tiny", "debug-tiny-llama"):
        spec = preset(name)
        framed = GPT(spec, attention="math")
        apply_tensor_parallel(framed, init_device_mesh("cpu", (world,)), sequence_parallel=False)
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                    for p in framed.blocks["0"].parameters())
        plain = sum(p.numel() for p in GPT(tp_rank_spec(spec, world)).blocks["0"].parameters())
        found[name] = (local, plain, sum(p.numel() for p in GPT(spec).blocks["0"].parameters()))
    rows = _dtensor_rows(rank, world, backend="gloo", family_model=preset("debug-tiny"),
                         sequence_parallel=False, repeats=9, batch=(2, 16), budget_s=0.0)
    if rank == 0:
        torch.save({"numel": found, "rows": [(r.name, r.shape, r.samples) for r in rows]}, out)
    gc.collect()  # before destroy: gloo's exit-time abort otherwise (profiler/collectives.py)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_dtensor_blocks_are_timed_against_what_a_tp_rank_computes_at_the_plans_size(tmp_path):
    """The DTensor rows time the framed model against `tp_rank_spec`, the whole model
    that computes what one tp rank does: a block of it holds exactly a tp rank's share of
    the framed block (heads, MLP and their biases split, norms whole), so the row holds
    DTensor's machinery and the collectives, not compute, at any size. On a model's own
    blocks at (micro-batch, sequence), the rows' size is that activation's bytes; a budget
    of no time still leaves 7 samples of the 9 asked for."""
    out = str(tmp_path / "out.pt")
    _spawn(_rank_spec_worker, args=(2, str(tmp_path / "store"), out), nprocs=2)
    got = torch.load(out)
    for local, plain, whole in got["numel"].values():
        assert local == plain < whole
    assert [(n, s) for n, s, _ in got["rows"]] == [
        (f"{cpu}dtensor_{n}", (4 * 2 * 16 * 64,)) for cpu in ("", "cpu.")
        for n in ("layer_total_forward", "layer_total_backward", "root_forward",
                  "root_backward")]
    assert all(samples == 7 for *_, samples in got["rows"])


def _share_worker(rank: int, world: int, store: str, out: str, probe: str) -> None:
    """Rank `rank` of `world`: the `probe` rows ("pass": `_pass_share_rows` on a one-block
    debug-tiny; "optimizer": `_optimizer_share_rows` over 1000 parameters), rank 0's
    saved to `out`."""
    import dataclasses

    import torch.distributed as dist

    from planner.specs.model import preset
    from profiler.hostcost import _optimizer_share_rows, _pass_share_rows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    if probe == "pass":
        spec = dataclasses.replace(preset("debug-tiny"), num_layers=1)
        rows = _pass_share_rows(rank, world, spec, (2, 16), budget_s=0.0)
    else:
        rows = _optimizer_share_rows(rank, world, 1000, rounds=3)
    if rank == 0:
        torch.save([(r.name, r.variant, r.shape, r.ranks, r.samples, r.p10_s) for r in rows],
                   out)
    gc.collect()  # before destroy: gloo's exit-time abort otherwise (profiler/collectives.py)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_the_models_own_pass_is_timed_with_one_to_all_ranks_at_once(tmp_path):
    """`pass_shared`: the model's forward + backward at the plan's (micro-batch,
    sequence), with n = 1..N of the ranks running it at once, sized by that activation's
    bytes (2 x 16 tokens x 64 in fp32) as the DTensor rows are; a budget of no time still
    leaves PASS_SHARED_MIN samples of each count."""
    from profiler.hostcost import PASS_SHARED_MIN

    out = str(tmp_path / "rows.pt")
    _spawn(_share_worker, args=(2, str(tmp_path / "store"), out, "pass"), nprocs=2)
    rows = torch.load(out)
    assert [(n, v, s, k, samples) for n, v, s, k, samples, _ in rows] == [
        ("pass_shared", None, (4 * 2 * 16 * 64,), k, PASS_SHARED_MIN) for k in (1, 2)]
    assert all(p10 > 0.0 for *_, p10 in rows)


@pytest.mark.multiprocess
def test_the_optimizer_step_is_timed_with_one_to_all_ranks_stepping_at_once(tmp_path):
    """`optimizer_shared`: AdamW and the gradients' zeroing over the model's parameters
    and over their 1/N shard, with n = 1..N of the ranks stepping at once, sized by the
    16 bytes a parameter the step streams."""
    out = str(tmp_path / "rows.pt")
    _spawn(_share_worker, args=(2, str(tmp_path / "store"), out, "optimizer"), nprocs=2)
    rows = torch.load(out)
    assert [(n, v, s, k, samples) for n, v, s, k, samples, _ in rows] == [
        ("optimizer_shared", None, (16 * params,), k, 3) for params in (500, 1000)
        for k in (1, 2)]
    assert all(p10 > 0.0 for *_, p10 in rows)


def test_fsdp2_rows_time_each_plan_model_once_at_its_shortest_pass():
    """FSDP2's cost is its units' (their bytes), not the pass's: the plan model's rows are
    measured once, at the smallest micro-batch x sequence asked for, where the difference
    of framed and plain passes has the least noise."""
    small, tiny = preset("debug-small"), preset("debug-tiny")
    blocks = [(small, 8, 64), (small, 4, 64), (small, 4, 128), (tiny, 2, 32)]
    assert _fsdp_blocks(blocks) == [(small, 4, 64), (tiny, 2, 32)]


def test_a_models_own_block_rows_take_more_rounds_than_the_tiny_ones(monkeypatch):
    """The rows on the plan model's blocks (FSDP2 units, DTensor blocks with and without
    sp) price ZeRO-3 and tp plans: a median of 25 paired differences moved them by 7-10%
    (docs/executor.md, "2026-12-06, 01:10-02:10"), so they take up to BLOCK_ROUNDS rounds
    within BLOCK_BUDGET_S; the tiny model's rows keep their 25."""
    import profiler.collectives
    import profiler.hostcost as hc

    calls: list[tuple[str, object, int, float | None]] = []

    def record(kind: str):
        def rows(rank, world, *, family_model, repeats, budget_s=None, **_):
            calls.append((kind, family_model, repeats, budget_s))
            return []
        return rows

    monkeypatch.setattr(profiler.collectives, "_ops", lambda *a, **k: None)
    monkeypatch.setattr(hc, "_samples", lambda fn, repeats, *, calls: [1e-3] * repeats)
    for name in ("_share_rows", "_p2p_rows", "_pass_share_rows", "_optimizer_share_rows"):
        monkeypatch.setattr(hc, name, lambda *a, **k: [])
    monkeypatch.setattr(hc, "Lateness", _NoLateness)
    monkeypatch.setattr(hc, "_fsdp_rows", record("fsdp"))
    monkeypatch.setattr(hc, "_dtensor_rows", record("dtensor"))
    small = preset("debug-small")
    hc.framework_rows(0, 2, backend="gloo", blocks=[(small, 8, 64)])
    tiny = [(k, r, b) for k, m, r, b in calls if isinstance(m, str)]
    own = [(k, r, b) for k, m, r, b in calls if m is small]
    assert tiny == [("fsdp", 25, None), ("dtensor", 25, None), ("dtensor", 25, None)]
    assert own == [(k, hc.BLOCK_ROUNDS, hc.BLOCK_BUDGET_S)
                   for k in ("fsdp", "dtensor", "dtensor")]
    assert hc.BLOCK_ROUNDS >= 100


def test_an_moe_models_blocks_are_timed_without_sequence_parallelism(monkeypatch):
    """The executor runs an MoE layer on the whole sequence (no sequence parallelism on MoE
    models, executor/preflight.py): the DTensor rows on its blocks with sp fed the router a
    sequence-sharded DTensor and `plan run --model debug-tiny-moe --gpus CPU:2` died in
    its profile. Its blocks are timed without sp; the tiny dense preset's with and without."""
    import profiler.collectives
    import profiler.hostcost as hc

    calls: list[tuple[object, bool]] = []

    def dtensor(rank, world, *, family_model, sequence_parallel, **_):
        calls.append((family_model, sequence_parallel))
        return []

    monkeypatch.setattr(profiler.collectives, "_ops", lambda *a, **k: None)
    monkeypatch.setattr(hc, "_samples", lambda fn, repeats, *, calls: [1e-3] * repeats)
    for name in ("_share_rows", "_p2p_rows", "_pass_share_rows", "_optimizer_share_rows",
                 "_fsdp_rows"):
        monkeypatch.setattr(hc, name, lambda *a, **k: [])
    monkeypatch.setattr(hc, "Lateness", _NoLateness)
    monkeypatch.setattr(hc, "_dtensor_rows", dtensor)
    moe, small = preset("debug-tiny-moe"), preset("debug-small")
    hc.framework_rows(0, 2, backend="gloo", family_model="debug-tiny-llama",
                      blocks=[(moe, 8, 32), (small, 8, 64)])
    assert calls == [("debug-tiny-llama", False), (moe, False), (small, False),
                     ("debug-tiny-llama", True), (small, True)]
