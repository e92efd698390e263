"""What this host has, as torch sees it: the device a measurement runs on, how many CUDA
devices there are, and the software versions a profile records. Imports torch inside each
function (the planner asks these only when it measures or runs)."""

from __future__ import annotations

from dataclasses import dataclass

from profiler.devices import DeviceSpec, device, match_device
from profiler.schema import fail

__all__ = ["LocalDevice", "Runtime", "cuda_device_count", "local_device", "runtime"]


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
        return LocalDevice(device(device_name), detail)
    if where == "cpu":
        return LocalDevice(device("CPU"), detail)
    props = torch.cuda.get_device_properties(torch.device(where))
    spec = match_device(detail, props.total_memory / 1024**3)
    if spec is None:
        fail("--device-name", None, f"cannot tell which catalog GPU {detail!r} is; "
             "name it (see `plan gpus`)")
    return LocalDevice(spec, detail)


def runtime(where: str) -> Runtime:
    """torch, CUDA and driver versions and torch's thread count, for a profile's metadata."""
    import torch

    cuda = where.startswith("cuda")
    return Runtime(torch_version=str(torch.__version__),
                   cuda_version=str(torch.version.cuda) if cuda else None,
                   driver=_driver_version() if cuda else None,
                   num_threads=torch.get_num_threads())


def _driver_version() -> str | None:
    try:
        import pynvml  # optional NVML bindings

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # optional: not every CUDA machine has NVML bindings
        return None
