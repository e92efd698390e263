"""The cost model's transformer layer against Sailor's own measured per-layer profiles.

Sailor profiled one layer of each model on each GPU type of its runs, forward and
backward, per micro-batch size and tp degree (planner/data/validation/README.md):
OPT-350M on GH200, RTX 3090, Titan RTX and RTX 2080 (`sailor_opt350_layer_profiles.csv`)
and GPT-Neo-2.7B on GH200 (`sailor_gptneo_gh200_profile.csv`). Each entry is priced as
the Sailor rows are (`sailor.py`: the run's fp32/TF32, Megatron's unfused attention, the
dropout the layers apply, DeepSpeed's communication), as one layer of a one-stage plan on
tp GPUs of one node of the row's own cluster: the steady layer's forward and backward
(`StageCost.layer_forward` / `layer_backward`: GPU compute, the in-line tp all-reduces
and the time the GPU waits for the host to issue kernels).

Nothing is fitted to these profiles; they say where an end-to-end Sailor error lives: in
the layer (here) or around it (pipeline, data parallelism, framework). What they showed
on 2026-12-07 is in docs/calibration.md ("Sailor's layer profiles").

Run `python -m planner.calibration.sailor_layers` for the table and the ratios by GPU and tp.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
from dataclasses import dataclass

from planner.calibration.published import VALIDATION_DIR
from planner.calibration.sailor import SAILOR_PROFILE_CSV, SailorCase, sailor_cases
from planner.costs.stages import Part, plan_costs
from planner.specs.choices import Recompute
from planner.specs.plan import Pipeline, Plan, Stage

__all__ = ["LAYER_PROFILES_CSV", "LayerRow", "layer_rows"]

LAYER_PROFILES_CSV = os.path.join(VALIDATION_DIR, "sailor_opt350_layer_profiles.csv")
# (model, Sailor's GPU name) -> the row whose plan (model, cluster) prices the layer: an
# OPT-350M row on GH200 nodes, the mixed cluster's row with every RTX type, a GPT-Neo row
_TEMPLATE = {("OPT-350M", "GH-96"): "sailor-13", ("OPT-350M", "RTX-3090"): "sailor-36",
             ("OPT-350M", "Titan-RTX"): "sailor-36", ("OPT-350M", "RTX-2080"): "sailor-36",
             ("GPT-Neo-2.7B", "GH-96"): "sailor-03"}


@dataclass(frozen=True)
class LayerRow:
    model: str
    sailor_gpu: str
    gpu: str  # the catalog type
    mbs: int
    tp: int
    measured_forward_s: float
    measured_backward_s: float
    forward: Part
    backward: Part

    @property
    def forward_ratio(self) -> float:
        return self.forward.total_s / self.measured_forward_s

    @property
    def backward_ratio(self) -> float:
        return self.backward.total_s / self.measured_backward_s

    @property
    def ratio(self) -> float:
        """Model / measured of forward + backward."""
        return ((self.forward.total_s + self.backward.total_s)
                / (self.measured_forward_s + self.measured_backward_s))


# The heads Sailor's profiler built where they differ from the runs': its
# `profile_all.py` passes `--num-attention-heads 20` for "GPT-Neo-2.7" (model_configs,
# third_party/Megatron-DeepSpeed/profile_all.py, saha18uiuc/sailor@13b7942; GPT-Neo
# 2.7B's own 20 heads of 128), while the runs' training config has 32 of 80
# (`training_config_gpt_neo27.json`), which their logged memory confirms
# (sailor_memory.py: 32 heads -2..-5% on rows 1, 2, 4, 5, 9, 12; 20 heads -17%).
_PROFILED_HEADS = {"GPT-Neo-2.7B": 20}

# (model, profile file, its GPU where the file has no `gpu` column)
_PROFILES = (("OPT-350M", LAYER_PROFILES_CSV, None),
             ("GPT-Neo-2.7B", SAILOR_PROFILE_CSV, "GH-96"))


def _measured() -> list[tuple[str, str, int, int, float, float]]:
    out = []
    for model, path, gpu in _PROFILES:
        with open(path, newline="", encoding="utf-8") as fh:
            out += [(model, gpu or r["gpu"], int(r["mbs"]), int(r["tp"]),
                     float(r["forward_s"]), float(r["backward_s"]))
                    for r in csv.DictReader(fh)]
    return out


def _one_layer_plan(template: Plan, model: str, sailor_gpu: str, mbs: int, tp: int
                    ) -> Plan | None:
    """One stage of the whole model on tp GPUs of the first node of `sailor_gpu`'s group
    (None where a node has fewer), one micro-batch of `mbs`, with the heads the profiler
    built (`_PROFILED_HEADS`)."""
    cluster = template.cluster
    group = next(i for i, g in enumerate(cluster.node_groups) if g.name == sailor_gpu.lower())
    node = cluster.node_groups[group].gpus_per_node or 0
    if node < tp:
        return None
    devices = tuple(s.index for s in cluster.slots if s.group == group)[:tp]
    stage = Stage(layers=(0, template.model.num_layers), devices=devices, tp=tp,
                  recompute=Recompute.NONE)
    heads = _PROFILED_HEADS.get(model, template.model.num_heads)
    return dataclasses.replace(
        template, model=dataclasses.replace(template.model, num_heads=heads),
        pipelines=(Pipeline(stages=(stage,), micro_batch_size=mbs,
                                      num_microbatches=1),),
        training=dataclasses.replace(template.training, global_batch_size=mbs))


def layer_rows(cases: list[SailorCase] | None = None) -> list[LayerRow]:
    """Every profiled (model, GPU, micro-batch, tp) the rows' clusters can hold, priced."""
    plans = {c.id: c.plan for c in (cases or sailor_cases())}
    out = []
    for model, sailor_gpu, mbs, tp, fwd, bwd in _measured():
        template = plans[_TEMPLATE[model, sailor_gpu]]
        assert template is not None
        plan = _one_layer_plan(template, model, sailor_gpu, mbs, tp)
        if plan is None:
            continue
        cost = plan_costs(plan).costs[0][0]
        gpu = plan.group_of(plan.pipelines[0].stages[0]).gpu
        out.append(LayerRow(model, sailor_gpu, gpu, mbs, tp, fwd, bwd, cost.layer_forward,
                            cost.layer_backward))
    return out


def main() -> None:
    rows = layer_rows()
    ms = 1e3
    print(f"{'model':13} {'gpu':10} {'mbs':>4} {'tp':>3} | measured fwd / bwd ms | "
          f"model fwd / bwd ms (of which tp, host) | model/measured fwd, bwd, sum")
    for r in rows:
        print(f"{r.model:13} {r.sailor_gpu:10} {r.mbs:4d} {r.tp:3d} | "
              f"{r.measured_forward_s * ms:9.2f} {r.measured_backward_s * ms:9.2f} | "
              f"{r.forward.total_s * ms:8.2f} {r.backward.total_s * ms:8.2f} "
              f"({(r.forward.tp_s + r.backward.tp_s) * ms:6.2f}, "
              f"{(r.forward.host_s + r.backward.host_s) * ms:5.2f}) | "
              f"{r.forward_ratio:5.2f} {r.backward_ratio:5.2f} {r.ratio:5.2f}")
    print()
    print("median model/measured by model, GPU and tp (forward, backward, sum):")
    keys = sorted({(r.model, r.sailor_gpu, r.tp) for r in rows})
    for model, gpu, tp in keys:
        group = [r for r in rows if (r.model, r.sailor_gpu, r.tp) == (model, gpu, tp)]
        print(f"  {model:13} {gpu:10} tp {tp}: "
              f"{statistics.median(r.forward_ratio for r in group):5.2f} "
              f"{statistics.median(r.backward_ratio for r in group):5.2f} "
              f"{statistics.median(r.ratio for r in group):5.2f}  ({len(group)} sizes)")


if __name__ == "__main__":
    main()
