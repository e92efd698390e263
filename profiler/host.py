"""What this host has, as torch sees it: the device a measurement runs on, how many CUDA
devices there are, and the software versions a profile records. Imports torch inside each
function (the planner asks these only when it measures or runs)."""

from __future__ import annotations

from dataclasses import dataclass

from profiler.devices import DeviceSpec, device, match_device
from profiler.schema import fail

__all__ = ["DTYPE_CAPABILITY", "LocalDevice", "Runtime", "check_dtype", "cuda_device_count",
           "local_device", "runtime"]

# The NVIDIA compute capability a profile dtype needs, what for, and the dtype to profile
# elsewhere: TF32 tensor cores from Ampere (8.0), FP8 ones from Ada (8.9) and Hopper (9.0).
DTYPE_CAPABILITY = {"tf32": ((8, 0), "TF32 tensor cores", "fp32"),
                    "fp8": ((8, 9), "FP8 tensor cores", "bf16")}


@dataclass(frozen=True)
class LocalDevice:
    spec: DeviceSpec  # the catalog entry it stands for
    detail: str  # what the hardware calls itself


@dataclass(frozen=True)
class Runtime:
    torch_version: str
    cuda_version: str | None
    driver: str | None
    num_threads: int


def cuda_device_count() -> int:
    """CUDA devices torch can use here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_device(where: str, *, device_name: str | None = None) -> LocalDevice:
    """The device `where` (cpu, cuda, cuda:N) and the catalog entry it stands for:
    `device_name` if given, else recognised from the driver's name."""
    import torch

    from profiler.measure import device_description

    if where.startswith("cuda"):
        if not torch.cuda.is_available():
            fail("--device", where, "torch sees no CUDA device here")
        index = torch.device(where).index or 0
        if index >= torch.cuda.device_count():
            fail("--device", where, f"this machine has {torch.cuda.device_count()} GPUs")
    detail = device_description(where)
    if device_name:
        named = device(device_name, where="--device-name")
        if (named.vendor == "cpu") != (where == "cpu"):
            fail("--device-name", device_name, f"a {'CPU' if where == 'cpu' else 'GPU'} catalog "
                 f"entry: --device {where} measures {detail!r}, and its times would price "
                 f"every {device_name} of a plan")
        return LocalDevice(named, detail)
    if where == "cpu":
        return LocalDevice(device("CPU"), detail)
    props = torch.cuda.get_device_properties(torch.device(where))
    spec = match_device(detail, props.total_memory / 1024**3)
    if spec is None:
        fail("--device-name", None, f"cannot tell which catalog GPU {detail!r} is; "
             "name it (see `plan gpus`)")
    return LocalDevice(spec, detail)


def check_dtype(where: str, dtype: str) -> None:
    """Refuse, in one line, a profile dtype the device `where` cannot run: tf32 and fp8
    are measured on NVIDIA GPUs of the compute capability in DTYPE_CAPABILITY (fp8 also
    needs a torch with `torch._scaled_mm`). The CPU has neither: a "tf32" profile there
    would be an fp32 one under another name."""
    if dtype not in DTYPE_CAPABILITY:
        return
    import torch

    (major, minor), what, instead = DTYPE_CAPABILITY[dtype]
    if not where.startswith("cuda"):
        fail("--dtype", dtype, f"{what} are on NVIDIA GPUs of compute capability "
             f"{major}.{minor} or newer; profile {instead} on the CPU")
    if torch.version.hip:
        fail("--dtype", dtype, "measured on NVIDIA GPUs only; this torch is ROCm's")
    have = torch.cuda.get_device_capability(torch.device(where))
    if have < (major, minor):
        name = torch.cuda.get_device_name(torch.device(where))
        fail("--dtype", dtype, f"{what} need compute capability {major}.{minor} or newer; "
             f"{name} is {have[0]}.{have[1]}")
    if dtype == "fp8" and not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e5m2")):
        fail("--dtype", dtype, f"torch {torch.__version__} has no FP8 GEMM (torch._scaled_mm)")


def runtime(where: str) -> Runtime:
    """torch, CUDA and driver versions and torch's thread count, for a profile's metadata."""
    import torch

    cuda = where.startswith("cuda")
    return Runtime(torch_version=str(torch.__version__),
                   cuda_version=str(torch.version.cuda) if cuda else None,
                   driver=_driver_version() if cuda else None,
                   num_threads=torch.get_num_threads())


def _driver_version() -> str | None:
    """The NVIDIA driver's version, from NVML's Python bindings or else nvidia-smi."""
    try:
        import pynvml  # optional NVML bindings

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # optional: not every CUDA machine has NVML bindings
        pass
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None
