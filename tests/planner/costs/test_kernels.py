"""Kernel selection: the fastest valid alternative a profile measured goes into the plan."""

import dataclasses

import pytest

from planner.costs.compute import ComputeCosts
from planner.costs.kernels import attention_for, fastest_kernels, supported_attention
from planner.costs.memory import rank_param_count
from planner.costs.workload import Op, WorkloadShape, layer_work, optimizer_work
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from profiler.devices import device
from profiler.store import load_profiles
from tests.planner.profile_helpers import op_row, write_profile

MODEL = preset("debug-small")
CFG = ParallelConfig(mbs=8, gbs=8, seq_len=64, dtype="fp32")


def _plan(gpus="CPU:1", cfg=CFG):
    return homogeneous_plan(MODEL, parse_gpus_arg(gpus), cfg)


_CORE = ("attn.core", "attn.scores", "attn.softmax", "attn.dropout", "attn.context")


def _rows(attention, core_scale=1.0):
    """The layer's ops at analytic times, its attention-core ops `core_scale` x slower."""
    work = layer_work(MODEL, WorkloadShape(micro_batch_size=8, seq_len=64, dtype="fp32",
                                           attention=attention))
    costs = ComputeCosts(device("CPU"), "fp32")
    return [op_row(op, costs.time_s(op) * (core_scale if op.name.startswith(_CORE) else 1.0))
            for op in (*work.forward, *work.backward) if isinstance(op, Op)]


def _optimizer_rows(times):
    params = rank_param_count(MODEL, num_layers=MODEL.num_layers, first=True, last=True, tp=1,
                              pp=1)
    return [op_row(optimizer_work(params, dtype="fp32", implementation=impl), t)
            for impl, t in times.items()]


def _profiles(tmp_path, rows, device="CPU"):
    path = write_profile(tmp_path / "p.csv", rows, device=device)
    return load_profiles([path], devices=[device], dtype="fp32")


def test_the_fastest_measured_alternatives_are_chosen(tmp_path):
    # math attention measured faster than flash; foreach AdamW faster than fused.
    rows = (_rows("flash", core_scale=100.0) + _rows("math")
            + _optimizer_rows({"fused": 2e-3, "foreach": 1e-3, "for_loop": 5e-3}))
    kernels = fastest_kernels(_plan(), _profiles(tmp_path, rows))
    assert (kernels.attention, kernels.optimizer) == ("math", "foreach")
    # an explicit --attention is kept; the optimizer is still chosen
    kept = fastest_kernels(_plan(), _profiles(tmp_path, rows), keep_attention=True)
    assert (kept.attention, kept.optimizer) == ("flash", "foreach")


def test_alternatives_the_profile_lacks_are_not_chosen(tmp_path):
    rows = _rows("flash", core_scale=100.0) + _optimizer_rows({"fused": 9e-3})
    kernels = fastest_kernels(_plan(), _profiles(tmp_path, rows))
    assert (kernels.attention, kernels.optimizer) == ("flash", "fused")


def test_a_kernel_the_profile_did_not_measure_is_kept(tmp_path):
    """A profile of math attention alone and for-loop AdamW alone says nothing of how the
    plan's flash and fused compare with them: the plan keeps its own."""
    plan = _plan()
    assert (plan.kernels.attention, plan.kernels.optimizer) == ("flash", "fused")
    rows = _rows("math") + _optimizer_rows({"for_loop": 1e-7})  # faster than anything
    kernels = fastest_kernels(plan, _profiles(tmp_path, rows))
    assert (kernels.attention, kernels.optimizer) == ("flash", "fused")


def test_a_profile_of_other_gpus_changes_nothing(tmp_path):
    rows = _optimizer_rows({"foreach": 1e-3})
    plan = dataclasses.replace(_plan())
    assert fastest_kernels(plan, _profiles(tmp_path, rows, device="A100-80GB-SXM")) == plan.kernels


def test_each_gpu_type_runs_its_own_attention_kernel():
    """PyTorch SDPA: flash on sm80+ in 16-bit, memory-efficient elsewhere (sdp_utils.cpp),
    math only when asked."""
    from profiler.schema import SpecError

    a100, v100, t4 = device("A100-80GB-SXM"), device("V100-32GB-SXM2"), device("T4-16GB")
    assert attention_for(a100, "bf16") == "flash"
    assert attention_for(a100, "fp32") == "memory_efficient"  # flash takes 16-bit inputs
    assert attention_for(v100, "fp16") == "memory_efficient"
    assert attention_for(t4, "fp16") == "memory_efficient"
    assert attention_for(a100, "bf16", "math") == "math"
    with pytest.raises(SpecError, match="V100-32GB-SXM2 runs memory_efficient, math"):
        attention_for(v100, "fp16", "flash")


def test_a_mixed_a100_v100_search_gives_each_stage_its_kernel(tmp_path):
    """The mixed search prices and writes flash on the A100 stages and memory-efficient
    attention on the V100 stages; `plan simulate --json` names the kernel per stage."""
    import json

    from planner.cli import main
    from planner.search import SearchRequest, search
    from planner.specs.cluster import ClusterSpec, NodeGroup
    from planner.specs.plan import save_plan

    cluster = ClusterSpec(name="a100+v100", node_groups=(
        NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=2),
        NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=2))).resolved()
    found = search(SearchRequest(model=preset("llama2-7b"), cluster=cluster, gbs=64,
                                 seq_len=4096, dtype="fp16", top=8))
    mixed = [r.plan for r in found.ranked
             if len(r.plan.gpu_types) == 2]
    assert mixed, "a plan using both GPU types"
    plan = mixed[0]
    for pipe in plan.pipelines:
        for s in pipe.stages:
            gpu = plan.group_of(s).gpu
            assert plan.attention_of(s) == ("flash" if gpu.startswith("A100")
                                            else "memory_efficient"), gpu
    path = tmp_path / "mixed.yaml"
    save_plan(plan, str(path))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", "--plan", str(path), "--json"]) == 0
    stages = json.loads(out.getvalue())["stages"]
    assert {(s["device"], s["attention"]) for s in stages} == {
        ("A100-80GB-SXM", "flash"), ("V100-32GB-SXM2", "memory_efficient")}


def test_a_gpu_type_that_cannot_run_the_plans_attention_runs_its_own():
    """A plan on A100s and V100s names the first type's default (flash); the V100 stages
    run memory-efficient attention in fp16 (FlashAttention needs sm80), and are priced so."""
    from planner.costs.stages import plan_replicas
    from planner.specs.cluster import ClusterSpec, NodeGroup
    from planner.specs.plan import Kernels

    cluster = ClusterSpec(name="av", node_groups=(
        NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=1),
        NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=1))).resolved()
    plan = homogeneous_plan(preset("gpt3-125m"), cluster, ParallelConfig(
        dp=16, mbs=1, gbs=16, seq_len=1024, dtype="fp16"), kernels=Kernels(attention="flash"))
    by_gpu = {cluster.group_of(st[0].devices[0]).gpu: st[0].attention
              for st in plan_replicas(plan)}
    assert by_gpu == {"A100-80GB-SXM": "flash", "V100-32GB-SXM2": "memory_efficient"}


def _attention_ops(attention, *, dtype="bf16"):
    work = layer_work(preset("gpt3-125m"), WorkloadShape(micro_batch_size=4, seq_len=4096,
                                                         dtype=dtype, attention=attention))
    fwd = next(op for op in work.forward if isinstance(op, Op) and op.name == "attn.core")
    bwd = next(op for op in work.backward if isinstance(op, Op) and op.name == "attn.core.bwd")
    return fwd, bwd


def test_flash_attentions_triton_port_is_priced_at_its_published_slowdown(tmp_path):
    """FlashAttention-2 (Dao 2023, arXiv:2307.08691, §4.1, A100 80GB): "around 1.3-1.5x
    faster than FlashAttention in Triton in the forward pass and around 2x faster in the
    backward pass". The Triton port's ops are FlashAttention-2's times (analytic or
    measured) that many times slower."""
    costs = ComputeCosts(device("A100-80GB-SXM"), "bf16")
    (flash_f, flash_b), (triton_f, triton_b) = _attention_ops("flash"), _attention_ops(
        "flash_triton")
    assert costs.time_s(triton_f) == pytest.approx(1.4 * costs.time_s(flash_f))
    assert costs.time_s(triton_b) == pytest.approx(2.0 * costs.time_s(flash_b))
    # a profile that measured FlashAttention-2 prices the port from the measured times
    rows = [op_row(flash_f, 1e-3), op_row(flash_b, 3e-3)]
    path = write_profile(tmp_path / "a100.csv", rows, device="A100-80GB-SXM", dtype="bf16")
    profile = load_profiles([path], devices=["A100-80GB-SXM"], dtype="bf16").get("A100-80GB-SXM")
    measured = ComputeCosts(device("A100-80GB-SXM"), "bf16", profile)
    assert measured.time_s(flash_f) == pytest.approx(1e-3)
    assert measured.time_s(triton_f) == pytest.approx(1.4e-3)
    assert measured.time_s(triton_b) == pytest.approx(6e-3)


def test_the_triton_port_is_chosen_only_when_asked():
    """Nothing picks it by default; it needs 16-bit inputs (the executor's refusal:
    tests/executor/test_preflight.py)."""
    a100 = device("A100-80GB-SXM")
    assert attention_for(a100, "bf16") == "flash"
    assert attention_for(a100, "bf16", "flash_triton") == "flash_triton"
    assert "flash_triton" not in supported_attention(a100, "fp32")
    assert "flash_triton" not in supported_attention(device("V100-32GB-SXM2"), "fp16")


def test_the_sources_say_how_the_triton_port_was_priced():
    from planner.costs.stages import cost_sources
    from planner.specs.plan import Kernels

    def plan(attention):
        return homogeneous_plan(preset("gpt3-125m"), parse_gpus_arg("A100-80GB-SXM:8"),
                                ParallelConfig(dp=8, mbs=1, gbs=8, seq_len=2048, dtype="bf16"),
                                kernels=Kernels(attention=attention))

    assert "Dao 2023" in cost_sources(plan("flash_triton"), None)["compute"]
    assert "flash_triton" not in cost_sources(plan("flash"), None)["compute"]


def test_a_model_with_dropout_runs_unfused_attention_on_the_cpu():
    # PyTorch's CPU kernels: "Both fused kernels do not support non-zero dropout"
    # (aten/src/ATen/native/transformers/sdp_utils_cpp.h); the executor refuses them
    # (executor/preflight.py). simulate and search chose flash for such a model, and
    # `plan run` then refused the plan they wrote. GPUs are unaffected.
    from executor.preflight import check_runnable

    cpu = device("CPU")
    assert attention_for(cpu, "fp32", dropout=True) == "math"
    assert attention_for(cpu, "fp32") != "math"  # fused where nothing forbids it
    assert all(not k.fused for k in supported_attention(cpu, "fp32", dropout=True))
    assert supported_attention(device("H100-80GB-SXM"), "bf16", dropout=True) == \
        supported_attention(device("H100-80GB-SXM"), "bf16")
    model = dataclasses.replace(MODEL, dropout=True)
    plan = homogeneous_plan(model, parse_gpus_arg("CPU:2"),
                            dataclasses.replace(CFG, dp=2, gbs=16))
    assert plan.kernels.attention == "math"
    check_runnable(plan, cuda_devices=0, host=False)
