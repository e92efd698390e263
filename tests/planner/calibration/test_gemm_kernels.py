"""The analytic GEMM model against OpenXLA's measured sm_90 and sm_100 matmul tables
(planner/calibration/gemm_kernels.py; docs/calibration.md "GEMM kernels on Hopper").

Held out: nothing is fitted to the tables. The model orders the shapes' efficiency as the
GPU does (rank correlation 0.98 bf16 and 0.96 TF32 on sm_90; 0.99 in bf16, TF32 and FP8 on
sm_100) but spans a narrower range than the kernels (0.21-0.50 of peak against 0.12-0.81
in bf16 on sm_90); the bounds below are today's values, rounded by about a point, so that
a change that orders shapes worse fails here.
"""

import math

import pytest

from planner.calibration.gemm_kernels import (
    BANDS_US,
    TABLES,
    bands,
    kernel_cases,
    rank_correlation,
)
from profiler.analytic import gemm_time_s
from profiler.devices import device


@pytest.fixture(scope="module")
def cases():
    return kernel_cases()


def test_the_table_is_the_whole_sweep_in_both_dtypes(cases):
    """matmul_perf_table_gen's sweep: b 1-4 and m, n, k 256-4096 by factors of 2."""
    assert len(cases) == 2 * 3 * 5 ** 3
    for dtype in ("bf16", "f32"):
        shapes = {(c.b, c.m, c.n, c.k) for c in cases if c.dtype == dtype}
        assert shapes == {(b, m, n, k) for b in (1, 2, 4) for m in (256, 512, 1024, 2048, 4096)
                          for n in (256, 512, 1024, 2048, 4096)
                          for k in (256, 512, 1024, 2048, 4096)}


def test_the_f32_dots_ran_on_tensor_cores_and_the_gpu_is_not_the_pcie_part(cases):
    """Why the f32 rows are priced as TF32 and the table as the SXM H100: the f32 rate
    is above the CUDA cores' 67 TFLOP/s, the bf16 one above the PCIe part's 756."""
    h100 = device("H100-80GB-SXM")
    f32 = max(c.flops / c.measured_s for c in cases if c.dtype == "f32")
    bf16 = max(c.flops / c.measured_s for c in cases if c.dtype == "bf16")
    assert f32 > 4 * h100.peak_flops("fp32")
    assert bf16 > device("H100-80GB-PCIe").peak_flops("bf16")


def test_each_case_is_the_models_gemm_time_beside_the_tables_rate(cases):
    c = next(c for c in cases if (c.b, c.m, c.n, c.k, c.dtype) == (1, 4096, 4096, 4096, "bf16"))
    assert c.measured_s == pytest.approx(2 * 4096 ** 3 / 783328793548203)
    assert c.predicted_s == gemm_time_s(1, 4096, 4096, 4096, device=device("H100-80GB-SXM"),
                                        dtype="bf16", elem_bytes=2)
    assert c.ratio == pytest.approx(c.predicted_s / c.measured_s)


def test_rank_correlation_is_spearmans():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their mean rank: ranks (0.5, 0.5, 2) against (0, 1, 2)
    assert rank_correlation([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)


def test_bands_hold_every_case_once(cases):
    split = bands(cases)
    assert len(split) == len(BANDS_US)
    assert sum(len(inside) for _, inside in split) == len(cases)


@pytest.mark.parametrize(("dtype", "bound"), [("bf16", 0.97), ("f32", 0.95)])
def test_the_model_orders_shapes_as_the_kernels_do(cases, dtype, bound):
    of = [c for c in cases if c.dtype == dtype]
    rho = rank_correlation([c.measured_fraction for c in of], [c.predicted_fraction for c in of])
    assert rho >= bound


@pytest.fixture(scope="module")
def blackwell():
    path, gpu = TABLES["sm_100"]
    return kernel_cases(device(gpu), path)


def test_the_blackwell_table_is_the_whole_sweep_in_three_dtypes_below_the_peaks(blackwell):
    """bf16, f32 (TF32) and FP8 e4m3 on sm_100, each under the B200's datasheet peak (the
    sm_90 table's FP8 rows are not used: 29 of them exceed the H100's 1,979 TFLOP/s)."""
    assert len(blackwell) == 3 * 3 * 5 ** 3
    for dtype in ("bf16", "f32", "fp8"):
        of = [c for c in blackwell if c.dtype == dtype]
        assert len(of) == 375
        assert max(c.measured_fraction for c in of) < 1.0


@pytest.mark.parametrize("dtype", ["bf16", "f32", "fp8"])
def test_the_model_orders_blackwell_shapes_as_the_kernels_do(blackwell, dtype):
    of = [c for c in blackwell if c.dtype == dtype]
    rho = rank_correlation([c.measured_fraction for c in of], [c.predicted_fraction for c in of])
    assert rho >= 0.98
