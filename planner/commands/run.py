"""`plan run`: run a plan on torch.distributed and measure it beside its prediction.

`plan run --plan FILE` runs a plan; `plan run --model M (--gpus T:N | --cluster F) --gbs N`
first searches for the best plan (the automatic execute mode). Plans the executor cannot
run here are refused before any process starts (executor/preflight.py); a one-node plan
runs under torchrun on this host, a multi-node one gets its torchrun command lines
printed, one per node. The report (predicted vs measured iteration time, tokens/s, memory
per rank) is printed and, with --report or in the automatic mode, written as Markdown
and JSON (default folder reports/<name>/).

The planner never imports the executor or torch: this module does, inside `run`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from planner.commands.args import (
    gbs_arg,
    int_in,
    non_negative_int,
    number_in,
    path_arg,
    positive_int,
    print_json,
    seq_arg,
)
from planner.commands.inputs import load_model_arg, profiles_for, with_prediction
from planner.errors import INTERRUPTED, Interrupted
from planner.outputs import check_output_dir, write_text
from planner.predict.results import SimResult
from planner.specs.choices import DType
from planner.specs.cluster import (
    ClusterSpec,
    NodeGroup,
    load_cluster,
    parse_gpus_arg,
    train_dtype,
)
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan, load_plan, save_plan
from profiler.devices import device
from profiler.schema import SpecError, fail

if TYPE_CHECKING:  # the planner imports the executor only inside `run`
    from executor.launch import NodeLaunch
    from executor.report import RunReport
    from planner.commands.profile import MeasureRequest
    from profiler.store import Profiles

__all__ = ["add_parser", "run"]

SEARCH_TOP = 10  # ranked plans the automatic mode considers
# Steps a run measures by default, and the first ones it leaves out: 2-rank CPU runs of
# debug-tiny here take 10-24 ms a step with their 3rd-5th steps still slow (2026-12-04:
# 10 steps less 2 measured 15.7 ms where the steps after the 5th of 30 took 12-13), so 8
# samples put that warm-up and the spread into the median
DEFAULT_STEPS, DEFAULT_WARMUP = 30, 5


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a plan (or search one and run it) and measure it",
        description="Run a plan on torch.distributed (gloo on CPU ranks, NCCL on GPUs) and "
        "report the measured iteration time, tokens/s and memory per rank beside the "
        "prediction. With --model instead of --plan: search first, then run the best plan "
        "the executor can run (report in reports/<name>/).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", type=path_arg, metavar="FILE", help="a Plan (.yaml/.json)")
    what.add_argument("--model", metavar="NAME", help="search for this preset, then run")
    what.add_argument("--model-file", type=path_arg, metavar="FILE",
                      help="search for this ModelSpec")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpus", metavar="TYPE:COUNT[,...]", help="with --model: GPUs in "
                       "their types' standard nodes (CPU:N: N CPU ranks on this host)")
    where.add_argument("--cluster", type=path_arg, metavar="FILE",
                       help="with --model: a ClusterSpec file")
    p.add_argument("--gbs", type=gbs_arg, metavar="N", help="with --model: global batch")
    p.add_argument("--seq", type=seq_arg, metavar="N", help="with --model: sequence "
                   "length (default: the model's)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32", "tf32"),
                   help="with --model (default: fp32 on CPU ranks; on GPUs bf16, or fp16 where "
                   "a GPU type lacks bf16: fp16 trains with dynamic loss scaling; tf32 is fp32 "
                   "with TF32 matmuls on GPUs)")
    measured = p.add_mutually_exclusive_group()
    measured.add_argument("--profile", type=path_arg, metavar="FILE|DIR", action="append",
                          help="measured profile(s) that price the search and the prediction "
                          "(default with --model on CPU ranks: measure one here first, into "
                          "the report folder's profiles/)")
    measured.add_argument("--no-profile", action="store_true",
                          help="with --model on CPU ranks: search and predict with the analytic "
                          "device model instead of measuring a profile first")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS, metavar="N",
                   help=f"training steps (default {DEFAULT_STEPS})")
    p.add_argument("--warmup", type=non_negative_int, metavar="N",
                   help=f"first steps left out of the measured time (default {DEFAULT_WARMUP}, "
                   "fewer where --steps leaves less)")
    p.add_argument("--trace", type=int_in(0, 100), default=0, metavar="N",
                   help="run N more steps after the measured ones under torch.profiler and "
                   "report each rank's time by kind of op (GEMMs, attention, memory-bound "
                   "ops, optimizer, collectives, framework) beside the cost model's "
                   "(default 0: no trace)")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0, metavar="N",
                   help="weights and data seed")
    p.add_argument("--lr", type=number_in(gt=0, high=10), metavar="X",
                   help="AdamW learning rate (default 3e-4, executor.worker.LEARNING_RATE)")
    p.add_argument("--checkpoint-dir", type=path_arg, metavar="DIR",
                   help="distributed checkpoints go here")
    p.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                   help="save a checkpoint every N steps")
    p.add_argument("--resume", action="store_true",
                   help="continue from the last complete checkpoint in --checkpoint-dir")
    p.add_argument("--hang-timeout", type=number_in(gt=0, high=86_400), default=30.0, metavar="S",
                   help="stop every rank when one makes no progress for S seconds "
                   "(default 30)")
    p.add_argument("--name", metavar="NAME", help="report name (folder reports/NAME/)")
    p.add_argument("--report", type=path_arg, metavar="DIR", help="write the report (and the run's "
                   "metrics) to DIR")
    p.add_argument("--dry-run", action="store_true",
                   help="print the torchrun command lines and stop")
    p.add_argument("--json", action="store_true", help="print the report as JSON (with "
                   "--dry-run, or a plan over several nodes: the launch commands)")
    p.add_argument("--inject-fault", metavar="RANK:STEP:KIND", help=argparse.SUPPRESS)


def _check_flags(args: argparse.Namespace) -> None:
    auto = args.plan is None
    if auto and args.gpus is None and args.cluster is None:
        raise SpecError("--gpus: --model needs --gpus TYPE:COUNT or --cluster FILE")
    if auto and args.gbs is None:
        raise SpecError("--gbs: --model needs the global batch size")
    if not auto:
        for flag in ("gpus", "cluster", "gbs", "seq", "dtype"):
            if getattr(args, flag) is not None:
                fail(f"--{flag}", getattr(args, flag), "only with --model (a plan has its own)")
        if args.no_profile:
            fail("--no-profile", True, "only with --model (a plan is predicted from "
                 "--profile, or the analytic model without it)")
    if (args.resume or args.checkpoint_every) and not args.checkpoint_dir:
        raise SpecError("--checkpoint-dir: --resume and --checkpoint-every need it")
    if args.resume and not args.checkpoint_every and not os.path.isdir(args.checkpoint_dir):
        # a typo'd folder trained from step 1 with exit 0; with --checkpoint-every the
        # folder may be a restart loop's first run, which starts at step 1 and writes it
        fail("--checkpoint-dir", args.checkpoint_dir, "an existing folder of checkpoints to "
             "resume from (or add --checkpoint-every N to start there and write them)")
    if args.checkpoint_dir and os.path.isdir(args.checkpoint_dir) and not args.resume:
        from executor.checkpoint_dirs import step_folders

        if saved := step_folders(args.checkpoint_dir):
            # a fresh run overwrote some of an earlier run's steps and left the rest, so a
            # later --resume took the earlier run's newest
            fail("--checkpoint-dir", args.checkpoint_dir, f"a folder without checkpoints "
                 f"(it holds an earlier run's, up to step {saved[0][0]}); --resume "
                 "continues that run")
    args.warmup_given = args.warmup is not None  # `_check_resume` refuses only a given one
    if args.warmup is None:
        args.warmup = min(DEFAULT_WARMUP, args.steps - 1)
    if not 0 <= args.warmup < args.steps:
        fail("--warmup", args.warmup, f"0 ≤ warmup < --steps {args.steps}")
    if args.name is not None and (not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", args.name)
                                  or ".." in args.name):
        fail("--name", args.name, "a folder name under reports/: letters, digits, '.', '_', "
             "'-' (no path)")
    if args.name is not None and args.report is not None:  # --name was dropped without a word
        fail("--name", args.name, "not with --report (--report DIR names the folder; --name "
             "writes reports/NAME/)")
    check_output_dir(args.report, flag="--report")
    check_output_dir(args.checkpoint_dir, flag="--checkpoint-dir")
    if args.inject_fault and not re.fullmatch(r"\d+:\d+:(kill|hang|freeze|error|overflow)",
                                              args.inject_fault):
        fail("--inject-fault", args.inject_fault,
             "RANK:STEP:kill|hang|freeze|error|overflow")


def _check_resume(args: argparse.Namespace, plan: Plan) -> None:
    """What a --resume of `plan` will load, before any rank starts: the checkpoint the
    ranks take (`resume_point`: newest first, damaged ones skipped) must hold the plan's
    model and leave steps to run (and to time, past --warmup); a different --seed or --lr
    than it was trained with is said (the run goes on, off the uninterrupted one's path)."""
    if not (args.resume and args.checkpoint_dir and os.path.isdir(args.checkpoint_dir)):
        return
    from executor.checkpoint_dirs import CheckpointError, resume_point

    def refusing(step: int) -> bool:  # hash the files before refusing by this checkpoint
        return args.steps <= step or (args.warmup_given and args.warmup >= args.steps - step)

    try:
        point = resume_point(args.checkpoint_dir, plan, verify=refusing)
    except CheckpointError as err:
        fail("--checkpoint-dir", args.checkpoint_dir, str(err))
    if point is None:
        return
    if args.steps <= point.step:
        # the ranks loaded it, ran no step, and the report had no time to take
        fail("--steps", args.steps, f"more than the step of the checkpoint it resumes "
             f"from, {point.step} ({point.path}): --steps counts from the run's start")
    if args.warmup_given and args.warmup >= args.steps - point.step:
        # it was dropped without a word
        fail("--warmup", args.warmup, f"fewer than the {args.steps - point.step} steps "
             f"run after the checkpoint of step {point.step}")
    from executor.worker import LEARNING_RATE

    ours = {"seed": args.seed, "learning_rate": LEARNING_RATE if args.lr is None else args.lr}
    differ = [f"--{'lr' if k == 'learning_rate' else k} {ours[k]:g} (it was "
              f"{point.marker[k]:g})" for k in ours
              if isinstance(point.marker.get(k), (int, float)) and point.marker[k] != ours[k]]
    if differ:
        print(f"plan run: note: resuming step {point.step} with {' and '.join(differ)}: the "
              "losses leave those of an uninterrupted run", file=sys.stderr)


def _cluster(args: argparse.Namespace) -> ClusterSpec:
    """The cluster of the automatic mode; `--gpus CPU:N` is N CPU ranks on this host."""
    if args.cluster is not None:
        return load_cluster(args.cluster)
    gpu, _, count = args.gpus.rpartition(":")
    if (gpu and "," not in args.gpus and re.fullmatch(r"[0-9]{1,3}", count) and int(count) > 0
            and device(gpu, where="--gpus").vendor == "cpu"):
        return ClusterSpec(name=f"{count} CPU rank{'s' if int(count) > 1 else ''}", node_groups=(NodeGroup(
            name="host", gpu=device(gpu).name, num_nodes=1, gpus_per_node=int(count),
            intra_node_link="loopback", island="local"),)).resolved()
    return parse_gpus_arg(args.gpus)


def _slug(text: str) -> str:
    """`text` as part of a folder name: letters, digits and dots, at most 80 of them (a
    model or cluster may be named at any length; a folder name may not)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:80].rstrip("-")


def _cuda_devices(kind: str) -> int:
    if kind != "cuda":
        return 0
    from profiler.host import cuda_device_count

    return cuda_device_count()


def _search(args: argparse.Namespace) -> tuple[Plan, SimResult, str, Profiles | None]:
    """The automatic mode: the best plan of `plan search` that the executor can run."""
    from executor.preflight import check_model, check_runnable, device_kind
    from planner.errors import InfeasiblePlan
    from planner.search import SearchRequest, search

    model = load_model_arg(args)
    check_model(model, f"--model {model.name}:")  # before profiling and searching for it
    cluster = _cluster(args)
    cpu = all(g.device.vendor == "cpu" for g in cluster.node_groups)
    # GPUs: bf16 where every type has it, else fp16 (a V100), as `plan search` defaults
    dtype = args.dtype or ("fp32" if cpu else str(train_dtype(
        (g.device for g in cluster.node_groups), None, where="--dtype")))
    if cpu and cluster.num_nodes == 1 and not (args.profile or args.no_profile or args.dry_run):
        args.profile = [_profile_here(args, model, cluster, dtype)]
    profiles = profiles_for(args, cluster, dtype)
    req = SearchRequest(model=model, cluster=cluster, gbs=args.gbs,
                        seq_len=args.seq or model.seq_len, dtype=DType(dtype), top=SEARCH_TOP,
                        attention="math" if cpu and model.drops_attention else None,
                        profiles=profiles)
    try:
        ranked = search(req).ranked
    except InfeasiblePlan as err:
        raise SpecError(f"--model: no plan: {err}") from None
    refusals = []
    for r in ranked:
        try:
            check_runnable(r.plan, cuda_devices=_cuda_devices(device_kind(r.plan)),
                           host=not args.dry_run)
        except SpecError as err:
            refusals.append(str(err))
            continue
        plan = with_prediction(r.plan, r.result, command=["plan", *args.argv],
                               profiles=profiles)
        return plan, r.result, "event simulation of the searched plan", profiles
    raise SpecError(f"--model: none of the {len(ranked)} best plans runs on the executor "
                    f"(the first: {refusals[0]})")


def _predict(plan: Plan, profiles: Profiles | None) -> tuple[SimResult, str]:
    """The plan's prediction as the executor runs it, priced with `profiles` (None: the
    analytic model): a plan priced with communication the executor does not do (`plan
    simulate -o` writes Megatron-LM's: gradients reduced while the backward runs) is
    priced again with the executor's, and a note says so."""
    from planner.export.frameworks import (
        CAPABILITIES,
        comm_differences,
        comm_value,
        comm_words,
    )
    from planner.simulator import simulate

    diffs = comm_differences(plan, CAPABILITIES["trainplan"])
    if not diffs:
        return simulate(plan, profiles=profiles), "event simulation"
    written = simulate(plan, profiles=profiles).iteration_time_s
    tr = plan.training
    executor: dict[str, Any] = {key: theirs for key, _, theirs in diffs}
    runs = replace(plan, training=replace(tr, comm=replace(tr.comm, **executor)))
    result = simulate(runs, profiles=profiles)
    print("plan run: note: the plan was priced with "
          + "; ".join(f"{comm_words(key, mine)} (training.comm.{key} {comm_value(mine)})"
                      for key, mine, _ in diffs)
          + "; the executor: " + "; ".join(comm_words(key, theirs)
                                               for key, _, theirs in diffs)
          + f": predicted as it runs, {result.iteration_time_s:.4g} s an iteration (the "
          f"plan's own setting: {written:.4g} s)", file=sys.stderr)
    return result, "event simulation with the executor's communication"


def _profile_here(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec,
                  dtype: str) -> str:
    """Measure, on this host's CPU, the model's ops at the shapes the search will ask for
    and the collectives among the cluster's ranks; the profile folder. A profile measured
    by the same command before (same report folder) is used again."""
    from planner.commands.profile import MeasureRequest, measure
    from planner.specs.layout import check_tp

    folder = os.path.join(_report_dir(args, model.name, cluster.name, args.gbs)[0], "profiles")
    os.makedirs(folder, exist_ok=True)
    ranks = cluster.num_gpus
    tps = []
    for tp in (2**k for k in range(ranks.bit_length())):
        try:
            check_tp(model, tp)
        except SpecError:
            continue
        tps.append(tp)
    mbs = tuple(sorted({m for m in (1, 4, min(16, args.gbs)) if m <= args.gbs}))
    requests = [MeasureRequest(model=model, output=os.path.join(folder, "cpu-ops.csv"),
                               command="", tp=tuple(tps), mbs=mbs,
                               seq=(args.seq or model.seq_len,), dtype=dtype,
                               host_costs=True)]
    if ranks > 1:
        state_bytes = 4 * model.num_params()
        cap = min(64 << 20, max(1 << 20, 1 << (state_bytes - 1).bit_length()))
        requests.append(MeasureRequest(model=None, command="", collectives=True, nprocs=ranks,
                                       max_bytes=cap, host_costs=True, host_model=model,
                                       # DTensor's rows on the model's blocks at the
                                       # largest micro-batch; between it and the tiny
                                       # preset's, the planner reads them on a line
                                       mbs=(max(mbs),), seq=(args.seq or model.seq_len,),
                                       output=os.path.join(folder, "cpu-collectives.csv")))
    for req in requests:
        command = _measure_command(req, args)
        req = replace(req, command=command)
        if os.path.exists(req.output) and _measured_by(req.output) == command:
            print(f"plan run: using the profile measured before: {req.output}", file=sys.stderr)
            continue
        print(f"plan run: measuring a profile of this host first (--no-profile skips it): "
              f"{command}", file=sys.stderr, flush=True)
        with contextlib.redirect_stdout(sys.stderr):  # stdout may be the --json report
            code = measure(req)
        if code == INTERRUPTED:  # Ctrl-C: the measurement kept its rows, marked interrupted
            raise Interrupted(f"kept the partial profile {req.output} (measured again "
                              "next time)")
        if code != 0:
            raise SpecError(f"--profile: measuring {req.output} failed (exit {code}); rerun "
                            "with --no-profile or --profile DIR")
    return folder


def _measure_command(req: MeasureRequest, args: argparse.Namespace) -> str:
    """The `plan profile measure` command line that measures what `req` asks for: what
    the profile records, and how a profile measured before is recognised."""
    argv = ["plan", "profile", "measure", "--device", req.device]
    if req.model is not None:
        argv += (["--model-file", args.model_file] if args.model_file
                 else ["--model", req.model.name])
        argv += ["--tp", ",".join(map(str, req.tp)), "--mbs", ",".join(map(str, req.mbs)),
                 "--seq", ",".join(map(str, req.seq or ())), "--dtype", str(req.dtype)]
    if req.collectives:
        argv += ["--collectives", "--nprocs", str(req.nprocs), "--max-bytes", str(req.max_bytes)]
    if req.host_costs:
        argv += ["--host-costs"]
        if req.collectives and req.host_model is not None and req.model is None:
            # the DTensor rows' blocks (a model file's name stands for its preset here)
            argv += ["--host-model", req.host_model.name, "--mbs", ",".join(map(str, req.mbs)),
                     "--seq", ",".join(map(str, req.seq or ()))]
    text = shlex.join([*argv, "-o", req.output])
    if (req.model or req.host_model) is not None and args.model_file:  # its content too
        with open(args.model_file, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()[:16]
        text += f"  # {os.path.basename(args.model_file)} sha256:{digest}"
    return text


def _measured_by(path: str) -> str | None:
    """The command that measured a profile, or None if it cannot be read."""
    from profiler.store import load_profile

    try:
        return load_profile(path).meta.command
    except (SpecError, OSError, ValueError):
        return None


def _report_dir(args: argparse.Namespace, model: str, cluster: str, gbs: int
                ) -> tuple[str, str, bool]:
    """(folder, report name, whether the report is kept there)."""
    name = args.name or (f"{_slug(model)}-{_slug(cluster)}-gbs{gbs}" if args.plan is None
                         else os.path.splitext(os.path.basename(args.plan))[0])
    if args.report:
        return args.report, name, True
    if args.plan is None or args.name:
        return os.path.join("reports", name), name, True
    return tempfile.mkdtemp(prefix="trainplan-run-"), name, False


def _print_launches(launches: list[NodeLaunch], *, why: str, as_json: bool = False,
                    shell_run_dir: bool = False) -> None:
    """The command for each node (`as_json`: one JSON object of them, the why on stderr);
    `shell_run_dir`: they take "$RUN_DIR" (no report folder was asked for)."""
    where = ("; RUN_DIR: a folder for the ranks' metrics and stop notes, shared by the "
             "nodes or one on each" if shell_run_dir else "")
    head = (f"plan run: {why}; run on each node (MASTER_ADDR: the address of the first"
            f"{where}):")
    if as_json:
        print(head, file=sys.stderr)
        print_json({"launched": False, "why": why,
                    "nodes": [{"node": launch.node, "node_rank": launch.node_rank,
                               "ranks": launch.num_ranks, "command": launch.command_line()}
                              for launch in launches]})
        return
    print(head)
    for launch in launches:
        print(f"# node {launch.node} ({launch.num_ranks} ranks)")
        print(launch.command_line())


def _write_report(folder: str, keep: bool, report: RunReport, as_json: bool) -> None:
    from executor.report import diverged, to_markdown

    if (why := diverged(report)) is not None:  # in the report too; said where --json hides it
        print(f"plan run: warning: {why}", file=sys.stderr)
    text = to_markdown(report)
    if keep:
        write_text(os.path.join(folder, "report.md"), text)
        write_text(os.path.join(folder, "report.json"), json.dumps(report.to_dict(), indent=1))
    if as_json:
        print_json(report.to_dict())
    else:
        print(text + (f"\nreport: {os.path.join(folder, 'report.md')}" if keep else ""))


def _clean(folder: str) -> None:
    """Forget a previous run's results in a reused report folder."""
    from executor.launch import STOP_REQUESTED

    for name in os.listdir(folder):
        # the report too: a failed rerun left the last run's report.md beside its stop notes
        if name in ("metrics.json", "report.md", "report.json", STOP_REQUESTED) or (
                name.startswith("stop-rank") and name.endswith(".json")):
            os.remove(os.path.join(folder, name))


def _run_here(args: argparse.Namespace, launch: NodeLaunch, *, cpu: bool, folder: str
              ) -> dict | None:
    """Run the one node's torchrun here; the metrics, or None (said why) if it failed."""
    from executor import checkpoint
    from executor.launch import first_failure, run_local

    if args.resume and not checkpoint.step_folders(args.checkpoint_dir):
        print(f"plan run: no checkpoint in {args.checkpoint_dir}: starting at step 1",
              file=sys.stderr)
    cores = os.cpu_count() or 1
    if cpu and launch.num_ranks > cores:
        print(f"plan run: note: {launch.num_ranks} ranks share {cores} cores; times will not "
              "match the prediction", file=sys.stderr)
    print(f"plan run: {launch.command_line()}", file=sys.stderr, flush=True)
    code = run_local(launch, cpu=cpu, run_dir=folder)
    if code != 0:
        reason = first_failure(folder) or f"torchrun exited with code {code}"
        print(f"plan run: failed: {reason}", file=sys.stderr)
        return None
    with open(os.path.join(folder, "metrics.json"), encoding="utf-8") as fh:
        return json.load(fh)


def run(args: argparse.Namespace) -> int:
    import importlib.util

    _check_flags(args)
    if importlib.util.find_spec("torch") is None and not args.dry_run:
        fail("plan run", "torch", "not installed: pip install 'trainplan[torch]'")
    from executor.preflight import check_runnable, device_kind

    if args.plan is not None:
        from planner.export.launch import plan_nodes

        plan = load_plan(args.plan)
        # a dry run, and a plan over several nodes, print the launch lines of any plan on
        # any host (nothing runs here): plan checks only
        lines_only = args.dry_run or len(plan_nodes(plan)) > 1
        check_runnable(plan, where=f"{args.plan}:", host=not lines_only,
                       cuda_devices=0 if lines_only else _cuda_devices(device_kind(plan)))
        profiles = None if lines_only else profiles_for(args, plan.cluster,
                                                        plan.training.dtype)
        prediction, source = (None, "") if lines_only else _predict(plan, profiles)
    else:
        plan, prediction, source, profiles = _search(args)
    _check_resume(args, plan)
    folder, name, keep = _report_dir(args, plan.model.name, plan.cluster.name,
                                     plan.training.global_batch_size)
    try:
        return _launch(args, plan, prediction, source, profiles, folder=folder, name=name,
                       keep=keep)
    except KeyboardInterrupt:
        from executor.checkpoint_dirs import step_folders

        # only a folder that holds checkpoints is worth naming (it may not exist yet)
        kept = ([f"checkpoints in {args.checkpoint_dir}"]
                if args.checkpoint_dir and step_folders(args.checkpoint_dir) else [])
        kept += [f"the run folder {folder}"] if keep else []
        raise Interrupted("kept " + " and ".join(kept) if kept else "nothing kept") from None
    finally:
        if not keep:  # a temporary folder for the ranks' metrics: nothing in it is wanted
            shutil.rmtree(folder, ignore_errors=True)


def _launch(args: argparse.Namespace, plan: Plan, prediction: SimResult | None, source: str,
            profiles: Profiles | None, *, folder: str, name: str, keep: bool) -> int:
    """Run (or print the torchrun lines of) `plan`, with `folder` for the ranks' files
    (`profiles`: what priced the prediction, for a traced run's split by kind of op)."""
    from executor.launch import node_launches
    from executor.preflight import device_kind
    from executor.report import make_report
    from executor.worker import worker_args

    os.makedirs(folder, exist_ok=True)
    if not args.dry_run:  # a dry run prints command lines: the last run's results stay
        _clean(folder)
    plan_path = args.plan or os.path.join(folder, "plan.yaml")
    if args.plan is None:
        save_plan(plan, plan_path)

    def launches_for(run_dir: str) -> list[NodeLaunch]:
        return node_launches(plan, worker_args(
            plan=os.path.abspath(plan_path), steps=args.steps, run_dir=run_dir,
            seed=args.seed, learning_rate=args.lr, checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every or 0, resume=args.resume,
            hang_timeout_s=args.hang_timeout, fault=args.inject_fault,
            trace_steps=args.trace))

    launches = launches_for(os.path.abspath(folder))
    if args.dry_run or len(launches) > 1:
        if not keep:  # this command's temporary folder is gone when the lines are run
            launches = launches_for("$RUN_DIR")
        _print_launches(launches, why="dry run" if args.dry_run else
                        f"the plan spans {len(launches)} nodes", as_json=args.json,
                        shell_run_dir=not keep)
        return 0
    metrics = _run_here(args, launches[0], cpu=device_kind(plan) == "cpu", folder=folder)
    if metrics is None:
        return 1
    assert prediction is not None  # only a dry run goes without
    sources = "; ".join(f"{k}: {v}" for k, v in prediction.sources.items())
    kinds = None
    if args.trace:
        from planner.predict.op_kinds import stage_op_kinds

        kinds = stage_op_kinds(plan, profiles)
    report = make_report(plan, metrics, prediction=prediction, source=f"{source} ({sources})",
                         warmup=args.warmup, name=name, predicted_kinds=kinds)
    _write_report(folder, keep, report, args.json)
    return 0
