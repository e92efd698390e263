"""Each tensor-core precision's own sustained fraction of its peak (profiler/analytic.py,
ArchEfficiency.gemm_peak_fraction; docs/calibration.md "Hopper").

A large GEMM sustains a different fraction of the datasheet peak in each precision (power
and operand movement per FLOP differ: the H100 SXM datasheet lists 494.7 / 989.4 / 1978.9
dense TFLOP/s for TF32 / BF16 / FP8 at one board power). `tf32_gemm_efficiency` and
`fp8_gemm_efficiency` say so where they are set and fall back to `gemm_efficiency` (the
16-bit fraction) where not, so fitting the 16-bit rate on BF16 runs cannot move a TF32 or
an FP8 prediction."""

from dataclasses import replace

import pytest

from profiler.analytic import gemm_time_s
from profiler.devices import (
    ArchEfficiency,
    arch_efficiency,
    device,
    device_efficiency,
    parameter_overrides,
)
from profiler.schema import SpecError, parse

SHAPE = (1, 8192, 8192, 8192)  # one large GEMM: compute-bound, tiles and waves full


def _time_s(gpu: str, dtype: str) -> float:
    b, m, n, k = SHAPE
    return gemm_time_s(b, m, n, k, device=device(gpu), dtype=dtype,
                       elem_bytes=1 if dtype == "fp8" else 2 if dtype in ("bf16", "fp16") else 4)


def test_unset_fields_fall_back_to_the_16_bit_fraction():
    """Every architecture without the fields prices TF32 and FP8 GEMMs as before."""
    for arch in ("volta", "ampere", "ada", "cdna3"):
        eff = arch_efficiency(arch)
        assert eff.tf32_gemm_efficiency is None and eff.fp8_gemm_efficiency is None, arch
        for dtype in ("tf32", "bf16", "fp16", "fp8"):
            assert eff.gemm_peak_fraction(dtype) == eff.gemm_efficiency, (arch, dtype)
    ampere = arch_efficiency("ampere")
    assert ampere.gemm_peak_fraction("fp32", simt=True) == ampere.simt_gemm_efficiency


def test_blackwell_prices_fp8_at_its_own_fit_and_tf32_at_the_16_bit_one():
    """Blackwell's fit (docs/calibration.md "Blackwell") set the 16-bit and the FP8 fraction
    from the DGX Cloud GB200 rows; no TF32 row was used, so TF32 keeps the 16-bit one."""
    bw = arch_efficiency("blackwell")
    assert (bw.gemm_efficiency, bw.fp8_gemm_efficiency) == (0.613, 0.589)
    assert bw.tf32_gemm_efficiency is None
    assert bw.gemm_peak_fraction("fp8") == 0.589
    assert bw.gemm_peak_fraction("tf32") == bw.gemm_peak_fraction("bf16") == 0.613


def test_hopper_holds_tf32_and_fp8_at_the_three_row_fit():
    """No TF32 or FP8 evidence was used when the 16-bit rate was refitted: both keep 0.527."""
    hopper = arch_efficiency("hopper")
    assert hopper.tf32_gemm_efficiency == hopper.fp8_gemm_efficiency == 0.527
    assert hopper.gemm_peak_fraction("tf32") == hopper.gemm_peak_fraction("fp8") == 0.527
    assert hopper.gemm_peak_fraction("bf16") == hopper.gemm_peak_fraction("fp16") \
        == hopper.gemm_efficiency


@pytest.mark.parametrize("gpu", ["H100-80GB-SXM", "GH200-96GB"])
def test_the_16_bit_rate_moves_only_16_bit_gemms(gpu):
    before = {dt: _time_s(gpu, dt) for dt in ("tf32", "bf16", "fp16", "fp8", "fp32")}
    hopper = arch_efficiency("hopper")
    faster = replace(hopper, gemm_efficiency=hopper.gemm_efficiency * 1.25)
    with parameter_overrides(arch={"hopper": faster}):
        after = {dt: _time_s(gpu, dt) for dt in before}
    for dtype in ("tf32", "fp8", "fp32"):
        assert after[dtype] == before[dtype], dtype
    for dtype in ("bf16", "fp16"):  # compute-bound: time ~ 1 / fraction, plus one kernel gap
        gap = hopper.kernel_overhead_s
        assert (after[dtype] - gap) == pytest.approx((before[dtype] - gap) / 1.25), dtype


def test_an_fp8_fraction_moves_only_fp8_gemms():
    hopper = arch_efficiency("hopper")
    assert hopper.fp8_gemm_efficiency is not None
    before = {dt: _time_s("H100-80GB-SXM", dt) for dt in ("tf32", "bf16", "fp8")}
    own = replace(hopper, fp8_gemm_efficiency=hopper.fp8_gemm_efficiency / 2)
    with parameter_overrides(arch={"hopper": own}):
        after = {dt: _time_s("H100-80GB-SXM", dt) for dt in before}
    assert after["tf32"] == before["tf32"] and after["bf16"] == before["bf16"]
    gap = hopper.kernel_overhead_s
    assert after["fp8"] - gap == pytest.approx(2 * (before["fp8"] - gap))


def test_a_devices_own_efficiency_without_the_fields_uses_its_own_16_bit_fraction():
    """H100 NVL's own fit (Zorse, fp16) predates the fields: its TF32 and FP8 GEMMs keep
    its own gemm_efficiency, not Hopper's per-precision values."""
    nvl = device("H100-94GB-NVL")
    eff = device_efficiency(nvl)
    assert nvl.efficiency is not None and eff.fp8_gemm_efficiency is None
    assert eff.gemm_peak_fraction("fp8") == eff.gemm_peak_fraction("tf32") \
        == nvl.efficiency.gemm_efficiency


def test_a_fraction_above_one_is_rejected():
    raw = {"gemm_efficiency": 0.6, "gemm_tile_m": 256, "gemm_tile_n": 128, "gemm_k_half": 128,
           "small_tile_penalty": 0.26, "attention_efficiency": 0.45, "memory_efficiency": 0.78,
           "kernel_overhead_us": 0.5, "launch_overhead_us": 48.0}
    assert parse(ArchEfficiency, {**raw, "fp8_gemm_efficiency": 0.5}).gemm_peak_fraction(
        "fp8") == 0.5
    with pytest.raises(SpecError, match="fp8_gemm_efficiency"):
        parse(ArchEfficiency, {**raw, "fp8_gemm_efficiency": 1.2})
    with pytest.raises(SpecError, match="tf32_gemm_efficiency"):
        parse(ArchEfficiency, {**raw, "tf32_gemm_efficiency": 0.0})
