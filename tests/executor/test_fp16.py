"""fp16 with dynamic loss scaling (executor/precision.py), and tf32 on the CPU.

Plan kinds trained in fp16 on gloo match a one-process fp16 run with the same loss
scaling, fp32 master weights and micro-batches (`fp16_reference`) to 1e-4 relative, step
by step. Why 1e-4: fp16 rounds the weights to 11 significant bits after every step, so
any reassociation of an fp32 sum (the replicas' gradients summed in another order, a
tied embedding's two halves summed in fp32 across stages where autograd sums them in
fp16, tensor parallelism's partial sums in fp16) flips the rounding of a few weights and
moves the loss by 2e-8 (dp2) to 3.3e-5 (mixed-tp-dp2-sp-tied) relative within the 5
steps, 2.0e-5 at most for the kinds here (all 32 kinds: docs/executor.md, `python -m
benchmarks.numerics --dtype fp16`); against the whole batch in one backward the
micro-batches' own fp16 roundings add up to 7.4e-5 (debug-small). Training on half of
each batch instead misses by 1.2e-3 (debug-tiny-llama) to 9.6e-3 (debug-small), one
skipped step by 2.3e-3 (`test_an_overflow_...`): the bound lies 3 times above the worst
noise and 12 times below the smallest of those.

Losses cannot show whether the gradients are unscaled before the step (AdamW's update
m / sqrt(v) hardly changes when every gradient is 2**16 times larger), so the optimizer's
first moment is checked against the fp32 gradient instead.
"""

import functools
import shutil

import pytest

torch = pytest.importorskip("torch")

from executor.precision import LossScaler, unscale_grads  # noqa: E402
from executor.train import reference_losses  # noqa: E402
from planner.specs.model import preset  # noqa: E402
from planner.specs.plan import Sharding  # noqa: E402
from tests.executor.distributed import TEST_LR, homogeneous, run_forked  # noqa: E402
from tests.executor.test_numerics import PLANS, STEPS  # noqa: E402

TINY = preset("debug-tiny")
TOL = 1e-4
SCALE = 2.0**16


def _in(plan, dtype):
    from dataclasses import replace

    return replace(plan, training=replace(plan.training, dtype=dtype))


def fp16_reference(plan, *, whole_batch=False, overflow_steps=(), steps=STEPS):
    """The one-process fp16 losses of `plan`'s global batch, its micro-batches' gradients
    added one by one in fp32 as the executor adds them (`whole_batch`: one backward)."""
    tr = plan.training
    sizes = None if whole_batch else [p.micro_batch_size for p in plan.pipelines
                                      for _ in range(p.num_microbatches)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as each rank: the fp16 kernels round alike
    try:
        return reference_losses(plan.model, global_batch_size=tr.global_batch_size,
                                seq_len=tr.seq_len, steps=steps, learning_rate=TEST_LR,
                                dtype="fp16", micro_batches=sizes,
                                overflow_steps=overflow_steps)
    finally:
        torch.set_num_threads(threads)


def _error(got, ref):
    return max(abs(a - b) / b for a, b in zip(got, ref, strict=True))


# ---- the loss scaler alone ---------------------------------------------------------------
def test_the_scale_backs_off_after_the_hysteresis_and_grows_after_the_interval():
    """Megatron-LM's DynamicGradScaler rules: the first overflow only uses up the
    hysteresis (2), each further one halves the scale (never below the minimum); a clean
    interval doubles it and restores the hysteresis."""
    s = LossScaler(growth_interval=3, min_scale=2.0**14)
    assert (s.scale, s.hysteresis_tracker) == (SCALE, 2)
    s.update(True)
    assert s.scale == SCALE
    for want in (2.0**15, 2.0**14, 2.0**14):  # then halves, down to min_scale
        s.update(True)
        assert s.scale == want
    for _ in range(2):
        s.update(False)
    assert (s.scale, s.growth_tracker) == (2.0**14, 2)
    s.update(False)
    assert (s.scale, s.growth_tracker, s.hysteresis_tracker) == (2.0**15, 0, 2)
    s.update(False)
    s.update(True)  # an overflow resets the growth count
    assert (s.scale, s.growth_tracker, s.hysteresis_tracker) == (2.0**15, 0, 1)
    again = LossScaler(growth_interval=3, min_scale=2.0**14)
    again.load(s.state())
    assert again == s


def test_unscaling_divides_and_finds_inf_and_nan():
    grads = [torch.full((3,), 8.0), torch.full((2, 2), -4.0)]
    assert unscale_grads(grads, 4.0).item() == 0.0
    assert grads[0].tolist() == [2.0] * 3 and grads[1].flatten().tolist() == [-1.0] * 4
    for bad in (float("inf"), float("nan")):
        grads[1][0, 1] = bad
        assert unscale_grads(grads, 2.0).item() == 1.0


# ---- distributed runs ------------------------------------------------------------------
FP16_KINDS = ["dp2", "dp4-zero2", "dp2xpp2-zero3", "hetero-dp2-zero3", "dp2xpp2-zb-h1",
              "tp2-sp", "mixed-tp-dp2-zero1"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", FP16_KINDS)
def test_fp16_plan_matches_one_process(kind, tmp_path):
    """Data parallelism, flat-buffer ZeRO-2, FSDP2 with pipelines and tied embeddings,
    flat-buffer ZeRO-3 (its fp32 master gathered in 16 bits), ZB-H1's split backward, sequence-parallel tp, mixed tp with ZeRO-1: every bucket kind
    and both pipeline paths of the loss scale."""
    plan = _in(PLANS[kind](), "fp16")
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    assert metrics["loss_scales"] == [SCALE] * STEPS and metrics["skipped_steps"] == []
    worst = _error(metrics["losses"], fp16_reference(plan))
    assert worst < TOL, (metrics["losses"], worst)


@pytest.mark.multiprocess
def test_fp16_without_the_replica_sum_misses_the_bound(monkeypatch, tmp_path):
    """Each replica stepping on its own half of the batch (no all-reduce across
    replicas): the bound catches it in fp16 too."""
    from executor.data_parallel import ShardedState

    reduce = ShardedState.reduce_grads

    def alone(self):
        self.layout = type(self.layout)((self.layout.rank,), self.layout.rank)
        reduce(self)

    monkeypatch.setattr(ShardedState, "reduce_grads", alone)
    plan = _in(PLANS["dp2"](), "fp16")
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0, 0] and metrics is not None
    assert _error(metrics["losses"], fp16_reference(plan)) > 10 * TOL


@pytest.mark.multiprocess
@pytest.mark.parametrize("hysteresis", [1, 2])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(hysteresis, monkeypatch,
                                                              tmp_path):
    """An inf in the gradients of one rank (rank 1: stage 0 of pipeline 1, as an fp16
    overflow makes) at step 2: the found-inf all-reduce over all ranks makes every rank
    of dp 2 x pp 2 skip that step (the run's metrics check the ranks agree, and the losses
    then follow the one-process run that skips it, not the one that does not), and the
    scale halves once the hysteresis is used up: at once with hysteresis 1, not yet with
    the default 2."""
    import executor.runtime
    import executor.train
    from executor.report import make_report, to_markdown

    scaler = functools.partial(LossScaler, hysteresis=hysteresis)
    monkeypatch.setattr(executor.runtime, "LossScaler", scaler)
    monkeypatch.setattr(executor.train, "LossScaler", scaler)
    plan = _in(PLANS["dp2xpp2"](), "fp16")
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS, fault="1:2:overflow")
    assert codes == [0] * 4 and metrics is not None
    assert metrics["skipped_steps"] == [2]
    after = SCALE / 2 if hysteresis == 1 else SCALE
    assert metrics["loss_scales"] == [SCALE, SCALE, after, after, after]
    got = metrics["losses"]
    assert _error(got, fp16_reference(plan, overflow_steps=[2])) < TOL
    assert _error(got, fp16_reference(plan)) > 10 * TOL
    report = to_markdown(make_report(plan, metrics, prediction=None, source="-", warmup=1,
                                     name="overflow"))
    assert (f"fp16 loss scale: 65536 at step 1, {after:g} at step 5; steps skipped on an "
            "overflow: 2.") in report


@pytest.mark.multiprocess
def test_a_found_inf_kept_to_its_rank_fails_the_run(monkeypatch, tmp_path):
    """Without the all-reduce only the overflowing rank skips: the replicas' weights part
    ways, and the run stops on the ranks' disagreeing skipped steps."""
    import executor.runtime

    monkeypatch.setattr(executor.runtime, "found_inf_anywhere",
                        lambda local, device: bool(local.item() > 0))
    from executor.launch import first_failure

    codes, metrics = run_forked(_in(PLANS["dp2"](), "fp16"), tmp_path, steps=3,
                                fault="1:2:overflow")
    assert metrics is None and codes != [0, 0]
    cause = first_failure(str(tmp_path))
    assert cause is not None and "loss scales and skipped steps differ" in cause, cause


@pytest.mark.multiprocess
def test_the_optimizer_steps_on_unscaled_gradients(tmp_path):
    """After one step of dp 2 with ZeRO-1 in fp16, AdamW's first moment (in the
    checkpoint: 0.1 times the gradient it stepped on) equals 0.1 times the fp32 gradient
    of the whole batch to 1e-2 (fp16's roundings: measured 2.4e-3); a gradient left scaled
    would be 2**16 times larger. The checkpoint also holds the loss scaler's state."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from executor.model import GPT
    from executor.runtime import LOSS_SCALER
    from executor.train import sample_batch

    plan = _in(homogeneous(TINY, world=2, dp=2, mbs=2, gbs=8, sharding=Sharding(optim=2)),
               "fp16")
    ck = tmp_path / "ck"
    codes, metrics = run_forked(plan, tmp_path, steps=1, checkpoint_dir=str(ck),
                                checkpoint_every=1)
    assert codes == [0, 0] and metrics is not None
    dcp_to_torch_save(str(ck / "step-00000001"), str(tmp_path / "state.pt"))
    state = torch.load(tmp_path / "state.pt")
    assert state[LOSS_SCALER].tolist() == [SCALE, 1.0, 2.0]
    model = GPT(TINY)
    tokens, targets = sample_batch(TINY, seq_len=32, seed=0, step=0, first=0, count=8)
    model(tokens, targets).backward()
    for name, p in model.named_parameters():
        moment = state[f"state.{name}.exp_avg"]
        assert torch.linalg.norm(moment - 0.1 * p.grad) < 1e-2 * torch.linalg.norm(
            0.1 * p.grad), name


@pytest.mark.multiprocess
def test_a_resume_restores_the_loss_scale(monkeypatch, tmp_path):
    """The scale halved by an overflow at step 1 (hysteresis 1) is in the checkpoint of
    step 2: the resumed steps 3 and 4 run at it and repeat the losses bit for bit. A bf16
    checkpoint (no scaler in it) resumes under fp16 with a fresh scaler."""
    import executor.runtime

    monkeypatch.setattr(executor.runtime, "LossScaler",
                        functools.partial(LossScaler, hysteresis=1))
    plan = _in(homogeneous(TINY, world=2, dp=2, mbs=2, gbs=8), "fp16")
    ck = dict(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    for d in ("a", "b", "c", "d"):
        (tmp_path / d).mkdir()
    codes, whole = run_forked(plan, tmp_path / "a", steps=4, fault="0:1:overflow", **ck)
    assert codes == [0, 0] and whole is not None
    assert whole["loss_scales"] == [SCALE] + [SCALE / 2] * 3
    shutil.rmtree(tmp_path / "ck" / "step-00000004")  # as if the run died after step 2
    codes, resumed = run_forked(plan, tmp_path / "b", steps=4, resume=True, **ck)
    assert codes == [0, 0] and resumed is not None and resumed["first_step"] == 2
    assert resumed["loss_scales"] == [SCALE / 2] * 2
    assert resumed["losses"] == whole["losses"][2:]
    bf16 = dict(checkpoint_dir=str(tmp_path / "ck-bf16"), checkpoint_every=2)
    codes, _ = run_forked(_in(plan, "bf16"), tmp_path / "c", steps=2, **bf16)
    assert codes == [0, 0]
    codes, resumed = run_forked(plan, tmp_path / "d", steps=3, resume=True, **bf16)
    assert codes == [0, 0] and resumed is not None and resumed["first_step"] == 2
    assert resumed["loss_scales"] == [SCALE]


@pytest.mark.multiprocess
def test_tf32_on_cpu_ranks_is_fp32(tmp_path):
    """The CPU has no TF32: a tf32 plan trains as the fp32 one, to the fp32 bound."""
    plan = _in(PLANS["dp2"](), "tf32")
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0, 0] and metrics is not None and metrics["loss_scales"] is None
    ref = reference_losses(TINY, global_batch_size=8, seq_len=32, steps=STEPS,
                           learning_rate=TEST_LR)
    assert _error(metrics["losses"], ref) < 1e-5


@pytest.mark.multiprocess
def test_traced_steps_leave_the_runs_loss_scales_alone(tmp_path):
    """`plan run --trace`: the steps traced after the measured ones are not the run's, so
    the report's loss scale per step run (and its step numbers) count only the run's."""
    plan = _in(PLANS["dp2"](), "fp16")
    codes, metrics = run_forked(plan, tmp_path, steps=3, trace_steps=2)
    assert codes == [0, 0] and metrics is not None
    assert metrics["loss_scales"] == [SCALE] * 3 and len(metrics["losses"]) == 3
    assert [t["steps"] for t in metrics["traces"]] == [2, 2]

