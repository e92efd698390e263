"""The Sailor artifact's measured runs as Plans, and the simulator's error on them.

planner/data/validation/sailor_measured.csv (its README names the source: eth-easl/sailor,
SOSP 2025) gives 36 measured iteration times with whole layouts: 27 on GH200 nodes (4 GPUs
a node, CSCS Clariden) and 9 on a mixed Titan-RTX / RTX-2080 / RTX-3090 cluster joined by
slow Ethernet. Each row becomes a Plan exactly as written:

* stages and replicas: `stage_replicas` lists, per pipeline stage, one [GPU, tp] per
  data-parallel replica; replica r is a Pipeline of stage k's r-th entry for every k,
  on tp GPUs of that type taken in order from the cluster;
* layers: `stage_layers` counts each stage's transformer layers, all of the model's
  (24 for OPT-350M, 32 for GPT-Neo-2.7B), with the embedding on the first stage and the
  head on the last besides. That is what DeepSpeed built: the run script passes the whole
  model (`--num-layers 24`, eth-easl/sailor ae_scripts/clariden_scripts/run_opt.slurm) to
  pretrain_gpt.py, whose `model_provider` builds OPTModelPipe / GPTNeoModelPipe without
  `layers_per_stage`, so PipelineModule splits the layer specs with
  `partition_method='uniform'` (deepspeed runtime/utils.py `partition_uniform`): OPT's
  28 specs (two casts, embedding, 24 layers, head) and GPT-Neo's 36 (two casts,
  embedding, 32 layers, final LayerNorm) fall into exactly the rows' splits (4/7/7/6,
  11/13; 6/9/9/8, 15/17, 2/5/5/5/4/4/4/3), the casts and the embedding counting
  towards the first stage and the head towards the last (`_stage_layers`); the
  artifact's own `layers_per_stage` lists agree (OPT-350M: 26 entries, Sailor's
  llm_info.json entry 0 the embedding, 1-24 the layers, 25 the head);
* the runs used Sailor's DeepSpeed-based runtime (its repository ships
  deepspeed/pipe_engine.py), so the plans take DeepSpeed's communication
  (`Communication.preset("deepspeed")`: blocking pipeline sends, gradients reduced after
  the backward in the training dtype) and its model states (`ModelStates.DEEPSPEED`; in
  fp32 the same bytes as every framework's), 1F1B, no recomputation;
* attention is Megatron's unfused softmax between two batched GEMMs (`math`): the runs
  trained in fp32, which fused (flash) attention kernels do not take;
* GPT-Neo in Megatron-DeepSpeed has no LM-head GEMM (GPTNeoModelPipe ends in a
  LayerNorm, cross-entropy on the hidden states, `model_notes`): `lm_head: false`.

* dtype: the run scripts train in fp32, inside the artifact's image
  (`FROM nvcr.io/nvidia/pytorch:24.10-py3`, eth-easl/sailor `Dockerfile`), whose
  `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1` runs fp32 matmuls in TF32 (PyTorch alone would
  not since 1.12, pytorch/pytorch#77114): every plan trains in `tf32`, which runs on
  tensor cores where the GPU has TF32 (GH200, RTX 3090) and on the CUDA cores in fp32
  where it has not (Titan RTX, RTX 2080 Ti: Turing).

Rows the planner cannot express are listed with the reason (GPU types the device catalog
lacks; a planner without tf32 scores fp32 and marks the row a lower bound).

A row whose measured time is below what its own layout needs by the artifact's own
measured per-layer profile (`sailor_gptneo_gh200_profile.csv`: GPT-Neo-2.7B on GH200)
is not a run of that layout: it is printed with its error but left out of the mean
(`profile_bound_s`; only row 8 is, see docs/calibration.md "Sailor"); so is a row whose
record the artifact copied from another run (`COPIED_RECORDS`: row 30).

Run `python -m planner.calibration.sailor` for the table and the error by group.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import os
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from planner.calibration.published import VALIDATION_DIR
from planner.predict.results import SimResult
from planner.specs.choices import ModelStates, Recompute
from planner.specs.cluster import ClusterSpec, IslandLink, NodeGroup
from planner.specs.model import ModelSpec
from planner.specs.plan import (
    TRAIN_DTYPES,
    Communication,
    Kernels,
    Pipeline,
    Plan,
    Stage,
    Training,
)
from profiler.devices import catalog
from profiler.kernels import Attention
from profiler.schema import SpecError

__all__ = ["SailorCase", "SailorScore", "sailor_cases", "score"]

SAILOR_CSV = os.path.join(VALIDATION_DIR, "sailor_measured.csv")
# Sailor's measured profile of one GPT-Neo-2.7B transformer layer on a GH200 (README).
SAILOR_PROFILE_CSV = os.path.join(VALIDATION_DIR, "sailor_gptneo_gh200_profile.csv")
PROFILED = ("GPT-Neo-2.7B", "GH-96")  # the model and GPU the profile was measured on

# Sailor's GPU names and the catalog names they may have (issue 14 adds the RTX cards).
# "RTX-2080" is an RTX 2080 Ti: Sailor's own cluster config gives it 11 GiB
# (`mem_per_gpu` 11811160064 in sailor/Planner/simulations/configs/basic_cluster_config.json,
# saha18uiuc/sailor@37ded108; the RTX 2080 has 8 GB, the 2080 Ti 11), and its measured
# fp32 layer (8.13 ms forward at micro-batch 1) is 95% of the Titan RTX's, below what an
# RTX 2080's 10.1 TFLOP/s and 448 GB/s allow for its GEMMs and fp32 softmax alone
# (docs/calibration.md, "Sailor: the RTX-2080 is an RTX 2080 Ti").
SAILOR_GPUS: dict[str, tuple[str, ...]] = {
    "GH-96": ("GH200-96GB",),
    "RTX-3090": ("RTX3090-24GB", "RTX-3090", "RTX3090"),
    "RTX-2080": ("RTX2080Ti-11GB",),
    "Titan-RTX": ("TITAN-RTX-24GB", "Titan-RTX-24GB", "Titan-RTX", "TitanRTX-24GB"),
}
# The mixed cluster's links as Sailor measured them (the row's `network` column): about
# 22.9 Gb/s between the Titan-RTX and RTX-2080 nodes, 0.92 Gb/s to the RTX-3090 node.
# Written as 25 GbE NICs and a 1 Gb/s link to the RTX-3090 node's island (their nominal
# rates; the socket transport's efficiencies apply on top, profiler/data/links.yaml).
MIXED_NIC_GBIT = 25.0
MIXED_SLOW_LINK_GBIT = 1.0


@dataclass(frozen=True)
class SailorCase:
    id: str
    group: str  # GH200 pipelined | GH200 data parallel | mixed RTX pipelined | ... data parallel
    plan: Plan | None  # None: not expressible (see `reason`)
    reason: str  # why not expressible, or what is approximated
    lower_bound: bool  # scored in a dtype slower than the run's (fp32 for TF32)
    measured_s: float
    sailor_s: float  # Sailor's own simulator on the same plan
    # why the measurement cannot be of this layout ("" if it can): printed, not scored
    inconsistent: str = ""
    # the run's logged `max_mem` (bytes; None where the row has none): the most any rank's
    # GPU had in use after its last step (`sailor_memory` says how it was measured)
    measured_mem_bytes: int | None = None


@dataclass(frozen=True)
class SailorScore:
    cases: tuple[SailorCase, ...]
    errors: dict[str, float]  # case id -> signed relative error
    sailor_errors: dict[str, float]  # Sailor's simulator on the same rows
    # rows whose measurement contradicts the artifact's own profile: their error, unscored
    excluded: dict[str, float] = dataclasses.field(default_factory=dict)

    def by_group(self) -> dict[str, tuple[float, float, int]]:
        """Per group: our mean |error|, Sailor's on the same rows, the row count."""
        out: dict[str, tuple[float, float, int]] = {}
        for group in sorted({c.group for c in self.cases}):
            ids = [c.id for c in self.cases if c.group == group and c.id in self.errors]
            if ids:
                out[group] = (statistics.mean(abs(self.errors[i]) for i in ids),
                              statistics.mean(abs(self.sailor_errors[i]) for i in ids), len(ids))
        return out

    @property
    def mape(self) -> float:
        return statistics.mean(abs(e) for e in self.errors.values()) if self.errors else 0.0


def _catalog_name(sailor_name: str, gpu_names: Mapping[str, tuple[str, ...]]) -> str | None:
    known = {k.lower(): k for k in catalog()}
    for name in gpu_names.get(sailor_name, ()):
        if name.lower() in known:
            return known[name.lower()]
    return None


# The dropout each model of Sailor's Megatron-DeepSpeed applies (saha18uiuc/sailor@13b7942,
# third_party/Megatron-DeepSpeed/megatron/model): OPT (`opt_model.py`) never applies its
# attention dropout and has its two residual dropouts commented out; GPT-Neo
# (`gpt_neo_model.py`) builds `attn_dropout` and never calls it, and keeps the residual
# dropouts. (dropout, attention_dropout) as ModelSpec takes them.
_DROPOUT = {"OPT-350M": (False, False), "GPT-Neo-2.7B": (True, False)}


def _model(r: dict[str, str], layers: int) -> ModelSpec:
    name = r["model"].split(" (")[0]
    dropout, attention_dropout = _DROPOUT[name]
    return ModelSpec(name=f"{name} (Sailor run)", num_layers=layers, hidden_size=int(r["hidden"]),
                     ffn_hidden_size=int(r["ffn"]), num_heads=int(r["heads"]),
                     vocab_size=int(float(r["vocab_run"])), seq_len=int(r["seq_len"]),
                     activation="gelu", norm="layernorm", position_embedding="learned",
                     tied_embeddings=r["lm_head"] not in ("untied", "none"),
                     lm_head=r["lm_head"] != "none", dropout=dropout,
                     attention_dropout=attention_dropout)


def _cluster(r: dict[str, str], types: list[str]) -> ClusterSpec:
    """GH200 rows: the catalog's quad-GH200 node. Mixed rows: one node per GPU type and
    count, 25 GbE between the Titan-RTX and RTX-2080 nodes, the RTX-3090 nodes on an island
    of their own behind a 1 Gb/s link."""
    per_node = int(float(r["gpus_per_node"]))
    counts = {t: int(n) for n, t in re.findall(r"(\d+)x ([\w-]+)", r["gpus"])}
    groups, links = [], []
    for sailor_name, count in counts.items():
        gpu = types[list(counts).index(sailor_name)]
        extra: dict[str, object] = {}
        if r["heterogeneous"] == "yes":
            slow = sailor_name == "RTX-3090"
            extra = {"nic": "ethernet", "nics_per_node": 1,
                     "nic_bandwidth_gbit_per_s": MIXED_NIC_GBIT, "intra_node_link": "pcie-host",
                     "island": "rtx3090" if slow else "main"}
        groups.append(NodeGroup(name=sailor_name.lower(), gpu=gpu,
                                num_nodes=max(1, count // per_node), gpus_per_node=per_node,
                                **extra))  # type: ignore[arg-type]  # literal values above
    if len({g.island for g in groups}) > 1:
        links.append(IslandLink(islands=("main", "rtx3090"),
                                bandwidth_gbit_per_s=MIXED_SLOW_LINK_GBIT, kind="ethernet"))
    return ClusterSpec(name=f"Sailor row {r['row_id']}", node_groups=tuple(groups),
                       island_links=tuple(links)).resolved()


def _stage_layers(r: dict[str, str]) -> list[int]:
    """Transformer layers per stage, as the row lists them: DeepSpeed's uniform split of
    the model's layer specs (module docstring), whose first stage also holds the two
    casts and the embedding and whose last holds the head, gives each stage exactly
    these many transformer layers and all of the model's in total."""
    return [int(x) for x in r["stage_layers"].split("/")]


def _plan(r: dict[str, str], gpu_names: Mapping[str, tuple[str, ...]]) -> tuple[Plan | None, str]:
    replicas = json.loads(r["stage_replicas"])  # [stage][replica] -> [GPU, tp]
    sailor_types = list(dict.fromkeys(t for _, t in re.findall(r"(\d+)x ([\w-]+)", r["gpus"])))
    types = [_catalog_name(t, gpu_names) for t in sailor_types]
    missing = [t for t, c in zip(sailor_types, types, strict=True) if c is None]
    if missing:
        return None, f"GPU {', '.join(missing)} not in the device catalog (issue 14 adds it)"
    cluster = _cluster(r, [t for t in types if t is not None])
    layers = _stage_layers(r)
    model = _model(r, sum(layers))
    dtype = "tf32" if "tf32" in TRAIN_DTYPES else "fp32"
    free: dict[str, list[int]] = {}
    for slot in cluster.slots:
        free.setdefault(cluster.node_groups[slot.group].gpu, []).append(slot.index)
    to_catalog = dict(zip(sailor_types, types, strict=True))
    dp = len(replicas[0])
    mbs, gbs = int(float(r["mbs"])), int(float(r["gbs"]))
    pipelines, bounds = [], [0]
    for n in layers:
        bounds.append(bounds[-1] + n)
    for rep in range(dp):
        stages = []
        for k, stage in enumerate(replicas):
            gpu, tp = stage[rep]
            devices = tuple(free[to_catalog[gpu]][:tp])
            del free[to_catalog[gpu]][:tp]
            stages.append(Stage(layers=(bounds[k], bounds[k + 1]), devices=devices, tp=tp,
                                recompute=Recompute.NONE))
        pipelines.append(Pipeline(stages=tuple(stages), micro_batch_size=mbs,
                                  num_microbatches=gbs // (mbs * dp)))
    training = Training(global_batch_size=gbs, seq_len=int(r["seq_len"]),
                        dtype=dtype,  # type: ignore[arg-type]  # one of TRAIN_DTYPES
                        comm=Communication.preset("deepspeed", dtype=dtype),
                        model_states=ModelStates.DEEPSPEED)
    plan = Plan(model=model, cluster=cluster, training=training, pipelines=tuple(pipelines),
                kernels=Kernels(attention=Attention.MATH))
    try:
        plan.check("plan")
    except SpecError as err:
        return None, f"not a valid plan: {err}"
    note = "" if dtype == "tf32" else "fp32 for the run's TF32 (the planner has no tf32 yet)"
    return plan, note


@functools.cache
def _profile(path: str = SAILOR_PROFILE_CSV) -> dict[tuple[int, int], float]:
    """(micro-batch size, tp) -> forward + backward seconds of one profiled layer."""
    with open(path, newline="", encoding="utf-8") as fh:
        return {(int(r["mbs"]), int(r["tp"])): float(r["forward_s"]) + float(r["backward_s"])
                for r in csv.DictReader(fh)}


def profile_bound_s(r: dict[str, str]) -> float | None:
    """The least time the row's layout can take by Sailor's own measured per-layer
    profile, where it has one (GPT-Neo-2.7B on GH200): every micro-batch passes forward
    and backward through each stage's transformer layers, so no schedule finishes before
    its busiest stage has done num_microbatches x layers x (forward + backward) of
    compute (embedding, head, communication and bubbles only add to it). None where the
    profile does not cover the row."""
    model = r["model"].split(" (")[0]
    gpus = {t for _, t in re.findall(r"(\d+)x ([\w-]+)", r["gpus"])}
    if model != PROFILED[0] or gpus != {PROFILED[1]}:
        return None
    replicas = json.loads(r["stage_replicas"])
    mbs, gbs = int(float(r["mbs"])), int(float(r["gbs"]))
    microbatches = gbs // (mbs * len(replicas[0]))
    bound = 0.0
    for layers, stage in zip(_stage_layers(r), replicas, strict=True):
        for _, tp in stage:
            per_layer = _profile().get((mbs, tp))
            if per_layer is None:
                return None
            bound = max(bound, microbatches * layers * per_layer)
    return bound


# Rows whose logged record is another run's: the artifact's plan_config_N3_D1.json (row 30,
# dp 1) carries N6_D2's (row 34) `real` 59.45533 s, `max_mem` and `red_grads` 5.4637 s of
# gradient reduction, which a run without data parallelism does not spend
# (sailor/Planner/simulations/validation/mit/N3 and N6, saha18uiuc/sailor@13b79423, a
# fork of eth-easl/sailor holding the same records).
COPIED_RECORDS = {"30": "34"}


def _inconsistent(r: dict[str, str]) -> str:
    if r["row_id"] in COPIED_RECORDS:
        return (f"its record (time, memory, 5.46 s of gradient reduction at dp 1) is row "
                f"{COPIED_RECORDS[r['row_id']]}'s, copied in the artifact")
    bound = profile_bound_s(r)
    measured = float(r["measured_iter_time_s"])
    if bound is None or measured >= bound:
        return ""
    return (f"measured {measured:.3f} s is below the {bound:.3f} s its layers need by "
            f"Sailor's own profile (sailor_gptneo_gh200_profile.csv)")


def _max_mem_bytes(r: dict[str, str]) -> int | None:
    logged = re.search(r"max_mem=(\d+) B", r["measurement_method"])
    return int(logged.group(1)) if logged else None


def _group(r: dict[str, str]) -> str:
    cluster = "GH200" if r["heterogeneous"] == "no" else "mixed RTX"
    return f"{cluster} {'pipelined' if int(float(r['pp'])) > 1 else 'data parallel'}"


def sailor_cases(path: str | None = None, *,
                 gpu_names: Mapping[str, tuple[str, ...]] = SAILOR_GPUS) -> list[SailorCase]:
    with open(path or SAILOR_CSV, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for r in rows:
        plan, reason = _plan(r, gpu_names)
        out.append(SailorCase(id=f"sailor-{int(r['row_id']):02d}", group=_group(r), plan=plan,
                              reason=reason,
                              lower_bound=plan is not None and plan.training.dtype == "fp32"
                              and "TF32" in r["dtype"],
                              measured_s=float(r["measured_iter_time_s"]),
                              sailor_s=float(r["sailor_simulator_iter_time_s"]),
                              inconsistent=_inconsistent(r),
                              measured_mem_bytes=_max_mem_bytes(r)))
    return out


def score(cases: list[SailorCase], simulate: Callable[[Plan], SimResult]) -> SailorScore:
    """Errors over the expressible rows; rows whose measurement contradicts the
    artifact's own profile go to `excluded` instead."""
    errors, sailor, excluded = {}, {}, {}
    for c in cases:
        if c.plan is None:
            continue
        error = simulate(c.plan).iteration_time_s / c.measured_s - 1
        if c.inconsistent:
            excluded[c.id] = error
            continue
        errors[c.id] = error
        sailor[c.id] = c.sailor_s / c.measured_s - 1
    return SailorScore(tuple(cases), errors, sailor, excluded)


def main(argv: list[str] | None = None) -> None:
    from planner.predict.estimate import estimate
    from planner.simulator import simulate

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", choices=("simulate", "estimate"), default="simulate")
    args = ap.parse_args(argv)
    cases = sailor_cases()
    s = score(cases, simulate if args.method == "simulate" else estimate)
    for c in cases:
        if c.plan is None:
            print(f"{c.id}  {c.group:24} not scored: {c.reason}")
            continue
        if c.id in s.excluded:
            print(f"{c.id}  {c.group:24} measured {c.measured_s:9.3f} s  error "
                  f"{s.excluded[c.id]:+7.1%}  not scored: {c.inconsistent}")
            continue
        e, se = s.errors[c.id], s.sailor_errors[c.id]
        flag = "  (lower bound: " + c.reason + ")" if c.lower_bound else ""
        print(f"{c.id}  {c.group:24} measured {c.measured_s:9.3f} s  error {e:+7.1%}  "
              f"Sailor {se:+7.1%}{flag}")
    print()
    for group, (ours, theirs, n) in s.by_group().items():
        print(f"{group:24} {n:2d} rows  mean |error| {ours:6.1%}  (Sailor's simulator {theirs:6.1%})")
    print(f"{'all scored':24} {len(s.errors):2d} rows  mean |error| {s.mape:6.1%}  "
          f"(Sailor's simulator {statistics.mean(abs(x) for x in s.sailor_errors.values()):6.1%})")
    if s.excluded:
        every = [*s.errors.values(), *s.excluded.values()]
        print(f"{'with the excluded':24} {len(every):2d} rows  mean |error| "
              f"{statistics.mean(abs(x) for x in every):6.1%}")
    unscored = [c for c in cases if c.plan is None]
    if unscored:
        print(f"not scored: {len(unscored)} rows ({unscored[0].reason})")


if __name__ == "__main__":
    main()
