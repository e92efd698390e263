"""Wall time of `plan search` over the full homogeneous space (issue: GPT-3 175B on 1,024
A100-80GB, gbs 1536: <= 10 s; Llama-3-405B on 16,384 H100, gbs 2048, seq 8192: <= 60 s).

    python benchmarks/search_speed.py

Exits 1 when a case runs over its budget, searches fewer than 1,000 candidates or finds no
plan that fits (wall-clock bounds live here, not in the test suite).
"""

import sys
import time

from planner.search import SearchRequest, search
from planner.specs.cluster import parse_gpus_arg
from planner.specs.model import preset

CASES = [
    ("gpt3-175b", "A100-80GB-SXM:1024", 1536, 2048, 10.0),
    ("llama3-405b", "H100-80GB-SXM:16384", 2048, 8192, 60.0),
]


def main() -> None:
    ok = True
    for model, gpus, gbs, seq, budget_s in CASES:
        start = time.perf_counter()
        result = search(SearchRequest(model=preset(model), cluster=parse_gpus_arg(gpus),
                                      gbs=gbs, seq_len=seq))
        elapsed = time.perf_counter() - start
        best = result.ranked[0]
        stage = best.plan.pipelines[0].stages[0]
        print(f"{model} on {gpus}, gbs {gbs}, seq {seq}: {elapsed:.1f} s (budget {budget_s:.0f} s) "
              f"for {result.num_candidates:,} candidates on {result.num_layouts} layouts; best "
              f"tp {stage.tp} pp {len(best.plan.pipelines[0].stages)} dp {best.plan.dp} "
              f"cp {stage.cp}: {best.result.iteration_time_s:.2f} s/iter, "
              f"MFU {best.result.mfu * 100:.1f}%")
        if elapsed > budget_s or result.num_candidates <= 1000 or not best.result.fits:
            print("  OVER BUDGET, too few candidates or not fitting")
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
