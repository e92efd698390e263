"""`plan profile`: measure a model's ops (and collectives) on this machine, show a
profile, fit the analytic device model to one.

    plan profile --device cpu --model debug-small --tp 1,2 --mbs 4,8 -o profiles/cpu.csv
    plan profile --device cpu --collectives --nprocs 2 --max-bytes 64MB -o profiles/cpu-coll.csv
    plan profile show profiles/cpu.csv [--plot cpu.png]
    plan profile fit profiles/cpu.csv

torch is imported only inside the measuring functions, so the rest of `plan` stays light.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence

from planner.kernels import ATTENTION_SUPPORT
from planner.layout import check_tp
from planner.profile_cases import OPTIMIZERS, op_cases
from planner.specs.model import ModelSpec, load_model, preset
from profiler.devices import DeviceSpec, device, match_device
from profiler.measure import Measured, MeasureSettings
from profiler.progress import ProgressBar
from profiler.schema import SpecError, fail
from profiler.store import PROFILE_SCHEMA_VERSION, ProfileMeta, ProfileRow, save_profile

__all__ = ["run_profile"]

INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C


def run_profile(args: argparse.Namespace) -> int:
    if args.profile_command == "show":
        from planner.profile_show import show_profile

        return show_profile(args.file, plot=args.plot, as_json=args.json)
    if args.profile_command == "fit":
        from planner.profile_fit import run_fit

        return run_fit(args.file, iterations=args.iterations)
    return _measure(args)


def _check_args(args: argparse.Namespace) -> ModelSpec | None:
    """Validate what torch need not be loaded for; the model, if any."""
    if not (args.model or args.model_file or args.collectives):
        fail("--model", None, "give a model to measure its ops, or --collectives")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        fail("--device", args.device, "cpu, cuda or cuda:N")
    if args.collectives and args.min_bytes > args.max_bytes:
        fail("--min-bytes", args.min_bytes, f"must be ≤ --max-bytes {args.max_bytes}")
    bad = [o for o in args.optimizer if o not in OPTIMIZERS]
    if bad:
        fail("--optimizer", bad[0], "allowed: " + ", ".join(OPTIMIZERS))
    if not args.output.endswith(".csv"):
        fail("-o", args.output, "a .csv file")
    model = load_model(args.model_file) if args.model_file else (
        preset(args.model) if args.model else None)
    if model is not None:
        for tp in args.tp:
            check_tp(model, tp)
    return model


def _local_device(args: argparse.Namespace) -> tuple[DeviceSpec, str]:
    """The catalog entry the measured device stands for, and its own description."""
    import torch

    from profiler.measure import device_description

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            fail("--device", args.device, "torch sees no CUDA device here")
        index = torch.device(args.device).index or 0
        if index >= torch.cuda.device_count():
            fail("--device", args.device, f"this machine has {torch.cuda.device_count()} GPUs")
    detail = device_description(args.device)
    if args.device_name:
        return device(args.device_name), detail
    if args.device == "cpu":
        return device("CPU"), detail
    props = torch.cuda.get_device_properties(torch.device(args.device))
    spec = match_device(detail, props.total_memory / 1024**3)
    if spec is None:
        fail("--device-name", None, f"cannot tell which catalog GPU {detail!r} is; "
             "name it (see `plan gpus`)")
    return spec, detail


def _attentions(args: argparse.Namespace, dev: DeviceSpec) -> tuple[str, ...]:
    supported = ATTENTION_SUPPORT.get(dev.arch, ("math",))
    chosen = args.attention or supported
    bad = [a for a in chosen if a not in supported]
    if bad:
        fail("--attention", bad[0], f"{dev.name} supports {', '.join(supported)}")
    return tuple(chosen)


def _meta(args: argparse.Namespace, dev: DeviceSpec, detail: str, dtype: str,
          world_size: int) -> ProfileMeta:
    import torch

    cuda = args.device.startswith("cuda")
    return ProfileMeta(
        schema_version=PROFILE_SCHEMA_VERSION, device=dev.name, device_detail=detail,
        dtype=dtype, torch_version=str(torch.__version__),  # type: ignore[arg-type]
        cuda_version=str(torch.version.cuda) if cuda else None,
        driver=_driver_version() if cuda else None, host=platform.node() or "unknown",
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        num_threads=torch.get_num_threads(), world_size=world_size, warmup=args.warmup,
        repeats=args.repeats, command=shlex.join(["plan", *args.argv]))


def _driver_version() -> str | None:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # optional: not every CUDA machine has NVML bindings
        return None


def _measure(args: argparse.Namespace) -> int:
    model = _check_args(args)
    import torch

    torch.set_num_threads(args.threads)
    dev, detail = _local_device(args)
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    if dtype not in dev.peak_tflops:
        fail("--dtype", dtype, f"{dev.name} offers {', '.join(dev.peak_tflops)}")
    start = time.perf_counter()
    rows: list[ProfileRow] = []
    interrupted = False
    notes: list[str] = []
    if model is not None:
        measured = _measure_ops(args, model, dev, dtype)
        rows.extend(measured.rows)
        interrupted = measured.interrupted
        notes.extend(f"skipped {c.name} [{c.variant}]: {why}" for c, why in measured.skipped)
    if args.collectives and not interrupted:
        coll, interrupted = _measure_collectives(args)
        rows.extend(coll)
    world = args.nprocs if args.collectives else 1
    save_profile(args.output, _meta(args, dev, detail, dtype, world), rows)
    for note in sorted(set(notes)):
        print(note, file=sys.stderr)
    elapsed = time.perf_counter() - start
    if interrupted:
        print(f"plan profile: interrupted; kept the {len(rows)} rows measured in "
              f"{elapsed:.0f} s in {args.output}", file=sys.stderr)
        return INTERRUPTED
    print(f"wrote {len(rows)} rows for {dev.name} ({detail}, {dtype}, "
          f"threads: {torch.get_num_threads()}) to {args.output} in {elapsed:.1f} s")
    return 0


def _measure_ops(args: argparse.Namespace, model: ModelSpec, dev: DeviceSpec,
                 dtype: str) -> Measured:
    from profiler.measure import measure_ops

    cases = op_cases(model, tps=args.tp, micro_batch_sizes=args.mbs,
                     seq_lens=args.seq or (model.seq_len,), dtype=dtype,
                     attentions=_attentions(args, dev), optimizers=args.optimizer,
                     sequence_parallel=args.sequence_parallel)
    bar = ProgressBar(len(cases), title="ops")
    settings = MeasureSettings(device=args.device, dtype=dtype, warmup=args.warmup,
                               repeats=args.repeats)
    try:
        return measure_ops(cases, settings, progress=bar)
    finally:
        bar.close()


def _measure_collectives(args: argparse.Namespace) -> tuple[Sequence[ProfileRow], bool]:
    from profiler.collectives import CollectiveSettings, measure_collectives, size_grid

    settings = CollectiveSettings(nprocs=args.nprocs, device="cuda" if args.device != "cpu"
                                  else "cpu", sizes_bytes=size_grid(args.min_bytes,
                                                                    args.max_bytes),
                                  warmup=args.warmup, repeats=args.repeats)
    bar = ProgressBar(len(settings.kinds), title=f"collectives x{args.nprocs}")
    try:
        return measure_collectives(settings, progress=bar)
    except RuntimeError as err:
        raise SpecError(f"--collectives: {err}") from None
    finally:
        bar.close()
