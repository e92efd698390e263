"""The communication model against published nccl-tests figures.

planner/data/reference/nccl_tests.csv holds 104 measured collective points with their
hardware (its README names every source). Each row whose GPU, node and NIC the catalog can
describe becomes a cluster and a group; the model's time (planner/costs/comm.py) is set
beside the measured one, with nccl-tests' bus bandwidth. Rows on EFA are priced as RoCE
(RDMA); rows the model cannot describe (TCPXO, unknown NICs or GPUs) are listed as such.

Run `python -m planner.calibration.nccl_tests`.
"""

from __future__ import annotations

import csv
import os
import statistics
from dataclasses import dataclass

from planner.costs.comm import (
    collective_choices,
    collective_time_s,
    group_ranks,
    group_tiers,
)
from planner.specs.cluster import ClusterSpec, NodeGroup

__all__ = ["NcclCase", "nccl_cases"]

REFERENCE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "reference")
# the GPU a row's hardware names, as the catalog calls it
GPUS = (("GH200", "GH200-96GB"), ("A100", "A100-80GB-SXM"), ("H100", "H100-80GB-SXM"),
        ("H200", "H200-141GB-SXM"),
        ("H20", "H100-80GB-SXM"), ("B200", "B200-180GB"), ("V100", "V100-32GB-SXM2"),
        ("RTX 4090", "RTX4090-24GB"))
NICS = {"ib-hdr": "infiniband", "ib-ndr": "infiniband", "roce": "roce", "efa": "roce",
        "tcp": "ethernet"}
KINDS = {"all_reduce": "all_reduce", "all_gather": "all_gather",
         "reduce_scatter": "reduce_scatter", "sendrecv": "send_recv", "alltoall": "all_to_all"}
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "send_recv": lambda n: 1.0,
              "all_to_all": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class NcclCase:
    id: str
    description: str
    kind: str
    size_bytes: float
    ranks: int
    measured_busbw_gb_per_s: float | None
    measured_s: float | None
    predicted_s: float
    choice: str  # NCCL's (algorithm, protocol) in the model

    @property
    def predicted_busbw_gb_per_s(self) -> float:
        return self.size_bytes / self.predicted_s * BUS_FACTOR[self.kind](self.ranks) / 1e9


def _cluster(r: dict[str, str]) -> tuple[ClusterSpec, tuple[int, ...]] | None:
    gpu = next((name for token, name in GPUS if token in r["hardware"]), None)
    if gpu is None or not r["gpus"] or r["nic_kind"] not in (*NICS, "nvlink", "pcie"):
        return None
    gpus, per_node = int(r["gpus"]), int(r["gpus_per_node"])
    group: dict[str, object] = {}
    if r["nic_kind"] in NICS:
        if not r["nic_gbit_per_s"]:
            return None
        group = {"nic": NICS[r["nic_kind"]], "nics_per_node": int(r["nics_per_node"] or 1),
                 "nic_bandwidth_gbit_per_s": float(r["nic_gbit_per_s"])}
    elif r["nic_kind"] == "pcie":
        if "no P2P" in r["hardware"] or "P2P not supported" in r["hardware"]:
            return None  # GeForce without P2P: not a catalog GPU
        group = {"intra_node_link": "pcie",
                 "intra_node_bandwidth_gb_per_s": float(r["nic_gbit_per_s"]) / 8}
    # one GPU per node used out of a full node: the node keeps its 8 GPUs and NICs
    full = 8 if per_node == 1 and int(r["nics_per_node"] or 0) == 8 else per_node
    node_group = NodeGroup(name="g", gpu=gpu, num_nodes=max(1, gpus // per_node),
                           gpus_per_node=full, **group)  # type: ignore[arg-type]  # literals above
    cluster = ClusterSpec(name=f"row {r['id']}", node_groups=(node_group,)).resolved()
    members = tuple(range(0, cluster.num_gpus, full)) if per_node == 1 else tuple(range(gpus))
    return cluster, members


def nccl_cases(path: str | None = None) -> tuple[list[NcclCase], list[str]]:
    """The rows the model can describe, and one line for each it cannot."""
    with open(path or os.path.join(REFERENCE_DIR, "nccl_tests.csv"), newline="",
              encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    cases, skipped = [], []
    for r in rows:
        built = _cluster(r) if r["bytes"] else None
        if built is None:
            skipped.append(f"row {r['id']}: {r['hardware'][:60]} ({r['nic_kind']}, "
                           f"{r['bytes'] or 'no size'})")
            continue
        cluster, members = built
        kind = KINDS[r["collective"]]
        tiers = group_tiers(cluster, members[:2] if kind == "send_recv" else members)
        size = float(r["bytes"])
        choice = ""
        if kind in ("all_reduce", "all_gather", "reduce_scatter"):
            best = min(collective_choices(kind, size, tiers), key=lambda c: c.time_s)
            choice = f"{best.algorithm}/{best.protocol}"
        cases.append(NcclCase(
            id=r["id"], description=r["hardware"][:44], kind=kind, size_bytes=size,
            ranks=group_ranks(tiers),
            measured_busbw_gb_per_s=float(r["busbw_gb_per_s"]) if r["busbw_gb_per_s"] else None,
            measured_s=float(r["time_us"]) * 1e-6 if r["time_us"] else None,
            predicted_s=collective_time_s(kind, size, tiers), choice=choice))
    return cases, skipped


def main() -> None:
    cases, skipped = nccl_cases()
    errors = []
    for c in cases:
        err = "" if c.measured_s is None else f"{c.predicted_s / c.measured_s - 1:+6.0%}"
        if c.measured_s is not None:
            errors.append(c.predicted_s / c.measured_s - 1)
        measured = "-" if c.measured_busbw_gb_per_s is None else f"{c.measured_busbw_gb_per_s:g}"
        print(f"row {c.id:>3} {c.ranks:4d} ranks {c.description:44} {c.kind:14} "
              f"{c.size_bytes:>13.0f} B  busbw {measured:>7} model {c.predicted_busbw_gb_per_s:8.3g}"
              f" GB/s  time {err:>6}  {c.choice}")
    print(f"\n{len(cases)} rows priced, median |time error| "
          f"{statistics.median(abs(e) for e in errors):.0%}; {len(skipped)} not described:")
    for line in skipped:
        print("  " + line)


if __name__ == "__main__":
    main()
