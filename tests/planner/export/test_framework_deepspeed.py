"""DeepSpeed configs checked by DeepSpeed 0.19.6's own DeepSpeedConfig.

DeepSpeedConfig takes the data-parallel world size from an `mpu` (Megatron-style model
parallel unit) once torch.distributed reports a rank; the test gives it an mpu that says
the plan's dp and a rank of 0, so its batch arithmetic checks against the plan's dp."""

import json

import pytest

from planner.export.formats import export_plan
from planner.export.frameworks import plan_shape
from planner.specs.plan import Communication, Sharding
from tests.planner.export.framework_helpers import framework, gpt3_on_selene, plan_on

pytestmark = pytest.mark.frameworks


class _DataParallel:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _ds_plan(gpus: str, **kw):
    """A plan priced as DeepSpeed keeps its model states (gradients in the training
    dtype) and communicates (`Communication.preset`): one priced with fp32 gradients, or
    with Megatron's overlapped reduction, is refused (tests/planner/export/
    test_export_cli.py)."""
    return plan_on(gpus, model_states="deepspeed",
                   comm=Communication.preset("deepspeed", dtype=kw.get("dtype", "bf16")), **kw)


def _parse(plan, monkeypatch):
    config_mod = framework("deepspeed.runtime.config")
    monkeypatch.setattr(config_mod.dist, "get_rank", lambda *a, **k: 0)
    out = export_plan(plan, "deepspeed")
    raw = json.loads(out.text)
    return out, raw, config_mod.DeepSpeedConfig(raw, mpu=_DataParallel(plan.dp))


@pytest.mark.parametrize(("sharding", "stage", "mics"), [
    (Sharding(), 0, -1), (Sharding(optim=8), 1, -1), (Sharding(grads=8, optim=8), 2, -1),
    (Sharding(params=8, grads=8, optim=8), 3, -1), (Sharding(params=2, grads=2, optim=2), 3, 2),
])
def test_zero_stages_round_trip(sharding, stage, mics, monkeypatch):
    plan = _ds_plan("H100-80GB-SXM:8", dp=8, mbs=2, gbs=64, sharding=sharding)
    out, raw, config = _parse(plan, monkeypatch)
    assert out.unsupported == ()
    assert config.world_size == plan.dp
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu,
            config.gradient_accumulation_steps) == (64, 2, plan_shape(plan).num_microbatches)
    assert config.zero_optimization_stage == stage
    assert config.zero_config.mics_shard_size == mics
    assert config.bfloat16_config.enabled
    # reduced after the backward, as priced (ZeRO-3 would overlap by default), in bf16
    assert config.zero_config.overlap_comm is False
    assert config.communication_data_type is None  # the engine's default: the bf16 of training


def test_a_reduction_in_fp32_is_written_as_the_communication_dtype(monkeypatch):
    """DeepSpeed reduces in the training dtype unless the config's communication_data_type
    says otherwise (runtime/engine.py); a plan whose gradients are reduced in fp32 says so,
    and its other settings stay DeepSpeed's."""
    import dataclasses

    plan = _ds_plan("H100-80GB-SXM:8", dp=8, mbs=2, gbs=64, sharding=Sharding(optim=8))
    fp32 = dataclasses.replace(plan, training=dataclasses.replace(
        plan.training, comm=dataclasses.replace(plan.training.comm, grad_reduce_dtype="fp32")))
    out, raw, config = _parse(fp32, monkeypatch)
    assert out.unsupported == () and raw["communication_data_type"] == "fp32"
    assert config.communication_data_type == framework("torch").float32


def test_pipeline_engine_with_full_recompute(monkeypatch):
    plan = _ds_plan("H100-80GB-SXM:16", pp=2, dp=8, mbs=1, gbs=64, recompute="full",
                    sharding=Sharding(optim=8))
    out, raw, config = _parse(plan, monkeypatch)
    assert out.unsupported == ()
    # the engine reads the checkpoint interval; stages and partition were written too,
    # which nothing reads (the PipelineModule's arguments decide): now a note says so
    assert raw["pipeline"] == {"activation_checkpoint_interval": 1}
    assert config.pipeline["activation_checkpoint_interval"] == 1
    assert len(out.notes) == 1 and "num_stages=2 and partition_method='type:" in out.notes[0]
    assert config.gradient_accumulation_steps == 8  # the pipeline engine's micro-batches
    assert config.zero_optimization_stage == 1


@pytest.mark.parametrize("tp", [1, 2])
def test_full_recompute_without_a_pipeline_says_the_model_code_does_it(tp, monkeypatch):
    """Without the pipeline engine no DeepSpeed config key recomputes anything (the
    activation_checkpointing section holds DeepSpeed's defaults and only configures
    deepspeed.checkpointing.checkpoint): the export said nothing, and a plan that fits only
    with recompute ran out of memory as written (audit of 2026-12-06). A note says what the
    model code must call; with recompute off there is none."""
    plan = _ds_plan("A100-80GB-SXM:16", tp=tp, dp=16 // tp, mbs=2, gbs=64, recompute="full",
                    sharding=Sharding(grads=16 // tp, optim=16 // tp))
    out, raw, _ = _parse(plan, monkeypatch)
    assert out.unsupported == () and "pipeline" not in raw
    assert len(out.notes) == 1 and "deepspeed.checkpointing.checkpoint" in out.notes[0]
    plain = _ds_plan("A100-80GB-SXM:16", tp=tp, dp=16 // tp, mbs=2, gbs=64,
                     sharding=Sharding(grads=16 // tp, optim=16 // tp))
    assert _parse(plain, monkeypatch)[0].notes == ()


def test_autotp(monkeypatch):
    plan = _ds_plan("H100-80GB-SXM:16", tp=2, dp=8, mbs=1, gbs=64,
                    sharding=Sharding(grads=8, optim=8))
    out, _, config = _parse(plan, monkeypatch)
    assert out.unsupported == ()
    assert config.tensor_parallel_config.autotp_size == 2
    assert config.zero_optimization_stage == 2


def test_refused_plans_still_name_their_sharding(monkeypatch):
    """zero_optimization is never dropped: an AMSP mix DeepSpeed lacks is refused by name,
    and the config's stage is the nearest (what --approximate would write)."""
    plan = plan_on("H100-80GB-SXM:8", dp=8, sharding=Sharding(grads=4, optim=8))
    out, raw, config = _parse(plan, monkeypatch)
    assert any(u.startswith("sharding P/G/OS 1/4/8") for u in out.unsupported)
    assert raw["zero_optimization"] == {"stage": 2}
    selene = export_plan(gpt3_on_selene(), "deepspeed")
    assert any("interleaved" in u for u in selene.unsupported)
    assert any(u.startswith("tp 8 with pp 16") for u in selene.unsupported)
