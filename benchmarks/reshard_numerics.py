"""The resharding check's numbers: every pair of tests/executor/test_reshard.py RESHARDS
(a checkpoint written under plan A after step 3, resumed under plan B for steps 4 and 5),
against A's uninterrupted run and the one-process run of the same global batch.

    python -m benchmarks.reshard_numerics    # a Markdown table of max relative errors
"""

import tempfile
import time
from pathlib import Path

import torch

from tests.executor.test_numerics import PLANS
from tests.executor.test_reshard import RESHARDS, reshard


def main() -> None:
    torch.set_num_threads(1)
    print("| written under -> resumed under | ranks | model | max relative loss difference, "
          "steps 4-5: vs uninterrupted A | vs one process |")
    print("|---|---|---|---|---|")
    for case, (a, b) in RESHARDS.items():
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            out = reshard(case, Path(folder))
            elapsed = time.perf_counter() - start
        plan_a, plan_b = PLANS[a](), PLANS[b]()
        print(f"| {case} | {plan_a.num_gpus_used} -> {plan_b.num_gpus_used} | "
              f"{plan_a.model.name} | {out['vs_whole']:.1e} | {out['vs_reference']:.1e} "
              f"({elapsed:.1f} s) |", flush=True)


if __name__ == "__main__":
    main()
