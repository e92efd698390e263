"""torchtitan TOML checked by torchtitan 0.2.2's own ConfigManager (TOML -> JobConfig) and
ParallelDims (the degrees must multiply to the world size)."""

import pytest

from planner.export.formats import export_plan
from planner.export.frameworks import chunk_layer_counts, plan_shape
from planner.specs.plan import Communication, Sharding
from tests.planner.export.framework_helpers import (
    framework,
    gpt3_on_selene,
    plan_on,
    torchtitan_config_manager,
)

pytestmark = pytest.mark.frameworks

# torchtitan's communication (FSDP2, tp collectives in line), which its plans are priced with
FSDP2 = Communication.preset("fsdp2", dtype="bf16")


def _parse(plan, tmp_path):
    out = export_plan(plan, "torchtitan")
    assert out.unsupported == (), out.unsupported
    path = tmp_path / "config.toml"
    path.write_text(out.text)
    config = torchtitan_config_manager()().parse_args(["--job.config_file", str(path)])
    par, tr = config.parallelism, config.training
    dims = framework("torchtitan.distributed.parallel_dims").ParallelDims(
        dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
        cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
        pp=par.pipeline_parallel_degree, ep=1, etp=1, world_size=plan.num_gpus_used)
    s = plan_shape(plan)
    assert (dims.tp, dims.pp, dims.cp, dims.dp_replicate * dims.dp_shard) == (s.tp, s.pp, s.cp,
                                                                          s.dp)
    assert dims.dp_shard == plan.sharding.params  # FSDP2 shards all three states at P
    assert tr.global_batch_size == plan.training.global_batch_size
    if s.pp > 1:  # one step per replica, split into micro-batches of pipeline's size
        assert par.pipeline_parallel_microbatch_size == s.mbs
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == s.num_microbatches
        assert tr.global_batch_size == tr.local_batch_size * s.dp
        chunks = par.module_fqns_per_model_part
        assert len(chunks) == s.pp * s.vp
        assert [sum(n.startswith("layers.") for n in c) for c in chunks] == chunk_layer_counts(
            s.layers, s.vp)
    else:  # torchtitan accumulates gradients over global / (local * dp) micro-batches
        assert tr.local_batch_size == s.mbs
        assert tr.global_batch_size // (tr.local_batch_size * s.dp) == s.num_microbatches
    assert config.activation_checkpoint.mode == s.recompute[0]
    return config


def test_interleaved_fsdp(tmp_path):
    plan = plan_on("H100-80GB-SXM:16", tp=2, pp=2, dp=4, vp=2, mbs=1, gbs=32,
                   sequence_parallel=True, sharding=Sharding(params=4, grads=4, optim=4),
                   comm=FSDP2)
    config = _parse(plan, tmp_path)
    assert config.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    assert (config.model.name, config.model.flavor) == ("llama3", "8B")


def test_uneven_stages_hsdp_full_recompute(tmp_path):
    plan = plan_on("H100-80GB-SXM:24", tp=2, pp=3, dp=4, mbs=2, gbs=32, recompute="full",
                   sequence_parallel=True, sharding=Sharding(params=2, grads=2, optim=2),
                   comm=FSDP2)
    assert len(set(plan_shape(plan).layers)) > 1
    config = _parse(plan, tmp_path)
    assert config.parallelism.data_parallel_replicate_degree == 2
    assert config.parallelism.module_fqns_per_model_part[0][0] == "tok_embeddings"
    assert config.parallelism.module_fqns_per_model_part[-1][-2:] == ["norm", "output"]


def test_data_parallel_with_accumulation(tmp_path):
    _parse(plan_on("H100-80GB-SXM:8", dp=8, mbs=2, gbs=64), tmp_path)


def test_refusals():
    selene = export_plan(gpt3_on_selene(), "torchtitan")  # ZeRO-1, selective
    assert any(u.startswith("sharding P/G/OS 1/1/8") for u in selene.unsupported)
    assert any(u.startswith("recompute selective") for u in selene.unsupported)
    no_sp = export_plan(plan_on("H100-80GB-SXM:16", tp=2, dp=8, gbs=64), "torchtitan")
    assert any("without sequence parallelism" in u for u in no_sp.unsupported)


def test_bf16_with_tp_or_pp_needs_sharded_parameters():
    """torchtitan's mixed precision is FSDP2's, or autocast without tp and pp
    (distributed/utils.py maybe_enable_amp): bf16 at tp 2 with replicate-only data
    parallelism was exported with exit 0 and would have computed in fp32. It is listed,
    and the search plans torchtitan's tp / pp layouts with sharded parameters only."""
    from planner.search import SearchRequest, search
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan
    from planner.specs.model import preset

    gpus = parse_gpus_arg("H100-80GB-SXM:8")
    for tp, pp in ((2, 1), (1, 2)):
        plan = homogeneous_plan(preset("llama3-8b"), gpus, ParallelConfig(
            tp=tp, pp=pp, dp=8 // (tp * pp), mbs=1, gbs=32, seq_len=4096,
            sequence_parallel=tp > 1))
        issues = export_plan(plan, "torchtitan").unsupported
        assert any(i.startswith(f"bf16 with tp {tp} / pp {pp} and unsharded parameters")
                   for i in issues), issues
        sharded = homogeneous_plan(preset("llama3-8b"), gpus, ParallelConfig(
            tp=tp, pp=pp, dp=8 // (tp * pp), mbs=1, gbs=32, seq_len=4096,
            sequence_parallel=tp > 1, sharding=Sharding(params=8 // (tp * pp),
                                                        grads=8 // (tp * pp),
                                                        optim=8 // (tp * pp))))
        assert not any("unsharded parameters" in i
                       for i in export_plan(sharded, "torchtitan").unsupported)
    found = search(SearchRequest(model=preset("llama3-8b"), cluster=gpus, gbs=32,
                                 seq_len=4096, framework="torchtitan", top=5))
    for r in found.ranked:
        shape = plan_shape(r.plan)
        assert shape.tp == shape.pp == 1 or r.plan.sharding.params > 1, r.plan.sharding_label


def test_replicated_data_parallelism_beside_tp_pp_or_cp_is_refused():
    """torchtitan runs unsharded data parallelism as DDP, which raises 'DDP has not
    supported > 1D parallelism' beside tp or pp (models/llama3/infra/parallelize.py): an
    fp32 tp 1 pp 2 dp 8 plan was exported (and searched) with exit 0. With cp > 1 it
    shards the model states over dp_shard x cp (parallel_dims.py: fsdp_enabled = dp_shard
    or cp), so P must be a multiple of cp; P 1 with cp 2 was exported as replicated
    (export sweep, 2026-12-04). The search plans neither."""
    from planner.search import SearchRequest, search
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.model import preset

    ddp = plan_on("A100-80GB-SXM:16", pp=2, dp=8, mbs=1, gbs=64, dtype="fp32",
                  attention="math")
    assert any("torchtitan runs it as DDP" in u for u in export_plan(ddp, "torchtitan").unsupported)
    alone = plan_on("A100-80GB-SXM:8", dp=8, mbs=1, gbs=64, dtype="fp32", attention="math")
    assert not any("DDP" in u for u in export_plan(alone, "torchtitan").unsupported)
    cp = plan_on("H100-80GB-SXM:16", tp=2, dp=4, cp=2, mbs=1, gbs=64, sequence_parallel=True,
                 comm=FSDP2)
    assert any(u.startswith("parameters sharded over 1 rank(s) with cp 2: torchtitan shards")
               for u in export_plan(cp, "torchtitan").unsupported)
    found = search(SearchRequest(model=preset("gpt3-1.3b"), cluster=parse_gpus_arg(
        "A100-80GB-SXM:16"), gbs=64, seq_len=2048, dtype="fp32", framework="torchtitan",
        top=10))
    for r in found.ranked:
        s, p = plan_shape(r.plan), r.plan.sharding.params
        assert not (s.dp > 1 and p <= 1 and (s.tp > 1 or s.pp > 1)), r.plan.sharding_label
        assert s.cp == 1 or p % s.cp == 0


def test_fsdp_regathers_parameters_for_the_backward_as_priced(tmp_path):
    """torchtitan's default keeps FSDP units gathered from forward to backward whenever
    pp > 1 (apply_fsdp: reshard_after_forward = not pp_enabled), ~4 GiB a rank more than a
    ZeRO-3 plan prices and fewer gathers; the export asks for the priced behaviour."""
    plan = plan_on("H100-80GB-SXM:16", tp=2, pp=2, dp=4, vp=2, mbs=1, gbs=32,
                   sequence_parallel=True, sharding=Sharding(params=4, grads=4, optim=4),
                   comm=FSDP2)
    assert _parse(plan, tmp_path).parallelism.fsdp_reshard_after_forward == "always"


def test_the_nearest_dtype_is_one_the_gpus_run():
    """torchtitan trains in bf16 or fp32: an fp16 plan on V100s (no bf16) was approximated
    to bf16, and the refusal named a 'bf16' the user's plan never had (audit of
    2026-12-06). The nearest dtype is one every GPU of the plan runs: fp32 there, bf16 on
    an A100."""
    from planner.export.approximate import nearest
    from planner.export.frameworks import CAPABILITIES
    from tests.planner.export.framework_helpers import plan_on

    caps = CAPABILITIES["torchtitan"]
    v100, changes = nearest(plan_on("V100-32GB-SXM2:8", model="gpt3-1.3b", attention="math",
                                    dtype="fp16"), caps)
    assert v100.training.dtype == "fp32" and "dtype fp16 -> fp32" in changes
    a100, changes = nearest(plan_on("A100-80GB-SXM:8", model="gpt3-1.3b", dtype="fp16"), caps)
    assert a100.training.dtype == "bf16" and "dtype fp16 -> bf16" in changes
