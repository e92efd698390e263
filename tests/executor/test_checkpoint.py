"""Distributed checkpoints: only complete ones are resumed, and a resumed run repeats the
losses of an uninterrupted one step for step."""

import json
import os

import pytest

pytest.importorskip("torch")

from executor.checkpoint import COMPLETE, latest_complete
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


@pytest.mark.slow
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


@pytest.mark.slow
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
