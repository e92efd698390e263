"""The embedding and the loss as layers of the pipeline split: Megatron-Core's
--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split add one
slot each to the layers it divides over pp x vp model chunks and take it off the first
(last) virtual stage (megatron/core/transformer/transformer_block.py
`get_num_layers_to_build`); the ModelZoo runs Qwen3-235B's 94 layers as pp 32 x vp 3 that
way (model_configs/benchmarking/Qwen3-235B-A22B.yaml)."""

import dataclasses

import pytest

from executor.preflight import check_runnable
from planner.export.formats import export_plan
from planner.export.frameworks import CAPABILITIES, plan_chunk_counts, unsupported
from planner.simulator import simulate
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import (
    ParallelConfig,
    check_parallel,
    chunk_sizes,
    homogeneous_plan,
    split_layers,
)
from planner.specs.model import preset
from profiler.schema import SpecError
from tests.executor.distributed import homogeneous


def test_qwen3_235b_split_over_96_model_chunks():
    counts = split_layers(94, 32, lead=1, tail=1)
    assert counts == [2] + [3] * 30 + [2] and sum(counts) == 94
    assert chunk_sizes(2, 3, lead=1) == [0, 1, 1]  # the embedding alone in chunk 0
    assert chunk_sizes(2, 3, tail=1) == [1, 1, 0]  # the loss alone in the last chunk
    assert chunk_sizes(3, 3) == [1, 1, 1]
    # the stage counts are those of the plain split; the chunks are not (embedding and
    # loss alone at the ends), and pp x vp = 96 chunks need the two slots
    assert split_layers(94, 32) == counts
    assert chunk_sizes(5, 2) == [3, 2]  # extra layers to the first chunks, as before


MODEL = dataclasses.replace(preset("gpt3-1.3b"), num_layers=6, seq_len=1024)
CLUSTER = parse_gpus_arg("A100-80GB-SXM:2")


def _cfg(**kw):
    base = dict(pp=2, vp=4, mbs=1, gbs=8, seq_len=1024, schedule="1f1b")
    return ParallelConfig(**{**base, **kw})


def test_interleaved_split_counts_embedding_and_loss():
    """pp 2 x vp 4 over 6 layers: 8 chunks need 8 slots, which the embedding and the loss
    make up; the first chunk holds only the embedding, the last only the loss."""
    with pytest.raises(SpecError, match=r"^--vp: 4 is not allowed \(pp\*vp = 8 model chunks"):
        check_parallel(_cfg(), MODEL, CLUSTER)  # interleaving added the chunks: --vp named
    cfg = _cfg(embedding_in_pipeline_split=True, loss_in_pipeline_split=True)
    check_parallel(cfg, MODEL, CLUSTER)
    plan = homogeneous_plan(MODEL, CLUSTER, cfg)
    assert [s.num_layers for s in plan.pipelines[0].stages] == [3, 3]
    assert plan_chunk_counts(plan) == [0, 1, 1, 1, 1, 1, 1, 0]
    args = export_plan(plan, "megatron").text
    assert "--pipeline-model-parallel-layout 'E|t*1|t*1|t*1|t*1|t*1|t*1|L'" in args
    assert not unsupported(plan, CAPABILITIES["megatron"])
    assert any("embedding / loss" in line for line in unsupported(plan, CAPABILITIES["trainplan"]))
    on_cpu = homogeneous(MODEL, world=2, pp=2, vp=4, mbs=1, gbs=8,
                         schedule="1f1b", embedding_in_pipeline_split=True,
                         loss_in_pipeline_split=True)
    with pytest.raises(SpecError, match="interleaved chunks by layers"):
        check_runnable(on_cpu, cuda_devices=0)
    assert simulate(plan).iteration_time_s > 0
    # without the settings a stage of 3 layers cannot fill 4 chunks
    with pytest.raises(SpecError, match="at least virtual_stages = 4 layers"):
        dataclasses.replace(plan, training=dataclasses.replace(
            plan.training, embedding_in_pipeline_split=False,
            loss_in_pipeline_split=False)).check("plan")


def test_embedding_only_and_head_only_stages():
    """Without interleaving the slots move layers off the end stages; with two layers over
    four stages the first holds the embedding alone and the last the head alone (DeepSpeed's
    PipelineModule partitions of issue 14), which the plan already allowed."""
    model = dataclasses.replace(MODEL, num_layers=2)
    cluster = parse_gpus_arg("A100-80GB-SXM:4")
    cfg = _cfg(pp=4, vp=1, embedding_in_pipeline_split=True, loss_in_pipeline_split=True)
    check_parallel(cfg, model, cluster)
    plan = homogeneous_plan(model, cluster, cfg)
    assert [s.num_layers for s in plan.pipelines[0].stages] == [0, 1, 1, 0]
    assert simulate(plan).iteration_time_s > 0
    assert "--pipeline-model-parallel-layout 'E|t*1|t*1|L'" in export_plan(plan, "megatron").text


def test_more_stages_than_layers_names_pp():
    with pytest.raises(SpecError, match=r"^--pp: 8 is not allowed \(pp\*vp = 8 model chunks"):
        check_parallel(_cfg(pp=8, vp=1), MODEL, CLUSTER)


@pytest.mark.parametrize("counts, vp, lead, tail", [((4, 4), 1, 0, 0), ((3, 4, 4, 3), 2, 0, 0),
                                                    ((5, 6, 6, 5), 3, 1, 1), ((1, 2), 2, 1, 0)])
def test_stage_layer_ranges_are_the_chunks_in_model_order(counts, vp, lead, tail):
    # Megatron-Core's interleaving: chunk c of stage s is model chunk c x pp + s
    # (schedules.py, `get_model_chunk_id`); the ranges cover the layers once, in order,
    # each chunk as long as `chunk_layer_counts` (the exports' count) says.
    from planner.export.frameworks import chunk_layer_counts
    from planner.specs.layout import stage_layer_ranges

    ranges = stage_layer_ranges(counts, vp, lead=lead, tail=tail)
    order = [ranges[s][c] for c in range(vp) for s in range(len(counts))]
    assert [len(r) for r in order] == chunk_layer_counts(counts, vp, lead=lead, tail=tail)
    assert [i for r in order for i in r] == list(range(sum(counts)))
    assert [sum(len(r) for r in chunks) for chunks in ranges] == list(counts)


def test_stage_moe_layers_count_the_pattern():
    # DeepSeek-V3: 3 dense layers, then MoE (arXiv:2412.19437 §4.2); interleaved over
    # pp 4 x vp 2, stage 0 holds model chunks 0 and 4: layers 0-7 and 32-38, three dense.
    from planner.specs.layout import stage_moe_layers

    v3 = preset("deepseek-v3")
    counts = tuple(split_layers(61, 4))
    per_stage = stage_moe_layers(v3, counts, 2)
    assert sum(per_stage) == v3.num_moe_layers == 58
    assert per_stage[0] == counts[0] - 3
    assert stage_moe_layers(v3, counts) == (counts[0] - 3, *counts[1:])
    # every layer alike: the model's average is exact, nothing to count
    assert stage_moe_layers(preset("mixtral-8x7b"), (16, 16)) == (None, None)
    assert stage_moe_layers(preset("llama3-8b"), (16, 16)) == (None, None)
