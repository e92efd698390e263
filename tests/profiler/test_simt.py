"""GEMMs on the CUDA cores (SIMT) against GEMMs on the tensor cores (profiler/analytic.py),
and the Pascal peaks mixed precision runs at (profiler/data/devices.yaml).

Sources: PyTorch runs fp32 matmuls without TF32 by default since 1.12
(pytorch/pytorch#77114); GA102 / AD10x datasheet fp32 peaks count a second FP32
datapath shared with INT32 (NVIDIA Ampere GA102 and Ada Lovelace whitepapers); autocast's
fp16 GEMMs accumulate in fp32 (CUBLAS_COMPUTE_32F), which Pascal runs at its FP32 rate
(Zorse measures fp16 / fp32 layer time 0.7-1.0 on P100 and P40). The efficiencies are
fitted on Zorse's fp32 layers (docs/calibration.md, "SIMT GEMMs")."""

from dataclasses import replace

import pytest

from profiler.analytic import gemm_peak_flops, gemm_time_s, on_cuda_cores
from profiler.devices import arch_efficiency, device, device_efficiency

SHAPE = (1, 8192, 8192, 8192)  # one large GEMM: tiles and waves fill the device


def _flops_per_s(gpu: str, dtype: str, elem_bytes: int) -> float:
    b, m, n, k = SHAPE
    return 2.0 * b * m * n * k / gemm_time_s(b, m, n, k, device=device(gpu), dtype=dtype,
                                            elem_bytes=elem_bytes)


def test_fp32_without_tf32_runs_on_the_cuda_cores():
    a100 = device("A100-80GB-SXM")
    assert on_cuda_cores(a100, "fp32")
    assert not on_cuda_cores(a100, "tf32") and not on_cuda_cores(a100, "bf16")
    assert on_cuda_cores(device("TitanRTX-24GB"), "tf32")  # Turing has no TF32
    assert on_cuda_cores(device("P100-16GB-PCIe"), "fp16")  # no tensor cores at all


def test_a100_fp32_gemm_reaches_its_fp32_peak_not_the_tensor_fraction():
    """Zorse: the A100's fp32 layers run at ~92% of 19.5 TFLOP/s; the tensor-core fraction
    (0.80) priced them 24% slow."""
    rate = _flops_per_s("A100-80GB-SXM", "fp32", 4)
    assert 0.85 * 19.5e12 < rate < 19.5e12
    eff = arch_efficiency("ampere")
    assert eff.simt_gemm_efficiency is not None and eff.simt_gemm_efficiency > eff.gemm_efficiency


def test_dual_issue_fp32_peak_is_mostly_not_reached():
    """GA102 (A10G, A6000, RTX 3090) and AD10x: an SGEMM runs at the single-issue half of
    the datasheet fp32 peak plus a small share of the INT32-shared datapath (~58%)."""
    a6000 = device("A6000-48GB")
    assert a6000.fp32_dual_issue and not device("A100-80GB-SXM").fp32_dual_issue
    gain = arch_efficiency("ampere").dual_issue_fp32_gain
    assert gain is not None and 0 < gain < 0.5
    assert gemm_peak_flops(a6000, "fp32") == pytest.approx(38.7e12 / 2 * (1 + gain))
    assert gemm_peak_flops(a6000, "fp16") == pytest.approx(154.8e12)  # tensor cores: as listed
    assert _flops_per_s("A6000-48GB", "fp32", 4) < 0.6 * 38.7e12
    for gpu in ("RTX3090-24GB", "A10G-24GB", "A10-24GB", "A40-48GB", "L4-24GB", "L40S-48GB",
                "RTX4090-24GB"):
        assert device(gpu).fp32_dual_issue, gpu
    for gpu in ("V100-16GB-SXM2", "T4-16GB", "TitanRTX-24GB", "H100-80GB-SXM", "P40-24GB"):
        assert not device(gpu).fp32_dual_issue, gpu


def test_a_devices_own_efficiency_takes_its_architectures_simt_fields():
    """Per-device fits made before the SIMT field (A10G) inherit the architecture's."""
    a10g = device("A10G-24GB")
    assert a10g.efficiency is not None and a10g.efficiency.simt_gemm_efficiency is None
    eff = device_efficiency(a10g)
    assert eff.simt_gemm_efficiency == arch_efficiency("ampere").simt_gemm_efficiency
    assert eff.gemm_efficiency == a10g.efficiency.gemm_efficiency
    own = replace(a10g, efficiency=replace(a10g.efficiency, simt_gemm_efficiency=0.5))
    assert device_efficiency(own).simt_gemm_efficiency == 0.5


def test_tensor_core_gemms_are_unchanged_by_the_simt_field():
    a100 = device("A100-80GB-SXM")
    simt_off = replace(a100, efficiency=replace(device_efficiency(a100),
                                                simt_gemm_efficiency=0.3))
    b, m, n, k = SHAPE
    for dtype in ("bf16", "fp16", "tf32"):
        assert (gemm_time_s(b, m, n, k, device=a100, dtype=dtype, elem_bytes=2)
                == gemm_time_s(b, m, n, k, device=simt_off, dtype=dtype, elem_bytes=2))
    assert (gemm_time_s(b, m, n, k, device=simt_off, dtype="fp32", elem_bytes=4)
            > 2 * gemm_time_s(b, m, n, k, device=a100, dtype="fp32", elem_bytes=4))


@pytest.mark.parametrize("gpu", ["P100-16GB-SXM2", "P100-16GB-PCIe", "P100-12GB-PCIe",
                                 "P40-24GB"])
def test_pascal_trains_fp16_at_its_fp32_rate(gpu):
    """Not the packed-half (P100 2x) or 1:64 (P40) headline: fp16 GEMMs with fp32
    accumulate run at the FP32 rate, on the CUDA cores."""
    dev = device(gpu)
    assert dev.peak_tflops["fp16"] == dev.peak_tflops["fp32"]
    assert not device_efficiency(dev).tensor_cores
    b, m, n, k = SHAPE
    fp16 = gemm_time_s(b, m, n, k, device=dev, dtype="fp16", elem_bytes=2)
    fp32 = gemm_time_s(b, m, n, k, device=dev, dtype="fp32", elem_bytes=4)
    assert fp16 == pytest.approx(fp32, rel=0.01)


def test_p100_12gb_pcie_is_in_the_catalog():
    """NVIDIA Tesla P100 PCIe datasheet: 12 GB at 549 GB/s (three HBM2 stacks)."""
    dev = device("P100-12GB-PCIe")
    assert dev.memory_gib == 12 and dev.memory_bandwidth_gb_per_s == 549
    assert dev.num_compute_units == device("P100-16GB-PCIe").num_compute_units
