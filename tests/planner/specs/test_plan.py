import dataclasses

import pytest

from planner.specs.cluster import load_cluster, parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import (
    Pipeline,
    Plan,
    Predicted,
    Sharding,
    Stage,
    Training,
    load_plan,
    plan_from_dict,
    plan_to_dict,
    save_plan,
)
from profiler.schema import SpecError


def _homogeneous() -> Plan:
    cfg = ParallelConfig(tp=2, pp=2, dp=2, mbs=1, gbs=8, seq_len=64, recompute="selective",
                         sequence_parallel=True, sharding=Sharding(params=1, grads=2, optim=2))
    return homogeneous_plan(preset("debug-small"), parse_gpus_arg("A100-80GB-SXM:8"), cfg)


def _heterogeneous() -> Plan:
    """Two unlike replicas on the mixed A100+V100 cluster: a 2-stage A100 pipeline with an
    uneven split and a 3-stage V100 pipeline, with different micro-batch counts."""
    cluster = load_cluster("cluster_specs/mixed-a100-v100.yaml")
    v100 = 16 * 8  # first V100 index
    fast = Pipeline(micro_batch_size=2, num_microbatches=20, stages=(
        Stage(layers=(0, 20), devices=tuple(range(0, 8)), tp=8, recompute="selective"),
        Stage(layers=(20, 42), devices=tuple(range(8, 16)), tp=8)))
    slow = Pipeline(micro_batch_size=1, num_microbatches=24, stages=(
        Stage(layers=(0, 13), devices=tuple(range(v100, v100 + 8)), tp=8, recompute="full"),
        Stage(layers=(13, 28), devices=tuple(range(v100 + 8, v100 + 16)), tp=8, recompute="full"),
        Stage(layers=(28, 42), devices=tuple(range(v100 + 16, v100 + 24)), tp=8,
              recompute="full")))
    model = dataclasses.replace(preset("megatron-7.5b"), num_layers=42)
    plan = Plan(model=model, cluster=cluster,
                training=Training(global_batch_size=64, seq_len=2048, dtype="fp16"),
                pipelines=(fast, slow),
                predicted=Predicted(iteration_time_s=1.25, tokens_per_s=1e5,
                                    tflops_per_gpu_model=100.5, mfu=0.31,
                                    peak_memory_bytes=(1, 2), sources={"compute": "x"}))
    plan.check("plan")
    return plan


def _per_stage() -> Plan:
    """AMSP per stage position: the first stage replicated, the second ZeRO-3."""
    untied = dataclasses.replace(preset("debug-small"), tied_embeddings=False)
    plan = dataclasses.replace(_homogeneous(), model=untied,
                               sharding=Sharding(params=2, grads=2, optim=2),
                               stage_sharding=(Sharding(), Sharding(params=2, grads=2, optim=2)))
    plan.check("plan")
    assert plan.sharding_of(0) == Sharding() and plan.sharding_label == (
        "P/G/OS per stage 1/1/1, 2/2/2")
    return plan


@pytest.mark.parametrize("make", [_homogeneous, _heterogeneous, _per_stage])
@pytest.mark.parametrize("ext", [".yaml", ".json"])
def test_round_trip_is_exact(tmp_path, make, ext):
    plan = make()
    path = str(tmp_path / f"plan{ext}")
    save_plan(plan, path)
    again = load_plan(path)
    assert again == plan
    save_plan(again, str(tmp_path / f"again{ext}"))
    assert (tmp_path / f"again{ext}").read_text() == (tmp_path / f"plan{ext}").read_text()


def test_homogeneous_layout_is_megatron_order():
    plan = _homogeneous()
    # tp fastest, then dp, then pp: pipeline 1 stage 0 on GPUs 2-3, stage 1 on 4-5.
    assert plan.pipelines[1].stages[0].devices == (2, 3)
    assert plan.pipelines[1].stages[1].devices == (6, 7)
    assert [s.layers for s in plan.pipelines[0].stages] == [(0, 2), (2, 4)]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["pipelines"][0]["stages"][1].update(layers=[3, 4]), "must start at 2"),
    (lambda d: d["pipelines"][0]["stages"][1].update(layers=[2, 3]), "must cover all 4 layers"),
    (lambda d: d["pipelines"][1]["stages"][0].update(devices=[0, 1]), "GPU 0 is already used"),
    (lambda d: d["pipelines"][0].update(num_microbatches=3), "must equal training.global_batch_size 8"),
    (lambda d: d["pipelines"][0]["stages"][0].update(devices=[0]), r"tp\*cp = 2 GPU indices"),
    (lambda d: d["pipelines"][0]["stages"][0].update(tp=3, devices=[0, 1, 2]), "must divide num_heads 8"),
    (lambda d: d["sharding"].update(params=2, grads=3), "must be a multiple of params"),
    (lambda d: d.update(sharding={"params": 2}),
     r"sharding.grads: 1 is not allowed \(must be a multiple of params \(2\): P \| G \| OS, "
     "a size left out is 1"),
    (lambda d: d["pipelines"][0]["stages"][0].update(devices=[0, 99]), "GPU indices are 0..7"),
    (lambda d: d.update(schema_version=7), "this trainplan reads version 1"),
    (lambda d: d["training"].update(virtual_stages=2), "exactly when schedule is interleaved-1f1b"),
    (lambda d: d["training"].update(schedule="zb-h2"), "'zb-h2' is not allowed"),
    (lambda d: d["training"].update(schedule="interleaved-1f1b", virtual_stages=2)
     or d["pipelines"][0].update(num_microbatches=3) or d["pipelines"][1].update(
         num_microbatches=5), r"pipelines\[0\].num_microbatches: 3 is not allowed "
     r"\(interleaved-1f1b needs a multiple of the pipeline's 2 stages\)"),
    (lambda d: d["training"].update(pipeline_flushes=3),
     r"pipelines\[0\].num_microbatches: 4 is not allowed \(a multiple of "
     r"training.pipeline_flushes \(3\)\)"),
    (lambda d: d["training"].update(schedule="interleaved-1f1b", virtual_stages=2,
                                    pipeline_flushes=4),
     r"pipelines\[0\].num_microbatches: 4 is not allowed \(interleaved-1f1b needs a "
     r"multiple of the pipeline's 2 stages in each of its 4 schedules "
     r"\(training.pipeline_flushes: 1 each\)\)"),
    (lambda d: d.update(training={**d["training"], "schedule": "zb-h1"}, pipelines=[
        {**d["pipelines"][0], "stages": [{**d["pipelines"][0]["stages"][0], "layers": [0, 4]}]},
        d["pipelines"][1]]),
     r"plan.training.schedule: 'zb-h1' is not allowed \(a zero-bubble schedule needs every "
     "pipeline to have at least 2 stages"),
])
def test_invalid_plans_are_refused(mutate, message):
    data = plan_to_dict(_homogeneous())
    mutate(data)
    with pytest.raises(SpecError, match=message):
        plan_from_dict(data)


_S = {"params": 1, "grads": 1, "optim": 1}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(stage_sharding=[_S]), r"plan.stage_sharding: '1 entries' is not "
     r"allowed \(one per stage \(2\)\)"),
    (lambda d: d.update(stage_sharding=[_S, {**_S, "params": 2, "grads": 1}]),
     r"plan.stage_sharding\[1\].grads: 1 is not allowed \(must be a multiple of params"),
    (lambda d: d.update(stage_sharding=[_S, {**_S, "optim": 4}]),
     r"plan.stage_sharding\[1\].optim: 4 is not allowed \(must divide the "
     r"data-parallel replicas x context-parallel ranks = 2"),
])
def test_invalid_stage_sharding_is_refused(mutate, message):
    data = plan_to_dict(_homogeneous())
    data["model"]["tied_embeddings"] = False
    mutate(data)
    with pytest.raises(SpecError, match=message):
        plan_from_dict(data)


def test_tied_embeddings_shard_alike_on_the_first_and_last_stage():
    data = plan_to_dict(_homogeneous())  # debug-small ties its embeddings
    data["stage_sharding"] = [_S, {**_S, "optim": 2}]
    with pytest.raises(SpecError, match=r"plan.stage_sharding\[1\]: '1/1/2' is not allowed "
                       r"\(the model ties its embeddings: the last stage holds the first "
                       r"stage's twin and shards like it \(1/1/1\)\)"):
        plan_from_dict(data)


def test_stage_sharding_needs_aligned_replicas():
    data = plan_to_dict(_heterogeneous())
    data["stage_sharding"] = [_S, _S]
    with pytest.raises(SpecError, match="only when every pipeline splits the layers at the "
                                         "same boundaries"):
        plan_from_dict(data)



def test_a_first_or_last_stage_may_hold_no_layer():
    """DeepSpeed-style partitions put the embedding (or the head) alone on a stage; a
    middle stage without layers, or one under interleaving, is refused."""
    data = plan_to_dict(_homogeneous())
    for pipe in data["pipelines"]:
        first, last = pipe["stages"]
        n = last["layers"][1]
        first["layers"], last["layers"] = [0, 0], [0, n]
    plan = plan_from_dict(data)
    assert [s.num_layers for s in plan.pipelines[0].stages] == [0, n]
    from planner.predict.estimate import estimate

    assert estimate(plan).iteration_time_s > 0
    data["training"].update(schedule="interleaved-1f1b", virtual_stages=2)
    with pytest.raises(SpecError, match=r"no layers only for a first stage"):
        plan_from_dict(data)


def test_a_plan_whose_cluster_leaves_node_fields_to_the_catalog_loads_resolved(tmp_path):
    """`plan simulate --plan FILE` ended in `AssertionError: resolve the cluster first` when
    the plan's cluster left gpus_per_node (and the NICs) to the catalog's standard node."""
    data = plan_to_dict(_homogeneous())
    data["cluster"]["node_groups"] = [{"name": "a100", "gpu": "A100-80GB-SXM", "num_nodes": 1}]
    plan = plan_from_dict(data)
    (g,) = plan.cluster.node_groups
    assert (g.gpus_per_node, g.nic, g.nics_per_node) == (8, "infiniband", 8)
    assert plan.cluster.num_gpus == 8 and plan.cluster.is_resolved
    path = str(tmp_path / "p.yaml")
    save_plan(plan, path)
    assert load_plan(path) == plan


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["training"].update(global_batch_size=10**9), "must be ≤ 65,536"),
    (lambda d: d["pipelines"][0].update(num_microbatches=10**9), "must be ≤ 65,536"),
    (lambda d: d["training"].update(seq_len=float("nan")), "expected an integer"),
    (lambda d: d["pipelines"][0]["stages"][0].update(tp=10**20), "must be ≤ 16,384"),
    # a bucket or unit of 1e-300 parameters priced an iteration at 1e301 s (and the
    # Megatron export wrote --ddp-bucket-size 0)
    (lambda d: d["training"].setdefault("comm", {}).update(grad_bucket_params=1e-300),
     r"grad_bucket_params: 1e-300 is not allowed \(must be ≥ 1\)"),
    (lambda d: d["training"].setdefault("comm", {}).update(shard_unit_params=1e-300),
     r"shard_unit_params: 1e-300 is not allowed \(must be ≥ 1\)"),
    (lambda d: d["training"].setdefault("comm", {}).update(shard_prefetch=10**9),
     r"shard_prefetch: 1000000000 is not allowed \(must be ≤ 1,024\)"),
])
def test_plan_numbers_are_bounded(mutate, message):
    data = plan_to_dict(_homogeneous())
    mutate(data)
    with pytest.raises(SpecError, match=message):
        plan_from_dict(data)


def test_bf16_on_a_gpu_without_it_is_refused_in_the_plan():
    """One rule (check_train_dtype) for `simulate --dtype`, `search`, `what-if` and a Plan:
    a plan that trains in bf16 on V100s is refused where it is loaded."""
    data = plan_to_dict(_heterogeneous())
    data["training"]["dtype"] = "bf16"
    with pytest.raises(SpecError, match=r"^plan.training.dtype: 'bf16' is not allowed "
                       r"\(V100-32GB-SXM2 has no bf16; it offers fp32, fp16, tf32 \(as fp32\)\)"):
        plan_from_dict(data)
    data["pipelines"] = data["pipelines"][:1]  # only the A100 pipeline trains
    data["training"]["global_batch_size"] = 40
    assert plan_from_dict(data).training.dtype == "bf16"


def test_a_json_plan_with_small_numbers_round_trips(tmp_path):
    plan = _homogeneous()
    groups = tuple(dataclasses.replace(g, price_per_gpu_hour_usd=1e-05)
                   for g in plan.cluster.node_groups)
    plan = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster,
                                                                 node_groups=groups))
    save_plan(plan, str(tmp_path / "p.json"))
    assert load_plan(str(tmp_path / "p.json")) == plan


def test_a_plan_built_in_code_checks_its_training_settings():
    """Plans the search or replan builds were never parsed: `Plan.check` itself refuses
    training settings `Training.check` refuses (before, only a file's plan was checked)."""
    plan = _homogeneous()
    bad = dataclasses.replace(plan, training=dataclasses.replace(plan.training,
                                                                  virtual_stages=2))
    with pytest.raises(SpecError, match=r"plan.training.virtual_stages: 2 is not allowed "
                       r"\(> 1 exactly when schedule is interleaved-1f1b\)"):
        bad.check("plan")


def test_master_weights_round_trip_and_are_described(tmp_path):
    """`training.master_weights` (default true: Megatron's fp32 master weights, gradients
    and Adam moments) is read from and written to plan files, and a plan without them
    says so in its one-line layout."""
    from planner.specs.plan import describe_layout

    plan = _homogeneous()
    assert plan.training.master_weights and "master" not in describe_layout(plan)
    pure = dataclasses.replace(plan, training=dataclasses.replace(plan.training,
                                                                  master_weights=False))
    path = str(tmp_path / "plan.yaml")
    save_plan(pure, path)
    assert load_plan(path) == pure
    assert describe_layout(pure).endswith("without fp32 master weights")
    data = plan_to_dict(plan)
    data["training"].pop("master_weights")
    assert plan_from_dict(data).training.master_weights  # older files: the default


def test_layout_line_names_the_expert_layout_dispatch_and_pipeline_flushes():
    """Plans that differ only in `training.ep_layout` (folded vs data_parallel: other ep
    groups, another price at tp 2, etp 1), `comm.moe_dispatcher` or `pipeline_flushes`
    must not print the same one-line layout (`plan simulate --plan`, `plan run`'s report,
    the launch files' header)."""
    from planner.specs.choices import EpLayout
    from planner.specs.plan import describe_layout

    cfg = ParallelConfig(tp=2, pp=2, dp=4, mbs=1, gbs=16, seq_len=64, ep=4, etp=1)
    plan = homogeneous_plan(preset("mixtral-8x7b"), parse_gpus_arg("H100-80GB-SXM:16"), cfg)
    tr = plan.training
    variants = [plan] + [dataclasses.replace(plan, training=dataclasses.replace(tr, **change))
                         for change in ({"ep_layout": EpLayout.DATA_PARALLEL},
                                        {"comm": dataclasses.replace(tr.comm,
                                                                     moe_dispatcher="deepep")},
                                        {"pipeline_flushes": 2})]
    for variant in variants:
        variant.check("plan")
    lines = [describe_layout(v) for v in variants]
    assert len(set(lines)) == len(lines)
    assert "ep 4 (ep_layout folded), etp 1," in lines[0]
    assert "ep 4 (ep_layout data_parallel), etp 1," in lines[1]
    assert ", deepep dispatch," in lines[2] and "dispatch" not in lines[0]
    assert ", 1f1b, 2 pipeline flushes per step," in lines[3]
    assert "flushes" not in lines[0]
    dense = describe_layout(_homogeneous())
    assert "ep_layout" not in dense and "dispatch" not in dense


def test_layout_line_names_context_parallelism_and_each_stages_recompute():
    """A cp 2 plan read back printed 'dp 2, pp 4, tp 4, ...' (its breakdown had cp comm),
    and a plan recomputing only some stages printed the first stage's setting."""
    from planner.specs.choices import Recompute
    from planner.specs.plan import describe_layout

    cfg = ParallelConfig(tp=4, cp=2, pp=4, dp=2, mbs=1, gbs=64, seq_len=16384,
                         sequence_parallel=True)
    plan = homogeneous_plan(preset("llama3-70b"), parse_gpus_arg("H100-80GB-SXM:64"), cfg)
    line = describe_layout(plan)
    assert "dp 2, pp 4, tp 4, cp 2," in line and "recompute none," in line
    pipe = plan.pipelines[0]
    stages = (dataclasses.replace(pipe.stages[0], recompute=Recompute.FULL), *pipe.stages[1:])
    mixed = dataclasses.replace(plan, pipelines=(dataclasses.replace(pipe, stages=stages),
                                                 *plan.pipelines[1:]))
    assert "recompute full/none," in describe_layout(mixed)
    assert ", cp " not in describe_layout(_homogeneous())


def _heterogeneous_dict() -> dict:
    return plan_to_dict(_heterogeneous())


def _swap_first_gpus(d: dict) -> None:
    """Swap one A100 of the first pipeline's second stage with one V100 of the second
    pipeline's first stage."""
    a, v = d["pipelines"][0]["stages"][1], d["pipelines"][1]["stages"][0]
    a["devices"][0], v["devices"][0] = v["devices"][0], a["devices"][0]


@pytest.mark.parametrize("mutate, message", [
    # one stage on two GPU types was priced as its first GPU's type
    (_swap_first_gpus, r"plan.pipelines\[0\].stages\[1\].devices: 9 is not allowed \(GPU "
     r"9 is A100-80GB-SXM, GPU 128 V100-32GB-SXM2: a stage's GPUs are of one type\)"),
    # a stage's own kernel must run on its GPUs
    (lambda d: d["pipelines"][1]["stages"][0].update(attention="flash"),
     r"plan.pipelines\[1\].stages\[0\].attention: 'flash' is not allowed \(V100-32GB-SXM2 "
     r"runs memory_efficient, math in fp16\)"),
    # the plan's kernel must run somewhere (a V100-only plan 'with flash' exported flash)
    (lambda d: d.update(pipelines=d["pipelines"][1:], training={
        **d["training"], "global_batch_size": 24}),
     r"plan.kernels.attention: 'flash' is not allowed \(V100-32GB-SXM2 runs "
     r"memory_efficient, math in fp16\)"),
])
def test_what_a_stages_gpus_run_is_checked(mutate, message):
    data = _heterogeneous_dict()
    mutate(data)
    with pytest.raises(SpecError, match=message):
        plan_from_dict(data, where="plan")


def test_a_token_dispatcher_on_a_dense_model_is_refused():
    """The layout line read 'deepep dispatch' for a model without experts."""
    data = plan_to_dict(_homogeneous())
    data["training"]["comm"] = {**data["training"].get("comm", {}), "moe_dispatcher": "deepep"}
    with pytest.raises(SpecError, match=r"plan.training.comm.moe_dispatcher: 'deepep' is not "
                                        r"allowed \(debug-small has no experts"):
        plan_from_dict(data, where="plan")


def test_sharding_divides_every_stages_data_and_context_ranks():
    """Stages may run different context-parallel sizes; each shards its model states over
    the replicas x its own cp ranks (dp 2 x cp 2 = 4 on one, dp 2 x cp 1 = 2 on the
    other), so a sharding of 4 cannot hold on both."""
    cfg = ParallelConfig(tp=1, pp=2, dp=2, cp=2, mbs=1, gbs=8, seq_len=64)
    data = plan_to_dict(homogeneous_plan(preset("debug-small"), parse_gpus_arg("A100-80GB-SXM:8"),
                                         cfg))
    data["sharding"] = {"params": 1, "grads": 1, "optim": 4}
    plan_from_dict(data)  # both stages at cp 2: 2 x 2 = 4 ranks
    for pipe in data["pipelines"]:
        pipe["stages"][1]["cp"], pipe["stages"][1]["devices"] = 1, pipe["stages"][1]["devices"][:1]
    with pytest.raises(SpecError, match=r"sharding.optim: 4 is not allowed \(must divide the "
                       r"data-parallel replicas x context-parallel ranks of the stages with "
                       r"cp 1 = 2\)"):
        plan_from_dict(data)


def test_a_plan_files_cluster_errors_name_their_path(tmp_path):
    """The cluster inside a plan file is resolved by the Plan, which has no path: an error
    there read 'node_groups[0].gpus_per_node: missing' with no file or 'cluster.'."""
    data = plan_to_dict(_homogeneous())
    (group,) = data["cluster"]["node_groups"]
    device = dict(next(iter(data["cluster"].get("devices") or []), None) or {
        "vendor": "nvidia", "arch": "ampere", "memory_gib": 80,
        "memory_bandwidth_gb_per_s": 2000, "num_compute_units": 108,
        "peak_tflops": {"bf16": 312, "fp32": 19.5}})
    device["name"] = "MYGPU"
    device.pop("node", None)
    data["cluster"] = {"name": "c", "devices": [device], "node_groups": [
        {"name": "m", "gpu": "MYGPU", "num_nodes": group["num_nodes"]}]}
    with pytest.raises(SpecError, match=r"^p.yaml:cluster.node_groups\[0\].gpus_per_node: "
                                        r"missing"):
        plan_from_dict(data, where="p.yaml:")



def test_sequence_parallelism_needs_a_stage_of_tp_above_one():
    """A plan file with sequence parallelism and tp 1 everywhere was exported with
    --sequence-parallel (which Megatron turns off at tp 1); the flag at tp 1 is dropped
    from the plan, and the header no longer says it (sweep of 2026-12-03)."""
    cfg = ParallelConfig(tp=1, pp=2, dp=4, mbs=1, gbs=8, seq_len=64, sequence_parallel=True)
    plan = homogeneous_plan(preset("debug-small"), parse_gpus_arg("A100-80GB-SXM:8"), cfg)
    assert not plan.training.sequence_parallel
    data = plan_to_dict(plan)
    data["training"]["sequence_parallel"] = True
    with pytest.raises(SpecError, match=r"training.sequence_parallel: true is not allowed "
                                        r"\(needs a stage of tp > 1"):
        plan_from_dict(data, where="plan")


def test_sequence_parallelism_needs_tp_to_split_the_sequence_evenly(tmp_path):
    """Megatron-Core's sequence-parallel scatter asserts "First dimension of the tensor
    should be divisible by tensor parallel size" (tensor_parallel/mappings.py) and
    torchtitan asserts seq_len % (tp x 2cp); the executor's gloo collectives died on
    seq 63 over tp 2 (a size mismatch, 2026-12-06). The flags and the plan file refuse it."""
    from planner.specs.layout import check_parallel

    model, cluster = preset("debug-small"), parse_gpus_arg("A100-80GB-SXM:8")
    cfg = ParallelConfig(tp=2, pp=1, dp=4, mbs=1, gbs=8, seq_len=63, sequence_parallel=True)
    with pytest.raises(SpecError, match=r"--sequence-parallel: true is not allowed "
                                        r"\(.*tp 2 must divide .*63\)"):
        check_parallel(cfg, model, cluster)
    check_parallel(dataclasses.replace(cfg, seq_len=64), model, cluster)
    check_parallel(dataclasses.replace(cfg, sequence_parallel=False), model, cluster)
    data = plan_to_dict(homogeneous_plan(model, cluster, dataclasses.replace(cfg, seq_len=64)))
    data["training"]["seq_len"] = 63
    with pytest.raises(SpecError, match=r"plan.pipelines\[0\].stages\[0\].tp: 2 is not allowed"
                                        r" \(with sequence parallelism.*63\)"):
        plan_from_dict(data, where="plan")
    data["training"]["sequence_parallel"] = False
    plan_from_dict(data, where="plan")
