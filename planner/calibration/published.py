"""Published measurements as plans, and the simulator's error against them.

Five datasets (planner/data/validation, see its README for sources):

* published table rows (Korthikanti et al. 2022, Megatron-LM README tables): converted
  exactly as `benchmarks/score_published.py` converts them for `plan simulate`
  (same model fields, same flags, the fastest fitting micro-batch size when the source
  did not publish one), so in-process numbers equal the scorer's;
* vTrain's 1,440 single-node A100 measurements (Bang et al. 2024, ground_truth_single):
  GPT models (ffn 4h, vocab 50257, sequence 1024) in Megatron-DeepSpeed with fp16, full
  recompute, 1F1B, Megatron's fused-softmax (unfused) attention, and DeepSpeed's engine's
  communication (`VTRAIN_COMM`: blocking pipeline sends, gradients all-reduced in fp16
  after the backward pass; their configs set use_gradient_bucket false).

* held out: vTrain's 109 multi-node A100 measurements (ground_truth_multi: GPT 3.6B, 18.4B,
  39.1B and 175B on 64-512 A100s, sequence 2048, nodes of 8 with 800 Gb/s of InfiniBand),
  converted as the single-node rows are; nothing was fitted to them, and every row
  is timed even where the memory model calls it out of memory.

* held out: NVIDIA's DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking, 2024-25),
  212 dense pre-training step times on H100 and GB200 (Llama 3.1 8B/70B/405B, Nemotron-4
  15B/340B, GPT-3 175B; NeMo, BF16 and per-tensor FP8), dgxc_dense.csv in
  published_visible.csv's columns; nothing was fitted to them. Every row is timed even where
  the memory model calls the run out of memory (they ran), and those rows are counted.

* held out: NVIDIA Megatron-Bridge's published B200 / GB200 dense pre-training throughputs
  (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, 25.09 / 25.11 / 26.02
  tables), 12 rows of Llama 3 8B / 70B and Llama 3.1 405B in per-tensor current-scaling FP8
  (FP8-CS), mbridge_blackwell.csv in the same columns; every row timed even where the memory
  model calls it out of memory. Blackwell's calibration holds them out
  (planner/calibration/fit.py `BLACKWELL_CALIBRATION`).

* held out: MosaicML LLM Foundry's MPT benchmarks (mosaicml/llm-foundry
  scripts/train/benchmarking/README.md), 201 training throughputs of MPT 125M-70B with
  Composer's FSDP FULL_SHARD (ZeRO-3 data parallelism alone) on 8-128 H100 and A100 GPUs,
  foundry_fsdp.csv in the same columns, communicating as Composer does (`FOUNDRY_COMM`);
  every row timed even where the memory model calls it out of memory.

    python -m planner.calibration.published [--by tp,mbs,hidden ...] [--multi-by gpus,tp ...]
        [--dgxc-by gpu,tp ...] [--mbridge-by gpu,release ...] [--foundry-by gpu,gpus ...]
        [--sets foundry ...] [-v]

prints the datasets' errors, the vTrain error grouped by what its rows share
(`vtrain_groups`, `vtrain_multi_groups`), which is where a mechanism the model lacks shows
first, the held-out DGX Cloud error grouped by GPU, dtype, model and NeMo generation
(`dgxc_groups`) and the held-out LLM Foundry error grouped by GPU, dtype, model, GPU count,
sequence and micro-batch (`foundry_groups`; -v: per row of both).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from planner.costs.workload import WorkloadShape
from planner.predict.results import SimResult
from planner.specs.choices import DType, Recompute
from planner.specs.cluster import ClusterSpec, NodeGroup, parse_gpus_arg
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan, sharding_preset
from planner.specs.model import ModelSpec
from planner.specs.plan import DEFAULT_COMM, Communication, Kernels, Plan
from profiler.kernels import Attention
from profiler.schema import SpecError

__all__ = ["DGXC_FIELDS", "FOUNDRY_COMM", "FOUNDRY_FIELDS", "MBRIDGE_FIELDS", "VTRAIN_COMM",
           "VTRAIN_FIELDS", "VTRAIN_MULTI_FIELDS", "Case", "ErrorSummary", "GroupError",
           "LayerCase", "dgxc_cases", "dgxc_groups", "dgxc_rows", "dgxc_summary", "does_not_fit",
           "foundry_cases", "foundry_groups", "foundry_rows", "foundry_summary",
           "held_out_summary", "korthikanti_layer_cases", "layer_errors", "main", "mbridge_cases",
           "mbridge_groups", "mbridge_rows", "published_cases", "summarize", "vtrain_cases",
           "vtrain_groups", "vtrain_multi_cases", "vtrain_multi_groups", "vtrain_multi_rows",
           "vtrain_rows"]

VALIDATION_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "validation")


@dataclass(frozen=True)
class Case:
    """One measured configuration: the plans to try (one per candidate micro-batch size;
    the fastest that fits is the prediction) and the measured iteration time."""

    id: str
    plans: tuple[Plan, ...]
    measured_s: float


@dataclass(frozen=True)
class ErrorSummary:
    mape: float  # mean |predicted/measured - 1|
    max_abs: float
    median_abs: float
    count: int
    failed: tuple[str, ...]
    errors: dict[str, float]  # case id -> signed relative error


# Settings a row's `note` may state, in the words of the run's configuration (the CSV's
# columns stay those of published_visible.csv): Megatron-Core's pipeline-split accounting and
# a model trained without dropout (ModelSpec's default is Megatron-LM's 0.1).
EMBEDDING_IN_SPLIT = "--account-for-embedding-in-pipeline-split"
LOSS_IN_SPLIT = "--account-for-loss-in-pipeline-split"
NO_DROPOUT = "no dropout"
# FP8 with FP8 primary weights (NeMo fp8_params / fp8_param_gather: Training.fp8_params)
# and Megatron-Core's gradient buffer in bf16 (grad_reduce_in_fp32 False:
# Communication.grad_reduce_dtype), as the FP8 recipes that say so set them
FP8_PARAMS = "fp8 params"
BF16_GRADS = "grad_reduce_in_fp32 False"
# ... and a model whose output layer is its input embedding, and one with a learned position
# table rather than rotary positions (ModelSpec's defaults: untied, rope): MPT as LLM
# Foundry's benchmark yamls build it (MPTConfig's defaults tie_word_embeddings True,
# learned_pos_emb True)
TIED_EMBEDDINGS = "tied embeddings"
LEARNED_POSITIONS = "learned position embeddings"


def _published_model(r: dict) -> ModelSpec:
    swiglu = int(r["ffn"]) != 4 * int(r["hidden"])
    return ModelSpec(name=r["model"], num_layers=int(r["layers"]), hidden_size=int(r["hidden"]),
                     ffn_hidden_size=int(r["ffn"]), num_heads=int(r["heads"]),
                     num_kv_heads=int(r["kv_heads"] or r["heads"]), vocab_size=int(r["vocab"]),
                     seq_len=int(r["seq"]), activation="swiglu" if swiglu else "gelu",
                     norm="rmsnorm" if swiglu else "layernorm",
                     tied_embeddings=TIED_EMBEDDINGS in r.get("note", ""),
                     position_embedding=("learned" if LEARNED_POSITIONS in r.get("note", "")
                                         else "rope"),
                     dropout=NO_DROPOUT not in r.get("note", ""))


def published_measured_s(r: dict) -> float:
    """The iteration time a row's metric implies, by its source's own FLOP formula
    (the same arithmetic as benchmarks/score_published.py)."""
    B, s, layers, h, V = (int(r["gbs"]), int(r["seq"]), int(r["layers"]), int(r["hidden"]),
                          int(r["vocab"]))
    gpus, v, metric = int(r["gpus"]), float(r["value"]), r["metric"]
    if metric == "iter_s":
        return v
    if metric == "tokens_per_s_per_gpu":
        return B * s / (gpus * v)
    if metric == "tflops_per_gpu_hw":
        flops = 96 * B * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h))
        return flops / (gpus * v * 1e12)
    if metric == "tflops_per_gpu_model":
        if r.get("kv_heads") or int(r["ffn"]) != 4 * h:
            ffn, kv, heads = int(r["ffn"]), int(r["kv_heads"] or r["heads"]), int(r["heads"])
            hd = h // heads
            n = layers * (h * h * 2 + 2 * h * kv * hd + 3 * h * ffn) + 2 * V * h
            flops = 6 * n * B * s + 12 * layers * h * s * B * s
        else:
            flops = 72 * B * s * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h))
        return flops / (gpus * v * 1e12)
    raise ValueError(f"unknown metric {metric!r}")


def _try_plan(model: ModelSpec, gpus: str | ClusterSpec, cfg: ParallelConfig,
              kernels: Kernels | None = None) -> Plan | None:
    cluster = parse_gpus_arg(gpus) if isinstance(gpus, str) else gpus
    try:
        check_parallel(cfg, model, cluster)
        kernels = kernels or Kernels()
        return homogeneous_plan(model, cluster, cfg, kernels=kernels)
    except SpecError:
        return None


def _csv_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def published_cases(path: str | None = None, *, comm: Communication | None = None) -> list[Case]:
    """The rows of a CSV in published_visible.csv's columns (default that file) as Cases,
    communicating as `comm` says (default Megatron-LM's, `Communication()`)."""
    rows = _csv_rows(path or os.path.join(VALIDATION_DIR, "published_visible.csv"))
    cases = []
    for r in rows:
        model = _published_model(r)
        dp = int(r["dp"])
        note = r.get("note", "")
        plans = []
        for mbs in ([int(r["mbs"])] if r["mbs"] else [1, 2, 4, 8]):
            if int(r["gbs"]) % (mbs * dp):
                continue
            cfg = ParallelConfig(
                tp=int(r["tp"]), pp=int(r["pp"]), dp=dp, cp=int(r["cp"] or 1),
                vp=int(r["vp"] or 1), mbs=mbs, gbs=int(r["gbs"]), seq_len=int(r["seq"]),
                recompute=Recompute(r["recompute"]),
                # Megatron turns --sequence-parallel off at tp 1 (the 1.7B row lists it)
                sequence_parallel=r["seq_par"] == "1" and int(r["tp"]) > 1,
                sharding=sharding_preset(r["sharding"] or "none", dp * int(r["cp"] or 1)),
                dtype=r["dtype"],  # type: ignore[arg-type]  # a published dtype name
                embedding_in_pipeline_split=EMBEDDING_IN_SPLIT in note,
                loss_in_pipeline_split=LOSS_IN_SPLIT in note,
                fp8_params=FP8_PARAMS in note and r["dtype"] == "fp8",
                comm=(Communication(grad_reduce_dtype="bf16") if BF16_GRADS in note
                      else comm or DEFAULT_COMM))
            plan = _try_plan(model, f"{r['gpu']}:{r['gpus']}", cfg,
                             Kernels(attention=Attention(r["attention"])))
            if plan is not None:
                plans.append(plan)
        cases.append(Case(r["id"], tuple(plans), published_measured_s(r)))
    return cases


DGXC_DENSE = os.path.join(VALIDATION_DIR, "dgxc_dense.csv")


def dgxc_cases(path: str | None = None) -> list[Case]:
    """NVIDIA DGX Cloud benchmarking recipes' dense pre-training rows (dgxc_dense.csv, a
    held-out set: nothing in the cost model was fitted to it), converted as the published
    rows are."""
    return published_cases(path or DGXC_DENSE)


def dgxc_rows(path: str | None = None) -> list[dict[str, str]]:
    return _csv_rows(path or DGXC_DENSE)


MBRIDGE_BLACKWELL = os.path.join(VALIDATION_DIR, "mbridge_blackwell.csv")


def mbridge_cases(path: str | None = None) -> list[Case]:
    """Megatron-Bridge's published B200 / GB200 dense pre-training throughputs
    (mbridge_blackwell.csv; held out from Blackwell's calibration), converted as the
    published rows are."""
    return published_cases(path or MBRIDGE_BLACKWELL)


def mbridge_rows(path: str | None = None) -> list[dict[str, str]]:
    return _csv_rows(path or MBRIDGE_BLACKWELL)


FOUNDRY_FSDP = os.path.join(VALIDATION_DIR, "foundry_fsdp.csv")
# How Composer ran LLM Foundry's MPT benchmarks (scripts/train/benchmarking/README.md: torch
# FSDP1 FULL_SHARD, one FSDP unit per MPTBlock, mixed_precision DEFAULT, or PURE in the older
# A100 tables): gradients reduce-scattered in bf16 during the backward, the next block's
# parameters gathered ahead. Composer's get_mixed_precision (mosaicml/composer@0099561e
# composer/trainer/mosaic_fsdp_utils.py) sets DEFAULT to param_dtype = buffer_dtype = the
# autocast dtype and leaves reduce_dtype None, which torch's MixedPrecision takes as
# param_dtype (bf16; also for amp_fp8, whose torch dtype _get_torch_dtype gives as bf16);
# PURE sets all three to it; DEFAULT's fp32 reduction came with mosaicml/composer#2628
# (October 2023). Composer's FSDP defaults (composer/trainer/dist_strategy.py
# prepare_fsdp_module): backward_prefetch BACKWARD_POST (the next unit's all-gather issued
# in the backward), forward_prefetch False, and the benchmark sets limit_all_gathers True
# (submit_benchmarks.py mod_parameters), which lets the CPU issue the next unit's forward
# all-gather while the current one computes: one unit ahead both ways.
FOUNDRY_COMM = Communication(overlap_grad_reduce=True, grad_reduce_dtype="bf16",
                             shard_prefetch=1)


def foundry_cases(path: str | None = None) -> list[Case]:
    """MosaicML LLM Foundry's MPT training throughputs (foundry_fsdp.csv, a held-out set:
    nothing in the cost model was fitted to it): ZeRO-3 data parallelism (FSDP FULL_SHARD)
    on 8-128 H100 / A100 GPUs, converted as the published rows are and communicating as
    Composer's FSDP does (`FOUNDRY_COMM`)."""
    return published_cases(path or FOUNDRY_FSDP, comm=FOUNDRY_COMM)


def foundry_rows(path: str | None = None) -> list[dict[str, str]]:
    return _csv_rows(path or FOUNDRY_FSDP)


# the columns of vtrain_single_node_a100.csv, in order, before the measured time
VTRAIN_FIELDS = ("gpus", "gbs", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp")


def vtrain_rows(path: str | None = None) -> list[tuple[dict[str, int], float]]:
    """Each vTrain row's configuration (VTRAIN_FIELDS) and measured iteration seconds."""
    path = path or os.path.join(VALIDATION_DIR, "vtrain_single_node_a100.csv")
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader)
        rows = [[float(x) for x in row] for row in reader]
    return [(dict(zip(VTRAIN_FIELDS, (int(x) for x in row[:-1]), strict=True)), row[-1] / 1e3)
            for row in rows]


# How vTrain's runs communicated, single-node and multi-node alike: DeepSpeed's engine as
# Megatron-DeepSpeed drives it (vTrain data/README.md: "collected using Megatron-DeepSpeed").
# With --deepspeed, pretrain_gpt.py builds GPTModelPipe and training.py trains it with
# DeepSpeed's PipelineEngine (`args.ds_pipeline_enabled = not args.no_pipeline_parallel`;
# the repository's scripts pass --no-pipeline-parallel only at pp 1, where the plain
# DeepSpeedEngine runs Megatron's schedule without pipeline sends). Hence
# `Communication.preset("deepspeed")` in fp16:
# * pipeline sends blocking: deepspeed/runtime/pipe/p2p.py asserts `async_op == False` and
#   calls dist.send / dist.recv (PipelineP2P.BLOCKING);
# * gradients all-reduced after the backward, in the training dtype: the PipelineEngine
#   sets `enable_backward_allreduce = False` and runs ReduceGrads once, after the schedule's
#   last backward (`_exec_reduce_grads` -> `allreduce_gradients`), the DeepSpeedEngine at the
#   accumulation boundary; vTrain's configs say the same (use_gradient_bucket false;
#   src/predictor.py adds one all-reduce of 2-byte gradients, "comm across dp", after the
#   last backward node);
# * in buckets of MEMORY_OPT_ALLREDUCE_SIZE = 5e8 elements (runtime/engine.py,
#   `buffered_allreduce_fallback(elements_per_buffer=...)`).
# Not priced: with tp > 1 the PipelineEngine sends 1/tp of each activation from each tp rank
# (pipe_partitioned / grad_partitioned, both True by default, runtime/config.py
# `get_pipeline_config`), as `_p2p` assumes, but then all-gathers it over the tp group three
# times per micro-batch and stage boundary (runtime/utils.py `PartitionedTensor.full`) and
# sends a partition-meta tensor beside each slice; see docs/calibration.md "What vTrain's
# runs ran" for its size.
VTRAIN_COMM = Communication.preset("deepspeed", dtype="fp16")


def _vtrain_case(case_id: str, r: dict[str, int], measured_s: float,
                 gpus: str | ClusterSpec) -> Case:
    """A vTrain row as a plan: GPT (ffn 4h, vocab 50257, learned positions, tied
    embeddings, dropout) in Megatron-DeepSpeed with fp16, full recompute, 1F1B,
    Megatron's fused-softmax attention and `VTRAIN_COMM`, as vTrain's validation configs
    set it (config/validation/*: use_checkpoint true, pipeline_scheduling 1f1b,
    use_gradient_bucket false)."""
    h, layers, seq = r["hidden"], r["layers"], r["seq"]
    model = ModelSpec(name=f"gpt-h{h}-l{layers}", num_layers=layers, hidden_size=h,
                      ffn_hidden_size=4 * h, num_heads=r["heads"], vocab_size=50257,
                      seq_len=seq, activation="gelu", norm="layernorm",
                      position_embedding="learned", tied_embeddings=True, dropout=True)
    cfg = ParallelConfig(tp=r["tp"], pp=r["pp"], dp=r["dp"], mbs=r["mbs"], gbs=r["gbs"],
                         seq_len=seq, recompute=Recompute.FULL, dtype=DType.FP16,
                         comm=VTRAIN_COMM)
    plan = _try_plan(model, gpus, cfg, Kernels(attention=Attention.MATH))
    return Case(case_id, (plan,) if plan else (), measured_s)


def vtrain_cases(path: str | None = None) -> list[Case]:
    return [_vtrain_case(f"vtrain-{i:04d}", r, measured_s, f"A100-80GB-SXM:{r['gpus']}")
            for i, (r, measured_s) in enumerate(vtrain_rows(path))]


# vtrain_multi_node_a100.csv's columns before the measured time (its first column, the
# model's size in billions, is left out: the shape columns define the model)
VTRAIN_MULTI_FIELDS = ("gpus", "gbs", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp",
                       "pp")
VTRAIN_MULTI = os.path.join(VALIDATION_DIR, "vtrain_multi_node_a100.csv")
# vTrain's multi-node cluster as its validation configs describe it
# (config/validation/multi/*.json: node_size 8, inter_node_bandwidth 800 "total bandwidth
# of inter-node communication in Gbps", src/config.py): DGX-A100-style nodes of eight
# NVSwitch-connected A100s with 800 Gb/s of InfiniBand each, taken as four 200 Gb/s HDR
# NICs (the configs give the total, not the NIC count).
VTRAIN_MULTI_NICS = 4
VTRAIN_MULTI_NIC_GBIT = 200.0


def vtrain_multi_rows(path: str | None = None) -> list[tuple[dict[str, int], float]]:
    """Each multi-node vTrain row's configuration (VTRAIN_MULTI_FIELDS) and measured
    iteration seconds."""
    with open(path or VTRAIN_MULTI, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader)
        rows = [[float(x) for x in row] for row in reader]
    return [(dict(zip(VTRAIN_MULTI_FIELDS, (int(x) for x in row[1:-1]), strict=True)),
             row[-1] / 1e3) for row in rows]


def vtrain_multi_cluster(gpus: int) -> ClusterSpec:
    nodes = max(1, gpus // 8)
    group = NodeGroup(name="vtrain-a100", gpu="A100-80GB-SXM", num_nodes=nodes,
                      gpus_per_node=min(gpus, 8), nic="infiniband",
                      nics_per_node=VTRAIN_MULTI_NICS,
                      nic_bandwidth_gbit_per_s=VTRAIN_MULTI_NIC_GBIT)
    return ClusterSpec(name=f"vTrain {gpus}x A100", node_groups=(group,)).resolved()


def vtrain_multi_cases(path: str | None = None) -> list[Case]:
    """vTrain's multi-node ground truth (64-512 A100s; a held-out set: nothing in the cost
    model was fitted to it), converted as the single-node rows are."""
    return [_vtrain_case(f"vtrain-multi-{i:03d}", r, measured_s, vtrain_multi_cluster(r["gpus"]))
            for i, (r, measured_s) in enumerate(vtrain_multi_rows(path))]



@dataclass(frozen=True)
class GroupError:
    """The signed relative errors of the rows sharing one value of the grouping fields."""

    key: tuple[int | str, ...]
    count: int
    mean: float  # signed: negative = predicted too fast
    mape: float
    low: float
    high: float
    share: float  # this group's part of the whole set's MAPE (sum |err| / all rows)


def _sort_key(key: tuple[int | str, ...]) -> tuple[tuple[int, int, str], ...]:
    return tuple((1, 0, v) if isinstance(v, str) else (0, v, "") for v in key)


def _group(errors: dict[str, float], keys: dict[str, tuple[int | str, ...]]) -> list[GroupError]:
    groups: dict[tuple[int | str, ...], list[float]] = {}
    for case_id, key in keys.items():
        e = errors.get(case_id)
        if e is not None:
            groups.setdefault(key, []).append(e)
    total = len(errors)
    return [GroupError(key, len(v), statistics.mean(v), statistics.mean(abs(e) for e in v),
                       min(v), max(v), sum(abs(e) for e in v) / total)
            for key, v in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))]


def dgxc_framework(r: dict[str, str]) -> str:
    """Which NeMo the row ran: the NeMo 2.0 recipes (NeMo-Run, 2025) or the NeMo
    Framework Launcher's Hydra configs (2024)."""
    return "NeMo 2.0" if "NeMo 2.0" in r["note"] else "NeMo launcher"


DGXC_FIELDS: dict[str, Callable[[dict[str, str]], int | str]] = {
    "gpu": lambda r: r["gpu"],
    "dtype": lambda r: r["dtype"],
    "model": lambda r: r["model"].split("-proxy")[0],
    "framework": dgxc_framework,
    "tp": lambda r: int(r["tp"]),
}


def _group_rows(errors: dict[str, float], by: tuple[str, ...],
                rows: Iterable[tuple[str, Callable[[str], int | str]]],
                fields: Iterable[str], what: str) -> list[GroupError]:
    """`errors` grouped by the `fields` named in `by`: `rows` gives each case id and its
    field values (a function of the field's name)."""
    allowed = tuple(fields)
    unknown = [f for f in by if f not in allowed]
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; choose from {allowed}")
    return _group(errors, {case_id: tuple(value(f) for f in by) for case_id, value in rows})


RowField = Callable[[dict[str, str]], int | str]


def _row_groups(errors: dict[str, float], by: tuple[str, ...], rows: list[dict[str, str]],
                fields: dict[str, RowField], dataset: str) -> list[GroupError]:
    """The errors of CSV rows (ids in their `id` column) grouped by the `fields` in `by`."""
    def values(r: dict[str, str]) -> Callable[[str], int | str]:
        return lambda f: fields[f](r)

    return _group_rows(errors, by, ((r["id"], values(r)) for r in rows), fields, dataset)


def dgxc_groups(errors: dict[str, float], by: tuple[str, ...],
                path: str | None = None) -> list[GroupError]:
    """The held-out DGX Cloud rows' errors grouped by `DGXC_FIELDS` (gpu, dtype, model,
    framework, tp), sorted by key."""
    return _row_groups(errors, by, dgxc_rows(path), DGXC_FIELDS, "DGX Cloud")


MBRIDGE_FIELDS: dict[str, RowField] = {
    "gpu": lambda r: r["gpu"],
    "model": lambda r: r["model"],
    "release": lambda r: r["id"].rsplit("-", 1)[1],  # the NeMo container, 2509 = 25.09
    "sharding": lambda r: r["sharding"],
}


def mbridge_groups(errors: dict[str, float], by: tuple[str, ...],
                   path: str | None = None) -> list[GroupError]:
    """The held-out Megatron-Bridge Blackwell rows' errors grouped by `MBRIDGE_FIELDS`
    (gpu, model, release, sharding), sorted by key."""
    return _row_groups(errors, by, mbridge_rows(path), MBRIDGE_FIELDS, "Megatron-Bridge")


FOUNDRY_FIELDS: dict[str, RowField] = {
    "gpu": lambda r: r["gpu"],
    "dtype": lambda r: r["dtype"],
    "model": lambda r: r["model"],
    "gpus": lambda r: int(r["gpus"]),
    "seq": lambda r: int(r["seq"]),
    "mbs": lambda r: int(r["mbs"]),
    "recompute": lambda r: r["recompute"],
}


def foundry_groups(errors: dict[str, float], by: tuple[str, ...],
                   path: str | None = None) -> list[GroupError]:
    """The held-out LLM Foundry rows' errors grouped by `FOUNDRY_FIELDS` (gpu, dtype, model,
    gpus, seq, mbs, recompute), sorted by key."""
    return _row_groups(errors, by, foundry_rows(path), FOUNDRY_FIELDS, "LLM Foundry")


def vtrain_groups(errors: dict[str, float], by: tuple[str, ...],
                  path: str | None = None) -> list[GroupError]:
    """vTrain's errors (`summarize(...).errors`, ids "vtrain-NNNN") grouped by the
    VTRAIN_FIELDS in `by`, sorted by key."""
    return _group_rows(errors, by, ((f"vtrain-{i:04d}", r.__getitem__)
                                    for i, (r, _) in enumerate(vtrain_rows(path))),
                       VTRAIN_FIELDS, "vTrain")


def vtrain_multi_groups(errors: dict[str, float], by: tuple[str, ...],
                        path: str | None = None) -> list[GroupError]:
    """The multi-node vTrain errors (ids "vtrain-multi-NNN") grouped by the
    VTRAIN_MULTI_FIELDS in `by`, sorted by key."""
    return _group_rows(errors, by, ((f"vtrain-multi-{i:03d}", r.__getitem__)
                                    for i, (r, _) in enumerate(vtrain_multi_rows(path))),
                       VTRAIN_MULTI_FIELDS, "vTrain")


@dataclass(frozen=True)
class LayerCase:
    """One transformer layer's measured forward and backward time."""

    id: str
    shape: WorkloadShape
    recompute: str
    forward_s: float
    backward_s: float


LAYER_MODEL = "megatron-22b"  # Korthikanti et al. 2022 Table 4: 22B, tp 8, micro-batch 4


def korthikanti_layer_cases(path: str | None = None) -> list[LayerCase]:
    rows = _csv_rows(path or os.path.join(VALIDATION_DIR, "korthikanti22_layer_times.csv"))
    cases = []
    for r in rows:
        setting = r["setting"]
        shape = WorkloadShape(micro_batch_size=4, seq_len=2048, tp=8, dtype="fp16",
                              sequence_parallel="sequence_parallel" in setting,
                              attention="math")
        recompute = ("full" if "full" in setting else
                     "selective" if "selective" in setting else "none")
        cases.append(LayerCase(setting, shape, recompute, float(r["forward_ms"]) / 1e3,
                               float(r["backward_ms"]) / 1e3))
    return cases


def layer_errors(cases: Iterable[LayerCase]) -> dict[str, float]:
    """Signed relative error of each layer's forward and backward time (A100, NVSwitch)."""
    from planner.costs.comm import group_tiers
    from planner.costs.stages import layer_parts
    from planner.specs.model import preset
    from profiler.devices import device

    model = preset(LAYER_MODEL)
    cluster = parse_gpus_arg("A100-80GB-SXM:8")
    tiers = (("tp", group_tiers(cluster, tuple(range(8)))), ("cp", ()))
    out = {}
    for c in cases:
        fwd, bwd = layer_parts(model, c.shape, device("A100-80GB-SXM"), tiers, c.recompute)
        out[f"{c.id} forward"] = fwd.total_s / c.forward_s - 1
        out[f"{c.id} backward"] = bwd.total_s / c.backward_s - 1
    return out


def predict_s(case: Case, simulate: Callable[[Plan], SimResult], *,
              require_fit: bool = True) -> float | None:
    """The fastest fitting candidate's predicted iteration time (None if none fits). With
    `require_fit` False a candidate the memory model rejects is timed too: the held-out
    rows are runs that did fit, so their time is scored whatever the memory model says
    (`does_not_fit` lists those rows)."""
    times = []
    for plan in case.plans:
        r = simulate(plan)
        if r.fits or not require_fit:
            times.append(r.iteration_time_s)
    return min(times) if times else None


def does_not_fit(cases: Iterable[Case], simulate: Callable[[Plan], SimResult]) -> list[str]:
    """The cases none of whose plans fits in memory by the model (a measured run that the
    memory model calls out of memory)."""
    return [c.id for c in cases if not any(simulate(p).fits for p in c.plans)]


def summarize(cases: Iterable[Case], simulate: Callable[[Plan], SimResult], *,
              require_fit: bool = True) -> ErrorSummary:
    errors, failed = {}, []
    for case in cases:
        predicted = predict_s(case, simulate, require_fit=require_fit)
        if predicted is None:
            failed.append(case.id)
            continue
        errors[case.id] = predicted / case.measured_s - 1
    magnitudes = [abs(e) for e in errors.values()]
    return ErrorSummary(mape=statistics.mean(magnitudes), max_abs=max(magnitudes),
                        median_abs=statistics.median(magnitudes), count=len(errors),
                        failed=tuple(failed), errors=errors)


def _print_summary(name: str, s: ErrorSummary) -> None:
    print(f"{name}: MAPE {100 * s.mape:.2f}%, median {100 * s.median_abs:.2f}%, "
          f"max {100 * s.max_abs:.2f}% ({s.count} rows, {len(s.failed)} failed)")


def _print_groups(title: str, by: tuple[str, ...], groups: list[GroupError]) -> None:
    print(f"{title} by {', '.join(by)}: rows, mean signed error, MAPE, range, "
          "share of the set's MAPE")
    for g in groups:
        key = " ".join(f"{f} {v}" for f, v in zip(by, g.key, strict=True))
        print(f"  {key:36s} {g.count:5d}  {100 * g.mean:+6.1f}%  {100 * g.mape:5.1f}%  "
              f"[{100 * g.low:+6.1f}, {100 * g.high:+6.1f}]  {100 * g.share:5.2f}")


def held_out_summary(cases: list[Case], simulate: Callable[[Plan], SimResult]
                     ) -> tuple[ErrorSummary, list[str]]:
    """Runs that ran: every row timed (fitting or not, see `predict_s`), and the rows the
    memory model calls out of memory; each plan simulated once for both."""
    results: dict[int, SimResult] = {}

    def once(plan: Plan) -> SimResult:
        if id(plan) not in results:  # the cases hold their plans: ids stay theirs
            results[id(plan)] = simulate(plan)
        return results[id(plan)]

    return summarize(cases, once, require_fit=False), does_not_fit(cases, once)


def dgxc_summary(simulate: Callable[[Plan], SimResult],
                 path: str | None = None) -> tuple[ErrorSummary, list[str]]:
    """The held-out DGX Cloud rows (`held_out_summary`)."""
    return held_out_summary(dgxc_cases(path), simulate)


def foundry_summary(simulate: Callable[[Plan], SimResult],
                    path: str | None = None) -> tuple[ErrorSummary, list[str]]:
    """The held-out LLM Foundry rows (`held_out_summary`)."""
    return held_out_summary(foundry_cases(path), simulate)


DATASETS = ("published", "vtrain", "vtrain-multi", "dgxc", "mbridge", "foundry")


Grouping = Callable[[dict[str, float], tuple[str, ...]], list[GroupError]]


def _print_groupings(short: str, errors: dict[str, float], groupings: list[str],
                     groups: Grouping) -> None:
    """Each grouping (comma-separated fields) of a set's errors."""
    for fields in groupings:
        by = tuple(fields.split(","))
        _print_groups(short, by, groups(errors, by))


def _print_held_out(name: str, short: str, cases: list[Case], simulate: Callable[[Plan], SimResult],
                    groupings: list[str], groups: Grouping, verbose: bool) -> None:
    """A held-out set's error, its runs the memory model calls out of memory, its groups
    and (verbose) every row's error."""
    summary, oom = held_out_summary(cases, simulate)
    _print_summary(name, summary)
    print(f"  {len(oom)} of these runs the memory model calls out of memory (timed all the same)"
          + (f": {', '.join(oom)}" if verbose else ""))
    _print_groupings(short, summary.errors, groupings, groups)
    if verbose:
        measured = {c.id: c.measured_s for c in cases}
        for case_id, e in summary.errors.items():
            print(f"  {case_id:52s} measured {measured[case_id]:8.3f}s  err {100 * e:+6.1f}%")


def main(argv: list[str] | None = None) -> int:
    from planner.simulator import simulate

    ap = argparse.ArgumentParser(prog="python -m planner.calibration.published",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--by", nargs="*", default=["tp", "pp", "dp", "mbs", "hidden", "layers",
                                                 "tp,mbs,hidden"],
                    help=f"vTrain groupings, comma-separated fields of {VTRAIN_FIELDS}")
    ap.add_argument("--multi-by", nargs="*", default=["gpus", "tp", "gpus,tp"],
                    help="multi-node vTrain groupings, comma-separated fields of "
                         f"{VTRAIN_MULTI_FIELDS}")
    ap.add_argument("--dgxc-by", nargs="*", default=["gpu", "dtype", "model", "framework",
                                                     "gpu,tp", "gpu,dtype"],
                    help="DGX Cloud groupings, comma-separated fields of "
                         f"{tuple(DGXC_FIELDS)}")
    ap.add_argument("--mbridge-by", nargs="*", default=["gpu", "model", "release", "sharding"],
                    help="Megatron-Bridge Blackwell groupings, comma-separated fields of "
                         f"{tuple(MBRIDGE_FIELDS)}")
    ap.add_argument("--foundry-by", nargs="*", default=["gpu", "dtype", "model", "gpus",
                                                        "gpu,gpus", "seq", "mbs", "recompute",
                                                        "gpu,dtype,model,gpus"],
                    help="LLM Foundry groupings, comma-separated fields of "
                         f"{tuple(FOUNDRY_FIELDS)}")
    ap.add_argument("--sets", nargs="*", choices=DATASETS, default=list(DATASETS),
                    help="which datasets to score (default all)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every DGX Cloud, Megatron-Bridge and LLM Foundry row's "
                         "signed error")
    args = ap.parse_args(argv)
    for option, groupings, fields in (
            ("--by", args.by, VTRAIN_FIELDS), ("--multi-by", args.multi_by, VTRAIN_MULTI_FIELDS),
            ("--dgxc-by", args.dgxc_by, DGXC_FIELDS), ("--mbridge-by", args.mbridge_by,
                                                        MBRIDGE_FIELDS),
            ("--foundry-by", args.foundry_by, FOUNDRY_FIELDS)):
        for grouping in groupings:
            unknown = [f for f in grouping.split(",") if f not in fields]
            if unknown:  # before minutes of scoring
                ap.error(f"{option}: unknown field {unknown[0]!r} in {grouping!r}; choose "
                         f"from {', '.join(fields)}")
    if "published" in args.sets:
        _print_summary("published rows (in process)", summarize(published_cases(), simulate))
    if "vtrain" in args.sets:
        vt = summarize(vtrain_cases(), simulate)
        _print_summary("vTrain single-node A100", vt)
        _print_groupings("vTrain", vt.errors, args.by, vtrain_groups)
    if "vtrain-multi" in args.sets:
        vm = summarize(vtrain_multi_cases(), simulate, require_fit=False)
        _print_summary("vTrain multi-node A100 (held out)", vm)
        _print_groupings("vTrain multi-node", vm.errors, args.multi_by, vtrain_multi_groups)
    if "dgxc" in args.sets:
        _print_held_out("DGX Cloud recipes (held out)", "DGX Cloud", dgxc_cases(), simulate,
                        args.dgxc_by, dgxc_groups, args.verbose)
    if "mbridge" in args.sets:
        _print_held_out("Megatron-Bridge B200 / GB200 (held out)", "Megatron-Bridge",
                        mbridge_cases(), simulate, args.mbridge_by, mbridge_groups, args.verbose)
    if "foundry" in args.sets:
        _print_held_out("LLM Foundry FSDP (held out)", "LLM Foundry", foundry_cases(), simulate,
                        args.foundry_by, foundry_groups, args.verbose)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
