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
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

from planner.commands.args import (
    Parser,
    add_model_args,
    bytes_arg,
    int_in,
    int_list_in,
    name_list,
    number_in,
    path_arg,
)
from planner.costs.workload import WorkloadShape
from planner.errors import INTERRUPTED
from planner.outputs import check_output_file
from planner.profiling.cases import FP8_GEMMS, OPTIMIZERS, op_cases, unmeasured_ops
from planner.specs.layout import check_tp
from planner.specs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from planner.specs.model import ModelSpec, load_model, preset
from profiler.devices import DeviceSpec
from profiler.host import LocalDevice, check_dtype, local_device, runtime
from profiler.hostcost import MAX_PASS_PARAMS
from profiler.kernels import SDPA_BACKENDS
from profiler.measure import MATMUL_PRECISION, Measured, MeasureSettings, OpCase
from profiler.parquet import require_pyarrow
from profiler.progress import ProgressBar
from profiler.schema import SpecError, fail
from profiler.store import (
    INTERRUPTED_NOTE,
    PROFILE_SCHEMA_VERSION,
    ProfileMeta,
    ProfileRow,
    is_parquet,
    save_profile,
)

__all__ = ["MeasureRequest", "add_parser", "default_verb", "measure", "run"]

PROFILE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`plan profile [measure|show|fit]` (measure when no verb is given)."""
    prof = sub.add_parser("profile", help="measure ops and collectives; show or fit a profile",
                          description="Measure a model's ops (and collectives) on this "
                          "machine into a profile that `plan simulate --profile` uses; "
                          "show one; fit the analytic device model to one.")
    verbs = prof.add_subparsers(dest="profile_command", required=True, parser_class=Parser)
    _add_measure(verbs)
    show = verbs.add_parser("show", help="achieved FLOP/s and bandwidth per op")
    show.add_argument("file", type=path_arg, metavar="FILE",
                      help="a profile (.csv or .parquet) that plan profile measure wrote")
    show.add_argument("--plot", type=path_arg, metavar="PNG", help="also draw them")
    show.add_argument("--json", action="store_true", help="print the rows as JSON")
    fit = verbs.add_parser("fit", help="fit the analytic model of the profiled GPU type")
    fit.add_argument("file", type=path_arg, metavar="FILE",
                     help="a profile (.csv or .parquet) that plan profile measure wrote")
    fit.add_argument("--iterations", type=int_in(1, 1_000_000), default=400, metavar="N",
                     help="Nelder-Mead evaluations (default 400)")
    fit.add_argument("-o", "--output", type=path_arg, metavar="FILE", help="write the GPU type with the "
                     "fitted parameters as a catalog file (for --catalog)")


def _add_measure(verbs: argparse._SubParsersAction) -> None:
    m = verbs.add_parser("measure", help="measure (the default verb)",
                         description="Measure the ops a model's training step runs at the "
                         "planner's shapes, and/or collectives across local processes.")
    add_model_args(m, required=False)
    m.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    m.add_argument("--device-name", metavar="GPU", help="the catalog type it is (default: "
                   "recognised from the driver's name; `plan gpus`)")
    m.add_argument("--tp", type=int_list_in(MAX_GPUS), default=(1,), metavar="N,N", help="tensor-parallel "
                   "degrees (default 1)")
    m.add_argument("--mbs", type=int_list_in(MAX_GLOBAL_BATCH), default=(1,), metavar="N,N",
                   help="micro-batch sizes (default 1)")
    m.add_argument("--seq", type=int_list_in(MAX_SEQ_LEN), metavar="N,N",
                   help="sequence lengths (default: the model's)")
    m.add_argument("--dtype", choices=PROFILE_DTYPES,
                   help="default fp32 on cpu, bf16 on cuda; tf32 (fp32 storage, TF32 "
                   "matmuls) and fp8 (the layers' GEMMs in FP8, bf16 elsewhere) on GPUs "
                   "that have them")
    m.add_argument("--attention", type=name_list, metavar="K,K", help="attention backends "
                   "(default: all the device supports; those torch cannot run are skipped)")
    m.add_argument("--optimizer", type=name_list, default=("fused", "foreach", "for_loop"),
                   metavar="K,K", help="AdamW implementations (default fused,foreach,for_loop)")
    m.add_argument("--sequence-parallel", action="store_true",
                   help="time the layer ops as sequence parallelism splits them")
    m.add_argument("--threads", type=int_in(1, 1024), default=1, metavar="N",
                   help="torch threads (default 1: one CPU rank is one core)")
    m.add_argument("--warmup", type=int_in(0, 100_000), default=3, metavar="N",
                   help="untimed calls before sampling (default 3)")
    m.add_argument("--repeats", type=int_in(1, 100_000), default=15, metavar="N",
                   help="timed samples per row (default 15; on the CPU, rounds at least)")
    m.add_argument("--passes", type=int_in(1, 100), default=2, metavar="N",
                   help="passes over every op (default 2): on a GPU each op's fastest median "
                        "kept (a burst of other load on the host slows whole ops, never "
                        "speeds one); on the CPU every pass's calls pooled")
    m.add_argument("--turn-seconds", type=number_in(low=0.0, high=3600.0), default=2.0,
                   metavar="S", help="on the CPU, where the ops of each step shape are "
                   "timed in turn (one call each a round, as a step runs them): seconds of "
                   "rounds per step shape and pass, at least --repeats rounds (default 2)")
    m.add_argument("--collectives", action="store_true",
                   help="also measure collectives across --nprocs local processes")
    m.add_argument("--nprocs", type=int_in(2, 256), default=2, metavar="N",
                   help="processes in the measured group (default 2; a collective needs two)")
    m.add_argument("--host-costs", action="store_true",
                   help="also measure host-side costs (profiler/hostcost.py): per-op dispatch "
                        "with --model; with --collectives on the CPU, each collective's fixed "
                        "cost, FSDP2's and DTensor's per-layer costs and how much slower a "
                        "GEMM runs while n of the --nprocs ranks compute at once (gemm_shared: "
                        "CPU ranks sharing the host's cores), and how late the slowest rank "
                        "reaches a collective after the same compute (arrival_skew: ranks "
                        "in step)")
    m.add_argument("--host-model", metavar="NAME",
                   help="with --collectives --host-costs on the CPU: the model (a preset) "
                        "whose tensor-parallel blocks the DTensor rows also time at each "
                        "--mbs x --seq, the activation sizes its plans run, and whose whole "
                        "forward + backward the shared-core rows time there (pass_shared), "
                        "without measuring its ops (default: --model)")
    m.add_argument("--min-bytes", type=bytes_arg, default=1024, metavar="SIZE",
                   help="the smallest collective measured (default 1KB)")
    m.add_argument("--max-bytes", type=bytes_arg, default=256 * 1024**2, metavar="SIZE",
                   help="the largest collective measured (the sizes: powers of two between "
                   "them; default 256MB)")
    m.add_argument("-o", "--output", required=True, type=path_arg, metavar="FILE",
                   help="the profile: .csv, or .parquet (typed columns; needs pyarrow, "
                   "`pip install 'trainplan[parquet]'`)")


def default_verb(argv: list[str]) -> list[str]:
    """`plan profile --device cpu ...` means `plan profile measure ...`."""
    if argv[:1] == ["profile"] and argv[1:2] and argv[1] not in _VERBS:
        return [argv[0], "measure", *argv[1:]]
    return argv


_VERBS = ("measure", "show", "fit", "-h", "--help")


@dataclass(frozen=True, kw_only=True)
class MeasureRequest:
    """What `plan profile measure` measures (its flags, as values); `command` is the
    command line the profile's metadata records."""

    model: ModelSpec | None
    output: str
    command: str
    device: str = "cpu"
    device_name: str | None = None
    tp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1,)
    seq: tuple[int, ...] | None = None
    dtype: str | None = None
    attention: tuple[str, ...] | None = None
    optimizer: tuple[str, ...] = ("fused", "foreach", "for_loop")
    sequence_parallel: bool = False
    threads: int = 1
    warmup: int = 3
    repeats: int = 15
    passes: int = 2
    turn_seconds: float = 2.0
    collectives: bool = False
    nprocs: int = 2
    host_costs: bool = False
    host_model: ModelSpec | None = None  # the model whose kind the host costs use (default: model)
    min_bytes: int = 1024
    max_bytes: int = 256 * 1024**2


def run(args: argparse.Namespace) -> int:
    if args.profile_command == "show":
        from planner.profiling.show import show_profile

        return show_profile(args.file, plot=args.plot, as_json=args.json)
    if args.profile_command == "fit":
        from planner.profiling.fit import run_fit

        return run_fit(args.file, iterations=args.iterations, output=args.output)
    model = load_model(args.model_file) if args.model_file is not None else (
        preset(args.model, where="--model") if args.model is not None else None)
    host_model = (preset(args.host_model, where="--host-model")
                  if args.host_model is not None else None)
    return measure(MeasureRequest(
        model=model, output=args.output, command=shlex.join(["plan", *args.argv]),
        device=args.device, device_name=args.device_name, tp=args.tp, mbs=args.mbs,
        seq=args.seq, dtype=args.dtype, attention=args.attention, optimizer=args.optimizer,
        sequence_parallel=args.sequence_parallel, threads=args.threads, warmup=args.warmup,
        repeats=args.repeats, passes=args.passes, turn_seconds=args.turn_seconds,
        collectives=args.collectives,
        nprocs=args.nprocs,
        host_costs=args.host_costs, host_model=host_model,
        min_bytes=args.min_bytes, max_bytes=args.max_bytes))


def _check(req: MeasureRequest) -> None:
    """Validate what torch need not be loaded for."""
    if req.model is None and not req.collectives:
        fail("--model", None, "give a model to measure its ops, or --collectives")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", req.device):
        fail("--device", req.device, "cpu, cuda or cuda:N")
    if req.collectives and req.min_bytes > req.max_bytes:
        fail("--min-bytes", req.min_bytes, f"must be ≤ --max-bytes {req.max_bytes}")
    bad = [o for o in req.optimizer if o not in OPTIMIZERS]
    if bad:
        fail("--optimizer", bad[0], "allowed: " + ", ".join(OPTIMIZERS))
    check_output_file(req.output, flag="-o", suffixes=(".csv", ".parquet"))
    if is_parquet(req.output):
        require_pyarrow("-o", req.output)
    if req.model is not None:
        for tp in req.tp:
            check_tp(req.model, tp)


def _attentions(req: MeasureRequest, dev: DeviceSpec) -> tuple[str, ...]:
    supported = tuple(str(k) for k in dev.attention_kernels if k in SDPA_BACKENDS)
    chosen = req.attention or supported
    bad = [a for a in chosen if a not in supported]
    if bad:
        fail("--attention", bad[0], f"{dev.name} supports {', '.join(supported)}")
    return tuple(chosen)


def _precision(device: str, dtype: str) -> str | None:
    """What the profile's `precision` records: how the dtype ran, where it is not plain."""
    if dtype == "fp8":
        return (f"FP8 GEMMs for {', '.join(FP8_GEMMS)} and their gradients (torch._scaled_mm, "
                "per-tensor scales, e4m3 activations and weights, e5m2 output gradients, "
                "operands cast before the timed call); every other op in bf16")
    if device.startswith("cuda") and dtype in MATMUL_PRECISION:
        tf32 = "TF32 tensor cores" if dtype == "tf32" else "full fp32, no TF32"
        return (f"fp32 storage, matmuls on {tf32} (torch.set_float32_matmul_precision"
                f"('{MATMUL_PRECISION[dtype]}'))")
    return None


def _meta(req: MeasureRequest, local: LocalDevice, dtype: str, world_size: int) -> ProfileMeta:
    rt = runtime(req.device)
    return ProfileMeta(
        schema_version=PROFILE_SCHEMA_VERSION, device=local.spec.name,
        device_detail=local.detail, dtype=dtype,  # type: ignore[arg-type]  # dtype checked against the device above
        precision=_precision(req.device, dtype) if req.model is not None else None,
        torch_version=rt.torch_version, cuda_version=rt.cuda_version, driver=rt.driver,
        host=platform.node() or "unknown",
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        num_threads=rt.num_threads, world_size=world_size, warmup=req.warmup,
        repeats=req.repeats, command=req.command)


def measure(req: MeasureRequest) -> int:
    """Measure what `req` asks for into `req.output`; the exit code (130 if interrupted,
    keeping what was measured)."""
    _check(req)
    import torch

    torch.set_num_threads(req.threads)
    local = local_device(req.device, device_name=req.device_name)
    dev = local.spec
    dtype = req.dtype or ("fp32" if req.device == "cpu" else "bf16")
    check_dtype(req.device, dtype)
    if dtype not in dev.peak_tflops:
        fail("--dtype", dtype, f"{dev.name} offers {', '.join(dev.peak_tflops)}")
    start = time.perf_counter()
    rows: list[ProfileRow] = []
    interrupted = False
    notes: list[str] = []
    if req.model is not None:
        measured = _measure_ops(req, req.model, dev, dtype)
        rows.extend(measured.rows)
        interrupted = measured.interrupted
        notes.extend(f"skipped {c.name} [{c.variant}]: {why}" for c, why in measured.skipped)
        left = unmeasured_ops(req.model, WorkloadShape(
            micro_batch_size=req.mbs[0], seq_len=(req.seq or (req.model.seq_len,))[0],
            tp=req.tp[0], dtype=dtype))
        if left:
            notes.append(f"not measured: {', '.join(left)} and their gradients (no torch code "
                         "here runs them as the frameworks do: the analytic model prices them)")
        if req.host_costs and not interrupted:
            from profiler.hostcost import dispatch_rows, runner_rows

            rows.extend(dispatch_rows(req.device, repeats=req.repeats))
            if req.device == "cpu":
                rows.extend(runner_rows(repeats=req.repeats))
    if req.collectives and not interrupted:
        coll, interrupted = _measure_collectives(req)
        rows.extend(coll)
    world = req.nprocs if req.collectives else 1
    meta = _meta(req, local, dtype, world)
    if interrupted:  # so that nothing takes it for the whole measurement (plan run reuses
        # a profile whose command is the one it would run)
        meta = replace(meta, command=f"{meta.command or ''}{INTERRUPTED_NOTE}{len(rows)} rows")
    save_profile(req.output, meta, rows)
    for note in sorted(set(notes)):
        print(note, file=sys.stderr)
    elapsed = time.perf_counter() - start
    if interrupted:
        print(f"plan profile: interrupted; kept the {len(rows)} rows measured in "
              f"{elapsed:.0f} s in {req.output}", file=sys.stderr)
        return INTERRUPTED
    print(f"wrote {len(rows)} rows for {dev.name} ({local.detail}, {dtype}, "
          f"threads: {torch.get_num_threads()}) to {req.output} in {elapsed:.1f} s")
    return 0


def _measure_ops(req: MeasureRequest, model: ModelSpec, dev: DeviceSpec,
                 dtype: str) -> Measured:
    from profiler.measure import measure_ops

    longer = [s for s in req.seq or () if s > model.seq_len]
    if longer and model.position_embedding == "learned":  # the lookup indexed past the table
        fail("--seq", longer[0], f"at most {model.name}'s {model.seq_len} learned positions "
             "(its position_embedding table; the executor refuses longer sequences too)")
    cases = op_cases(model, tps=req.tp, micro_batch_sizes=req.mbs,
                     seq_lens=req.seq or (model.seq_len,), dtype=dtype,
                     attentions=_attentions(req, dev), optimizers=req.optimizer,
                     sequence_parallel=req.sequence_parallel)
    _check_fits(cases, req, dev)
    bar = ProgressBar(len(cases) * req.passes, title="ops")
    settings = MeasureSettings(device=req.device, dtype=dtype, warmup=req.warmup,
                               repeats=req.repeats, passes=req.passes,
                               in_turn_s=req.turn_seconds)
    try:
        return measure_ops(cases, settings, progress=bar)
    finally:
        bar.close()


def _memory_bytes(req: MeasureRequest, dev: DeviceSpec) -> tuple[int, str]:
    """What the measuring device holds: the host's physical memory on the CPU, the
    catalog's memory of the GPU type."""
    if req.device == "cpu":
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this host's"
    return dev.memory_bytes, f"{dev.name}'s"


def _check_fits(cases: Sequence[OpCase], req: MeasureRequest, dev: DeviceSpec) -> None:
    """Refuse before measuring an op whose tensors cannot be held: its bytes (operands and
    results; a softmax's scores and their gradient) beyond the device's memory. A
    100,000-token debug-tiny profile ran for minutes in one attention op and ignored
    Ctrl-C and SIGTERM there (torch holds them inside an op), and would have needed
    7,150 GiB."""
    memory, whose = _memory_bytes(req, dev)
    big = max(cases, key=lambda c: c.bytes, default=None)
    if big is None:
        return
    if big.bytes <= memory:
        _check_step_fits(cases, req, memory, whose)
        return
    if big.kind == "optimizer":  # the model's size, whatever the batch
        fail("--model", req.model.name if req.model else None,
             f"a model whose optimizer step fits in {whose} {memory / 2**30:,.1f} GiB; "
             f"{big.name} ({big.variant}) over its {big.shape[0]:,} parameters on one tp "
             f"rank holds {big.bytes / 2**30:,.1f} GiB: a higher --tp, or a smaller model")
    _fail_shape(req, f"ops whose tensors fit in {whose} {memory / 2**30:,.1f} GiB; {big.name}"
                f"{f' ({big.variant})' if big.variant else ''} at shape "
                f"{'x'.join(map(str, big.shape))} holds {big.bytes / 2**30:,.1f} GiB: lower them"
                + ("" if big.variant is None else ", or leave that backend out with --attention"))


def _fail_shape(req: MeasureRequest, allowed: str) -> NoReturn:
    """Refuse the shapes asked for (--seq and --mbs), saying what is allowed."""
    flags = [f"--seq {','.join(map(str, req.seq))}"] if req.seq else []
    flags.append(f"--mbs {','.join(map(str, req.mbs))}")
    fail("/".join(f.split()[0] for f in flags), " ".join(flags), allowed)


def _check_step_fits(cases: Sequence[OpCase], req: MeasureRequest, memory: int,
                     whose: str) -> None:
    """On the CPU a step shape's ops are timed in turn, each keeping its tensors: refuse
    a step shape whose ops' bytes together pass the host's memory."""
    if req.device != "cpu":
        return
    steps: dict[int, float] = {}
    for case in cases:
        steps[case.step] = steps.get(case.step, 0.0) + case.bytes
    held = max(steps.values())
    if held > memory:
        _fail_shape(req, f"a step shape whose ops fit in {whose} {memory / 2**30:,.3g} GiB "
                    "together (the CPU times them in turn, each keeping its tensors); the "
                    f"largest holds {held / 2**30:,.3g} GiB: lower them")


def _host_model(req: MeasureRequest) -> str | None:
    """The tiny preset whose blocks the framework's host costs are measured on: the one of
    the model's kind (SwiGLU and RMSNorm or GELU and LayerNorm; a GeGLU model takes the
    SwiGLU one, whose MLP launches the same ops, the gate's function aside); CPU only."""
    if not req.host_costs or req.device != "cpu":
        return None
    model = req.host_model or req.model
    return "debug-tiny-llama" if model is not None and model.gated else "debug-tiny"


# What the DTensor rows time a model's own blocks at, at most: 5-block models (framed and a
# tp rank's, with gradients) of this many parameters a block, and the math attention's
# scores [b, heads, s, s] in fp32 of this many bytes.
MAX_BLOCK_PARAMS = 25_000_000
MAX_SCORES_BYTES = 512 << 20


def _host_blocks(req: MeasureRequest) -> tuple[tuple[ModelSpec, int, int], ...]:
    """(model, micro-batch, sequence) at which the DTensor rows also time the model's own
    blocks: its plans' activation sizes (--mbs x --seq; the tiny preset's rows alone lie
    at one small size, and a tp collective's cost in a block differs from one timed back
    to back), and at which the `pass_shared` rows time its whole pass with n ranks at
    once (a model of at most MAX_PASS_PARAMS); CPU host costs with a model only."""
    model = req.host_model or req.model
    if _host_model(req) is None or model is None:
        return ()
    if model.params_per_layer() > MAX_BLOCK_PARAMS:
        print(f"plan profile: DTensor rows on {model.name}'s own blocks skipped: a block "
              f"holds {model.params_per_layer() / 1e6:,.0f}M parameters, more than the CPU "
              f"times in 5-block models ({MAX_BLOCK_PARAMS / 1e6:.0f}M); the tiny preset's "
              "rows price its plans", file=sys.stderr)
        return ()
    shapes = [(mbs, seq) for mbs in req.mbs for seq in req.seq or (model.seq_len,)]
    big = [(b, s) for b, s in shapes if 4 * b * model.num_heads * s * s > MAX_SCORES_BYTES]
    if big:
        print(f"plan profile: DTensor rows on {model.name}'s blocks skipped at (micro-batch, "
              f"sequence) {', '.join(map(str, big))}: their attention scores exceed "
              f"{MAX_SCORES_BYTES >> 20} MiB", file=sys.stderr)
    if model.num_params() > MAX_PASS_PARAMS:
        print(f"plan profile: the shared-core rows on {model.name}'s whole pass skipped: it "
              f"holds {model.num_params() / 1e6:,.0f}M parameters, more than the "
              f"{MAX_PASS_PARAMS / 1e6:.0f}M a process times here; a GEMM's "
              "(gemm_shared) price its plans", file=sys.stderr)
    return tuple((model, b, s) for b, s in shapes if (b, s) not in big)


def _measure_collectives(req: MeasureRequest) -> tuple[Sequence[ProfileRow], bool]:
    from profiler.collectives import CollectiveSettings, measure_collectives, size_grid

    settings = CollectiveSettings(nprocs=req.nprocs, device="cuda" if req.device != "cpu"
                                  else "cpu", sizes_bytes=size_grid(req.min_bytes,
                                                                    req.max_bytes),
                                  warmup=req.warmup, repeats=req.repeats,
                                  host_costs_model=_host_model(req),
                                  host_costs_blocks=_host_blocks(req))
    bar = ProgressBar(len(settings.kinds) + int(settings.host_costs_model is not None),
                      title=f"collectives x{req.nprocs}")
    try:
        return measure_collectives(settings, progress=bar)
    except RuntimeError as err:
        raise SpecError(f"--collectives: {err}") from None
    finally:
        bar.close()
