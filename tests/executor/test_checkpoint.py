"""Distributed checkpoints: only complete and intact ones are resumed (a damaged, truncated
or foreign file is refused before anything is unpickled, and the run falls back to the
newest intact one, saying so in one line), and a resumed run repeats the losses of an
uninterrupted one step for step."""

import hashlib
import json
import os
import pickle
import random
import shutil

import pytest

pytest.importorskip("torch")

from executor.checkpoint import COMPLETE, latest_complete
from executor.launch import first_failure
from planner.specs.model import preset
from planner.specs.plan import Sharding
from tests.executor.distributed import homogeneous, run_forked


def _folder(root, name, *, complete):
    path = root / name
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"x")
    if complete:
        (path / COMPLETE).write_text(json.dumps({"step": 0, "plan": "p"}))


def test_only_complete_checkpoints_count(tmp_path):
    assert latest_complete(str(tmp_path / "none")) is None
    _folder(tmp_path, "step-00000002", complete=True)
    _folder(tmp_path, "step-00000004", complete=True)
    _folder(tmp_path, "step-00000006", complete=False)  # crashed after the rename? no marker
    _folder(tmp_path, "step-00000008.tmp", complete=True)  # never renamed: still partial
    _folder(tmp_path, "other", complete=True)
    assert latest_complete(str(tmp_path)) == (4, str(tmp_path / "step-00000004"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("sharding", [Sharding(grads=2, optim=2),
                                      Sharding(params=2, grads=2, optim=2)],
                         ids=["amsp-flat-buffers", "fsdp2"])
def test_resume_after_a_killed_rank_repeats_the_losses(tmp_path, sharding):
    # pipeline x data parallel, tied embeddings across stages, sharded gradients and
    # optimizer states: every kind of state a checkpoint must carry
    plan = homogeneous(preset("debug-tiny"), world=4, dp=2, pp=2, mbs=1, gbs=4,
                       sharding=sharding)
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    codes, whole = run_forked(plan, tmp_path / "a", steps=6)
    assert codes == [0] * 4 and whole is not None
    codes, broken = run_forked(plan, tmp_path / "b", steps=6, fault="3:5:kill", **ck)
    assert codes[3] == -9 and all(c != 0 for c in codes) and broken is None
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-00000002", "step-00000004"]
    codes, resumed = run_forked(plan, tmp_path / "c", steps=6, resume=True, **ck)
    assert codes == [0] * 4 and resumed is not None
    assert resumed["first_step"] == 4
    assert resumed["losses"] == whole["losses"][4:]  # bit for bit


@pytest.mark.multiprocess
@pytest.mark.parametrize("sharding", [Sharding(), Sharding(optim=2)], ids=["whole", "zero1"])
def test_resume_of_mixed_tp_repeats_the_losses(tmp_path, sharding):
    """Replicas at tp 1 and tp 2 (executor/mixed_tp.py) save their shards under keys per
    tp degree (with ZeRO-1: the parameters per tp degree, each rank's moments per replica
    and tp rank); a resume after a killed rank repeats the uninterrupted losses."""
    from tests.executor.distributed import explicit

    plan = explicit(preset("debug-tiny-llama"), world=3, sharding=sharding, pipelines=[
        (2, 3, [(0, 2, [0], 1, "none")]), (2, 1, [(0, 2, [1, 2], 2, "none")])])
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    codes, whole = run_forked(plan, tmp_path / "a", steps=6)
    assert codes == [0] * 3 and whole is not None
    codes, broken = run_forked(plan, tmp_path / "b", steps=6, fault="2:5:kill", **ck)
    assert codes[2] == -9 and broken is None
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-00000002", "step-00000004"]
    codes, resumed = run_forked(plan, tmp_path / "c", steps=6, resume=True, **ck)
    assert codes == [0] * 3 and resumed is not None
    assert resumed["first_step"] == 4
    assert resumed["losses"] == whole["losses"][4:]  # bit for bit


# ---- nothing trusted blindly (issue 15) ---------------------------------------------------
class _RunsCode:
    """Unpickled, it makes a folder: what a crafted `.metadata` could do instead."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _evil_metadata(folder, sentinel, *, with_marker):
    """Replace DCP's `.metadata` by a pickle that would run code; `with_marker`: and make
    COMPLETE.json match it, as a crafted folder would."""
    data = pickle.dumps(_RunsCode(str(sentinel)))
    (folder / ".metadata").write_bytes(data)
    if with_marker:
        marker = json.loads((folder / COMPLETE).read_text())
        marker["files"][".metadata"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                        "bytes": len(data)}
        (folder / COMPLETE).write_text(json.dumps(marker))


def _largest_shard(folder):
    return max(folder.glob("*.distcp"), key=lambda f: f.stat().st_size)


def _damage(folder, how, sentinel):
    """Damage the checkpoint in `folder`; the reason the resume should give."""
    if how == "random-bytes":  # 4 KB of random bytes inside a shard, same size
        shard = _largest_shard(folder)
        data = bytearray(shard.read_bytes())
        at = len(data) // 2
        data[at:at + 4096] = random.Random(0).randbytes(4096)
        shard.write_bytes(bytes(data))
        return f"{shard.name} differs from its SHA-256 in COMPLETE.json"
    if how in ("truncated-shard", "truncated-metadata"):
        file = _largest_shard(folder) if how == "truncated-shard" else folder / ".metadata"
        size = file.stat().st_size
        with open(file, "r+b") as fh:
            fh.truncate(size // 2)
        return f"{file.name} is {size // 2} bytes, COMPLETE.json says {size}"
    if how == "foreign-metadata":
        _evil_metadata(folder, sentinel, with_marker=False)
        return ".metadata is"
    if how == "crafted-with-marker":
        _evil_metadata(folder, sentinel, with_marker=True)
        return ".metadata does not unpickle as DCP metadata (UnpicklingError: posix.mkdir is " \
               "not allowed in checkpoint metadata)"
    assert how == "missing-marker"
    (folder / COMPLETE).unlink()
    return "no COMPLETE.json"


TINY_DP2 = dict(world=2, dp=2, mbs=1, gbs=4)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """4 steps of dp 2 with checkpoints after steps 2 and 4; the folder and the losses."""
    root = tmp_path_factory.mktemp("checkpointed")
    (root / "run").mkdir()
    codes, metrics = run_forked(homogeneous(preset("debug-tiny"), **TINY_DP2), root / "run",
                                steps=4, checkpoint_dir=str(root / "ck"), checkpoint_every=2)
    assert codes == [0, 0] and metrics is not None
    assert sorted(os.listdir(root / "ck")) == ["step-00000002", "step-00000004"]
    return root / "ck", metrics["losses"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["random-bytes", "truncated-shard", "truncated-metadata",
                                 "foreign-metadata", "crafted-with-marker", "missing-marker"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(checkpointed, tmp_path, how):
    """Step 4's checkpoint damaged: the run resumes from step 2, says why in one line, and
    repeats the uninterrupted losses; a pickle that would run code never runs."""
    base, whole = checkpointed
    ck, sentinel = tmp_path / "ck", tmp_path / "code-ran"
    shutil.copytree(base, ck)
    reason = _damage(ck / "step-00000004", how, sentinel)
    (tmp_path / "run").mkdir()
    codes, resumed = run_forked(homogeneous(preset("debug-tiny"), **TINY_DP2), tmp_path / "run",
                                steps=4, checkpoint_dir=str(ck), resume=True)
    assert not sentinel.exists()  # the crafted .metadata was never unpickled as it asked
    assert codes == [0, 0] and resumed is not None
    note = resumed["resume"]
    assert note.startswith(f"resume: from step 2 ({ck / 'step-00000002'}); skipped step 4: "
                           f"{reason}"), note
    assert "\n" not in note
    assert resumed["first_step"] == 2 and resumed["losses"] == whole[2:]  # bit for bit


@pytest.mark.multiprocess
def test_no_intact_checkpoint_is_refused_in_one_line(checkpointed, tmp_path, capfd):
    """Every checkpoint damaged: the run refuses (rather than start over at step 1 and
    overwrite them), each rank in one line without a traceback."""
    base, _ = checkpointed
    ck = tmp_path / "ck"
    shutil.copytree(base, ck)
    _damage(ck / "step-00000004", "random-bytes", None)
    _damage(ck / "step-00000002", "missing-marker", None)
    (tmp_path / "run").mkdir()
    codes, metrics = run_forked(homogeneous(preset("debug-tiny"), **TINY_DP2), tmp_path / "run",
                                steps=4, checkpoint_dir=str(ck), resume=True)
    assert metrics is None and all(c != 0 for c in codes)
    cause = first_failure(str(tmp_path / "run"))
    assert f"CheckpointError: no intact checkpoint in {ck} (step 4: " in cause, cause
    assert "; step 2: no COMPLETE.json); move it away to start at step 1" in cause, cause
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    # each rank that reaches the check says so in one line; a rank the job stops first
    # (the failed peer ends the run: fail-fast) says nothing, which a loaded machine shows
    assert 1 <= len(lines) <= 2 and all("no intact checkpoint" in line for line in lines), lines
    assert sorted(os.listdir(ck)) == ["step-00000002", "step-00000004"]  # left as they were


@pytest.mark.multiprocess
def test_a_checkpoint_of_another_model_is_refused(checkpointed, tmp_path):
    base, _ = checkpointed
    (tmp_path / "run").mkdir()
    plan = homogeneous(preset("debug-tiny-llama"), **TINY_DP2)
    codes, metrics = run_forked(plan, tmp_path / "run", steps=4, checkpoint_dir=str(base),
                                resume=True)
    assert metrics is None and all(c != 0 for c in codes)
    cause = first_failure(str(tmp_path / "run"))
    assert f"CheckpointError: {base / 'step-00000004'} holds model 'debug-tiny', this plan " \
           "trains 'debug-tiny-llama' (activation 'gelu' there, 'swiglu' here;" in cause, cause


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["flat-zero1", "flat-zero3", "mixed-tp-zero1"])
def test_bf16_checkpoints_hold_the_fp32_masters(tmp_path, kind):
    """In bf16 the checkpoint holds the fp32 master weights (flat buffers: the optimizer
    shard's, at ZeRO-3 the only copy of the parameter shard; mixed-tp ZeRO-1: each rank's
    sub-pieces), so a resume repeats the losses bit for bit."""
    from dataclasses import replace

    from tests.executor.distributed import explicit

    llama = preset("debug-tiny-llama")
    if kind == "flat-zero1":
        plan = homogeneous(llama, world=2, dp=2, mbs=2, gbs=8, sharding=Sharding(optim=2))
    elif kind == "flat-zero3":  # unequal micro-batch counts: flat buffers, not FSDP2
        plan = explicit(llama, world=2, sharding=Sharding(params=2, grads=2, optim=2),
                        pipelines=[(2, 3, [(0, 2, [0], 1, "none")]),
                                   (1, 2, [(0, 2, [1], 1, "none")])])
    else:
        plan = explicit(llama, world=3, sharding=Sharding(optim=2), pipelines=[
            (2, 3, [(0, 2, [0], 1, "none")]), (2, 1, [(0, 2, [1, 2], 2, "none")])])
    plan = replace(plan, training=replace(plan.training, dtype="bf16"))
    ck = dict(checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    codes, whole = run_forked(plan, tmp_path / "a", steps=5, checkpoint_every=3, **ck)
    assert codes == [0] * plan.num_gpus_used and whole is not None
    codes, resumed = run_forked(plan, tmp_path / "b", steps=5, resume=True, **ck)
    assert codes == [0] * plan.num_gpus_used and resumed is not None
    assert resumed["first_step"] == 3 and resumed["losses"] == whole["losses"][3:]
