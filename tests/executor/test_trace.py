"""`plan run --trace`: the ranks' ops by kind (executor/trace.py) beside the cost model's
split of the step (planner/predict/op_kinds.py), in the run report."""

from __future__ import annotations

import pytest

from executor.trace import KINDS, op_kind, summarize


@pytest.mark.parametrize("name, kind", [
    ("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("aten::bmm", "gemm"),
    ("aten::baddbmm", "gemm"), ("aten::_scaled_mm", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
    ("aten::_efficient_attention_backward", "attention"),
    ("aten::_fused_adamw_", "optimizer"), ("aten::_foreach_mul_", "optimizer"),
    ("aten::gelu", "elementwise"), ("aten::native_layer_norm_backward", "elementwise"),
    ("aten::mm_backward_like_op", "elementwise"),  # only whole names count as GEMMs
    ("c10d::allreduce_", "collective"), ("c10d::send", "collective"),
    ("MmBackward0", "framework"), ("Optimizer.step#AdamW.step", "framework"),
    ("aten::t", "framework"), ("aten::transpose", "framework"), ("aten::view", "framework"),
    ("aten::empty", "framework"), ("aten::as_strided", "framework"),
    ("aten::to", "framework"), ("aten::_to_copy", "elementwise"),
    ("aten::copy_", "elementwise"), ("aten::fill_", "elementwise"),
    ("autograd::engine::evaluate_function: MmBackward0", "framework"),
])
def test_cpu_ops_by_kind(name, kind):
    assert op_kind(name) == kind


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>", "gemm"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
     "collective"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...FusedAdamMathFunctor>",
     "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
     "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "elementwise"),
])
def test_gpu_kernels_by_kind(name, kind):
    assert op_kind(name, device=True) == kind


def test_summary_is_per_step_and_sorted():
    events = [("aten::mm", 30, 0.003), ("aten::gelu", 6, 0.0006), ("c10d::allreduce_", 3, 0.0009),
              ("aten::addmm", 3, 0.0003), ("MmBackward0", 30, 0.00015)]
    s = summarize(events, steps=3, wall_s=0.002)
    assert set(s.kinds) == set(KINDS)
    assert s.kinds["gemm"] == pytest.approx(0.0011)
    assert s.kinds["elementwise"] == pytest.approx(0.0002)
    assert s.kinds["collective"] == pytest.approx(0.0003)
    assert s.kinds["framework"] == pytest.approx(0.00005)
    assert [t[0] for t in s.top][:2] == ["aten::mm", "c10d::allreduce_"]
    assert s.top[0][2:] == (pytest.approx(10.0), pytest.approx(0.001))


@pytest.mark.multiprocess
def test_a_traced_run_times_its_ops_and_not_its_traced_steps(tmp_path):
    """Two data-parallel CPU ranks of debug-tiny, 4 steps and 2 traced: the traced steps
    are not in the step times, and each rank's GEMMs, attention and optimizer show up."""
    pytest.importorskip("torch")
    from planner.specs.model import model_presets
    from tests.executor.distributed import homogeneous, run_forked

    plan = homogeneous(model_presets()["debug-tiny"], world=2, tp=1, pp=1, dp=2, mbs=2,
                       gbs=4, seq_len=16)
    codes, metrics = run_forked(plan, tmp_path, steps=4, trace_steps=2)
    assert codes == [0, 0] and metrics is not None
    assert len(metrics["step_times_s"]) == 4 and len(metrics["losses"]) == 4
    assert len(metrics["traces"]) == 2
    for trace in metrics["traces"]:
        assert trace["steps"] == 2 and trace["wall_s"] > 0
        for kind in ("gemm", "attention", "elementwise", "optimizer", "collective"):
            assert trace["kinds"][kind] > 0, kind
        # the ops' own times fit in the step, and nothing outside the step is counted
        # (the barrier between traced steps was, in the next step's cycle)
        assert sum(trace["kinds"].values()) < trace["wall_s"]
        assert "c10d::barrier" not in [op[0] for op in trace["top"]]


@pytest.mark.multiprocess
def test_an_untraced_run_has_no_traces(tmp_path):
    pytest.importorskip("torch")
    from planner.specs.model import model_presets
    from tests.executor.distributed import homogeneous, run_forked

    plan = homogeneous(model_presets()["debug-tiny"], world=1, tp=1, pp=1, dp=1, mbs=2,
                       gbs=2, seq_len=16)
    codes, metrics = run_forked(plan, tmp_path, steps=2)
    assert codes == [0] and metrics is not None and metrics["traces"] == []


def test_the_report_sets_each_kind_beside_its_prediction():
    from executor.report import make_report, to_markdown
    from planner.specs.model import model_presets
    from tests.executor.distributed import homogeneous

    plan = homogeneous(model_presets()["debug-tiny"], world=2, tp=1, pp=1, dp=2, mbs=2,
                       gbs=4, seq_len=16)
    kinds = dict.fromkeys(KINDS, 0.0) | {"gemm": 0.004, "elementwise": 0.002}
    trace = {"steps": 2, "kinds": kinds, "wall_s": 0.01,
             "top": [["aten::mm", "gemm", 12.0, 0.004]]}
    metrics = {"first_step": 0, "losses": [5.0, 4.9], "step_times_s": [0.02, 0.01],
               "peak_memory_bytes": [1, 1], "model_state_bytes": [{"params": 1}] * 2,
               "memory_kind": "test", "traces": [trace, trace]}
    predicted = {(0, 0): {"gemm": 0.005, "attention": 0.001, "elementwise": 0.001,
                          "optimizer": 0.0005},
                 (1, 0): {"gemm": 0.005, "attention": 0.001, "elementwise": 0.001,
                          "optimizer": 0.0005}}
    report = make_report(plan, metrics, prediction=None, source="test", warmup=1, name="t",
                         predicted_kinds=predicted)
    assert [t.rank for t in report.traces] == [0, 1]
    gemm = next(k for k in report.traces[0].kinds if k.kind == "gemm")
    assert (gemm.predicted_s, gemm.measured_s) == (0.005, 0.004)
    framework = next(k for k in report.traces[0].kinds if k.kind == "framework")
    assert framework.predicted_s is None
    text = to_markdown(report)
    assert "| 0 | 0.0 | gemm | 5.00 | 4.00 | 0.80 |" in text
    assert "| 1 | 1.0 | elementwise | 1.00 | 2.00 | 2.00 |" in text
    assert "in no op" in text and "| 0 | 0.0 | traced step (wall) | - | 10.00 | - |" in text
    # the measured iteration is rank 1's median after the warm-up step: 10 ms
    assert "A traced step took 10.00 ms against the measured 10.00" in text
    assert report.to_dict()["traces"][1]["kinds"][0]["kind"] == "gemm"
