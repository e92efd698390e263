"""The cost builder against Zorse's measured per-layer times on 17 GPU types
(planner/calibration/zorse.py, zorse_fit.py; docs/calibration.md "Zorse").

The bounds are the errors this calibration measured, rounded up by under a point: a
change that makes any GPU type's held-out error or its speed relative to the A100 worse
fails here. Fix the model or refit (python -m planner.calibration.zorse_fit), never the
bound.
"""

import statistics
from collections import defaultdict

import pytest

from planner.calibration.zorse import (
    GPU_MAP,
    MODELS,
    _stats,
    layer_params,
    measured_device,
    model_spec,
    zorse_cases,
)
from planner.calibration.zorse_fit import (
    FITTED,
    SIMT_FITTED,
    arch_device,
    fit_dtype,
    mean_error,
    relative_speed,
    set_aside,
    simt_split,
    split,
    without_simt,
)
from profiler.devices import catalog
from profiler.kernels import Attention


def test_every_zorse_gpu_is_a_catalog_device():
    assert set(GPU_MAP.values()) <= set(catalog())
    assert {c.gpu for c in zorse_cases()} == set(GPU_MAP) - {"rtx3090"}  # GPT lines only
    assert measured_device("p100").memory_bandwidth_gb_per_s == 549  # the 12 GB PCIe part


def test_model_shapes_match_zorse_parameter_counts():
    """Our layer plus the linear biases the ModelSpec does not carry = Zorse's count."""
    for name in MODELS:
        if name in _stats():
            spec = model_spec(name)
            encoder_like = MODELS[name].family in ("gpt", "bert")  # q, k, v, proj, fc1, fc2
            biases = 5 * spec.hidden_size + spec.ffn_hidden_size if encoder_like else 0
            assert spec.params_per_layer() + biases == layer_params(name), name


def test_cases_run_the_measured_attention():
    """flash-attn 2 for HF Llama in fp16 on sm80+, SDPA's memory-efficient kernel below
    and in fp32, HF eager (math) on the P40 and for GPT, BERT and Mistral."""
    kernel = {(c.model, c.gpu, c.dtype): c.shape.attention for c in zorse_cases()}
    assert kernel[("deepspeedllama_7b", "a100x40", "fp16")] is Attention.FLASH
    assert kernel[("deepspeedllama_7b", "a100x40", "fp32")] is Attention.MEMORY_EFFICIENT
    assert kernel[("deepspeedllama_7b", "v100x16", "fp16")] is Attention.MEMORY_EFFICIENT
    assert kernel[("deepspeedllama_7b", "p40", "fp32")] is Attention.MATH
    assert kernel[("deepspeedmistral_7b", "t4", "fp32")] is Attention.MATH
    assert kernel[("deepspeedbert_large", "a6000", "fp32")] is Attention.MATH
    assert len(zorse_cases()) > 3000


def test_a100_agrees_with_the_published_calibration():
    """The A100 architecture parameters come from vTrain and the published rows; Zorse's
    A100 Llama layers (another framework, HF code) agree with them within 6%."""
    for gpu in ("a100x40", "a100x80"):
        cases = [c for c in zorse_cases() if c.gpu == gpu and c.dtype == "fp16"]
        assert mean_error(cases) <= 0.06, (gpu, mean_error(cases))


# Held-out (7B models, never seen by the fit) mean |error| per GPU type, as measured.
HELD_OUT_BOUND = {
    "a100x40": 0.05, "a100x80": 0.05, "a10g": 0.04, "a6000": 0.045, "h100-nvl": 0.06,
    "l4": 0.11, "p100": 0.04, "p40": 0.035, "t4": 0.185, "v100-pciex16": 0.06,
    "v100x16": 0.055,
}


@pytest.mark.parametrize("gpu", sorted(HELD_OUT_BOUND))
def test_held_out_error(gpu):
    held_out = split(gpu).held_out
    assert len(held_out) >= 12
    error = mean_error(held_out)
    assert error <= HELD_OUT_BOUND[gpu], f"{gpu}: {error:.3f}"
    if gpu in FITTED:  # every fitted parameter earns its place on data it never saw
        assert error < mean_error(held_out, arch_device(gpu))


def test_fitted_parameters_are_the_catalogs():
    for gpu in FITTED:
        assert measured_device(gpu).efficiency is not None, gpu
    assert all(c.dtype == fit_dtype(c.gpu) for g in FITTED for c in split(g).train)
    assert not any(set_aside(c) for g in FITTED for c in split(g).train)


def _speed_by_model(gpu):
    """Per model: mean predicted / measured ratio of (layer time on gpu / on the A100)."""
    by_model = defaultdict(list)
    for case, measured, predicted in relative_speed(gpu):
        by_model[case.model].append(predicted / measured)
    return {m: statistics.mean(v) for m, v in by_model.items()}


@pytest.mark.parametrize("gpu", ["v100x16", "v100-pciex16", "t4", "a10g", "a6000", "l4",
                                 "h100-nvl", "a100x80"])
def test_speed_relative_to_the_a100(gpu):
    """What a heterogeneous plan splits work by: the predicted ratio of a layer's time on
    each GPU type to the A100-40GB's, against the measured ratio, Llama layers in fp16
    (measured ratios: V100 2.3-2.5, T4 7.3-8.1, A10G 3.1-3.6, L4 3.6-4.5, H100 NVL 0.52-0.57).
    The mean over models within 10%, every model within 21%."""
    ratios = _speed_by_model(gpu)
    assert ratios
    assert abs(statistics.mean(ratios.values()) - 1) <= 0.10, ratios
    assert max(abs(r - 1) for r in ratios.values()) <= 0.21, ratios


# fp32 layers (GEMMs on the CUDA cores, no TF32): held-out 7B mean |error| per GPU type
# with the SIMT GEMM efficiency (python -m planner.calibration.zorse_fit --simt), as
# measured, rounded up by under a point. Before it (the tensor-core fraction of the
# datasheet fp32 peak): A100 26%, A10G 34%, A6000 26%, H100 NVL 54%, L40S 32%, L4 35%,
# T4 29%, V100 23-27%.
SIMT_HELD_OUT_BOUND = {
    "a100x40": 0.045, "a10g": 0.12, "a6000": 0.12, "h100-nvl": 0.05, "l40s": 0.12,
    "l4": 0.17, "t4": 0.075, "v100x16": 0.03, "v100x32": 0.06, "v100-pciex16": 0.05,
    "p100": 0.04, "p40": 0.035,
}


@pytest.mark.parametrize("gpu", sorted(SIMT_HELD_OUT_BOUND))
def test_fp32_held_out_error(gpu):
    held_out = simt_split(gpu).held_out
    assert len(held_out) >= 4
    error = mean_error(held_out)
    assert error <= SIMT_HELD_OUT_BOUND[gpu], f"{gpu}: {error:.3f}"
    if any(gpu in gpus for gpus, _ in SIMT_FITTED.values()):  # the field earns its place
        assert error < mean_error(held_out, without_simt(gpu))


# Pascal in fp16 (autocast, fp32 accumulate) at the FP32 rate: every case, as measured
# (before the catalog's fp16 peaks were the FP32 rate: P100 45% fast, P40 45x slow).
@pytest.mark.parametrize(("gpu", "bound"), [("p100", 0.065), ("p40", 0.15)])
def test_pascal_fp16_runs_at_the_fp32_rate(gpu, bound):
    cases = [c for c in zorse_cases() if c.gpu == gpu and c.dtype == "fp16"]
    assert len(cases) >= 100 and not any(set_aside(c) for c in cases)
    assert mean_error(cases) <= bound, f"{gpu}: {mean_error(cases):.3f}"


@pytest.mark.parametrize("gpu", ["p100", "p40", "v100x16", "a10g", "a6000", "h100-nvl"])
def test_fp32_speed_relative_to_the_a100(gpu):
    """The ratio a heterogeneous fp32 plan splits work by (Pascal trains fp32 beside an
    A100): predicted / measured within 10% on the mean over models (before the SIMT
    efficiency: P100 0.78, P40 0.77 from the A100's fp32 error alone)."""
    ratios = [p / m for _, m, p in relative_speed(gpu, dtype="fp32")]
    assert ratios
    assert abs(statistics.mean(ratios) - 1) <= 0.10, statistics.mean(ratios)


def test_the_eager_attention_extra_subtracts_what_the_workload_priced():
    """HF's eager attention is priced as the workload's "math" path plus the difference
    (`_eager_extra`): the eager kernels' bytes less the workload's own softmax and dropout
    ops over the same scores, whichever path the workload took. At 8,192 keys Megatron's
    fused softmax does not apply (s_kv <= 4096), so a 16-bit workload prices the torch
    path (36 B a score forward, 48 B backward, `workload._softmax`), not the fused kernel's
    2 x 2 B: the extra must subtract those (a table of fused-kernel bytes did not)."""
    from dataclasses import replace

    from planner.calibration.zorse import _EAGER_KERNELS, _eager_extra

    case = next(c for c in zorse_cases() if c.model.endswith("gpt_1.3b") and c.dtype == "fp16")
    long = replace(case, seq_len=8192)
    scores = long.micro_batch_size * MODELS[long.model].heads * long.seq_len ** 2
    fwd, bwd = _EAGER_KERNELS[("gpt_eager", 2)]
    extra_f, extra_b, kernels = _eager_extra(long)
    # the workload's torch softmax (36 B, 5 kernels; backward 48 B, 6) and the attention
    # dropout (read 2, write 2 + 1 mask byte; backward 1.5x that; 2 kernels, then 1)
    assert extra_f == pytest.approx((sum(fwd) - 36 - 5) * scores)
    assert extra_b == pytest.approx((sum(bwd) - 48 - 7.5) * scores)
    assert kernels == len(fwd) + len(bwd) - (5 + 6 + 2 + 1)
    # at 512 keys the fused kernel applies: 2 x 2 B forward, 1.5x that backward
    short_scores = case.micro_batch_size * MODELS[case.model].heads * case.seq_len ** 2
    f2, b2, k2 = _eager_extra(case)
    assert f2 == pytest.approx((sum(fwd) - 4 - 5) * short_scores)
    assert b2 == pytest.approx((sum(bwd) - 6 - 7.5) * short_scores)
    assert k2 == len(fwd) + len(bwd) - (1 + 1 + 2 + 1)
