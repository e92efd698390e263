"""Every plan kind, run on gloo with 2 to 6 CPU ranks for 5 steps, matches a one-process
run of the same global batch to 1e-5 relative, step by step.

The learning rate is ten times the default, so that a wrong gradient (half the batch, or
replicas weighted wrongly) moves the loss by 1e-4 to 2e-3 within the 5 steps while a
correct run stays within a few 1e-7 (tests/executor/test_numerics.py::
test_the_check_can_fail shows the first half of that).
"""

import functools
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from executor.model import GPT  # noqa: E402
from executor.train import adamw, reference_losses, sample_batch  # noqa: E402
from planner.specs.model import preset  # noqa: E402
from planner.specs.plan import Sharding  # noqa: E402
from tests.executor.distributed import TEST_LR, explicit, homogeneous, run_forked  # noqa: E402

TINY, LLAMA, SMALL = preset("debug-tiny"), preset("debug-tiny-llama"), preset("debug-small")
STEPS, RTOL = 5, 1e-5
S = Sharding


def _stages(*spec):
    """(first, last, rank[, tp ranks, recompute]) per stage."""
    out = []
    for s in spec:
        a, b, devs = s[:3]
        devs = devs if isinstance(devs, list) else [devs]
        out.append((a, b, devs, len(devs), s[3] if len(s) > 3 else "none"))
    return out


PLANS = {
    # data parallelism: plain, ZeRO-1/2 and AMSP mixes (P, G, OS at different sizes) on
    # flat buffers; ZeRO-3 and HSDP (P = G = OS) with FSDP2
    "dp2": lambda: homogeneous(TINY, world=2, dp=2, mbs=2, gbs=8),
    "dp4-zero1": lambda: homogeneous(TINY, world=4, dp=4, mbs=1, gbs=8, sharding=S(optim=4)),
    "dp4-zero2": lambda: homogeneous(TINY, world=4, dp=4, mbs=1, gbs=8,
                                     sharding=S(grads=4, optim=4)),
    "dp4-zero3": lambda: homogeneous(TINY, world=4, dp=4, mbs=1, gbs=8,
                                     sharding=S(params=4, grads=4, optim=4)),
    "dp2-zero3": lambda: homogeneous(TINY, world=2, dp=2, mbs=2, gbs=8,
                                     sharding=S(params=2, grads=2, optim=2)),
    "dp4-hsdp-2": lambda: homogeneous(LLAMA, world=4, dp=4, mbs=1, gbs=8,
                                      sharding=S(params=2, grads=2, optim=2)),
    "dp4-amsp-1-2-4": lambda: homogeneous(TINY, world=4, dp=4, mbs=1, gbs=8,
                                          sharding=S(params=1, grads=2, optim=4)),
    "dp4-amsp-2-4-4": lambda: homogeneous(LLAMA, world=4, dp=4, mbs=1, gbs=8,
                                          sharding=S(params=2, grads=4, optim=4)),
    # pipelines with uneven stages (and recompute), every schedule
    "pp2-gpipe": lambda: explicit(SMALL, world=2, schedule="gpipe",
                                  pipelines=[(2, 4, _stages((0, 3, 0), (3, 4, 1)))]),
    "pp2-1f1b-recompute": lambda: explicit(SMALL, world=2, pipelines=[
        (2, 4, _stages((0, 1, 0, "full"), (1, 4, 1, "selective")))]),
    "pp2-interleaved": lambda: explicit(SMALL, world=2, schedule="interleaved-1f1b", vp=2,
                                        pipelines=[(2, 4, _stages((0, 2, 0), (2, 4, 1)))]),
    # zero-bubble ZB-H1: B and W split on every chunk but the first
    "pp2-zb-h1": lambda: explicit(SMALL, world=2, schedule="zb-h1", pipelines=[
        (2, 4, _stages((0, 3, 0), (3, 4, 1, "selective")))]),
    "dp2xpp2-zb-h1": lambda: homogeneous(TINY, world=4, dp=2, pp=2, mbs=1, gbs=8,
                                         schedule="zb-h1"),
    "dp2xpp2-zb-h1-zero3": lambda: homogeneous(TINY, world=4, dp=2, pp=2, mbs=1, gbs=8,
                                               schedule="zb-h1",
                                               sharding=S(params=2, grads=2, optim=2)),
    "tp2xpp2-sp-zb-h1": lambda: homogeneous(LLAMA, world=4, tp=2, pp=2, mbs=2, gbs=8,
                                            sequence_parallel=True, schedule="zb-h1"),
    "hetero-dp2xpp2-zero3-zb-h1": lambda: explicit(
        SMALL, world=4, schedule="zb-h1", sharding=S(params=2, grads=2, optim=2), pipelines=[
            (1, 6, _stages((0, 1, 0), (1, 4, 1))), (2, 1, _stages((0, 1, 2), (1, 4, 3)))]),
    # tensor parallelism (GQA + SwiGLU + rope; tied + learned positions + sequence parallel)
    "tp2": lambda: homogeneous(LLAMA, world=2, tp=2, mbs=2, gbs=8),
    "tp2-sp": lambda: homogeneous(TINY, world=2, tp=2, mbs=2, gbs=8, sequence_parallel=True),
    # combinations
    "dp2xpp2": lambda: homogeneous(TINY, world=4, dp=2, pp=2, mbs=1, gbs=8),
    "dp2xpp2-zero3": lambda: homogeneous(TINY, world=4, dp=2, pp=2, mbs=1, gbs=8,
                                         sharding=S(params=2, grads=2, optim=2)),
    "tp2xpp2-sp": lambda: homogeneous(LLAMA, world=4, tp=2, pp=2, mbs=2, gbs=8,
                                      sequence_parallel=True),
    # heterogeneous: replicas with unequal micro-batch counts (and sizes), with sharded
    # gradients and parameters (flat buffers; ghost passes keep the per-pass collectives
    # in step)
    "hetero-dp2": lambda: explicit(TINY, world=2, pipelines=[
        (2, 3, _stages((0, 2, 0))), (2, 1, _stages((0, 2, 1)))]),
    "hetero-dp2-zero2": lambda: explicit(TINY, world=2, sharding=S(grads=2, optim=2), pipelines=[
        (2, 3, _stages((0, 2, 0))), (1, 2, _stages((0, 2, 1)))]),
    "hetero-dp2-zero3": lambda: explicit(
        TINY, world=2, sharding=S(params=2, grads=2, optim=2), pipelines=[
            (2, 3, _stages((0, 2, 0))), (1, 2, _stages((0, 2, 1)))]),
    "hetero-dp2xpp2-zero3": lambda: explicit(
        SMALL, world=4, sharding=S(params=2, grads=2, optim=2), pipelines=[
            (1, 6, _stages((0, 3, 0), (3, 4, 1))), (2, 1, _stages((0, 3, 2), (3, 4, 3)))]),
    # AMSP per stage (each stage position at its own sharding; flat buffers), with unequal
    # micro-batch counts, and with tied embeddings (first and last stage shard alike)
    "dp2xpp2-per-stage-1-1-2+2-2-2": lambda: _per_stage(
        homogeneous(LLAMA, world=4, dp=2, pp=2, mbs=1, gbs=8),
        S(optim=2), S(params=2, grads=2, optim=2)),
    "hetero-dp2xpp2-per-stage-zb-h1": lambda: _per_stage(explicit(
        LLAMA, world=4, schedule="zb-h1", pipelines=[
            (1, 6, _stages((0, 1, 0), (1, 2, 1))), (2, 1, _stages((0, 1, 2), (1, 2, 3)))]),
        S(), S(grads=2, optim=2)),
    "dp2xpp3-per-stage-tied": lambda: _per_stage(explicit(
        SMALL, world=6, pipelines=[
            (1, 4, _stages((0, 1, 0), (1, 3, 1), (3, 4, 2))),
            (1, 4, _stages((0, 1, 3), (1, 3, 4), (3, 4, 5)))]),
        S(optim=2), S(params=2, grads=2, optim=2), S(optim=2)),
    # mixed tp: replicas at different tp at one stage position (whole gradients summed
    # over every rank of the position, executor/mixed_tp.py); unequal micro-batch counts
    "mixed-tp-dp2": lambda: explicit(LLAMA, world=3, pipelines=[
        (2, 3, _stages((0, 2, 0))), (2, 1, _stages((0, 2, [1, 2])))]),
    "mixed-tp-dp2-sp-tied": lambda: explicit(TINY, world=3, sequence_parallel=True, pipelines=[
        (1, 2, _stages((0, 2, [0, 1]))), (2, 2, _stages((0, 2, 2)))]),
    "mixed-tp-dp2xpp2-per-stage": lambda: _per_stage(explicit(LLAMA, world=5, pipelines=[
        (1, 6, _stages((0, 1, 0), (1, 2, 1))), (2, 1, _stages((0, 1, [2, 3]), (1, 2, 4)))]),
        S(), S(grads=2, optim=2)),
    "mixed-tp-dp2xpp2-tied": lambda: explicit(TINY, world=6, pipelines=[
        (1, 4, _stages((0, 1, 0), (1, 2, 1))), (2, 2, _stages((0, 1, [2, 3]), (1, 2, [4, 5])))]),
    # ZeRO-1 at a mixed position: each rank steps its sub-piece of the whole parameters
    "mixed-tp-dp2-zero1": lambda: explicit(LLAMA, world=3, sharding=S(optim=2), pipelines=[
        (2, 3, _stages((0, 2, 0))), (2, 1, _stages((0, 2, [1, 2])))]),
    "mixed-tp-dp2xpp2-zero1-per-stage": lambda: _per_stage(explicit(LLAMA, world=5, pipelines=[
        (1, 6, _stages((0, 1, 0), (1, 2, 1))), (2, 1, _stages((0, 1, [2, 3]), (1, 2, 4)))]),
        S(optim=2), S(grads=2, optim=2)),
}


def _per_stage(plan, *shardings):
    from dataclasses import replace

    most = max(shardings, key=lambda s: (s.optim, s.grads, s.params))
    plan = replace(plan, sharding=most, stage_sharding=shardings)
    plan.check("plan")
    return plan


def _reference(name: str, gbs: int, seq_len: int) -> tuple[float, ...]:
    return _spec_reference(preset(name), gbs, seq_len)


@functools.cache
def _spec_reference(spec, gbs: int, seq_len: int) -> tuple[float, ...]:
    return tuple(reference_losses(spec, global_batch_size=gbs, seq_len=seq_len, steps=STEPS,
                                  learning_rate=TEST_LR))


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", PLANS)
def test_plan_matches_one_process(kind, tmp_path):
    plan = PLANS[kind]()
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    tr = plan.training
    ref = _reference(plan.model.name, tr.global_batch_size, tr.seq_len)
    got = metrics["losses"]
    assert len(got) == STEPS
    worst = max(abs(a - b) / b for a, b in zip(got, ref, strict=True))
    assert worst < RTOL, (got, ref)


# GeGLU (Shazeer 2020; Grok-1): the Llama model with GELU gating its MLP. Its fc1 is
# [gate | up] as SwiGLU's, regrouped for tensor parallelism (executor/tensor_parallel.py).
GEGLU = replace(LLAMA, name="debug-tiny-geglu", activation="geglu")
GEGLU_PLANS = {
    "geglu-dp2": lambda: homogeneous(GEGLU, world=2, dp=2, mbs=2, gbs=8),
    "geglu-tp2": lambda: homogeneous(GEGLU, world=2, tp=2, mbs=2, gbs=8),
    "geglu-tp2xpp2-sp": lambda: homogeneous(GEGLU, world=4, tp=2, pp=2, mbs=2, gbs=8,
                                            sequence_parallel=True),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", GEGLU_PLANS)
def test_geglu_plan_matches_one_process(kind, tmp_path):
    plan = GEGLU_PLANS[kind]()
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    ref = _spec_reference(GEGLU, plan.training.global_batch_size, plan.training.seq_len)
    worst = max(abs(a - b) / b for a, b in zip(metrics["losses"], ref, strict=True))
    assert worst < RTOL, (metrics["losses"], ref)
    # the reference is GeGLU's own: SwiGLU's losses (the same weights) miss it by ~1e-4
    llama = _reference(LLAMA.name, plan.training.global_batch_size, plan.training.seq_len)
    assert max(abs(a - b) / b for a, b in zip(ref, llama, strict=True)) > 5 * RTOL


def test_the_check_can_fail():
    """Training on half of each batch (a lost replica's gradient) moves the loss past the
    tolerance within the 5 steps."""
    model = GPT(TINY)
    opt = adamw(model.parameters(), implementation="foreach", learning_rate=TEST_LR)
    losses = []
    for step in range(STEPS):
        tokens, targets = sample_batch(TINY, seq_len=32, seed=0, step=step, first=0, count=8)
        losses.append(model(tokens, targets).item())
        model(tokens[:4], targets[:4]).backward()
        opt.step()
        opt.zero_grad()
    ref = _reference(TINY.name, 8, 32)
    assert max(abs(a - b) / b for a, b in zip(losses, ref, strict=True)) > 10 * RTOL


@pytest.mark.multiprocess
def test_a_skipped_w_misses_the_bound(monkeypatch, tmp_path):
    """ZB-H1 with W passes that compute nothing (the ranks are forked with the patch):
    the linear weights of stage 1 then never learn, and the loss leaves the bound."""
    import executor.pipeline

    monkeypatch.setattr(executor.pipeline, "backward_weight", lambda pending: None)
    plan = PLANS["pp2-zb-h1"]()
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0, 0] and metrics is not None
    ref = _reference(SMALL.name, plan.training.global_batch_size, plan.training.seq_len)
    assert max(abs(a - b) / b for a, b in zip(metrics["losses"], ref, strict=True)) > 10 * RTOL


@pytest.mark.multiprocess
@pytest.mark.parametrize("broken,kind", [("no-sum", "mixed-tp-dp2"),
                                         ("contiguous-rows", "mixed-tp-dp2"),
                                         ("no-twin-sum", "mixed-tp-dp2xpp2-tied")])
def test_mixed_tp_without_the_whole_gradient_misses_the_bound(broken, kind, monkeypatch,
                                                              tmp_path):
    """Mixed tp with each replica stepping on its own gradient (no sum across replicas),
    with a fused QKV / SwiGLU weight's rows taken as one contiguous block on the tp 2
    replica (not regrouped as tensor parallelism holds them), or with a tied embedding's
    twins not summed inside their replica: the loss leaves the bound."""
    import executor.mixed_tp
    import executor.runtime
    from executor.data_parallel import ShardedState

    if broken == "no-sum":
        monkeypatch.setattr(executor.mixed_tp.MixedTpState, "reduce_grads",
                            ShardedState.reduce_grads)
    elif broken == "contiguous-rows":
        monkeypatch.setattr(executor.runtime, "_fused", lambda module: {})
    else:
        monkeypatch.setattr(executor.mixed_tp.MixedTpState, "tied_grads", lambda self: [])
    plan = PLANS[kind]()
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    ref = _reference(plan.model.name, plan.training.global_batch_size, plan.training.seq_len)
    assert max(abs(a - b) / b for a, b in zip(metrics["losses"], ref, strict=True)) > 10 * RTOL


@pytest.mark.multiprocess
@pytest.mark.parametrize("broken", ["no-param-sum", "no-replica-cut"])
def test_mixed_tp_zero1_without_the_parameter_sum_misses_the_bound(broken, monkeypatch,
                                                                   tmp_path):
    """ZeRO-1 at a mixed position with each rank keeping only its own updated sub-piece
    (no all-reduce of the whole parameters after the step; measured: worst relative
    error 1.4e-3), or with the pieces not cut by replica (every rank steps the first
    1/tp of the whole buffer: pieces overlap, half the parameters never step; measured
    5.4e-3): the loss leaves the bound."""
    import executor.mixed_tp
    from executor.mixed_tp import MixedTpState

    if broken == "no-param-sum":
        def publish(self):
            with torch.no_grad():
                full, at = torch.zeros(self.full_numel), 0
                for lo, hi, _ in self.ranges:
                    full[lo:hi].copy_(self.master[at:at + hi - lo])
                    at += hi - lo
                for (pieces, dim), (at, n) in zip(self._pieces(full), self.offsets,
                                                  strict=True):
                    mine = torch.cat(pieces, dim=dim).reshape(-1)
                    keep = mine != 0  # its own elements only; the rest stays stale
                    self.full[at:at + n][keep] = mine[keep]
                if not self.keep_master:
                    self.master.data = torch.empty(0)
        monkeypatch.setattr(MixedTpState, "_publish", publish)
    else:
        cut = executor.mixed_tp.zero1_ranges
        monkeypatch.setattr(executor.mixed_tp, "zero1_ranges",
                            lambda params, **kw: cut(params, **{**kw, "replica": 0}))
    plan = PLANS["mixed-tp-dp2-zero1"]()
    codes, metrics = run_forked(plan, tmp_path, steps=STEPS)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    ref = _reference(plan.model.name, plan.training.global_batch_size, plan.training.seq_len)
    worst = max(abs(a - b) / b for a, b in zip(metrics["losses"], ref, strict=True))
    print(f"{broken}: worst relative error {worst:.2e}")
    assert worst > 10 * RTOL


@pytest.mark.multiprocess
def test_mixed_tp_zero1_in_bf16_keeps_a_master_of_its_sub_piece(tmp_path):
    """In mixed precision the fp32 master weights of a rank's ZeRO-1 sub-piece are held
    between steps (planner/costs/memory.py counts 4 bytes per optimizer element); each rank's
    model-state bytes match the prediction. Holding the master of the whole local shard
    instead would add 2 bytes per local parameter (17% of 12 here, by arithmetic)."""
    from dataclasses import replace

    from executor.report import make_report
    from planner.simulator import simulate

    plan = PLANS["mixed-tp-dp2-zero1"]()
    plan = replace(plan, training=replace(plan.training, dtype="bf16"))
    codes, metrics = run_forked(plan, tmp_path, steps=2)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    report = make_report(plan, metrics, prediction=simulate(plan), source="test", warmup=1,
                         name="bf16")
    for r in report.ranks:
        assert r.model_state_bytes == pytest.approx(r.predicted_model_state_bytes, rel=1e-3), r


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["dp2-zero3", "hetero-dp2-zero3", "hetero-dp2-zero2"])
def test_bf16_model_state_bytes_are_the_frameworks_rule(kind, tmp_path):
    """In bf16 each rank's measured model-state bytes equal the memory model's to 0.1%
    (planner/costs/memory.py `state_bytes_per_param`). ZeRO-3 under FSDP2 (dp2-zero3) and
    on flat buffers (unequal micro-batch counts: hetero-dp2-zero3) keep the fp32 shard as
    the parameter, 4 + 4 + 8 = 16 bytes per parameter over k; Megatron's 18 misses them by
    2/18 = 11%. ZeRO-2 on flat buffers keeps the 16-bit weights whole, 2 + (4 + 12)/k."""
    from dataclasses import replace

    from executor.report import make_report
    from planner.simulator import simulate

    plan = PLANS[kind]()
    plan = replace(plan, training=replace(plan.training, dtype="bf16"))
    codes, metrics = run_forked(plan, tmp_path, steps=2)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    report = make_report(plan, metrics, prediction=simulate(plan), source="test", warmup=1,
                         name=kind)
    for r in report.ranks:
        assert r.model_state_bytes == pytest.approx(r.predicted_model_state_bytes, rel=1e-3), r


@pytest.mark.multiprocess
def test_the_seed_sets_weights_and_data(tmp_path):
    plan = PLANS["dp2xpp2"]()
    codes, metrics = run_forked(plan, tmp_path, steps=2, seed=3)
    assert codes == [0] * 4 and metrics is not None
    ref = reference_losses(TINY, global_batch_size=8, seq_len=32, steps=2, seed=3,
                           learning_rate=TEST_LR)
    assert max(abs(a - b) / b for a, b in zip(metrics["losses"], ref, strict=True)) < RTOL
    assert metrics["losses"][0] != _reference(TINY.name, 8, 32)[0]


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", [k for k in PLANS if "per-stage" in k
                                  or k.startswith("mixed-tp") and "zero1" in k])
def test_each_stage_holds_its_own_sharding(kind, tmp_path):
    """AMSP per stage is applied, not only matched in loss (sharding never changes the
    loss): each rank's parameters, gradients and optimizer states are what the memory
    model predicts at its stage's sharding (to flat-buffer padding). One sharding for
    every stage instead misses the first stage's ranks by a third."""
    from executor.report import make_report
    from planner.simulator import simulate

    plan = PLANS[kind]()
    codes, metrics = run_forked(plan, tmp_path, steps=2)
    assert codes == [0] * plan.num_gpus_used and metrics is not None
    report = make_report(plan, metrics, prediction=simulate(plan), source="test", warmup=1,
                         name=kind)
    for r in report.ranks:
        assert r.model_state_bytes == pytest.approx(r.predicted_model_state_bytes, rel=1e-3), r
