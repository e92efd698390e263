"""The numerics check's numbers: every plan kind of tests/executor/test_numerics.py, run
for 5 steps on gloo, against the one-process run of the same global batch.

    python -m benchmarks.numerics              # a Markdown table of max relative errors
    python -m benchmarks.numerics --dtype fp16 # the same plans in fp16 (loss scaling)

In fp16 the reference adds the plan's micro-batches' gradients one by one, as the
executor does (tests/executor/test_fp16.py `fp16_reference`); the error against the
whole-batch reference is shown beside it.
"""

import argparse
import tempfile
import time
from dataclasses import replace

import torch

from planner.specs.plan import describe_layout
from tests.executor.distributed import run_forked
from tests.executor.test_fp16 import fp16_reference
from tests.executor.test_numerics import PLANS, STEPS, _reference


def _error(got: list[float], ref: list[float] | tuple[float, ...]) -> float:
    return max(abs(a - b) / b for a, b in zip(got, ref, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    parser.add_argument("--kinds", help="comma-separated plan kinds (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fp16 = args.dtype == "fp16"
    extra = " | vs the whole batch at once | loss scales, skipped steps" if fp16 else ""
    print(f"| plan kind | ranks | layout | max relative loss error over 5 steps{extra} |")
    print("|---|---|---|---|" + ("---|---|" if fp16 else ""))
    kinds = args.kinds.split(",") if args.kinds else list(PLANS)
    for kind in kinds:
        plan = PLANS[kind]()
        if fp16:
            plan = replace(plan, training=replace(plan.training, dtype="fp16"))
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            codes, metrics = run_forked(plan, folder, steps=STEPS)
            elapsed = time.perf_counter() - start
        assert metrics is not None, (kind, codes)
        tr = plan.training
        got = metrics["losses"]
        layout = describe_layout(plan).split(", gbs")[0]
        row = f"| {kind} | {plan.num_gpus_used} | {plan.model.name}: {layout} | "
        if fp16:
            err = _error(got, fp16_reference(plan))
            whole = _error(got, fp16_reference(plan, whole_batch=True))
            scales = sorted(set(metrics["loss_scales"]))
            row += (f"{err:.1e} ({elapsed:.1f} s) | {whole:.1e} | {scales}, "
                    f"{metrics['skipped_steps']} |")
        else:
            ref = _reference(plan.model.name, tr.global_batch_size, tr.seq_len)
            row += f"{_error(got, ref):.1e} ({elapsed:.1f} s) |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
