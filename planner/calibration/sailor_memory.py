"""The Sailor artifact's logged peak memory against the memory model, held out: nothing
in the model is fitted to these rows.

What `max_mem` is (eth-easl/sailor, read at its fork saha18uiuc/sailor, which holds the
same records): the memory runs are separate jobs with PRINT_MEMORY=1
(ae_scripts/clariden_scripts/run.sh @075c9470), under which the PipelineEngine writes,
after every pipeline instruction, `TOTAL <nvidia-smi memory.used> Bytes, RESERVED
<torch.cuda.memory_reserved()> Bytes, ALLOCATED <torch.cuda.memory_allocated()> Bytes`
(deepspeed/pipe_engine.py @13b79423, `_exec_schedule` and `get_total_used_mem`);
ae_scripts/clariden_scripts/process_results.py @a83aefe3 (`get_mem`) keeps the largest
TOTAL among the last lines of all ranks' logs. So `max_mem` is the device memory in use
(CUDA context, NCCL buffers, the caching allocator's segments) after the last optimizer
step, on the rank that has the most: not `max_memory_allocated`, and not rank 0's alone.
The allocator keeps its segments, so it is the run's peak reserve plus what lies outside
the allocator.

The model's matching quantity is a rank's `StageMemory.total_bytes` (model states,
activations at the schedule's peak, transient buffers, and `runtime_reserve_bytes` for
the CUDA context, NCCL, cuBLAS and fragmentation), the largest over the plan's ranks.
Rank 0 (pipeline 0, stage 0: DeepSpeed's global rank 0 is stage 0 of data-parallel
replica 0) is printed beside it.

Rows 8 and 30 are printed, not scored (`SailorCase.inconsistent`): row 30's record,
`max_mem` included, is row 34's (`sailor.COPIED_RECORDS`); row 8's is not a run of its
layout (`ROW_8_MEMORY`, docs/calibration.md "Sailor").

What the rows say (nothing tuned to them): the 34 rows' mean |error| is 24.1%, GH200
pipelined 10.8% (its large-activation rows within -2..-7%). It was 51.3% while the plans
priced Megatron's default dropout, whose mask and output the model saves beside the
softmax output (9 bytes a score in fp32 against 4, `workload._saved_activation_bytes`):
Sailor's OPT and GPT-Neo attention feeds the softmax straight into the second batched
GEMM (`sailor._DROPOUT`), so the plans now apply the dropout the layers apply. Left:
- small runs (rows 3, 6, 7, 13, 14, 23, 24) hold 2.1-3.5 GiB more than the model, beyond
  its 2 GiB runtime reserve (CUDA context, NCCL buffers, cuBLAS workspace, the
  allocator's cache): two to three times that reserve is in use on a GH200;
- rows 28 and 29 (mixed RTX, +222% / +175%) logged 3.8 and 5.5 GiB, less than one
  stage's fp32 softmax outputs (row 28) or its fp32 Adam states and weights (row 29,
  16 bytes a parameter of OPT-350M: 5.3 GiB) need: not a record of those layouts;
- row 11 logged 26.6 GiB where rows 1, 5 and 9, the same per-rank layout, logged 34.8.

Run `python -m planner.calibration.sailor_memory` for the table and the error by group.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from planner.calibration.sailor import SailorCase, sailor_cases
from planner.predict.results import SimResult
from planner.specs.plan import Plan

__all__ = ["MemoryScore", "RowMemory", "score_memory"]

GIB = 1024**3
ROW_8_MEMORY = ("its 18.2 GiB is what OPT-350M logged on the same layout (row 25, 17.9 GiB), "
                "short of the fp32 Adam states of its 667 M parameters a rank (9.9 GiB) plus "
                "one micro-batch of 32 layers' activations")


@dataclass(frozen=True)
class RowMemory:
    case: SailorCase
    peak_bytes: float  # the largest rank's total
    rank0_bytes: float  # pipeline 0, stage 0

    @property
    def measured_bytes(self) -> float:
        assert self.case.measured_mem_bytes is not None
        return float(self.case.measured_mem_bytes)

    @property
    def error(self) -> float:
        return self.peak_bytes / self.measured_bytes - 1

    @property
    def rank0_error(self) -> float:
        return self.rank0_bytes / self.measured_bytes - 1


@dataclass(frozen=True)
class MemoryScore:
    rows: tuple[RowMemory, ...]

    @property
    def scored(self) -> tuple[RowMemory, ...]:
        return tuple(r for r in self.rows if not r.case.inconsistent)

    def by_group(self) -> dict[str, tuple[float, int]]:
        """Per group (`SailorCase.group`): mean |error| of the largest rank, row count."""
        groups = sorted({r.case.group for r in self.scored})
        return {g: (statistics.mean(abs(r.error) for r in self.scored if r.case.group == g),
                    sum(r.case.group == g for r in self.scored)) for g in groups}

    @property
    def mape(self) -> float:
        return statistics.mean(abs(r.error) for r in self.scored)

    @property
    def rank0_mape(self) -> float:
        return statistics.mean(abs(r.rank0_error) for r in self.scored)


def score_memory(cases: list[SailorCase], simulate: Callable[[Plan], SimResult]) -> MemoryScore:
    """Every expressible row with a logged `max_mem`; `MemoryScore.scored` leaves out the
    inconsistent ones."""
    rows = []
    for c in cases:
        if c.plan is None or c.measured_mem_bytes is None:
            continue
        stages = simulate(c.plan).stages
        rank0 = next(s for s in stages if s.pipeline == 0 and s.stage == 0)
        rows.append(RowMemory(c, max(s.memory.total_bytes for s in stages),
                              rank0.memory.total_bytes))
    return MemoryScore(tuple(rows))


def main() -> None:
    from planner.simulator import simulate

    s = score_memory(sailor_cases(), simulate)
    print(f"{'row':9} {'group':24} {'measured':>9} {'largest rank':>17} {'rank 0':>17}")
    for r in s.rows:
        line = (f"{r.case.id} {r.case.group:24} {r.measured_bytes / GIB:5.1f} GiB "
                f"{r.peak_bytes / GIB:5.1f} GiB {r.error:+7.1%} "
                f"{r.rank0_bytes / GIB:5.1f} GiB {r.rank0_error:+7.1%}")
        if r.case.inconsistent:
            why = ROW_8_MEMORY if r.case.id == "sailor-08" else r.case.inconsistent
            line += f"  not scored: {why}"
        print(line)
    print()
    for group, (mape, n) in s.by_group().items():
        print(f"{group:24} {n:2d} rows  mean |error| {mape:6.1%}")
    print(f"{'all scored':24} {len(s.scored):2d} rows  mean |error| {s.mape:6.1%}  "
          f"(rank 0 alone: {s.rank0_mape:6.1%})")


if __name__ == "__main__":
    main()
