"""Which profile dtypes a device can measure (tf32 and fp8 on NVIDIA GPUs that have them).

No GPU here: the CUDA answers are the GPU's capability as torch would report it."""

import pytest

torch = pytest.importorskip("torch")

from profiler.host import check_dtype  # noqa: E402
from profiler.schema import SpecError  # noqa: E402


@pytest.mark.parametrize("dtype, needle", [
    ("tf32", "--dtype: 'tf32' is not allowed (TF32 tensor cores are on NVIDIA GPUs of compute "
             "capability 8.0 or newer; profile fp32 on the CPU)"),
    ("fp8", "--dtype: 'fp8' is not allowed (FP8 tensor cores are on NVIDIA GPUs of compute "
            "capability 8.9 or newer; profile bf16 on the CPU)")])
def test_the_cpu_measures_neither_tf32_nor_fp8(dtype, needle):
    with pytest.raises(SpecError) as err:
        check_dtype("cpu", dtype)
    assert str(err.value) == needle
    for plain in ("fp32", "bf16", "fp16"):
        check_dtype("cpu", plain)


def _gpu(monkeypatch, name, capability):
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize("name, capability, allowed", [
    ("Tesla V100-SXM2-32GB", (7, 0), ()),
    ("NVIDIA A100-SXM4-80GB", (8, 0), ("tf32",)),
    ("NVIDIA L4", (8, 9), ("tf32", "fp8")),
    ("NVIDIA H200", (9, 0), ("tf32", "fp8")),
])
def test_gpus_measure_what_their_tensor_cores_have(monkeypatch, name, capability, allowed):
    _gpu(monkeypatch, name, capability)
    for dtype in ("tf32", "fp8"):
        if dtype in allowed:
            check_dtype("cuda:0", dtype)
            continue
        with pytest.raises(SpecError, match=rf"need compute capability .* or newer; {name} is "
                           rf"{capability[0]}\.{capability[1]}\)$"):
            check_dtype("cuda:0", dtype)


def test_fp8_needs_a_torch_with_scaled_mm(monkeypatch):
    _gpu(monkeypatch, "NVIDIA H200", (9, 0))
    monkeypatch.delattr(torch, "_scaled_mm")
    with pytest.raises(SpecError, match=r"has no FP8 GEMM \(torch._scaled_mm\)"):
        check_dtype("cuda", "fp8")
    check_dtype("cuda", "tf32")
