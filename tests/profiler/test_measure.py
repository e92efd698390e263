"""Measuring ops with torch on the CPU: fragments, timing, rows, skips, Ctrl-C."""


import pytest

torch = pytest.importorskip("torch")

from profiler import torch_ops  # noqa: E402
from profiler.measure import MeasureSettings, OpCase, measure_ops  # noqa: E402
from profiler.timing import time_calls  # noqa: E402

SMALL = {  # impl -> small dimensions
    "linear": (8, 6, 4), "qkv": (2, 8, 16, 4, 2, 4, 1), "sdpa": (2, 4, 2, 8, 8, 4, 0),
    "scores": (2, 4, 2, 8, 8, 4), "causal_softmax": (8, 8, 8), "dropout": (64,),
    "context": (2, 4, 2, 8, 8, 4), "layernorm": (8, 16), "rmsnorm": (8, 16),
    "residual": (8, 16, 1), "gelu": (8, 16), "swiglu": (8, 16),
    "embedding": (2, 8, 32, 16, 8, 1), "cross_entropy": (8, 32),
}


def test_every_impl_runs_forward_and_backward():
    assert set(SMALL) == set(torch_ops.IMPLS)
    for impl, dims in SMALL.items():
        frag = torch_ops.build(impl, dims, variant="math", dtype=torch.float32, device="cpu")
        outputs = frag.forward()
        leaves = frag.inputs + frag.weights
        grads = torch.autograd.grad(outputs, leaves, [torch.ones_like(o) for o in outputs])
        assert all(g.shape == leaf.shape for g, leaf in zip(grads, leaves, strict=True)), impl


def test_qkv_splits_heads_as_the_model_does():
    frag = torch_ops.build("qkv", (2, 8, 16, 4, 2, 4, 0), variant=None, dtype=torch.float32,
                           device="cpu")
    q, k, v = frag.forward()
    assert q.shape == (2, 4, 8, 4) and k.shape == v.shape == (2, 2, 8, 4)


def test_timing_reports_median_and_spread():
    t = time_calls(lambda: sum(range(2000)), repeats=9, min_sample_s=1e-4)
    assert t.p10_s <= t.median_s <= t.p90_s and t.calls >= 1 and t.samples == 9


def _case(name, impl, dims, grad_of=None, variant=None, kind="elementwise"):
    return OpCase(name=name, kind=kind, variant=variant, shape=(dims[0],), flops=1.0, bytes=1.0,
                  kernels=1, impl=impl, dims=dims, grad_of=grad_of, reuse_bytes=1 << 20)


FAST = MeasureSettings(warmup=1, repeats=3, min_sample_s=2e-4)


def test_rows_for_forward_backward_and_optimizer():
    cases = [_case("mlp.gelu", "gelu", (64, 64)), _case("mlp.gelu.bwd", "gelu", (64, 64), "all"),
             _case("mlp.fc1.wgrad", "linear", (64, 32, 16), "weight", kind="gemm"),
             OpCase(name="optimizer.adamw", kind="optimizer", variant="foreach", shape=(600,),
                    flops=1.0, bytes=1.0, kernels=1, impl="adamw", dims=(100, 500))]
    measured = measure_ops(cases, FAST)
    assert not measured.interrupted and not measured.skipped
    assert [r.name for r in measured.rows] == [c.name for c in cases]
    assert all(r.time_s > 0 and r.p10_s <= r.time_s <= r.p90_s for r in measured.rows)


def test_a_backend_torch_cannot_run_is_skipped_with_its_reason():
    flash_with_dropout = _case("attn.core", "sdpa", (2, 4, 4, 8, 8, 4, 1), variant="flash",
                               kind="attention")
    measured = measure_ops([flash_with_dropout, _case("mlp.gelu", "gelu", (8, 8))], FAST)
    assert [r.name for r in measured.rows] == ["mlp.gelu"]
    (case, reason), = measured.skipped
    assert case is flash_with_dropout and reason


def test_ctrl_c_keeps_what_was_measured():
    cases = [_case(f"op{i}", "gelu", (8, 8)) for i in range(4)]

    def progress(i, _label):
        if i == 2:
            raise KeyboardInterrupt

    measured = measure_ops(cases, FAST, progress=progress)
    assert measured.interrupted and [r.name for r in measured.rows] == ["op0", "op1"]
