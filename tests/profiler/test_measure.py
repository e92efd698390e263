"""Measuring ops with torch on the CPU: fragments, timing, rows, skips, Ctrl-C."""


import pytest

torch = pytest.importorskip("torch")

from profiler import torch_ops  # noqa: E402
from profiler.measure import MeasureSettings, OpCase, measure_ops, torch_dtype  # noqa: E402
from profiler.timing import time_calls  # noqa: E402

SMALL = {  # impl -> small dimensions
    "linear": (8, 6, 4), "qkv": (2, 8, 16, 4, 2, 4, 1), "sdpa": (2, 4, 2, 8, 8, 4, 0),
    "scores": (2, 4, 2, 8, 8, 4), "causal_softmax": (8, 8, 8), "dropout": (64,),
    "context": (2, 4, 2, 8, 8, 4), "layernorm": (8, 16), "rmsnorm": (8, 16),
    "residual": (8, 16, 1), "gelu": (8, 16), "swiglu": (8, 16),
    "geglu": (8, 16),
    "embedding": (2, 8, 32, 16, 8, 1), "cross_entropy": (8, 32),
    "fp8_linear": (16, 32, 48), "fp8_qkv": (2, 8, 16, 2, 1, 8, 1),  # FP8: multiples of 16
}


def test_every_impl_runs_forward_and_backward():
    assert set(SMALL) == set(torch_ops.IMPLS)
    for impl, dims in SMALL.items():
        dtype = torch.bfloat16 if impl.startswith("fp8") else torch.float32
        frag = torch_ops.build(impl, dims, variant="math", dtype=dtype, device="cpu")
        outputs = frag.forward()
        leaves = frag.inputs + frag.weights
        grads = torch.autograd.grad(outputs, leaves, [torch.ones_like(o) for o in outputs])
        assert all(g.shape == leaf.shape for g, leaf in zip(grads, leaves, strict=True)), impl


def test_qkv_splits_heads_as_the_model_does():
    frag = torch_ops.build("qkv", (2, 8, 16, 4, 2, 4, 0), variant=None, dtype=torch.float32,
                           device="cpu")
    q, k, v = frag.forward()
    assert q.shape == (2, 4, 8, 4) and k.shape == v.shape == (2, 2, 8, 4)


def test_the_gated_units_gate_the_up_half_with_their_function():
    """SwiGLU: SiLU(gate) * up; GeGLU: GELU(gate) * up (Shazeer 2020), the input being
    fc1's output [gate | up]."""
    functions = {"swiglu": torch.nn.functional.silu, "geglu": torch.nn.functional.gelu}
    outs = {}
    for impl, act in functions.items():
        frag = torch_ops.build(impl, (4, 8), variant=None, dtype=torch.float32, device="cpu")
        gate, up = frag.inputs[0].chunk(2, dim=-1)
        (outs[impl],) = frag.forward()
        torch.testing.assert_close(outs[impl], act(gate) * up)
    assert not torch.allclose(outs["swiglu"], outs["geglu"])


def test_timing_reports_median_and_spread():
    t = time_calls(lambda: sum(range(2000)), repeats=9, min_sample_s=1e-4)
    assert t.p10_s <= t.median_s <= t.p90_s and t.calls >= 1 and t.samples == 9


def _case(name, impl, dims, grad_of=None, variant=None, kind="elementwise"):
    return OpCase(name=name, kind=kind, variant=variant, shape=(dims[0],), flops=1.0, bytes=1.0,
                  kernels=1, impl=impl, dims=dims, grad_of=grad_of, reuse_bytes=1 << 20)


FAST = MeasureSettings(warmup=1, repeats=3, min_sample_s=2e-4, in_turn_s=0.0)
BACK_TO_BACK = MeasureSettings(warmup=1, repeats=3, min_sample_s=2e-4, in_turn=False)


@pytest.mark.parametrize("settings", [FAST, BACK_TO_BACK], ids=["in turn", "back to back"])
def test_rows_for_forward_backward_and_optimizer(settings):
    cases = [_case("mlp.gelu", "gelu", (64, 64)), _case("mlp.gelu.bwd", "gelu", (64, 64), "all"),
             _case("mlp.fc1.wgrad", "linear", (64, 32, 16), "weight", kind="gemm"),
             OpCase(name="optimizer.adamw", kind="optimizer", variant="foreach", shape=(600,),
                    flops=1.0, bytes=1.0, kernels=1, impl="adamw", dims=(100, 500))]
    measured = measure_ops(cases, settings)
    assert not measured.interrupted and not measured.skipped
    assert [r.name for r in measured.rows] == [c.name for c in cases]
    assert all(r.time_s > 0 and r.p10_s <= r.time_s <= r.p90_s for r in measured.rows)


@pytest.mark.parametrize("settings", [FAST, BACK_TO_BACK], ids=["in turn", "back to back"])
def test_a_backend_torch_cannot_run_is_skipped_with_its_reason(settings):
    flash_with_dropout = _case("attn.core", "sdpa", (2, 4, 4, 8, 8, 4, 1), variant="flash",
                               kind="attention")
    measured = measure_ops([flash_with_dropout, _case("mlp.gelu", "gelu", (8, 8))], settings)
    assert [r.name for r in measured.rows] == ["mlp.gelu"]
    (case, reason), = measured.skipped
    assert case is flash_with_dropout and reason


def test_ctrl_c_keeps_what_was_measured():
    cases = [_case(f"op{i}", "gelu", (8, 8)) for i in range(4)]

    def progress(i, _label):
        if i == 2:
            raise KeyboardInterrupt

    measured = measure_ops(cases, BACK_TO_BACK, progress=progress)
    assert measured.interrupted and [r.name for r in measured.rows] == ["op0", "op1"]


def test_ctrl_c_in_turn_keeps_every_case_timed_once():
    cases = [_case(f"op{i}", "gelu", (8, 8)) for i in range(4)]

    def progress(_i, label):  # called after each timed round
        raise KeyboardInterrupt

    import gc

    measured = measure_ops(cases, FAST, progress=progress)
    assert measured.interrupted and [r.name for r in measured.rows] == [c.name for c in cases]
    assert all(r.samples == 1 for r in measured.rows)
    assert gc.isenabled()  # the rounds ran with the collector off, and gave it back


class _Recorded:
    """Fake runners and a fake clock for `measure_ops` in turn: every call is recorded
    (a baseline as NAME/base) and takes the seconds `seconds(name, pass)` says."""

    def __init__(self, monkeypatch, seconds=lambda name, n: 1e-3, baselines=()):
        import profiler.measure as measure

        self.calls: list[str] = []
        self.passes: dict[str, int] = {}

        def runners(case, _s):
            def fn(label=case.name):
                self.calls.append(label)

            def base(label=case.name + "/base"):
                self.calls.append(label)
            return fn, base if case.name in baselines else None, 1

        def sampler(_device):
            def sample(fn, n):
                fn()
                name = self.calls[-1]
                return seconds(name, self.passes.get(name, 0))
            return sample

        monkeypatch.setattr(measure, "_runners", runners)
        monkeypatch.setattr(measure, "sampler", sampler)
        monkeypatch.setattr(measure, "_autograd_call_s", lambda _s: 2e-4)


def test_in_turn_every_case_of_a_step_is_called_once_a_round(monkeypatch):
    """A round calls each case of a step shape once, in order, the weight gradients'
    baselines after them; each step shape takes its rounds before the next."""
    import dataclasses

    rec = _Recorded(monkeypatch, baselines=("b",))
    cases = [_case("a", "gelu", (8, 8)), _case("b", "linear", (8, 6, 4), "weight"),
             dataclasses.replace(_case("c", "gelu", (8, 8)), step=1)]
    measure_ops(cases, dataclasses.replace(FAST, passes=1, warmup=2, repeats=3))
    # one call each to see that it runs, then 2 warm-up and 3 timed rounds a step shape
    assert rec.calls == ["a", "b"] + ["a", "b", "b/base"] * 5 + ["c"] * 6


def test_in_turn_rounds_go_on_for_the_time_asked_and_no_longer(monkeypatch):
    import dataclasses

    import profiler.measure as measure

    rec = _Recorded(monkeypatch)  # 1 ms a call
    cases = [_case("a", "gelu", (8, 8)), _case("b", "gelu", (8, 8))]
    settings = dataclasses.replace(FAST, passes=1, warmup=0, repeats=3)
    (row,) = measure_ops(cases[:1], dataclasses.replace(settings, in_turn_s=0.0)).rows
    assert row.samples == 3  # repeats, at least
    rec.calls.clear()
    measured = measure_ops(cases, dataclasses.replace(settings, in_turn_s=0.049))
    assert [r.samples for r in measured.rows] == [25, 25]  # rounds of 2 ms
    measured = measure_ops(cases, dataclasses.replace(settings, in_turn_s=1e9))
    assert [r.samples for r in measured.rows] == [measure.IN_TURN_MAX_ROUNDS] * 2


def test_in_turn_rows_subtract_the_baseline_or_the_backward_call_over_every_pass(
        monkeypatch):
    """A weight gradient is its backward less the input gradient's alone (its baseline);
    another backward less the fixed cost of one autograd.grad call (2e-4 s here); a row
    is the median of every pass's calls (3 rounds a pass here)."""
    import dataclasses

    times = {("a", 0): 3e-3, ("a", 1): 1e-3, ("b", 0): 4e-3, ("b", 1): 5e-3,
             ("b/base", 0): 1.5e-3, ("b/base", 1): 1.5e-3, ("c", 0): 1e-3, ("c", 1): 1e-3}
    rec = _Recorded(monkeypatch, seconds=lambda name, n: times[(name, n)], baselines=("b",))

    def next_pass(_i, label):
        if label.startswith("round 3/"):
            for name in ("a", "b", "b/base", "c"):
                rec.passes[name] = rec.passes.get(name, 0) + 1

    cases = [_case("a", "gelu", (8, 8)), _case("b", "linear", (8, 6, 4), "weight"),
             _case("c", "gelu", (8, 8), "input")]
    measured = measure_ops(cases, dataclasses.replace(FAST, passes=2), progress=next_pass)
    assert [(r.name, round(r.time_s, 9), r.samples) for r in measured.rows] == [
        ("a", 2e-3, 6), ("b", 3e-3, 6), ("c", 0.8e-3, 6)]


def test_each_op_keeps_its_fastest_pass(monkeypatch):
    """A burst of other load on the host slows every sample of the op it falls on (debug-
    small's fc2 weight-gradient GEMM: 1.32 ms in one pass, 0.40 in the runs before and
    after); the pass over all ops that missed it is the device's time. A case that cannot
    run is skipped once; progress counts every pass."""
    import dataclasses

    import profiler.measure as measure

    times = {("a", 0): 1e-3, ("b", 0): 5e-3, ("a", 1): 3e-3, ("b", 1): 2e-3, ("a", 2): 4e-3}
    calls: list[str] = []
    real = measure._measure_case

    def fake(case, s, overhead, cache):
        if case.name == "bad":
            raise RuntimeError("no backend here\ndetail")
        row = real(case, s, overhead, cache)
        t = times[(case.name, calls.count(case.name))]
        calls.append(case.name)
        return dataclasses.replace(row, time_s=t, p10_s=t, p90_s=t)

    monkeypatch.setattr(measure, "_measure_case", fake)
    cases = [_case("a", "gelu", (8, 8)), _case("bad", "gelu", (8, 8)), _case("b", "gelu", (8, 8))]
    seen: list[int] = []
    measured = measure_ops(cases, BACK_TO_BACK, progress=lambda i, _: seen.append(i))
    assert [(r.name, r.time_s) for r in measured.rows] == [("a", 1e-3), ("b", 2e-3)]
    assert [c.name for c, _ in measured.skipped] == ["bad"]
    assert calls == ["a", "b", "a", "b"] and seen == [0, 1, 2, 3, 5, 6]
    one = measure_ops(cases[:1], MeasureSettings(warmup=1, repeats=3, min_sample_s=2e-4,
                                                 passes=1, in_turn=False))
    assert len(one.rows) == 1 and calls[-1] == "a" and len(calls) == 5


# FP8 GEMMs (torch._scaled_mm also runs on the CPU, so the code CUDA runs is checked here)

def test_fp8_linear_is_the_bf16_linear_within_fp8_rounding():
    frag = torch_ops.build("fp8_linear", (32, 48, 64), variant=None, dtype=torch.bfloat16,
                           device="cpu")
    (y,) = frag.forward()
    (x,), (w,) = frag.inputs, frag.weights
    exact = x.float() @ w.float().t()
    assert y.dtype == torch.bfloat16 and y.shape == (32, 48)
    assert (y.float() - exact).norm() / exact.norm() < 0.1  # e4m3: 3 mantissa bits
    dx, dw = torch.autograd.grad((y,), (x, w), (torch.ones_like(y),))
    assert dx.shape == x.shape and dw.shape == w.shape and dx.dtype == dw.dtype == torch.bfloat16


def test_fp8_gemms_take_the_layouts_and_sizes_cuda_takes():
    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    b = torch.randn(48, 64).to(torch.float8_e4m3fn)
    one = torch.ones(())
    assert torch_ops.fp8_mm(a, b.t(), one, one, fast_accum=True).shape == (32, 48)
    with pytest.raises(ValueError, match="row-major x column-major"):
        torch_ops.fp8_mm(a, b.t().contiguous(), one, one, fast_accum=True)
    with pytest.raises(ValueError, match="divisible by 16, not 32x48x40"):
        torch_ops.fp8_mm(a[:, :40].contiguous(), b[:, :40].contiguous().t(), one, one,
                         fast_accum=True)


def _count_fp8_gemms(monkeypatch):
    calls = []
    real = torch_ops.fp8_mm

    def counting(*args, **kwargs):
        calls.append(kwargs["fast_accum"])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_ops, "fp8_mm", counting)
    return calls


@pytest.mark.parametrize("grad_of, gemms, baseline_gemms", [
    ("input", 1, None), ("weight", 2, 1), ("all", 2, None)])
def test_fp8_backward_runs_the_gemms_of_its_gradient(grad_of, gemms, baseline_gemms, monkeypatch):
    """A custom autograd Function computes the gradients its leaves require, not those
    autograd.grad asks for: .dgrad freezes the weight, .wgrad's baseline is the backward
    of a frozen-weight copy (dgrad alone), so each times its own GEMMs."""
    from profiler.measure import _runners

    case = _case("mlp.fc1.x", "fp8_linear", (32, 48, 64), grad_of, kind="gemm")
    fn, baseline, _ = _runners(case, MeasureSettings(dtype="fp8"))
    calls = _count_fp8_gemms(monkeypatch)
    fn()
    assert calls == [False] * gemms  # gradients without fast accumulation
    if baseline_gemms is None:
        assert baseline is None
    else:
        calls.clear()
        baseline()
        assert calls == [False] * baseline_gemms


def test_fp8_cases_measure_on_the_cpu():
    cases = [_case("attn.qkv", "fp8_qkv", (2, 8, 16, 2, 1, 8, 1), kind="gemm"),
             _case("attn.qkv.wgrad", "fp8_qkv", (2, 8, 16, 2, 1, 8, 1), "weight", kind="gemm"),
             _case("mlp.fc2.dgrad", "fp8_linear", (16, 32, 48), "input", kind="gemm"),
             _case("mlp.gelu", "gelu", (16, 16)),
             _case("mlp.fc2.odd", "fp8_linear", (16, 32, 40), kind="gemm")]
    measured = measure_ops(cases, MeasureSettings(dtype="fp8", warmup=1, repeats=3,
                                                  min_sample_s=2e-4))
    assert [r.name for r in measured.rows] == [c.name for c in cases[:4]]
    (case, reason), = measured.skipped
    assert case is cases[4] and "divisible by 16" in reason
    assert torch_dtype("fp8") == torch.bfloat16 and torch_dtype("tf32") == torch.float32


def test_the_optimizer_row_times_adamw_and_the_gradients_zeroing(monkeypatch):
    """planner/costs/workload.py `optimizer_work` prices AdamW and the gradient buffer's
    zeroing for the next step (as Megatron-LM and the executor keep their gradients): the
    profiled step runs both, on the step's own gradients, every call."""
    from profiler.measure import _runners

    zeroed: list[list] = []
    real = torch._foreach_zero_
    monkeypatch.setattr(torch, "_foreach_zero_",
                        lambda ts: (zeroed.append(list(ts)), real(ts))[1])
    case = OpCase(name="optimizer.adamw", kind="optimizer", variant="fused", shape=(600,),
                  flops=1.0, bytes=1.0, kernels=1, impl="adamw", dims=(100, 500))
    step, baseline, footprint = _runners(case, FAST)
    assert baseline is None and footprint == 16 * 600
    step()
    step()
    assert len(zeroed) == 2 and [g.numel() for g in zeroed[0]] == [100, 500]
    assert all(float(g.abs().sum()) == 0.0 for g in zeroed[1])
