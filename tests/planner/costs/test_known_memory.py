"""No false "does not fit", no false "fits": configurations known to have run must fit,
ones known to have run out of memory must not (planner/data/validation/known_memory.csv;
each row names its source: torchtitan's, llm-foundry's and NeMo AutoModel's published
benchmark tables, Korthikanti et al. 2022, and GitHub issues with the exact configuration
and the OOM). A row naming a `preset` takes that model (an MoE one: its experts split over
`ep`); `master_weights` 0 trains without fp32 master weights (`Training.master_weights`)."""

import csv
import dataclasses
import os

import pytest

from planner.costs.stages import plan_costs
from planner.specs.choices import Recompute, ShardingPreset
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.layout import ParallelConfig, homogeneous_plan, sharding_preset
from planner.specs.model import ModelSpec, preset
from planner.specs.plan import Kernels
from profiler.devices import device

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "planner", "data",
                    "validation", "known_memory.csv")
ROWS = list(csv.DictReader(open(DATA, encoding="utf-8")))
GIB = 1024**3

# torchtitan's H100s are Grand Teton's 96 GB HBM2e, 500 W part (docs/performance.md), not
# the catalog's 80 GB SXM: defined here as a user would.
H100_96 = dataclasses.replace(device("H100-80GB-SXM"), name="H100-96GB-HBM2e", memory_gib=95.0,
                              memory_bandwidth_gb_per_s=2400,
                              source="torchtitan docs/performance.md (Grand Teton)")


def _cluster(gpu: str, count: int) -> ClusterSpec:
    own = (H100_96,) if gpu == H100_96.name else ()
    dev = own[0] if own else device(gpu)
    per_node = min(count, dev.node.gpus_per_node)
    return ClusterSpec(name=f"{count}x {gpu}", devices=own, node_groups=(NodeGroup(
        name="g", gpu=gpu, num_nodes=count // per_node, gpus_per_node=per_node,
        nic="infiniband", nics_per_node=8, nic_bandwidth_gbit_per_s=400),)).resolved()


def _model(r: dict) -> ModelSpec:
    if r["preset"]:
        return dataclasses.replace(preset(r["preset"]), seq_len=int(r["seq"]))
    return ModelSpec(name=r["model"], num_layers=int(r["layers"]), hidden_size=int(r["hidden"]),
                     num_heads=int(r["heads"]), num_kv_heads=int(r["kv_heads"]),
                     ffn_hidden_size=int(r["ffn"]), vocab_size=int(r["vocab"]),
                     seq_len=int(r["seq"]), activation=r["activation"], norm=r["norm"],
                     position_embedding=r["position"], tied_embeddings=r["tied"] == "1",
                     dropout=r["dropout"] == "1")


def _peak(r: dict) -> tuple[float, float]:
    """(predicted peak GiB of the fullest rank, its capacity GiB)."""
    m = _model(r)
    dp, tp = int(r["dp"]), int(r["tp"])
    cfg = ParallelConfig(tp=tp, pp=int(r["pp"]), dp=dp, mbs=int(r["mbs"]), gbs=int(r["gbs"]),
                         seq_len=m.seq_len, recompute=Recompute(r["recompute"]),
                         sequence_parallel=tp > 1, dtype=r["dtype"],
                         sharding=sharding_preset(ShardingPreset(r["sharding"]), dp),
                         ep=int(r["ep"] or 1))
    plan = homogeneous_plan(m, _cluster(r["gpu"], int(r["gpus"])), cfg,
                            kernels=Kernels(attention=r["attention"]))
    if r["master_weights"] == "0":
        plan = dataclasses.replace(plan, training=dataclasses.replace(
            plan.training, master_weights=False))
    worst = max((c.memory for pc in plan_costs(plan).costs for c in pc),
                key=lambda mem: mem.total_bytes)
    return worst.total_bytes / GIB, worst.capacity_bytes / GIB


@pytest.mark.parametrize("r", ROWS, ids=[r["id"] for r in ROWS])
def test_known_runs_fit_and_known_ooms_do_not(r):
    peak, capacity = _peak(r)
    why = f"{r['source']}: {r['note']} (predicted {peak:.1f} of {capacity:.1f} GiB)"
    if r["outcome"] == "ran":
        assert peak <= capacity, why
        if r["peak_gib"]:  # measured peaks bound the prediction from below, loosely
            assert peak >= 0.9 * float(r["peak_gib"]), why
    else:
        assert peak > capacity, why
