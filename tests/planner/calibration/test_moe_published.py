"""The simulator against published MoE training throughputs (issue 18.5; rows and
sources: planner/data/validation/moe_throughput.csv and its README)."""

from planner.calibration.moe import (
    measured_s,
    moe_cases,
    score,
    scored_rows,
    source_flops_per_token,
)
from planner.specs.model import preset


def test_every_scored_row_names_its_source():
    rows = scored_rows()
    assert len(rows) >= 20
    assert all(r["source"] and r["value"] for r in rows)


def test_source_flops_count_causal_attention_at_half():
    # Megatron-LM num_floating_point_operations: 6 x active weights (logits included,
    # embeddings not) + 6 x layers x seq x attention width (causal attention at half)
    m, s = preset("mixtral-8x7b"), 4096
    norms = (2 * m.num_layers + 1) * m.hidden_size
    active = m.num_active_params() - m.embedding_params() - norms
    assert abs(source_flops_per_token(m, s) / (6 * active + 6 * m.num_layers * s * m.q_dim)
               - 1) < 1e-6


def _dispatchers(case_id: str) -> str:
    """The MoE dispatcher of a row's plans."""
    (case,) = [c for c in moe_cases() if c.id == case_id]
    return "/".join(sorted({p.training.comm.moe_dispatcher for p in case.plans}))


def test_moe_rows_mean_error():
    # Reached (15.1% over the first 21 rows, median 10.0%; 14.7% over 43 with the DGX Cloud
    # recipes' 22, median 10.5%; 14.0% with Transformer Engine's FP8 quantization priced,
    # median 12.1%; 13.4% with the DeepEP dispatcher NeMo 25.07's DeepSeek-V3 script
    # runs on H100), not the 10% target. The rows run with
    # what their sources state: Megatron-Core's recompute modules (the long-context rows
    # fit with "layernorm, moe"), the Megatron-Bridge recipes' recompute none; 128k
    # (dp 1, cp 8) fits with the distributed optimizer over dp x cp; DeepSeek-V3 with its
    # multi-head latent attention.
    # Left: the NeMo FP8 Qwen3-30B rows measure half the throughput of the same layout in
    # the 25.09 container (-60% / -62%, Megatron-Bridge #1998), a tp 4 layout measures a
    # third slower (zoo-q235-h100-e, -41%), forced-balance long-context rows are 5-14%
    # slow (docs/calibration.md, "MoE").
    s = score()
    assert s.count >= 21, s.failed
    assert s.mape <= 0.137, s.errors
    # FP8 (delayed scaling) on the DGX Cloud recipes: TE's casts and transposes around
    # every FP8 GEMM priced (-16..-19% without them; the rest of the gap to the measured
    # 1.24x FP8 speed-up is not explained: docs/calibration.md, "DGX Cloud recipes")
    fp8 = [k for k in s.errors if k.startswith("dgxc-") and "-fp8-" in k]
    assert len(fp8) == 9 and all(abs(s.errors[k]) < 0.165 for k in fp8), s.errors
    # DeepSeek-V3 on 1024 H100 in NeMo 25.07 (tp 1, pp 8, vp 2, ep 64): DeepEP on H100, as
    # its release's pretrain_deepseek_v3.py sets (planner/data/validation/README.md); +45%
    # priced with the all-to-all dispatcher. Still too slow, where the NeMo 25.04 rows of
    # the same model, priced on the all-to-all dispatcher as before (which of the
    # scripts of that time ran is not stored), are too fast
    assert "deepep" in _dispatchers("dgxc-dsv3-pretrain-h100-bf16-1024-example")
    assert 0 < s.errors["dgxc-dsv3-pretrain-h100-bf16-1024-example"] < 0.25
    assert _dispatchers("dgxc-dsv3-2505-h100-bf16-1024") == "alltoall"
    # DeepSeek-V3 on 256 H100 (NeMo AutoModel): MLA priced as the model runs it
    assert abs(s.errors["automodel-dsv3-256"]) < 0.08
    # pp 32 x vp 3 over 94 layers: the embedding and the loss counted as layers
    assert abs(s.errors["zoo-q235-h100-d"]) < 0.12
    assert abs(s.errors["mb-2511-h100-qwen3-235b-a22b-fp8-cs-256"]) < 0.10  # ep 32, etp 1
    assert abs(s.errors["zoo-q235-h100-a"]) < 0.10  # cross-node EP 32, DeepEP
    assert abs(s.errors["zoo-q235-h100-c"]) < 0.10  # intra-node EP 8, Megatron-FSDP
    # selective "layernorm, moe" at 16k-64k (ModelZoo command line)
    long = [k for k in s.errors if k.startswith("zoo-q235-h100-long")]
    assert len(long) == 8 and all(abs(s.errors[k]) < 0.17 for k in long), s.errors
    assert all(abs(s.errors[k]) < 0.16 for k in long if "128k" not in k), s.errors
    # 128k: dp 1 x cp 8, the distributed optimizer sharded over the 8 cp ranks
    assert abs(s.errors["zoo-q235-h100-long128k-dropless"]) < 0.10


def test_cases_carry_their_plans():
    cases = {c.id: c for c in moe_cases()}
    mixtral = cases["mcore-mixtral8x7b-468"]
    assert mixtral.plans and mixtral.plans[0].training.ep == 8
    assert mixtral.plans[0].training.pipeline_flushes == 1  # Megatron: one schedule
    # NeMo AutoModel runs a schedule per local batch (LBS 8 of mbs 1): GA = 4 at 1024 GPUs
    # (gbs 8192 over dp 256), 1 at 256 (gbs 512 over dp 64)
    assert {p.training.pipeline_flushes for p in cases["automodel-dsv3-1024"].plans} == {4}
    assert {p.training.pipeline_flushes for p in cases["automodel-dsv3-256"].plans} == {1}
    # NeMo AutoModel trains bf16 models with torch.optim.Adam: no fp32 master weights
    # (the rows' notes cite the model builders and benchmark configs); Megatron keeps them
    assert mixtral.plans[0].training.master_weights
    for row in ("automodel-qwen3-30b-8", "automodel-dsv3-256", "automodel-dsv3-1024"):
        assert {p.training.master_weights for p in cases[row].plans} == {False}, row
    # gradients reduced in bf16 where the row's recipe sets grad_reduce_in_fp32 False
    # (Megatron-Bridge's Qwen3 recipes, cited in the notes), else Megatron's fp32
    assert {p.training.comm.grad_reduce_dtype
            for p in cases["mb-2511-h100-qwen3-235b-a22b-fp8-cs-256"].plans} == {"bf16"}
    assert {p.training.comm.grad_reduce_dtype for p in mixtral.plans} == {"fp32"}


def test_no_false_does_not_fit():
    """NeMo AutoModel ran Qwen3-30B-A3B with FSDP over 8 H100, ep 8, local batch 4 and full
    recompute; priced with Megatron's 18 bytes of states per parameter it did not fit
    (80.3 of 79.6 GiB), with its bf16 weights, gradients and Adam moments it does."""
    s = score()
    assert not s.failed, s.failed
    assert "automodel-qwen3-30b-8" in s.errors


def test_dgx_cloud_recipe_rows_are_priced():
    """NVIDIA/dgxc-benchmarking's H100 rows (README step times with their layouts, sources
    in the CSV and its README) are read and priced: 22 rows (DeepSeek-V3 3, Qwen3-235B 1,
    Grok-1 16, Llama 4 Maverick 2); the Grok-1 proxies (fewer layers, no preset) and the
    GB200 rows are data only. A later change that drops them fails here."""
    rows = [r for r in scored_rows() if r["id"].startswith("dgxc-")]
    assert len(rows) == 22, [r["id"] for r in rows]
    assert {r["model"] for r in rows} == {"deepseek-v3", "qwen3-235b-a22b", "grok-1",
                                          "llama4-maverick"}
    cases = {c.id: c for c in moe_cases() if c.id.startswith("dgxc-")}
    assert len(cases) == 22 and all(c.plans for c in cases.values()), cases.keys()
    s = score()
    assert len([k for k in s.errors if k.startswith("dgxc-")]) == 22, s.failed


def test_a_printed_step_time_is_the_measurement():
    # DeepSeek-V3 on 1024 H100 (deepseek_v3/pretraining/README.md): 52.04 s per step,
    # printed beside 163.7 TFLOPS_per_GPU; the row is timed by the step time, not by a FLOP
    # count over the TFLOP/s (which would differ by the source's FLOP formula)
    m = preset("deepseek-v3")
    row = next(r for r in scored_rows() if r["id"] == "dgxc-dsv3-2505-h100-bf16-1024")
    assert row["metric"] == "step_time_s"
    assert measured_s(row, m) == 52.04
    by_tflops = source_flops_per_token(m, 4096) * 8192 * 4096 / (1024 * 163.7e12)
    assert 0.03 < 1 - by_tflops / 52.04 < 0.05  # 50.1 s by Megatron-LM's count: 3.7% apart


def test_delayed_scaling_fp8_is_priced_as_fp8():
    # Transformer Engine's delayed scaling keeps one scale per tensor (amax history), as
    # current scaling does: this project's fp8; Grok-1 FP8 on 512 H100 (NeMo 24.12)
    cases = {c.id: c for c in moe_cases()}
    assert {p.training.dtype for p in cases["dgxc-grok1-2412-h100-fp8-512"].plans} == {"fp8"}
    assert {p.training.dtype for p in cases["dgxc-grok1-2412-h100-bf16-512"].plans} == {"bf16"}
