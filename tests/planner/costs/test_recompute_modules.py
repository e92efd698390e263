"""Selective recomputation by module (Megatron-Core `recompute_modules`,
megatron/core/transformer/transformer_config.py): what each module re-runs before the
backward and which saved tensors it frees."""

import dataclasses

import pytest

from planner.calibration.moe import recomputations
from planner.costs.memory import activation_memory
from planner.costs.workload import (
    Comm,
    HostSync,
    Op,
    WorkloadShape,
    hardware_flops_per_token,
    layer_work,
    model_flops_per_token,
)
from planner.specs.choices import Recompute, RecomputeModule
from planner.specs.cluster import homogeneous_cluster
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import plan_from_dict, plan_to_dict
from profiler.devices import device
from profiler.schema import SpecError

QWEN = preset("qwen3-235b-a22b")  # 128 experts, top-8, no shared experts
MIXTRAL = preset("mixtral-8x7b")


def _work(model, modules, **fields):
    shape = WorkloadShape(**{"micro_batch_size": 1, "seq_len": 4096, "tp": 2,
                             "sequence_parallel": True, "ep": 8, "etp": 1,
                             "recompute_modules": modules, **fields})
    return layer_work(model, shape)


def _names(items):
    return [i.name for i in items]


def test_default_is_the_attention_core():
    # Megatron's default recompute_modules ["core_attn"]: the attention backend's ops
    w = _work(QWEN, ("core_attn",))
    assert w.selective_recompute == w.attention_core
    assert _names(w.selective_recompute) == ["attn.core"]


def test_layernorm_frees_the_norm_outputs():
    # output-discarding checkpoint of input_layernorm and pre_mlp_layernorm: the QKV and
    # MLP inputs (one [s/tp, b, h] tensor each with sequence parallelism) are not kept
    base, norms = _work(QWEN, ("core_attn",)), _work(QWEN, ("core_attn", "layernorm"))
    n_sp, h = 4096 // 2, QWEN.hidden_size
    assert base.selective_activation_bytes - norms.selective_activation_bytes == \
        pytest.approx(2 * n_sp * h * 2)
    assert _names(norms.selective_recompute) == ["attn.norm", "attn.core", "mlp.norm"]


def test_moe_act_frees_the_expert_activation_output():
    # the fc2 input of the routed experts: tokens x top-k x expert ffn, bf16
    base, act = _work(QWEN, ("core_attn",)), _work(QWEN, ("core_attn", "moe_act"))
    copies = 4096 // 2 * QWEN.experts_per_token  # sequence-parallel tokens routed, etp 1
    freed = base.selective_activation_bytes - act.selective_activation_bytes
    assert freed == pytest.approx(copies * QWEN.expert_ffn * 2)
    assert "moe.expert.swiglu" in _names(act.selective_recompute)


def test_moe_keeps_only_its_input_and_runs_the_all_to_alls_again():
    # MoELayer checkpoints router, dispatch, experts and combine as one function
    w = _work(QWEN, ("moe",))
    again = w.selective_recompute
    assert [c.name for c in again if isinstance(c, Comm)] == ["moe.dispatch", "moe.combine"]
    assert {"moe.router", "moe.expert.fc1", "moe.expert.fc2"} <= set(_names(again))
    none = _work(QWEN, ("moe", "moe_act"))  # moe_act is inside the moe checkpoint
    assert none.selective_activation_bytes == w.selective_activation_bytes
    assert _names(none.selective_recompute) == _names(again)
    # freed: router probabilities (fp32), permuted tokens and their probabilities, the
    # experts' gate/up outputs and activation outputs (bf16)
    n_r, h, f = 4096 // 2, QWEN.hidden_size, QWEN.expert_ffn
    copies = n_r * QWEN.experts_per_token
    freed = (4 * n_r * QWEN.num_experts + copies * (2 * h + 4) + copies * f * (2 * 2 + 2))
    assert w.activation_bytes - w.selective_activation_bytes == pytest.approx(freed)


def test_shared_experts_and_mlp_modules():
    m = dataclasses.replace(MIXTRAL, num_shared_experts=1, shared_expert_ffn_hidden_size=4096)
    w = _work(m, ("shared_experts",))
    assert {"moe.shared.fc1", "moe.shared.fc2"} <= set(_names(w.selective_recompute))
    dense = preset("llama3-8b")
    d = _work(dense, ("mlp",), ep=1, etp=None)
    assert {"mlp.fc1", "mlp.fc2"} <= set(_names(d.selective_recompute))
    assert _names(_work(dense, ("moe_act",), ep=1, etp=None).selective_recompute) == []


def test_recomputed_modules_cost_backward_time_and_save_memory():
    dev = device("H100-80GB-SXM")
    shape = WorkloadShape(micro_batch_size=1, seq_len=4096, tp=2, sequence_parallel=True,
                          ep=8, etp=1)
    moe = dataclasses.replace(shape, recompute_modules=("layernorm", "moe"))
    base = activation_memory(QWEN, device=dev, shape=shape, num_layers=12, last=False,
                             recompute=Recompute.SELECTIVE, layers_in_flight=30)
    less = activation_memory(QWEN, device=dev, shape=moe, num_layers=12, last=False,
                             recompute=Recompute.SELECTIVE, layers_in_flight=30)
    assert less.activations_bytes < 0.4 * base.activations_bytes
    # the recomputed layer's tensors exist while its backward runs
    assert less.buffers_bytes > base.buffers_bytes


def test_hardware_flops_count_the_recomputed_matmuls():
    s = 4096
    model = model_flops_per_token(QWEN, s)
    again = hardware_flops_per_token(QWEN, s, "selective", ("layernorm", "moe")) - model
    routed = 2 * QWEN.hidden_size * (QWEN.num_experts + 3 * QWEN.experts_per_token
                                     * QWEN.expert_ffn)
    assert again == pytest.approx(QWEN.num_layers * routed)
    assert hardware_flops_per_token(QWEN, s, "selective", ("moe_act",)) == model


def test_plans_carry_and_check_their_modules():
    cluster = homogeneous_cluster("H100-80GB-SXM", 64)
    cfg = ParallelConfig(tp=1, pp=4, dp=16, mbs=1, gbs=256, seq_len=4096, ep=8,
                         recompute=Recompute.SELECTIVE,
                         recompute_modules=(RecomputeModule.LAYERNORM, RecomputeModule.MOE))
    plan = homogeneous_plan(MIXTRAL, cluster, cfg)
    again = plan_from_dict(plan_to_dict(plan))
    assert again.training.recompute_modules == (RecomputeModule.LAYERNORM,
                                                RecomputeModule.MOE)
    data = plan_to_dict(plan)
    data["training"]["recompute_modules"] = ["moe", "moe"]
    with pytest.raises(SpecError, match="recompute_modules"):
        plan_from_dict(data)
    data["training"]["recompute_modules"] = ["qkv_proj"]  # not a Megatron-Core module
    with pytest.raises(SpecError, match="allowed"):
        plan_from_dict(data)


@pytest.mark.parametrize("text, expected", [
    ("selective: norm, act", (Recompute.SELECTIVE, ("layernorm", "moe_act"))),
    ("selective: layernorm, moe", (Recompute.SELECTIVE, ("layernorm", "moe"))),
    ("select (moe_act, layernorm)", (Recompute.SELECTIVE, ("moe_act", "layernorm"))),
    ("select", (Recompute.SELECTIVE, ("core_attn",))),
    ("none listed", (Recompute.NONE, ("core_attn",))),
    ("full", (Recompute.FULL, ("core_attn",))),
])
def test_the_calibration_reads_what_a_row_recomputed(text, expected):
    assert recomputations(text) == [expected]
    assert len(recomputations("not stated")) == 3
    assert recomputations("selective: mlp (dense layers), mla up_proj") == []
    again = _work(QWEN, expected[1]).selective_recompute
    assert all(isinstance(op, Op | Comm | HostSync) for op in again)
    # re-running the MoE block re-runs the dispatcher's wait for the token counts
    assert any(isinstance(op, HostSync) for op in again) == ("moe" in expected[1])
