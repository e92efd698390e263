"""A checkpoint written under one plan resumes under another (other dp / tp / pp, a mixed
plan into a one-type one, FSDP2 into flat buffers and back): the resumed losses equal the
uninterrupted run's within 1e-5 relative, as every plan kind equals the one-process run
(tests/executor/test_numerics.py). The checkpoint holds whole-model parameter names and
each rank's boxes of them (executor/checkpoint_layout.py); DCP reads the overlaps.

Plan A runs 5 steps with a checkpoint after step 3; plan B resumes from it and runs steps
4 and 5. `python -m benchmarks.reshard_numerics` runs every pair of RESHARDS."""

import pytest

pytest.importorskip("torch")

from tests.executor.distributed import run_forked
from tests.executor.test_numerics import PLANS, RTOL, STEPS, _reference

SAVED_AT = 3

# (written under, resumed under): plan kinds of test_numerics with the same model and batch
RESHARDS = {
    # dp -> tp: AMSP flat-buffer shards (partial rows) into DTensor shards of fused QKV
    # and SwiGLU weights (regrouped rows)
    "dp4-amsp-2-4-4 -> tp2": ("dp4-amsp-2-4-4", "tp2"),
    # pp 2 -> pp 1: FSDP2 DTensor shards of two stages (tied twins) into one stage's flat
    # buffers
    "dp2xpp2-zero3 -> dp2": ("dp2xpp2-zero3", "dp2"),
    # a mixed plan (replicas at tp 1 and tp 2, ZeRO-1 sub-pieces) -> a one-type plan
    # (HSDP with FSDP2)
    "mixed-tp-dp2-zero1 -> dp4-hsdp-2": ("mixed-tp-dp2-zero1", "dp4-hsdp-2"),
    # the other directions, interleaving, zero bubble, sequence parallelism, AMSP per
    # stage (the benchmark runs these too)
    "tp2 -> dp4-amsp-2-4-4": ("tp2", "dp4-amsp-2-4-4"),
    "dp2 -> dp2xpp2": ("dp2", "dp2xpp2"),
    "tp2-sp -> hetero-dp2-zero2": ("tp2-sp", "hetero-dp2-zero2"),
    "dp4-zero1 -> dp4-zero3": ("dp4-zero1", "dp4-zero3"),
    "pp2-interleaved -> pp2-gpipe": ("pp2-interleaved", "pp2-gpipe"),
    "pp2-zb-h1 -> hetero-dp2xpp2-zero3": ("pp2-zb-h1", "hetero-dp2xpp2-zero3"),
    "hetero-dp2xpp2-zero3-zb-h1 -> dp2xpp3-per-stage-tied": (
        "hetero-dp2xpp2-zero3-zb-h1", "dp2xpp3-per-stage-tied"),
    "mixed-tp-dp2xpp2-tied -> tp2-sp": ("mixed-tp-dp2xpp2-tied", "tp2-sp"),
    "mixed-tp-dp2 -> tp2xpp2-sp-zb-h1": ("mixed-tp-dp2", "tp2xpp2-sp-zb-h1"),
    "tp2xpp2-sp -> mixed-tp-dp2xpp2-zero1-per-stage": (
        "tp2xpp2-sp", "mixed-tp-dp2xpp2-zero1-per-stage"),
}
IN_CI = ("dp4-amsp-2-4-4 -> tp2", "dp2xpp2-zero3 -> dp2", "mixed-tp-dp2-zero1 -> dp4-hsdp-2")


def written(kind: str, folder) -> list[float]:
    """Plan `kind`'s uninterrupted losses; its checkpoint after step SAVED_AT in folder/ck."""
    plan = PLANS[kind]()
    (folder / "a").mkdir()
    codes, whole = run_forked(plan, folder / "a", steps=STEPS, checkpoint_every=SAVED_AT,
                              checkpoint_dir=str(folder / "ck"))
    assert codes == [0] * plan.num_gpus_used and whole is not None, codes
    return whole["losses"]


def resumed(kind: str, folder, run_dir, whole: list[float]) -> dict:
    """Plan `kind` resumed from folder/ck: its losses and their errors against the
    uninterrupted run's (`whole`) and the one-process run's."""
    plan = PLANS[kind]()
    run_dir.mkdir()
    codes, after = run_forked(plan, run_dir, steps=STEPS, resume=True,
                              checkpoint_dir=str(folder / "ck"))
    assert codes == [0] * plan.num_gpus_used and after is not None, codes
    tr = plan.training
    ref = _reference(plan.model.name, tr.global_batch_size, tr.seq_len)[SAVED_AT:]
    got = after["losses"]
    return {"first_step": after["first_step"], "note": after["resume"], "losses": got,
            "vs_whole": max(abs(a - b) / b for a, b in zip(got, whole[SAVED_AT:],
                                                           strict=True)),
            "vs_reference": max(abs(a - b) / b for a, b in zip(got, ref, strict=True))}


def reshard(case: str, folder) -> dict:
    """Run A with a checkpoint, resume under B (same model and batch)."""
    a, b = RESHARDS[case]
    assert PLANS[a]().model == PLANS[b]().model
    assert PLANS[a]().training.global_batch_size == PLANS[b]().training.global_batch_size
    return resumed(b, folder, folder / "b", written(a, folder))


@pytest.fixture(scope="module")
def amsp_checkpoint(tmp_path_factory):
    """dp4-amsp-2-4-4's checkpoint (resumed under tp 2, rightly and wrongly, below)."""
    folder = tmp_path_factory.mktemp("amsp")
    return folder, written("dp4-amsp-2-4-4", folder)


def _check(out: dict) -> None:
    assert out["first_step"] == SAVED_AT and len(out["losses"]) == STEPS - SAVED_AT
    assert "; resharded from dp " in out["note"], out["note"]
    assert out["vs_whole"] < RTOL and out["vs_reference"] < RTOL, out


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", [c for c in IN_CI if not c.startswith("dp4-amsp-2-4-4 ")])
def test_resume_under_another_layout_continues_the_losses(case, tmp_path):
    _check(reshard(case, tmp_path))


@pytest.mark.multiprocess
def test_resume_of_dp_under_tp_continues_the_losses(amsp_checkpoint, tmp_path):
    """dp -> tp: AMSP flat-buffer shards into DTensor shards of fused weights."""
    folder, whole = amsp_checkpoint
    _check(resumed("tp2", folder, tmp_path / "b", whole))


@pytest.mark.multiprocess
@pytest.mark.parametrize("broken", ["no-optimizer-state", "fused-rows-as-one-block"])
def test_a_resume_that_loses_state_misses_the_bound(broken, amsp_checkpoint, monkeypatch,
                                                    tmp_path):
    """The check can fail: resuming dp4-amsp-2-4-4's weights under tp 2 without AdamW's
    state, or reading a fused QKV / SwiGLU weight's rows as one block (not regrouped as
    tp 2 holds them), moves the loss past the bound (the ranks are forked with the
    patch)."""
    import executor.checkpoint_layout
    import executor.runtime

    layout = executor.checkpoint_layout
    if broken == "no-optimizer-state":
        load = layout.LoadPieces.__init__
        monkeypatch.setattr(layout.LoadPieces, "__init__", lambda self, pieces: load(
            self, [p for p in pieces if not p.key.startswith("state.")]))
    else:
        place_of = layout.place_of
        monkeypatch.setattr(executor.runtime, "place_of",
                            lambda name, p, widths=None: place_of(name, p))
    folder, whole = amsp_checkpoint
    out = resumed("tp2", folder, tmp_path / "b", whole)
    assert out["vs_whole"] > 10 * RTOL, out


@pytest.mark.multiprocess
def test_a_run_that_lost_a_node_resumes_under_a_replanned_layout(tmp_path, capsys):
    """The path back after a node dies: plan A (dp 2 x pp 2 of debug-tiny on 2 nodes of 2
    CPU ranks) trains with a checkpoint every 2 steps; rank 3 (on node 1) is killed at
    step 5; `plan replan --without 1:CPU` searches the node that is left for plan B; B
    resumes from step 4's checkpoint and its steps 5-6 continue the losses of the
    uninterrupted one-process run."""
    from executor.preflight import check_runnable
    from executor.train import reference_losses
    from planner.specs.cluster import ClusterSpec, NodeGroup
    from planner.specs.layout import ParallelConfig, homogeneous_plan
    from planner.specs.model import preset
    from planner.specs.plan import load_plan, save_plan
    from tests.executor.distributed import KERNELS, TEST_LR
    from tests.planner.cli_helpers import run_cli

    nodes = ClusterSpec(name="cpu-nodes", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=2, gpus_per_node=2, intra_node_link="loopback",
        island="local"),)).resolved()
    plan_a = homogeneous_plan(preset("debug-tiny"), nodes, ParallelConfig(
        dp=2, pp=2, mbs=1, gbs=8, seq_len=32, dtype="fp32"), kernels=KERNELS)
    save_plan(plan_a, str(tmp_path / "a.yaml"))
    ck = dict(checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    codes, metrics = run_forked(plan_a, tmp_path / "a", steps=6, checkpoint_every=2,
                                fault="3:5:kill", **ck)
    assert codes[3] == -9 and metrics is None
    code, _, err = run_cli(["replan", "--plan", str(tmp_path / "a.yaml"), "--without",
                            "1:CPU", "-o", str(tmp_path / "b.yaml")], capsys)
    assert code == 0, err
    plan_b = load_plan(str(tmp_path / "b.yaml"))
    check_runnable(plan_b, cuda_devices=0)  # as `plan run` would
    assert plan_b.num_gpus_used == 2
    codes, resumed = run_forked(plan_b, tmp_path / "b", steps=6, resume=True, **ck)
    assert codes == [0, 0] and resumed is not None
    assert resumed["first_step"] == 4
    assert "; resharded from dp 2, pp 2, tp 1" in resumed["resume"], resumed["resume"]
    ref = reference_losses(preset("debug-tiny"), global_batch_size=8, seq_len=32, steps=6,
                           learning_rate=TEST_LR)[4:]
    got = resumed["losses"]
    assert max(abs(a - b) / b for a, b in zip(got, ref, strict=True)) < RTOL, (got, ref)
