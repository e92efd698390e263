"""`plan simulate`: predict one iteration of one homogeneous configuration (the flags) or of
a Plan file (`--plan`, heterogeneous plans included)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from planner.commands.args import (
    add_cluster_args,
    add_model_args,
    gbs_arg,
    int_in,
    path_arg,
    positive_int,
    print_json,
    seq_arg,
)
from planner.commands.inputs import input_files, load_inputs, profiles_for, with_prediction
from planner.costs.kernels import default_kernels, fastest_kernels
from planner.costs.stages import with_stage_attention
from planner.export.frameworks import CAPABILITIES, unsupported
from planner.outputs import (
    PICTURE_SUFFIXES,
    PLAN_SUFFIXES,
    atomic_path,
    check_distinct,
    check_output_file,
)
from planner.predict.estimate import estimate
from planner.predict.results import SimResult
from planner.search.search import check_framework
from planner.simulator import simulate_detailed, write_gantt, write_trace
from planner.specs.choices import EpLayout, Recompute, Schedule, ShardingPreset, values
from planner.specs.cluster import ClusterSpec, count_gpus, train_dtype
from planner.specs.layout import (
    ParallelConfig,
    check_parallel,
    homogeneous_plan,
    sharding_preset,
)
from planner.specs.limits import MAX_GPUS
from planner.specs.model import ModelSpec
from planner.specs.plan import (
    TRAIN_DTYPES,
    Plan,
    Sharding,
    describe_layout,
    expert_words,
    load_plan,
    other_attention,
    plan_to_dict,
    save_plan,
)
from profiler.kernels import Attention
from profiler.progress import ProgressBar
from profiler.schema import SpecError, fail
from profiler.store import Profiles

__all__ = ["add_parser", "config_from_args", "run", "summary"]

GIB = 1024**3
# The event simulation schedules every pass of every distinct pipeline, about 30,000 a
# CPU-second: past this it would take minutes, where the closed form takes milliseconds.
MAX_SIMULATED_PASSES = 262_144


def add_parser(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="predict one training iteration of a configuration",
                         description="Predict iteration time, throughput, MFU, time breakdown "
                         "and per-rank memory of one parallel configuration (the flags), or "
                         "of a Plan file (--plan).")
    add_model_args(sim, plan=True)
    add_cluster_args(sim, required=False)
    for flag, default, text in (("--tp", None, "tensor-parallel degree"),
                                ("--pp", None, "pipeline stages"),
                                ("--dp", None, "data-parallel replicas"),
                                ("--cp", 1, "context-parallel degree"),
                                ("--ep", 1, "expert-parallel degree (MoE models; divides "
                                 "dp x cp and the experts)"),
                                ("--etp", None, "expert tensor-parallel degree: 1 or --tp "
                                 "(default --tp; 1 folds tp into ep)"),
                                ("--vp", 1, "interleaved chunks per stage (interleaved 1F1B)"),
                                ("--mbs", None, "micro-batch size"),
                                ("--gbs", None, "global batch size (sequences)")):
        sim.add_argument(flag, type=gbs_arg if flag in ("--gbs", "--mbs") else
                         int_in(1, MAX_GPUS if flag != "--vp" else 1024),
                         default=default, metavar="N",
                         help=text + (" (required without --plan)"
                                      if default is None and flag != "--etp" else ""))
    sim.add_argument("--seq", type=seq_arg, metavar="N",
                     help="sequence length (default: the model's)")
    sim.add_argument("--recompute", choices=values(Recompute),
                     help="activation recomputation (default none)")
    sim.add_argument("--sequence-parallel", action="store_true",
                     help="Megatron's sequence parallelism: the tp group's norms and dropout "
                     "split along the sequence (all-gather / reduce-scatter for all-reduce)")
    sim.add_argument("--ep-layout", choices=values(EpLayout),
                     help="which ranks an ep group is: folded (default; Megatron-Core: a "
                     "replica's tp / etp ranks, then the next replica's) or data_parallel (one "
                     "tp rank of ep data-parallel replicas, as trainplan's executor forms them)")
    sim.add_argument("--moe-dispatcher", choices=("alltoall", "deepep"),
                     help="MoE token dispatch: NCCL all-to-all (default, Megatron's alltoall "
                     "dispatcher) or DeepEP (a token goes once to each rank, and over the "
                     "network once to each node, holding one of its experts)")
    sim.add_argument("--schedule", choices=values(Schedule.chosen()),
                     help="pipeline schedule, default 1f1b (with --vp > 1: interleaved 1F1B; zb-h1: "
                     "zero-bubble ZB-H1, Qi et al. 2024, needs --pp > 1 and --vp 1)")
    shard = sim.add_mutually_exclusive_group()
    shard.add_argument("--sharding", choices=values(ShardingPreset),
                       help="ZeRO stage (a point of the sharding space)")
    shard.add_argument("--shard-params", type=positive_int, metavar="N",
                       help="replicas sharing one copy of the parameters (AMSP)")
    sim.add_argument("--shard-grads", type=positive_int, metavar="N",
                     help="replicas sharing one copy of the gradients")
    sim.add_argument("--shard-optim", type=positive_int, metavar="N",
                     help="replicas sharing one copy of the optimizer states")
    sim.add_argument("--dtype", choices=TRAIN_DTYPES,
                     help="training dtype (default: bf16 where every GPU type has it, else fp16)")
    sim.add_argument("--attention", choices=values(Attention),
                     help="attention kernel (default: the fastest the device supports)")
    sim.add_argument("--profile", type=path_arg, metavar="FILE|DIR", action="append",
                     help="measured profile (`plan profile`: .csv or .parquet), or a folder of "
                     "them matched by device name; repeatable. It answers the ops and "
                     "collectives it has, the analytic models the rest")
    sim.add_argument("--framework", choices=tuple(CAPABILITIES),
                     help="communicate and keep model states as this framework does, at the "
                     "version `plan search --framework` plans for, and refuse what it cannot "
                     "run (a searched plan's numbers: search's default is trainplan); default: "
                     "Megatron-LM's communication, any layout")
    sim.add_argument("--method", choices=("simulate", "estimate"), default="simulate",
                     help="event simulation of the task graph (default) or the closed-form "
                     "estimate")
    sim.add_argument("--trace", type=path_arg, metavar="FILE",
                     help="write a Chrome-trace JSON of the "
                     "simulated timeline (open in Perfetto)")
    sim.add_argument("--gantt", type=path_arg, metavar="PNG",
                     help="write a picture of the pipeline schedule")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("-o", "--output", type=path_arg, metavar="PLAN",
                     help="also write the Plan (.yaml/.json)")




def _sharding(args: argparse.Namespace) -> Sharding:
    if args.sharding and (args.shard_grads or args.shard_optim):
        fail("--sharding", args.sharding, "not together with --shard-grads / --shard-optim")
    if args.sharding:
        return sharding_preset(args.sharding, args.dp * args.cp)
    params = args.shard_params or 1
    grads = args.shard_grads or params
    optim = args.shard_optim or grads
    # named by the flags (a left-out one takes the level before it)
    if grads % params:
        fail("--shard-grads", grads, f"must be a multiple of --shard-params ({params})")
    if optim % grads:
        fail("--shard-optim", optim, f"must be a multiple of the gradient sharding ({grads}"
             + (")" if args.shard_grads else ": --shard-grads, which defaults to "
                "--shard-params)"))
    return Sharding(params=params, grads=grads, optim=optim)


_LAYOUT_FLAGS = ("tp", "pp", "dp", "mbs", "gbs")  # required without --plan
_PLAN_HAS = (*_LAYOUT_FLAGS, "etp", "ep_layout", "moe_dispatcher", "gpus", "cluster", "catalog", "seq", "recompute", "schedule", "sharding",
             "shard_params", "shard_grads", "shard_optim", "dtype", "attention", "framework")


def _require_configuration(args: argparse.Namespace) -> None:
    missing = [f"--{f}" for f in ("gpus", *_LAYOUT_FLAGS) if getattr(args, f) is None]
    if args.cluster is not None and missing[:1] == ["--gpus"]:
        missing.pop(0)
    if missing:
        raise SpecError(f"{missing[0]}: required (or --plan FILE); a configuration needs "
                        f"--gpus or --cluster, {', '.join('--' + f for f in _LAYOUT_FLAGS)}")


def config_from_args(args: argparse.Namespace, model: ModelSpec) -> ParallelConfig:
    return ParallelConfig(
        tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, vp=args.vp, mbs=args.mbs, gbs=args.gbs,
        seq_len=args.seq or model.seq_len, recompute=Recompute(args.recompute or "none"),
        sequence_parallel=args.sequence_parallel, sharding=_sharding(args),
        schedule=Schedule(args.schedule or "1f1b"), ep=args.ep, etp=args.etp,
        ep_layout=EpLayout(args.ep_layout or EpLayout.FOLDED),
    )


def _plan_from_args(args: argparse.Namespace) -> Plan:
    """`--plan FILE`: the plan as written; the flags that would change it are refused."""
    for flag in _PLAN_HAS:
        if getattr(args, flag) is not None:
            fail(f"--{flag.replace('_', '-')}", getattr(args, flag),
                 "not with --plan (the plan has its own)")
    if args.cp != 1 or args.vp != 1 or args.ep != 1 or args.sequence_parallel:
        fail("--cp/--vp/--ep/--sequence-parallel", "set",
             "not with --plan (the plan has its own)")
    return replace(load_plan(args.plan), predicted=None, provenance=None)


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file this run would write, checked before any work."""
    check_output_file(args.output, flag="-o", suffixes=PLAN_SUFFIXES)
    check_output_file(args.trace, flag="--trace", suffixes=(".json",))
    check_output_file(args.gantt, flag="--gantt", suffixes=PICTURE_SUFFIXES)
    check_distinct({**input_files(args), "-o": args.output, "--trace": args.trace,
                    "--gantt": args.gantt})
    if (args.trace or args.gantt) and args.method != "simulate":
        fail("--method", args.method, "--trace and --gantt need the event simulation")




def run(args: argparse.Namespace) -> int:
    _check_outputs(args)
    if args.plan is not None:
        return _simulate_plan(args, _plan_from_args(args))
    _require_configuration(args)
    model, cluster = load_inputs(args)
    if not model.is_moe:  # expert settings on a dense model would be silently ignored
        for flag in ("ep_layout", "moe_dispatcher"):
            if getattr(args, flag) is not None:
                fail(f"--{flag.replace('_', '-')}", getattr(args, flag),
                     f"only for mixture-of-experts models ({model.name} has no experts)")
    cfg = config_from_args(args, model)
    taken = None
    if args.cluster is not None:  # a configuration may use the first part of a larger cluster
        if cfg.num_gpus <= cluster.num_gpus and (
                problem := cluster.take_problem(cfg.num_gpus)) is not None:
            # the layout's flags are what to change, not the cluster (it blamed --cluster)
            fail("--dp", cfg.dp, f"tp*pp*dp*cp = {cfg.tp}*{cfg.pp}*{cfg.dp}*{cfg.cp}: "
                 f"{problem} of --cluster {cluster.name!r}")
        whole = cluster
        cluster = cluster.take(cfg.num_gpus)
        if cluster.num_gpus < whole.num_gpus:
            taken = _taken_note(whole, cluster)
    cfg = replace(cfg, dtype=train_dtype((g.device for g in cluster.node_groups), args.dtype,
                                         where="--dtype"))
    caps = None
    if args.framework is not None:  # as `plan search --framework` prices and writes plans
        caps = check_framework(args.framework, model, cfg.dtype)
        cfg = replace(cfg, comm=caps.communication(cfg.dtype), model_states=caps.model_states,
                      ep_layout=EpLayout(args.ep_layout) if args.ep_layout else
                      caps.ep_layout)
    check_parallel(cfg, model, cluster)
    kernels = default_kernels([g.device for g in cluster.node_groups], dtype=cfg.dtype,
                              attention=args.attention, dropout=model.drops_attention)
    if not kernels.attention.fused and cfg.cp > 1:
        fail("--attention", "math", "context parallelism needs a fused attention kernel")
    plan = with_stage_attention(homogeneous_plan(model, cluster, cfg, kernels=kernels))
    if caps is not None and (cannot := unsupported(plan, caps)):
        fail("--framework", args.framework, f"this configuration: {cannot[0]}")
    if args.moe_dispatcher:
        tr = plan.training
        plan = replace(plan, training=replace(tr, comm=replace(
            tr.comm, moe_dispatcher=args.moe_dispatcher)))
    profiles = profiles_for(args, cluster, cfg.dtype)
    if profiles is not None:
        plan = replace(plan, kernels=fastest_kernels(plan, profiles,
                                                     keep_attention=args.attention is not None))
    if args.sequence_parallel and args.tp == 1:  # it was dropped without a word
        # as Megatron-LM does (arguments.py: sequence parallelism off at tp 1, with a
        # warning), which the published rows' commands rely on; said once the flags are
        # checked, so that an error stays one line
        print("plan simulate: note: --sequence-parallel does nothing at --tp 1 (it splits "
              "the tensor-parallel group's norms and dropout along the sequence): left off",
              file=sys.stderr)
    if taken:  # which GPUs the layout takes of a larger cluster was said nowhere
        print(f"plan simulate: note: {taken}; training in {cfg.dtype}", file=sys.stderr)
    return _simulate_plan(args, plan, profiles=profiles, layout=_cfg_layout(plan, cfg))


def _taken_note(whole: ClusterSpec, part: ClusterSpec) -> str:
    """Which GPUs of `whole` a layout of `part.num_gpus` runs on (its node groups in the
    file's order), and that the rest idle."""
    groups = ", ".join(f"{g.num_gpus} {g.gpu} of group {g.name!r}" for g in part.node_groups)
    return (f"the layout's {count_gpus(part.num_gpus)} are the first of --cluster's "
            f"{whole.num_gpus} ({groups}; the rest idle: plan search uses them all)")


def _simulate_plan(args: argparse.Namespace, plan: Plan, *, profiles: Profiles | None = None,
                   layout: str | None = None) -> int:
    """Predict `plan`, write what was asked for, print the summary (or JSON)."""
    if args.plan is not None:
        profiles = profiles_for(args, plan.cluster, plan.training.dtype)
    if args.method == "estimate":
        result = estimate(plan, profiles=profiles)
    else:
        _check_simulation_size(plan)
        # a timeline of many stages takes seconds to draw: say which step is under way
        steps = 1 + bool(args.trace) + bool(args.gantt)
        with ProgressBar(steps, title="plan simulate", unit="steps",
                         delay_s=0 if args.gantt else None) as bar:
            bar(0, "simulating one iteration")
            result, sim = simulate_detailed(plan, profiles=profiles)
            if args.trace:
                bar(bar.done + 1, "writing the trace")
                with atomic_path(args.trace) as tmp:
                    write_trace(sim, tmp)
            if args.gantt:
                bar(bar.done + 1, "drawing the timeline")
                with atomic_path(args.gantt) as tmp:
                    write_gantt(sim, tmp)
    if args.output:
        save_plan(with_prediction(plan, result, command=["plan", *args.argv],
                                  profiles=profiles), args.output)
    if args.json:
        k = plan.kernels
        # what was simulated, beside its numbers: the layout line and the training
        # settings as a plan file writes them
        print_json({**result.to_dict(), "model": plan.model.name, "cluster": plan.cluster.name,
                    "layout": layout or describe_layout(plan),
                    "training": plan_to_dict(plan)["training"],
                    "kernels": {"attention": k.attention, "optimizer": k.optimizer}})
    else:
        print(summary(plan, layout or describe_layout(plan), result))
    return 0




def simulated_passes(plan: Plan) -> int:
    """Forward and backward passes the event simulation schedules: identical replicas
    are simulated once (the simulator's own test is finer; this one never undercounts
    by more than the number of GPU types)."""
    distinct = {(p.micro_batch_size, p.num_microbatches,
                 tuple((s.layers, s.tp, s.cp, s.recompute, plan.group_of(s).gpu)
                       for s in p.stages)): 2 * len(p.stages) * p.num_microbatches
                for p in plan.pipelines}
    return sum(distinct.values()) * plan.training.virtual_stages


def _check_simulation_size(plan: Plan) -> None:
    passes = simulated_passes(plan)
    if passes > MAX_SIMULATED_PASSES:
        fail("--method", "simulate", f"{passes:,} passes to schedule (at most "
             f"{MAX_SIMULATED_PASSES:,}, minutes of event simulation): use --method estimate, "
             "or fewer micro-batches per pipeline")


def _cfg_layout(plan: Plan, cfg: ParallelConfig) -> str:
    return (f"tp {cfg.tp}, pp {cfg.pp}, dp {cfg.dp}, cp {cfg.cp}, vp {cfg.vp}"
            f"{expert_words(plan.training)}, {plan.training.schedule} schedule, "
            f"mbs {cfg.mbs}, gbs {cfg.gbs}, seq {cfg.seq_len}, recompute {cfg.recompute}"
            # the plan's: at tp 1 there is no sequence to split (Megatron turns it off)
            f"{', sequence parallel' if plan.training.sequence_parallel else ''}, {cfg.dtype}, "
            f"sharding P/G/OS {cfg.sharding.params}/{cfg.sharding.grads}/{cfg.sharding.optim}, "
            f"{plan.kernels.attention} attention{other_attention(plan)}, "
            f"{plan.kernels.optimizer} AdamW")


def _on(plan: Plan, n: int) -> str:
    """'dgx-h100 (8 GPUs)', 'dgx-h100 (first 8 GPUs)', '8x H100-80GB-SXM', 'local (2
    CPU ranks)': the cluster and how many of its GPUs the plan uses, once."""
    cpu = all(g.device.vendor == "cpu" for g in plan.cluster.node_groups)
    count = f"{n} CPU rank{'s' if n != 1 else ''}" if cpu else count_gpus(n)
    name = plan.cluster.name
    if name.endswith(f"(first {count_gpus(n)})") or name.startswith(f"{n}x "):
        return name
    return f"{name} ({count})"


def _figure(value: float, decimals: int) -> str:
    """`value` with `decimals` decimals and thousands separators, or to 3 significant
    digits where those decimals would show fewer (0.076 tokens/s printed as 0)."""
    if value == 0 or abs(value) >= 10 ** (2 - decimals):
        return f"{value:,.{decimals}f}"
    return f"{value:.3g}"


def summary(plan: Plan, layout: str, r: SimResult) -> str:
    """The readable report of one simulation."""
    b = r.breakdown
    total = r.iteration_time_s
    parts = [("compute", b.compute_s), ("kernel launch", b.host_overhead_s),
             ("tp comm", b.tp_comm_s), ("cp comm", b.cp_comm_s),
             ("ep all-to-all", b.ep_comm_s), ("pp comm", b.pp_comm_s), ("dp comm", b.dp_comm_s), ("bubble", b.bubble_s),
             ("optimizer", b.optimizer_s)]
    worst = max(r.stages, key=lambda s: s.memory.total_bytes / s.memory.capacity_bytes)
    m = worst.memory
    fit = ("fits" if r.fits else
           f"DOES NOT FIT: short by {m.shortfall_bytes / GIB:.1f} GiB per rank on stage {worst.stage}")
    lines = [
        f"{plan.model.name} on {_on(plan, r.num_gpus)}",
        f"  {layout}",
        f"iteration   {total:.4g} s   ({r.method})",
        f"throughput  {_figure(r.tokens_per_s, 0)} tokens/s, "
        f"{_figure(r.tokens_per_s / r.num_gpus, 1)} per GPU",
        f"FLOP/s      {_figure(r.tflops_per_gpu_model, 1)} TFLOP/s per GPU (model), "
        f"{_figure(r.tflops_per_gpu_hw, 1)} (hardware), MFU {r.mfu * 100:.1f}%",
        "breakdown   " + " | ".join(f"{name} {sec:.3g} s ({sec / total * 100:.0f}%)"
                                    for name, sec in parts if sec > total * 1e-9),
        f"memory      stage {worst.stage} peak {m.total_bytes / GIB:.1f} of "
        f"{m.capacity_bytes / GIB:.1f} GiB: params {m.params_bytes / GIB:.1f}, grads "
        f"{m.grads_bytes / GIB:.1f}, optimizer {m.optimizer_bytes / GIB:.1f}, activations "
        f"{m.activations_bytes / GIB:.1f}, buffers {m.buffers_bytes / GIB:.1f}, reserve "
        f"{m.reserve_bytes / GIB:.1f}; {fit}",
        "sources     " + "; ".join(f"{k}: {v}" for k, v in r.sources.items()),
    ]
    return "\n".join(lines)
