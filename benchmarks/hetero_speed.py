"""Wall time of `plan search` on large mixed clusters (issue: a 1,024-GPU cluster of three
GPU types and two NIC kinds with a 70B model in <= 30 s; 4,096 GPUs in <= 120 s).

    python benchmarks/hetero_speed.py [--gpus 1024|4096|both]

Exits 1 when a case runs over its budget or its best plan does not fit (the test suite
holds no wall-clock bounds: a busy machine must not fail a test).
"""

import argparse
import sys
import time

from planner.search import SearchRequest, search
from planner.specs.cluster import ClusterSpec, IslandLink, NodeGroup
from planner.specs.model import preset


def mixed_cluster(scale: int) -> ClusterSpec:
    """Three GPU types, two NIC kinds: H100 and A100 nodes on InfiniBand islands, L40S
    servers on RoCE, joined by 400 Gb/s Ethernet. `scale` 1 is 1,024 GPUs."""
    groups = (
        NodeGroup(name="h100", gpu="H100-80GB-SXM", num_nodes=32 * scale, island="ib-h100",
                  price_per_gpu_hour_usd=3.0),
        NodeGroup(name="a100", gpu="A100-80GB-SXM", num_nodes=64 * scale, island="ib-a100",
                  price_per_gpu_hour_usd=1.8),
        NodeGroup(name="l40s", gpu="L40S-48GB", num_nodes=32 * scale, nic="roce",
                  island="roce-l40s", price_per_gpu_hour_usd=1.0),
    )
    links = tuple(IslandLink(islands=pair, bandwidth_gbit_per_s=400 * scale)
                  for pair in (("ib-h100", "ib-a100"), ("ib-h100", "roce-l40s"),
                               ("ib-a100", "roce-l40s")))
    return ClusterSpec(name=f"mixed-{1024 * scale}", node_groups=groups,
                       island_links=links).resolved()


def run(scale: int, budget_s: float) -> bool:
    """Print the case; whether it met its budget and found a plan that fits."""
    cluster = mixed_cluster(scale)
    start = time.perf_counter()
    result = search(SearchRequest(model=preset("llama2-70b"), cluster=cluster,
                                  gbs=512 * scale, seq_len=4096, top=3))
    elapsed = time.perf_counter() - start
    best = result.ranked[0]
    print(f"{cluster.name} ({cluster.num_gpus} GPUs), llama2-70b: {elapsed:.1f} s "
          f"(budget {budget_s:.0f} s), {result.num_candidates:,} candidates; best "
          f"{best.result.iteration_time_s:.2f} s/iteration on {best.result.num_gpus} GPUs")
    for b in result.baselines:
        rated = "n/a" if b.result is None else f"{b.result.iteration_time_s:.2f} s"
        print(f"  baseline {b.name}: {rated} {b.note}")
    for note in result.notes:
        print(f"  note: {note}")
    ok = elapsed <= budget_s and best.result.fits
    if not ok:
        print(f"  OVER BUDGET or not fitting: {elapsed:.1f} s > {budget_s:.0f} s, "
              f"fits {best.result.fits}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", choices=("1024", "4096", "both"), default="both")
    args = ap.parse_args()
    ok = True
    if args.gpus in ("1024", "both"):
        ok &= run(1, 30.0)
    if args.gpus in ("4096", "both"):
        ok &= run(4, 120.0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
