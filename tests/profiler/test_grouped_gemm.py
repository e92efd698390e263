"""A grouped GEMM of local experts priced as the MoE implementations run it on Hopper
(profiler/analytic.py `gemm_efficiency(..., streams=)`, planner/costs/workload.py
`GROUPED_GEMM_STREAMS`).

Sources: Transformer Engine's GroupedLinear runs forward, dgrad and wgrad each as one
`general_grouped_gemm` over `num_gemms = len(m_splits)` GEMMs
(transformer_engine/pytorch/module/grouped_linear.py); `multi_stream_cublas_gemm`
(transformer_engine/common/gemm/cublaslt_gemm.cu) launches GEMM i with its own cublasLt
call on compute stream `i % num_streams`, `num_compute_streams = 4`
(common/util/multi_stream.cpp); the grouped_gemm package (fanshiqing fork, NeMo AutoModel's
nv-grouped-gemm 1.1.4) does the same with cublasGemmEx on `cublas_handle[i % NUM_STREAM]`,
NUM_STREAM 4, on every device but sm80 (csrc/grouped_gemm.cu `CublasGroupedGemm`)."""

import math

from planner.costs.compute import ComputeCosts
from planner.costs.workload import EXPERT_GEMM_STREAMS, GROUPED_GEMM_STREAMS, Op, _backward_of
from profiler.analytic import gemm_efficiency, gemm_time_s
from profiler.devices import device, device_efficiency

H100 = device("H100-80GB-SXM")


def test_te_and_grouped_gemm_launch_one_gemm_per_expert_over_four_streams():
    assert GROUPED_GEMM_STREAMS == 4
    # the catalog prices the experts as one batched GEMM (not adopted: docs/calibration.md)
    assert EXPERT_GEMM_STREAMS == 0


def test_one_batched_launch_is_unchanged_by_the_grouped_path():
    # streams 0 is the batched GEMM: waves over all batch x tiles, the best tile for all
    for shape in [(1, 8192, 8192, 8192), (16, 1024, 3072, 4096), (4, 128, 4096, 7168)]:
        assert gemm_efficiency(*shape, device=H100) == gemm_efficiency(*shape, device=H100,
                                                                       streams=0)


def test_each_launch_takes_the_tile_best_for_its_own_shape():
    # 32 experts of 128 rows: batched, 128 x 128 tiles of all 32 fill the SMs' waves; one
    # expert alone (32 such tiles on 132 SMs) takes smaller tiles at their lower rate
    batched = gemm_efficiency(32, 128, 4096, 7168, device=H100)
    grouped = gemm_efficiency(32, 128, 4096, 7168, device=H100, streams=GROUPED_GEMM_STREAMS)
    alone = gemm_efficiency(1, 128, 4096, 7168, device=H100)
    assert grouped < batched
    assert math.isclose(grouped, alone, rel_tol=0.05)  # its waves are full either way


def test_at_most_streams_launches_share_the_sms():
    # experts so small that four at once leave SMs idle: a lone 128 x 128 GEMM takes the
    # smallest tile (8 tiles of 64 x 32), four such GEMMs' 32 tiles resident on 132 SMs
    eff = device_efficiency(H100)
    one = gemm_efficiency(64, 128, 128, 4096, device=H100, streams=1)
    four = gemm_efficiency(64, 128, 128, 4096, device=H100, streams=4)
    assert math.isclose(four / one, 4.0, rel_tol=1e-9)
    assert four < gemm_efficiency(64, 128, 128, 4096, device=H100)  # 64 tiles in one wave
    # a gap per launch on each stream, the four streams' gaps overlapping
    t16 = gemm_time_s(16, 4096, 4096, 4096, device=H100, dtype="bf16", elem_bytes=2,
                      streams=4)
    flops = 2.0 * 16 * 4096 ** 3
    rate = H100.peak_flops("bf16") * gemm_efficiency(16, 4096, 4096, 4096, device=H100,
                                                     streams=4)
    assert math.isclose(t16, flops / rate + 4 * eff.kernel_overhead_s, rel_tol=1e-9)


def test_dgrad_and_wgrad_run_grouped_too():
    # TE: dgrad and wgrad are general_grouped_gemm calls over the same m_splits
    fc1 = Op("moe.expert.fc1", "gemm", 2.0 * 16 * 1024 * 3072 * 4096, 0.0, (16, 1024, 3072, 4096),
             streams=GROUPED_GEMM_STREAMS)
    dgrad, wgrad = _backward_of(fc1)
    assert dgrad.streams == wgrad.streams == GROUPED_GEMM_STREAMS
    costs = ComputeCosts(H100, "bf16")
    assert costs.time_s(wgrad) > costs.time_s(Op(wgrad.name, "gemm", wgrad.flops, wgrad.bytes,
                                                 wgrad.shape))
