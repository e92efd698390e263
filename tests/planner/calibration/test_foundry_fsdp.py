"""The held-out LLM Foundry rows (planner/data/validation/foundry_fsdp.csv: MosaicML's MPT
training throughputs with FSDP FULL_SHARD on H100 and A100, llm-foundry
scripts/train/benchmarking/README.md; sources per row and in the folder's README).

Nothing in the cost model was fitted to these rows. The error bound below is a regression
guard for a held-out set, not an accuracy target: it is the MAPE measured when the rows
were priced with the attention kernel they ran (7.97%, FlashAttention's Triton port at its
published slowdown; 18.20% when the file was added and they were priced as
FlashAttention-2; docs/calibration.md "LLM Foundry FSDP (held out)") rounded up to the next
whole percent plus one point. A change that breaks it made the held-out predictions worse:
find the mechanism, never widen the bound to pass.
"""

import csv
import re

import pytest

from planner.calibration.published import (
    FOUNDRY_COMM,
    FOUNDRY_FSDP,
    foundry_cases,
    foundry_groups,
    foundry_rows,
    foundry_summary,
)
from planner.simulator import simulate
from planner.specs.choices import DType, Recompute
from profiler.kernels import Attention


@pytest.fixture(scope="module")
def summary():
    return foundry_summary(simulate)


@pytest.fixture(scope="module")
def plans():
    return {c.id: c.plans[0] for c in foundry_cases()}


def test_every_row_is_read_and_priced(summary):
    """Each line of the CSV becomes one case with its published layout (micro-batch,
    accumulation and GPU count are published, so one plan per row) and gets a time."""
    with open(FOUNDRY_FSDP, newline="", encoding="utf-8") as fh:
        lines = list(csv.DictReader(fh))
    cases = foundry_cases()
    assert len(lines) == len(cases) == 201
    assert [c.id for c in cases] == [r["id"] for r in lines]
    assert all(len(c.plans) == 1 for c in cases), [c.id for c in cases if len(c.plans) != 1]
    s, _ = summary
    assert not s.failed and s.count == len(cases)
    assert set(s.errors) == {r["id"] for r in lines}



def test_each_model_has_the_parameters_the_table_reports(plans):
    """The README's NumParams column (copied into each note) is MPTConfig's count with
    linear biases, which ModelSpec does not price: 9 x d_model per block (Wqkv 3d,
    out_proj d, up_proj 4d, down_proj d). Matching it to the parameter checks the shape
    (yaml d_model, n_layers, vocab 50368), the tied embedding and the learned position
    table of max_seq_len x d_model on every row."""
    for r in foundry_rows():
        m = plans[r["id"]].model
        published = int(re.search(r"NumParams (\d+)", r["note"]).group(1))
        assert m.num_params() + 9 * m.hidden_size * m.num_layers == published, r["id"]


def test_the_rows_run_as_composer_ran_them(plans):
    """FSDP FULL_SHARD over every GPU (ZeRO-3), Composer's communication (bf16 gradient
    reduction: DEFAULT before mosaicml/composer#2628 and PURE both reduce in the autocast
    dtype), MPT's defaults the yamls keep, Triton FlashAttention, and recompute from the
    table's Activation Checkpointing column."""
    rows = {r["id"]: r for r in foundry_rows()}
    for case_id, plan in plans.items():
        gpus = int(rows[case_id]["gpus"])
        assert plan.sharding.params == plan.sharding.grads == plan.sharding.optim == gpus
        assert plan.training.comm == FOUNDRY_COMM
        assert plan.kernels.attention == Attention.FLASH_TRITON
        m = plan.model
        assert m.tied_embeddings and m.position_embedding == "learned" and not m.dropout
        assert m.activation == "gelu" and m.norm == "layernorm"
    assert FOUNDRY_COMM.grad_reduce_dtype == "bf16" and FOUNDRY_COMM.overlap_grad_reduce
    assert FOUNDRY_COMM.shard_prefetch == 1
    fp8 = plans["foundry-h100-fp8-mpt-3b-s32768-g8-b144"]
    assert fp8.training.dtype == DType.FP8
    assert fp8.pipelines[0].stages[0].recompute == Recompute.FULL  # Activation Checkpointing True
    plain = plans["foundry-a100-40gb-mpt-125m-s512-g8-b2496"]
    assert plain.training.dtype == DType.BF16
    assert plain.pipelines[0].stages[0].recompute == Recompute.NONE
    assert plain.pipelines[0].micro_batch_size == 104
    assert plain.pipelines[0].num_microbatches == 3  # 2496 = 8 GPUs x 104 x 3


def test_held_out_error_stays_within_its_guard(summary):
    s, oom = summary
    assert s.mape <= 0.09, f"MAPE {s.mape:.4f}"
    assert len(oom) <= 0, oom  # runs the memory model calls out of memory (they ran)


def test_the_error_does_not_grow_with_the_sequence(summary):
    """Priced as FlashAttention-2, the rows erred -7% at sequence 512 and -40% at 65,536
    (the attention's share of the step grows with the sequence). Priced as the Triton
    port they ran, at its published slowdown, no sequence group is off by more than 10%
    on average, and the longest sequences are no worse than the shortest."""
    s, _ = summary
    groups = {g.key[0]: g for g in foundry_groups(s.errors, ("seq",))}
    assert all(abs(g.mean) <= 0.10 for g in groups.values()), {
        k: round(g.mean, 3) for k, g in groups.items()}
    assert groups[65536].mape <= groups[512].mape + 0.05


def test_groups_split_the_rows_by_gpu_and_gpu_count():
    rows = foundry_rows()
    errors = {r["id"]: (0.5 if r["gpu"] == "H100-80GB-SXM" else -0.1) for r in rows}
    groups = {g.key: g for g in foundry_groups(errors, ("gpu",))}
    assert {k: g.count for k, g in groups.items()} == {("A100-40GB-SXM",): 78,
                                                        ("A100-80GB-SXM",): 61,
                                                        ("H100-80GB-SXM",): 62}
    assert groups[("H100-80GB-SXM",)].mean == pytest.approx(0.5)
    assert sum(g.share for g in groups.values()) == pytest.approx(
        sum(abs(e) for e in errors.values()) / len(errors))
    gpus = {g.key[0]: g.count for g in foundry_groups(errors, ("gpus",))}
    assert gpus == {8: 152, 16: 12, 32: 15, 64: 13, 128: 9}
    dtypes = {g.key[0]: g.count for g in foundry_groups(errors, ("dtype",))}
    assert dtypes == {"bf16": 191, "fp8": 10}
    with pytest.raises(ValueError, match="unknown LLM Foundry field"):
        foundry_groups(errors, ("framework",))
