"""What the executor refuses before any process starts (no processes here)."""

import pytest

from executor.preflight import check_runnable
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from profiler.schema import SpecError
from tests.executor.distributed import explicit, homogeneous

SMALL, LLAMA = preset("debug-small"), preset("debug-tiny-llama")


def _refused(plan, needle, cuda_devices=0):
    with pytest.raises(SpecError, match=needle):
        check_runnable(plan, cuda_devices=cuda_devices)


def test_gpu_plans_need_enough_gpus_on_this_host():
    plan = homogeneous_plan(SMALL, parse_gpus_arg("H100-80GB-SXM:4"),
                            ParallelConfig(dp=4, mbs=1, gbs=4, seq_len=32))
    _refused(plan, "this host has no CUDA device")
    _refused(plan, r"'GPU 3 of node 0' is not allowed \(a node of this host has 2 GPUs\)",
             cuda_devices=2)
    check_runnable(plan, cuda_devices=8)


def test_dtypes_the_executor_trains():
    """fp16 (dynamic loss scaling), tf32 and bf16 run; fp8 has no GEMMs here."""
    from dataclasses import replace

    def in_dtype(plan, dtype):
        return replace(plan, training=replace(plan.training, dtype=dtype))

    cpu = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2)
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        check_runnable(in_dtype(cpu, dtype), cuda_devices=0)
    gpu = homogeneous_plan(SMALL, parse_gpus_arg("H100-80GB-SXM:2"),
                           ParallelConfig(dp=2, mbs=1, gbs=2, seq_len=32, dtype="fp8"))
    _refused(gpu, r"^plan:training\.dtype: 'fp8' is not allowed \(the executor has no FP8 "
             r"GEMMs; use bf16 \(fp16 where a GPU lacks bf16\), or export an fp8 plan to "
             r"Megatron-Core \(plan search --framework megatron\)\)$", cuda_devices=2)
    for dtype in ("bf16", "fp16"):
        check_runnable(in_dtype(gpu, dtype), cuda_devices=2)
    tf32 = in_dtype(gpu, "tf32")  # FlashAttention has no fp32: another SDPA backend
    _refused(tf32, r"kernels\.attention: 'flash' is not allowed \(H100-80GB-SXM runs "
             r"memory_efficient, math in tf32\)", cuda_devices=2)
    check_runnable(replace(tf32, kernels=replace(tf32.kernels, attention="memory_efficient")),
                   cuda_devices=2)
    # FlashAttention's Triton port is priced by the planner, run by no PyTorch backend
    triton = replace(in_dtype(gpu, "bf16"), kernels=replace(gpu.kernels, attention="flash_triton"))
    _refused(triton, r"kernels\.attention: 'flash_triton' is not allowed \(the executor runs "
             r"flash, math, memory_efficient \(PyTorch's scaled_dot_product_attention backends\)\)",
             cuda_devices=2)


def test_tensor_parallel_limits():
    _refused(homogeneous(LLAMA, world=4, tp=4, mbs=1, gbs=4),
             "must divide num_kv_heads 2")
    mixed = [(0, 3, [0, 1], 2, "none"), (3, 4, [2], 1, "none")]
    _refused(explicit(SMALL, world=3, sequence_parallel=True, pipelines=[(1, 2, mixed)]),
             "sequence parallelism needs equal tp on neighbouring stages")
    _refused(explicit(SMALL, world=3, pipelines=[(1, 2, mixed)]),
             "tied embeddings need the same tp on the first and the last stage")


def test_interleaving_needs_micro_batches_in_multiples_of_the_stages():
    """Refused by the Plan itself (Plan.check: the simulator needs it too), before the
    executor sees it."""
    stages = [(0, 2, [0], 1, "none"), (2, 4, [1], 1, "none")]
    with pytest.raises(SpecError, match=r"pipelines\[0\].num_microbatches: 3 is not allowed "
                       r"\(interleaved-1f1b needs a multiple of the pipeline's 2 stages\)"):
        explicit(SMALL, world=2, schedule="interleaved-1f1b", vp=2, pipelines=[(1, 3, stages)])
    check_runnable(explicit(SMALL, world=2, schedule="interleaved-1f1b", vp=2,
                            pipelines=[(1, 4, stages)]), cuda_devices=0)


def test_a_launch_of_the_wrong_size_stops_before_joining(monkeypatch, tmp_path):
    """A hand-typed torchrun line with the wrong process count: refused at once."""
    from executor.runtime import RunSettings, run_rank

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    plan = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2)
    with pytest.raises(SystemExit, match="the plan has 2 ranks; this launch has 3"):
        run_rank(plan, RunSettings(steps=1, run_dir=str(tmp_path)))


def test_zero_bubble_refuses_full_recompute_where_it_splits_the_backward():
    """ZB-H1's W is a second autograd pass: checkpointed layers would be recomputed twice."""
    def plan(first, second):
        return explicit(SMALL, world=2, schedule="zb-h1", pipelines=[
            (1, 4, [(0, 2, [0], 1, first), (2, 4, [1], 1, second)])])

    _refused(plan("none", "full"), r"pipelines\[0\]\.stages\[1\]\.recompute: 'full' is not "
             r"allowed \(zb-h1 .* allowed: none, selective \(full on stage 0\)\)")
    for first, second in (("full", "selective"), ("none", "none")):
        check_runnable(plan(first, second), cuda_devices=0)


def test_mixed_tp_runs_only_without_sharding_there():
    """Replicas may differ in tp at a stage position (whole gradients summed there,
    executor/mixed_tp.py), but not with model-state sharding at that position other than
    ZeRO-1 over all replicas; every
    replica still splits the layers alike (and a tied embedding's twins at one tp)."""
    from dataclasses import replace

    from planner.specs.plan import Sharding

    tiny = preset("debug-tiny")

    def one_stage(model, sharding=None):
        return explicit(model, world=3, sharding=sharding, pipelines=[
            (2, 3, [(0, 2, [0], 1, "none")]), (2, 1, [(0, 2, [1, 2], 2, "none")])])

    def two_stages(model):
        return explicit(model, world=5, pipelines=[
            (1, 2, [(0, 1, [0], 1, "none"), (1, 2, [1], 1, "none")]),
            (1, 2, [(0, 1, [2, 3], 2, "none"), (1, 2, [4], 1, "none")])])

    check_runnable(one_stage(LLAMA), cuda_devices=0)
    check_runnable(one_stage(tiny), cuda_devices=0)  # tied inside the one stage
    _refused(one_stage(LLAMA, Sharding(grads=2, optim=2)),
             r"sharding: 'P/G/OS 1/2/2 at stage position 0' is not allowed \(the replicas' "
             r"tp differs there \(\[1, 2\]\); .* without model-state sharding")
    check_runnable(one_stage(LLAMA, Sharding(optim=2)), cuda_devices=0)  # ZeRO-1 over dp
    tp1_replicas = [(1, 1, [(0, 2, [r], 1, "none")]) for r in range(3)]
    _refused(explicit(LLAMA, world=5, sharding=Sharding(optim=2), pipelines=[
        *tp1_replicas, (1, 1, [(0, 2, [3, 4], 2, "none")])]),
        r"'P/G/OS 1/1/2 at stage position 0' is not allowed .* ZeRO-1 over all 4 replicas")
    _refused(one_stage(LLAMA, Sharding(grads=2, optim=2)), r"'P/G/OS 1/2/2 at stage")
    _refused(one_stage(LLAMA, Sharding(params=2, grads=2, optim=2)),
             r"'P/G/OS 2/2/2 at stage position 0' is not allowed .* or with ZeRO-1 over "
             r"all 2 replicas \(P/G/OS 1/1/1 or 1/1/2 at that position\)")
    per_stage = replace(two_stages(LLAMA), sharding=Sharding(grads=2, optim=2),
                        stage_sharding=(Sharding(), Sharding(grads=2, optim=2)))
    check_runnable(per_stage, cuda_devices=0)  # sharded where the tp agrees
    swapped = replace(per_stage, stage_sharding=(Sharding(grads=2, optim=2), Sharding()))
    _refused(swapped, r"stage_sharding: 'P/G/OS 1/2/2 at stage position 0'")
    # tied embeddings across stages: each replica's twins at one tp
    _refused(two_stages(tiny), r"pipelines\[1\]\.stages: \[2, 1\] is not allowed \(tied "
             r"embeddings need the same tp on the first and the last stage\)")
    check_runnable(explicit(tiny, world=6, pipelines=[
        (1, 2, [(0, 1, [0], 1, "none"), (1, 2, [1], 1, "none")]),
        (1, 2, [(0, 1, [2, 3], 2, "none"), (1, 2, [4, 5], 2, "none")])]), cuda_devices=0)
    _refused(explicit(SMALL, world=5, pipelines=[
        (1, 2, [(0, 1, [0], 1, "none"), (1, 4, [1], 1, "none")]),
        (1, 2, [(0, 2, [2, 3], 2, "none"), (2, 4, [4], 1, "none")])]),
        r"the same boundaries as pipelines\[0\]")
    _refused(explicit(LLAMA, world=5, pipelines=[
        (2, 1, [(0, 2, [0], 1, "none")]), (2, 1, [(0, 2, [1, 2, 3, 4], 4, "none")])]),
        r"pipelines\[1\]\.stages\[0\]\.tp: 4 is not allowed \(must divide num_kv_heads 2")


def test_communication_other_than_megatrons_is_for_prediction_only():
    import dataclasses

    from planner.specs.plan import Communication

    plan = homogeneous(SMALL, world=2, pp=2, mbs=1, gbs=2)
    deepspeed = dataclasses.replace(plan.training,
                                    comm=Communication.preset("deepspeed", dtype="bf16"))
    _refused(dataclasses.replace(plan, training=deepspeed), "pipeline sends are non-blocking")
    half = dataclasses.replace(plan.training, comm=Communication(grad_reduce_dtype="bf16"))
    _refused(dataclasses.replace(plan, training=half), "reduces gradients in fp32")


def test_selective_recompute_is_of_the_attention_core_only():
    # executor/model.py recomputes the attention core; Megatron's other modules are not run
    from dataclasses import replace

    plan = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2, recompute="selective")
    check_runnable(plan, cuda_devices=0)
    moe = replace(plan, training=replace(plan.training, recompute_modules=("layernorm", "mlp")))
    _refused(moe, "re-runs the attention core only")
    none = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2)
    check_runnable(replace(none, training=replace(none.training, recompute_modules=("mlp",))),
                   cuda_devices=0)  # nothing recomputed selectively: the modules do not apply


def test_one_pipeline_schedule_per_step():
    """A plan whose step runs several pipeline schedules (NeMo AutoModel's
    `training.pipeline_flushes`) is refused: the executor runs one."""
    from dataclasses import replace

    plan = homogeneous(SMALL, world=2, pp=2, mbs=1, gbs=4)
    check_runnable(plan, cuda_devices=0)
    flushed = replace(plan, training=replace(plan.training, pipeline_flushes=2))
    _refused(flushed, r"training.pipeline_flushes: 2 is not allowed \(1 \(the executor runs "
             r"a step's micro-batches as one schedule\)\)")


def test_master_weights_are_kept():
    """A bf16 plan without fp32 master weights (`training.master_weights` false, NeMo
    AutoModel's pure-bf16 states) is refused: the executor keeps fp32 masters
    (executor/precision.py). In fp32 the setting changes nothing and runs."""
    from dataclasses import replace

    plan = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2)
    check_runnable(plan, cuda_devices=0)
    bf16 = replace(plan, training=replace(plan.training, dtype="bf16", master_weights=False))
    _refused(bf16, r"training.master_weights: false is not allowed \(true \(the executor "
             r"keeps fp32 master weights")
    fp32 = replace(plan, training=replace(plan.training, dtype="fp32", master_weights=False))
    check_runnable(fp32, cuda_devices=0)


def test_model_states_are_the_executors_rule():
    """A bf16 plan priced with DeepSpeed's model-state rule (gradients in bf16,
    `training.model_states` deepspeed) is refused: the executor keeps fp32 gradients
    (executor/data_parallel.py), 2 bytes per parameter more than the plan priced. In fp32
    both rules keep the same bytes and the plan runs."""
    from dataclasses import replace

    from planner.specs.choices import ModelStates

    plan = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2)
    ds = ModelStates.DEEPSPEED
    bf16 = replace(plan, training=replace(plan.training, dtype="bf16", model_states=ds))
    _refused(bf16, r"training.model_states: 'deepspeed' is not allowed \(fp32_grads \(the "
             r"executor keeps fp32 gradients")
    check_runnable(replace(bf16, training=replace(bf16.training,
                                                  model_states=ModelStates.FP32_GRADS)),
                   cuda_devices=0)
    fp32 = replace(plan, training=replace(plan.training, dtype="fp32", model_states=ds))
    check_runnable(fp32, cuda_devices=0)


def test_multi_latent_attention_is_refused_in_one_line():
    """executor/model.py builds ordinary attention; an MLA model's plan (DeepSeek's) is
    refused naming the model, not run into a shape error."""
    mla = preset("deepseek-v2-lite")
    plan = homogeneous_plan(mla, parse_gpus_arg("H100-80GB-SXM:8"),
                            ParallelConfig(dp=8, mbs=1, gbs=8, seq_len=4096, ep=8))
    with pytest.raises(SpecError) as err:
        check_runnable(plan, cuda_devices=8)
    message = str(err.value)
    assert "\n" not in message and message.startswith("plan:model.kv_lora_rank: 512")
    assert "deepseek-v2-lite" in message and "multi-head latent attention" in message


def test_deepep_dispatch_is_for_prediction_only():
    # executor/moe.py dispatches tokens with all_to_all_single: a plan priced with
    # DeepEP's dispatch ran, and its report compared the measurement with a prediction for
    # a dispatcher it never used.
    import dataclasses

    plan = homogeneous(preset("debug-tiny-moe"), world=2, dp=2, ep=2, mbs=1, gbs=2,
                       ep_layout="data_parallel")
    check_runnable(plan, cuda_devices=0)
    comm = dataclasses.replace(plan.training.comm, moe_dispatcher="deepep")
    deepep = dataclasses.replace(plan.training, comm=comm)
    _refused(dataclasses.replace(plan, training=deepep), "moe_dispatcher: 'deepep'")


def test_a_sequence_past_the_learned_positions_is_refused_before_launch():
    """debug-tiny learns 64 positions: a plan at seq 128 launched, and every rank died on
    its embedding with a traceback (sweep of 2026-12-03). Rotary positions take any
    length."""
    cluster = parse_gpus_arg("CPU:2")
    tiny = homogeneous_plan(preset("debug-tiny"), cluster,
                            ParallelConfig(dp=2, mbs=1, gbs=2, seq_len=128, dtype="fp32"))
    with pytest.raises(SpecError) as err:
        check_runnable(tiny, cuda_devices=0)
    assert str(err.value) == ("plan:training.seq_len: 128 is not allowed (debug-tiny learns "
                              "64 positions (position_embedding: learned): at most 64)")
    llama = preset("debug-tiny-llama")
    check_runnable(homogeneous_plan(llama, cluster, ParallelConfig(
        dp=2, mbs=1, gbs=2, seq_len=2 * llama.seq_len, dtype="fp32")), cuda_devices=0)
