"""Published MoE training throughputs as plans, and the simulator's error against them.

The rows (planner/data/validation/moe_throughput.csv, sources in its README) that can be
priced as published: an H100 or H800 cluster (GB200 NVL72 racks and B200/B300 are not
in this check), the layout complete (tp, pp, ep, cp, dp, gbs, seq; a missing micro-batch
size is searched over 1, 2, 4 as `published.py` does), a stated training dtype (BF16, or
FP8 with per-tensor scaling, current or delayed = this project's fp8), a model with a
preset, and a throughput metric or a step time. GPU-hours of whole pre-training runs, MFU figures without their
layout and rows with no dtype are left out.

Each row becomes `homogeneous_plan`s in Megatron's rank order with sequence parallelism
where tp > 1 (Megatron-Core requires it with MoE), the distributed optimizer (ZeRO-1),
or FSDP (ZeRO-3) where the source says so (NeMo AutoModel, Megatron-FSDP), an expert tp
of 1 where the source states it (or where the layout needs it: ep above dp x cp), DeepEP's dispatch where the source names it, balanced
routing (load_imbalance 1, as the NVIDIA
benchmarks force it), 16-bit model states without an fp32 master copy where the note says
so (NeMo AutoModel's bf16 models with torch.optim.Adam), the embedding and the loss counted as layers of the pipeline split
where the note names Megatron's --account-for-embedding-in-pipeline-split /
--account-for-loss-in-pipeline-split. A row whose recompute is not stated tries none, selective and
full; the fastest plan that fits is the prediction.

The measured iteration time is the row's step time where its metric is one (`step_time_s`),
else it comes from the row's metric by the source's own FLOP count:
Megatron-LM's / Megatron-Bridge's MoE model FLOPs (active experts, causal attention at
half: `source_flops_per_token`); NeMo AutoModel does not state its count, so its rows
are timed by the time per global step its table prints. DeepSeek-V3's MLA is counted as
Megatron-LM's MLA branch counts it (`attention_core_flops_per_token`, `ModelSpec.attention_params`).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from planner.calibration.published import (
    BF16_GRADS,
    VALIDATION_DIR,
    Case,
    ErrorSummary,
    summarize,
)
from planner.costs.workload import attention_core_flops_per_token, model_flops_per_token
from planner.predict.results import SimResult
from planner.specs.choices import DEFAULT_RECOMPUTE_MODULES, Recompute, RecomputeModule
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan, sharding_preset
from planner.specs.model import ModelSpec, model_presets
from planner.specs.plan import Kernels, Plan
from planner.specs.rules import ep_problem
from profiler.schema import SpecError

__all__ = ["MOE_CSV", "measured_s", "moe_cases", "recomputations", "scored_rows",
           "source_flops_per_token"]

MOE_CSV = os.path.join(VALIDATION_DIR, "moe_throughput.csv")
_GPUS = {"H100": "H100-80GB-SXM", "H800": "H800-80GB-SXM"}
# Transformer Engine's per-tensor FP8 recipes: current scaling (CS) and delayed scaling (DS,
# an amax history per tensor); not blockwise, MXFP8 or NVFP4
_DTYPES = {"BF16": "bf16", "FP8": "fp8", "FP8-CS": "fp8", "FP8-DS": "fp8"}
_METRICS = ("tflops_per_gpu", "model_tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")
_LAYOUT = ("gpus", "tp", "pp", "ep", "cp", "dp", "gbs", "seq")


def source_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Megatron-LM's num_floating_point_operations for MoE models (and Megatron-Bridge's
    flop_utils): 3 x (forward GEMMs of the active weights and the logits + causal
    attention at half: 2 x s/2 x heads x (d_qk + d_v) per layer, MLA's widths in its MLA
    branch). `model_flops_per_token` counts the attention in full, so half of it comes
    off (6 x s x q_dim per layer for ordinary heads)."""
    return (model_flops_per_token(model, seq_len)
            - 1.5 * model.num_layers * attention_core_flops_per_token(model, seq_len))


def scored_rows(path: str = MOE_CSV) -> list[dict[str, str]]:
    """The rows this check can price (see the module docstring)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    presets = model_presets()
    return [r for r in rows
            if r["gpu"] in _GPUS and r["dtype"] in _DTYPES and r["metric"] in _METRICS
            and r["model"] in presets and all(r[k] for k in _LAYOUT)]


_STEP_TIME = re.compile(r"step time ([0-9.]+) s")


def measured_s(r: dict[str, str], model: ModelSpec) -> float:
    """The iteration time the row's metric implies. A row whose metric is the step time
    (`step_time_s`: the source prints seconds per step, as NVIDIA's DGX Cloud recipes do)
    is that time; no FLOP count comes between. Where the source does not state how it
    counts its FLOPs (NeMo AutoModel) but prints the time per global step, that time
    (reading its TFLOP/s by Megatron's count would move it by the difference)."""
    if r["metric"] == "step_time_s":
        return float(r["value"])
    stated = _STEP_TIME.search(r["note"])
    if stated and "counting method not stated" in r["flops_counting"]:
        return float(stated.group(1))
    tokens = int(r["gbs"]) * int(r["seq"])
    gpus, value = int(r["gpus"]), float(r["value"])
    if r["metric"] == "tokens_per_s_per_gpu":
        return tokens / (gpus * value)
    return source_flops_per_token(model, int(r["seq"])) * tokens / (gpus * value * 1e12)


# The sources' names for Megatron-Core's recompute modules (the ModelZoo tables write
# "norm, act" for its scripts' `--recompute-modules layernorm moe_act`)
_MODULE_NAMES = {"norm": RecomputeModule.LAYERNORM, "layernorm": RecomputeModule.LAYERNORM,
                 "act": RecomputeModule.MOE_ACT, "moe_act": RecomputeModule.MOE_ACT,
                 "moe": RecomputeModule.MOE, "mlp": RecomputeModule.MLP,
                 "shared_expert": RecomputeModule.SHARED_EXPERTS,
                 "shared_experts": RecomputeModule.SHARED_EXPERTS,
                 "core_attn": RecomputeModule.CORE_ATTN,
                 "mla_up_proj": RecomputeModule.MLA_UP_PROJ,
                 "mla up_proj": RecomputeModule.MLA_UP_PROJ}
Recomputation = tuple[Recompute, tuple[RecomputeModule, ...]]


def recomputations(text: str) -> list[Recomputation]:
    """What a row's `recompute` cell says was recomputed: none, full, or selective with
    Megatron-Core's modules ("selective: layernorm, moe"; "select" alone: the default,
    core_attn). A cell that names no setting ("not stated") tries none, selective and
    full; one naming a module this model has no term for none."""
    text = text.strip()
    if text in ("none", "none listed"):
        return [(Recompute.NONE, DEFAULT_RECOMPUTE_MODULES)]
    if text == "full":
        return [(Recompute.FULL, DEFAULT_RECOMPUTE_MODULES)]
    if text in ("select", "selective"):
        return [(Recompute.SELECTIVE, DEFAULT_RECOMPUTE_MODULES)]
    for prefix in ("selective:", "select ("):
        if text.startswith(prefix):
            names = [n.strip(" ()") for n in text[len(prefix):].split(",")]
            if not all(n in _MODULE_NAMES for n in names):
                return []
            return [(Recompute.SELECTIVE, tuple(dict.fromkeys(_MODULE_NAMES[n] for n in names)))]
    return [(mode, DEFAULT_RECOMPUTE_MODULES) for mode in Recompute]  # not stated


def _sharding(r: dict[str, str]) -> str:
    fsdp = "FSDP=On" in r["note"] or r["framework"].startswith("NeMo AutoModel")
    return "zero3" if fsdp else "zero1"


def _plans(r: dict[str, str], model: ModelSpec) -> tuple[Plan, ...]:
    tp, dp = int(r["tp"]), int(r["dp"])
    cluster = parse_gpus_arg(f"{_GPUS[r['gpu']]}:{r['gpus']}")
    plans = []
    for mbs in [int(r["mbs"])] if r["mbs"] else [1, 2, 4]:
        for recompute, modules in recomputations(r["recompute"]):
            cfg = ParallelConfig(
                tp=tp, pp=int(r["pp"]), dp=dp, cp=int(r["cp"]), vp=int(r["vp"] or 1), mbs=mbs,
                gbs=int(r["gbs"]), seq_len=int(r["seq"]), recompute=recompute,
                recompute_modules=modules,
                sequence_parallel=tp > 1, sharding=sharding_preset(_sharding(r), dp * int(r["cp"])),
                dtype=_DTYPES[r["dtype"]],  # type: ignore[arg-type]  # a DType value
                ep=int(r["ep"]), etp=_etp(r, model),
                embedding_in_pipeline_split="--account-for-embedding-in-pipeline-split" in r["note"],
                loss_in_pipeline_split="--account-for-loss-in-pipeline-split" in r["note"])
            try:
                check_parallel(cfg, model, cluster)
                plan = homogeneous_plan(model, cluster, cfg, kernels=Kernels())
            except SpecError:
                continue
            tr = plan.training
            comm = replace(tr.comm, moe_dispatcher=_dispatcher(r), moe_routing=_routing(r),
                           grad_reduce_dtype="bf16" if BF16_GRADS in r["note"]
                           else tr.comm.grad_reduce_dtype)
            plans.append(replace(plan, training=replace(
                tr, comm=comm, pipeline_flushes=_flushes(r, dp * int(r["cp"])),
                master_weights=_master_weights(r))))
    return tuple(plans)


def _etp(r: dict[str, str], model: ModelSpec) -> int | None:
    """The stated expert tp; where the source does not state it, 1 if the layout needs
    it (ep above dp x cp: only MoE Parallel Folding runs that), else tp (the default)."""
    if r["etp"]:
        return int(r["etp"])
    tp, ep, dp, cp = (int(r[k]) for k in ("tp", "ep", "dp", "cp"))
    return None if ep_problem(model, ep, dp=dp, cp=cp, tp=tp) is None else 1


_LOCAL_BATCH = re.compile(r"LBS=([0-9]+)")


def _flushes(r: dict[str, str], replicas: int) -> int:
    """Pipeline schedules per step: NeMo AutoModel's benchmark runs each of its gradient
    accumulation steps (a local batch of LBS sequences per data-parallel rank) as its own
    torch.distributed.pipelining `schedule.step` (nemo_automodel/recipes/llm/benchmark.py
    `run_benchmark`: `_forward_backward_step` per local batch; train_ft.py
    `_forward_backward_step`: `self.pp.info.schedule.step(...)`), so gbs / (dp x LBS) of
    them; the other frameworks run one per step."""
    local = _LOCAL_BATCH.search(r["note"])
    if not local or not r["framework"].startswith("NeMo AutoModel"):
        return 1
    return max(1, int(r["gbs"]) // (replicas * int(local.group(1))))


def _master_weights(r: dict[str, str]) -> bool:
    """fp32 master weights, gradients and Adam moments (Megatron's mixed precision), except
    where the note says the states are 16-bit with no master copy: NeMo AutoModel builds
    its MoE models in config.torch_dtype (bf16) and its benchmark configs train them with
    torch.optim.Adam (sources in the rows' notes)."""
    return "no fp32 master" not in r["note"]


def _dispatcher(r: dict[str, str]) -> Literal["alltoall", "deepep"]:
    """DeepEP where the source names it (ModelZoo notes, NeMo AutoModel's TE + DeepEP),
    else Megatron's NCCL all-to-all."""
    return "deepep" if "deepep" in (r["note"] + r["framework"]).lower() else "alltoall"


def _routing(r: dict[str, str]) -> Literal["learned", "fake_balanced"]:
    """NeMo AutoModel's benchmarks route with its FakeBalancedGate (the note quotes
    'fake balanced gate'; `fake_balanced_gate: true` in examples/benchmark/configs)."""
    return "fake_balanced" if "fake balanced gate" in r["note"].lower() else "learned"


def moe_cases(path: str = MOE_CSV) -> list[Case]:
    """One case per priced row: its candidate plans and the measured iteration time."""
    presets = model_presets()
    cases = []
    for r in scored_rows(path):
        model = presets[r["model"]]
        cases.append(Case(r["id"], _plans(r, model), measured_s(r, model)))
    return cases


def score(simulate: Callable[[Plan], SimResult] | None = None) -> ErrorSummary:
    """The simulator's error on every priced row (`predict_s`: the fastest fitting plan)."""
    if simulate is None:
        from planner.predict.estimate import estimate

        simulate = estimate
    return summarize(moe_cases(), simulate)


def main(argv: list[str] | None = None) -> int:
    """`python -m planner.calibration.moe`: one line per row, then the mean error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true",
                        help="the event simulation (default: the closed-form estimate)")
    args = parser.parse_args(argv)
    simulate = None
    if args.simulate:
        from planner.simulator import simulate as simulate_plan

        simulate = simulate_plan
    s = score(simulate)
    for case_id, error in s.errors.items():
        print(f"{case_id:42} {error * 100:+6.1f}%")
    for case_id in s.failed:
        print(f"{case_id:42}  no plan fits")
    print(f"mean |error| {s.mape * 100:.1f}% over {s.count} rows (median {s.median_abs * 100:.1f}%, "
          f"max {s.max_abs * 100:.1f}%); {len(s.failed)} rows without a fitting plan")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
