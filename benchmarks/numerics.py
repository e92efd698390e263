"""The numerics check's numbers: every plan kind of tests/executor/test_numerics.py, run
for 5 steps on gloo, against the one-process run of the same global batch.

    python -m benchmarks.numerics            # a Markdown table of max relative errors
"""

import tempfile
import time

import torch

from planner.specs.plan import describe_layout
from tests.executor.distributed import run_forked
from tests.executor.test_numerics import PLANS, STEPS, _reference


def main() -> None:
    torch.set_num_threads(1)
    print("| plan kind | ranks | layout | max relative loss error over 5 steps |")
    print("|---|---|---|---|")
    for kind, make in PLANS.items():
        plan = make()
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            codes, metrics = run_forked(plan, folder, steps=STEPS)
            elapsed = time.perf_counter() - start
        assert metrics is not None, (kind, codes)
        tr = plan.training
        ref = _reference(plan.model.name, tr.global_batch_size, tr.seq_len)
        err = max(abs(a - b) / b for a, b in zip(metrics["losses"], ref, strict=True))
        layout = describe_layout(plan).split(", gbs")[0]
        print(f"| {kind} | {plan.num_gpus_used} | {plan.model.name}: {layout} | {err:.1e} "
              f"({elapsed:.1f} s) |", flush=True)


if __name__ == "__main__":
    main()
