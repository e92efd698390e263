"""The Sailor artifact's logged peak memory (`max_mem`) against the memory model
(planner/calibration/sailor_memory.py), held out."""

from planner.calibration.sailor import sailor_cases
from planner.calibration.sailor_memory import score_memory
from planner.simulator import simulate


def test_every_row_logs_its_peak_memory():
    cases = sailor_cases()
    assert all(c.measured_mem_bytes is not None for c in cases)
    row = next(c for c in cases if c.id == "sailor-01")
    assert row.measured_mem_bytes == 37281071104  # nvidia-smi's MiB, in bytes


def test_memory_error_is_bounded():
    """34 rows scored (8 and 30 printed only). Measured 24.1% mean |error| of the largest
    rank, GH200 pipelined 10.8% (51.3% / 40.2% while the plans priced the attention
    dropout Sailor's OPT and GPT-Neo layers do not apply: the module's docstring)."""
    s = score_memory(sailor_cases(), simulate)
    assert len(s.rows) == 36
    assert {r.case.id for r in s.rows} - {r.case.id for r in s.scored} == {"sailor-08",
                                                                             "sailor-30"}
    assert s.mape <= 0.25
    assert s.by_group()["GH200 pipelined"][0] <= 0.115
    # the largest rank, not rank 0: row 10's stage 1 (5 layers x 7 micro-batches in
    # flight) holds more than stage 0 (2 x 8)
    row10 = next(r for r in s.rows if r.case.id == "sailor-10")
    assert row10.peak_bytes > 1.5 * row10.rank0_bytes
