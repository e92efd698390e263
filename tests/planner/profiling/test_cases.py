"""What `plan profile` measures covers every op the cost model will look up."""

import dataclasses

import pytest

from planner.costs.memory import rank_param_count
from planner.costs.workload import Op, WorkloadShape, embedding_work, head_work, layer_work
from planner.profiling.cases import op_cases, step_bytes, unmeasured_ops
from planner.specs.model import preset
from profiler.measure import OpCase

MODELS = [preset("debug-tiny"), preset("debug-tiny-llama"),
          dataclasses.replace(preset("debug-small"), dropout=True),
          dataclasses.replace(preset("debug-tiny-llama"), name="debug-tiny-geglu",
                              activation="geglu")]


def _workload_keys(model, w):
    work = layer_work(model, w)
    emb, head = embedding_work(model, w), head_work(model, w)
    items = (*work.forward, *work.backward, *emb[0], *emb[1], *head[0], *head[1])
    return {(op.name, op.variant, op.shape) for op in items if isinstance(op, Op)}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("attention", ["flash", "math"])
def test_cases_cover_every_op_of_the_workload(model, attention):
    cases = op_cases(model, tps=(1, 2), micro_batch_sizes=(2,), seq_lens=(32,), dtype="fp32",
                     attentions=(attention,))
    keys = {c.key for c in cases}
    for tp in (1, 2):
        w = WorkloadShape(micro_batch_size=2, seq_len=32, tp=tp, dtype="fp32",
                          attention=attention)
        assert _workload_keys(model, w) <= keys
    assert len({(c.key, c.grad_of) for c in cases}) == len(cases)  # each measured once


def test_each_case_runs_a_known_impl_at_valid_dimensions():
    pytest.importorskip("torch")
    from profiler.torch_ops import IMPLS

    for model in MODELS:
        for c in op_cases(model, tps=(1,), micro_batch_sizes=(2,), seq_lens=(32,),
                          dtype="bf16", attentions=("flash", "math")):
            assert isinstance(c, OpCase)
            if c.impl == "adamw":
                assert sum(c.dims) == c.shape[0]
            else:
                assert len(c.dims) == len(IMPLS[c.impl][1]), c
            assert c.reuse_bytes > 0


def test_backward_cases_differentiate_their_forward():
    cases = {c.name: c for c in op_cases(MODELS[0], tps=(1,), micro_batch_sizes=(2,),
                                         seq_lens=(32,), dtype="fp32", attentions=("flash",))}
    assert cases["mlp.fc1.dgrad"].grad_of == "input" and cases["mlp.fc1.wgrad"].grad_of == "weight"
    assert cases["mlp.fc1.dgrad"].dims == cases["mlp.fc1"].dims
    assert cases["attn.norm.bwd"].grad_of == "all" and cases["embed.grad"].impl == "embedding"


def test_optimizer_cases_hold_the_models_parameters_per_implementation():
    model = MODELS[1]
    cases = [c for c in op_cases(model, tps=(1, 2), micro_batch_sizes=(1,), seq_lens=(32,),
                                 dtype="fp32", attentions=("flash",)) if c.impl == "adamw"]
    assert {(c.variant, c.shape[0]) for c in cases} == {
        (impl, int(rank_param_count(model, num_layers=model.num_layers, first=True, last=True,
                                    tp=tp, pp=1)))
        for impl in ("fused", "foreach", "for_loop") for tp in (1, 2)}


def test_step_traffic_grows_with_the_batch():
    m = MODELS[0]
    small, big = (step_bytes(m, WorkloadShape(micro_batch_size=b, seq_len=64, dtype="fp32"))
                  for b in (1, 8))
    assert 0 < small < big


@pytest.mark.parametrize("model", MODELS[:2], ids=lambda m: m.name)
def test_fp8_runs_the_layers_gemms_in_fp8_and_the_rest_in_bf16(model):
    """Transformer Engine's te.Linear in Megatron-LM: the layers' linear layers in FP8,
    the LM head (not a TE module) and everything else in bf16."""
    from planner.profiling.cases import FP8_GEMMS

    fp8 = {c.name: c for c in op_cases(model, tps=(1,), micro_batch_sizes=(2,),
                                       seq_lens=(32,), dtype="fp8", attentions=("flash",))}
    bf16 = {c.name: c for c in op_cases(model, tps=(1,), micro_batch_sizes=(2,),
                                        seq_lens=(32,), dtype="bf16", attentions=("flash",))}
    # the same ops, less Transformer Engine's FP8 quantization kernels, which the profile
    # leaves to the memory model (planner/costs/workload.py `is_fp8_quantization`)
    assert fp8.keys() == bf16.keys()
    from planner.costs.workload import WorkloadShape, is_fp8_quantization, layer_work

    work = layer_work(model, WorkloadShape(micro_batch_size=2, seq_len=32, dtype="fp8"))
    assert any(is_fp8_quantization(op) for op in (*work.forward, *work.backward)
               if hasattr(op, "flops"))
    in_fp8 = {name for name, c in fp8.items() if c.impl.startswith("fp8_")}
    assert in_fp8 == {f"{g}{suffix}" for g in FP8_GEMMS for suffix in ("", ".dgrad", ".wgrad")}
    for name in in_fp8:
        assert fp8[name].impl == "fp8_" + bf16[name].impl and fp8[name].dims == bf16[name].dims
    assert fp8["head.logits"].impl == "linear" and fp8["head.logits.wgrad"].impl == "linear"
    assert not any(c.impl.startswith("fp8_") for c in bf16.values())


def test_each_op_of_a_profile_has_the_dtype_it_ran_in():
    from planner.profiling.cases import op_dtype

    assert [op_dtype("fp8", n) for n in ("mlp.fc1", "attn.qkv.dgrad", "mlp.fc2.wgrad",
                                         "head.logits", "attn.core.bwd", "optimizer.adamw")] \
        == ["fp8", "fp8", "fp8", "bf16", "bf16", "bf16"]
    assert op_dtype("tf32", "mlp.fc1") == "tf32" and op_dtype("bf16", "head.logits") == "bf16"


def test_a_geglu_model_profiles_its_own_activation():
    """GeGLU's elementwise op is measured as `mlp.geglu` by profiler/torch_ops.py's geglu
    (GELU of the gate times up), at the shape SwiGLU's is."""
    cases = {c.name: c for c in op_cases(MODELS[3], tps=(2,), micro_batch_sizes=(2,),
                                         seq_lens=(32,), dtype="fp32", attentions=("flash",))}
    assert "mlp.swiglu" not in cases
    assert (cases["mlp.geglu"].impl, cases["mlp.geglu"].dims) == ("geglu", (2 * 32, 176 // 2))
    assert cases["mlp.geglu.bwd"].impl == "geglu" and cases["mlp.geglu.bwd"].grad_of == "all"


def test_the_optimizer_is_timed_as_cold_as_the_largest_measured_step_leaves_it():
    """Between two optimizer steps a plan runs at least one micro-batch's forward and
    backward: the optimizer case's reuse distance is that step's traffic at the largest
    micro-batch x sequence the profile measures, not one sequence's."""
    m = MODELS[0]
    cases = op_cases(m, tps=(1,), micro_batch_sizes=(1, 8), seq_lens=(32, 64), dtype="fp32",
                     attentions=("flash",))
    adamw = [c for c in cases if c.impl == "adamw"]
    assert adamw and all(c.reuse_bytes == step_bytes(
        m, WorkloadShape(micro_batch_size=8, seq_len=64, dtype="fp32")) for c in adamw)
    assert adamw[0].reuse_bytes > step_bytes(
        m, WorkloadShape(micro_batch_size=1, seq_len=m.seq_len, dtype="fp32"))


def test_each_step_shape_is_a_step_of_its_own_and_the_optimizer_steps_after_the_largest():
    """Measured in turn, the cases of one step shape (tp, micro-batch, sequence; every
    attention backend's ops at it) take turns; the optimizer's are among the largest
    shape's of their tp."""
    m = MODELS[0]
    cases = op_cases(m, tps=(1, 2), micro_batch_sizes=(1, 8), seq_lens=(32,), dtype="fp32",
                     attentions=("flash", "math"))
    steps = {(c.name, c.variant, c.shape): c.step for c in cases}
    assert sorted(set(steps.values())) == [0, 1, 2, 3]  # tp 1 x mbs 1, 8; tp 2 x mbs 1, 8
    for tp, (small, large) in {1: (0, 1), 2: (2, 3)}.items():
        fc1 = {c.step for c in cases if c.name == "mlp.fc1" and c.shape[2] == m.ffn_hidden_size // tp}
        assert fc1 == {small, large}
    # both backends in one step's turns: flash's fused op [b, heads, ...] and the math
    # path's scores GEMM [b x heads, ...] at the same micro-batch and heads per rank
    flash = {c.step: c.shape[0] * c.shape[1] for c in cases if c.name == "attn.core"}
    math_ = {c.step: c.shape[0] for c in cases if c.name == "attn.scores"}
    assert flash == math_ == {0: 4, 1: 32, 2: 2, 3: 16}
    assert {c.step for c in cases if c.impl == "adamw"} == {1, 3}


# an MoE model with MLA attention, shared experts and a dense first layer (DeepSeek-V2's
# layout, Liu et al. 2024), small enough to measure
TINY_MLA_MOE = dataclasses.replace(
    preset("debug-tiny-moe"), name="tiny-mla-moe", kv_lora_rank=32, q_lora_rank=48,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, expert_ffn_hidden_size=32,
    num_shared_experts=1, first_k_dense=1)


@pytest.mark.parametrize("model, left", [
    (preset("debug-tiny-moe"),
     ["moe.topk", "moe.permute", "moe.expert.fc1", "moe.expert.fc2", "moe.unpermute"]),
    (TINY_MLA_MOE,
     ["attn.latent_norm", "attn.rope", "attn.core", "moe.topk", "moe.permute",
      "moe.expert.fc1", "moe.expert.fc2", "moe.unpermute"]),
], ids=["moe", "mla-moe"])
def test_moe_and_mla_cases_cover_every_op_torch_runs_and_name_the_rest(model, left):
    """`plan profile` on an MoE or MLA model raised on the first op without torch code
    (moe.router), the shipped debug-tiny-moe included; now it measures every op a plain
    GEMM or a norm, activation or attention of the dense layer's kind runs, and names the
    rest, which the analytic model prices."""
    w = WorkloadShape(micro_batch_size=2, seq_len=32, tp=1, dtype="fp32", attention="flash")
    assert unmeasured_ops(model, w) == left
    cases = op_cases(model, tps=(1,), micro_batch_sizes=(2,), seq_lens=(32,), dtype="fp32",
                     attentions=("flash",))
    measured = {c.name for c in cases}
    every = {name for name, _, _ in _workload_keys(model, w)}
    assert {"moe.router", "moe.router.wgrad", "moe.expert.swiglu"} <= measured
    forward = {name: name.removesuffix(".dgrad").removesuffix(".wgrad").removesuffix(".bwd")
               for name in every}
    assert every - measured == {name for name in every if forward[name] in left}
