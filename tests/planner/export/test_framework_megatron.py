"""Megatron-LM arguments checked by Megatron-Core 0.16.1's own config classes.

Megatron-LM's argument parser (megatron/training/arguments.py) is not on PyPI (the
megatron-core wheel holds megatron/core only), so the arguments are turned into the
configs the way Megatron-LM's core_transformer_config_from_args does: a flag sets the
TransformerConfig field of the same name. TransformerConfig, the DDP config, the
pipeline layout and the micro-batch calculator then validate and derive as Megatron does.
"""

import dataclasses
import shlex

import pytest

from planner.export.formats import export_plan
from planner.export.frameworks import chunk_layer_counts, plan_shape
from planner.specs.plan import Sharding
from tests.planner.export.framework_helpers import framework, gpt3_on_selene, plan_on

pytestmark = pytest.mark.frameworks


def _args(text: str) -> dict:
    tokens = shlex.split(text.replace("\\\n", " "))
    out, i = {}, 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag.startswith("--"), flag
        values = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            values.append(tokens[i + 1])
            i += 1
        i += 1
        if len(values) > 1:  # an nargs flag (--recompute-modules)
            out[flag] = values
        elif values:
            out[flag] = _number(values[0])
        else:
            out[flag] = True
    return out


def _number(text: str) -> object:
    """An argument as argparse's type would read it: int, float (1e-2), else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _megatron_configs(args: dict, world: int):
    """(TransformerConfig, DistributedDataParallelConfig, micro-batch calculator)."""
    torch = framework("torch")
    tc_mod = framework("megatron.core.transformer.transformer_config")
    enums = framework("megatron.core.transformer.enums")
    ddp_mod = framework("megatron.core.distributed.distributed_data_parallel_config")
    calc = framework("megatron.core.num_microbatches_calculator")
    names = {f.name for f in dataclasses.fields(tc_mod.TransformerConfig)}
    kw = {k[2:].replace("-", "_"): v for k, v in args.items()}
    fields = {k: v for k, v in kw.items() if k in names}
    if "num_layers_per_virtual_pipeline_stage" in kw:  # Megatron-LM's validate_args
        per_stage = kw["num_layers"] // kw["pipeline_model_parallel_size"]
        fields["virtual_pipeline_model_parallel_size"] = (
            per_stage // kw["num_layers_per_virtual_pipeline_stage"])
    fields["attention_backend"] = enums.AttnBackend[kw["attention_backend"]]
    if kw.get("disable_bias_linear"):  # arguments.py: store_false into add_bias_linear
        fields["add_bias_linear"] = False
    for flag, field in (("num_experts", "num_moe_experts"), ("moe_router_topk", None),
                        ("moe_ffn_hidden_size", None),
                        ("expert_model_parallel_size", None),
                        ("expert_tensor_parallel_size", None)):
        if flag in kw:
            fields[field or flag] = kw[flag]
    if kw.get("swiglu"):
        fields["gated_linear_unit"] = True
    if "fp8_format" in kw:  # Megatron-LM's arguments: --fp8-format becomes config.fp8
        fields["fp8"] = kw["fp8_format"]
    if kw.get("fp8_param_gather"):  # arguments.py: kw_args['fp8_param'] = args.fp8_param_gather
        fields["fp8_param"] = True
    dtype = torch.bfloat16 if kw.get("bf16") else torch.float16 if kw.get("fp16") else None
    if dtype is not None:
        fields.update(params_dtype=dtype, pipeline_dtype=dtype)
    config = tc_mod.TransformerConfig(**fields)
    dp = world // (config.tensor_model_parallel_size * config.pipeline_model_parallel_size
                   * config.context_parallel_size)
    ddp = ddp_mod.DistributedDataParallelConfig(
        # Megatron-LM's validate_args turns accumulate_allreduce_grads_in_fp32 on for bf16
        # ("accumulate and all-reduce gradients in fp32 for bfloat16 data type"), and
        # training.py hands it to the DDP config as grad_reduce_in_fp32
        grad_reduce_in_fp32=bool(kw.get("accumulate_allreduce_grads_in_fp32") or kw.get("bf16")),
        use_distributed_optimizer=bool(kw.get("use_distributed_optimizer")),
        # training.py hands --overlap-grad-reduce and --ddp-bucket-size over as these
        overlap_grad_reduce=bool(kw.get("overlap_grad_reduce")),
        bucket_size=kw.get("ddp_bucket_size"),
        num_distributed_optimizer_instances=kw.get("num_distributed_optimizer_instances", 1))
    batches = calc.ConstantNumMicroBatchesCalculator(
        kw["global_batch_size"], kw["micro_batch_size"], dp,
        decrease_batch_size_if_needed=False, rank=0)
    return config, ddp, batches, dp


def _round_trip(plan):
    out = export_plan(plan, "megatron")
    assert out.unsupported == (), out.unsupported
    config, ddp, batches, dp = _megatron_configs(_args(out.text), plan.num_gpus_used)
    s = plan_shape(plan)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
            config.context_parallel_size, dp) == (s.tp, s.pp, s.cp, s.dp)
    assert (config.virtual_pipeline_model_parallel_size or 1) == s.vp
    assert (batches.get_micro_batch_size(), batches.get_current_global_batch_size(),
            batches.get()) == (s.mbs, plan.training.global_batch_size, s.num_microbatches)
    assert config.sequence_parallel == plan.training.sequence_parallel
    assert config.recompute_granularity == {"none": None}.get(s.recompute[0], s.recompute[0])
    assert config.bf16 == (plan.training.dtype in ("bf16", "fp8"))  # fp8: bf16 elsewhere
    assert config.fp8 == ("hybrid" if plan.training.dtype == "fp8" else None)
    assert config.fp8_param == plan.training.fp8_params  # FP8 primary weights as priced
    # fp32 main gradients in 16-bit training, as the plan prices them (fp32_grads);
    # fp32 training's gradients are fp32 whatever the flag
    assert ddp.grad_reduce_in_fp32 == (plan.training.dtype != "fp32")
    # the gradient reduction overlapped with the backward where the plan priced it so
    # (Megatron-Core's default is not to), in the plan's buckets
    comm, ranks = plan.training.comm, s.dp * s.cp
    assert ddp.overlap_grad_reduce == (comm.overlap_grad_reduce and ranks > 1)
    assert ddp.bucket_size == (comm.grad_bucket_params if ranks > 1 else None)
    sh = plan.sharding
    optim = dp // ddp.num_distributed_optimizer_instances if ddp.use_distributed_optimizer else 1
    assert (1, 1, optim) == (sh.params, sh.grads, sh.optim)
    return config


def _layers_per_chunk(config, pp: int, vp: int) -> list[int]:
    enums = framework("megatron.core.transformer.enums")
    layout = config.pipeline_model_parallel_layout
    if layout is None:  # Megatron's even split
        return [config.num_layers // (pp * vp)] * (pp * vp)
    layout.validate_layer_layout(config.num_layers, mtp_num_layers=None)
    return [layout.layout[s][c].count(enums.LayerType.decoder)
            for c in range(vp) for s in range(pp)]


def test_gpt3_on_selene_round_trips_through_megatron_core():
    plan = gpt3_on_selene()
    config = _round_trip(plan)
    assert config.virtual_pipeline_model_parallel_size == 3
    assert _layers_per_chunk(config, 16, 3) == [2] * 48
    assert config.attention_backend.name == "flash"


def test_uneven_stages_as_a_pipeline_layout():
    plan = gpt3_on_selene(pp=5, dp=8, tp=8, vp=2, gbs=1280, cp=1)  # 96 layers: 19/20/19/...
    assert len(set(plan_shape(plan).layers)) > 1
    config = _round_trip(plan)
    assert _layers_per_chunk(config, 5, 2) == chunk_layer_counts(plan_shape(plan).layers, 2)


def test_full_recompute_partial_distributed_optimizer_gqa():
    plan = plan_on("H100-80GB-SXM:64", tp=2, pp=4, dp=8, mbs=1, gbs=128, recompute="full",
                   sequence_parallel=True, sharding=Sharding(optim=4))
    config = _round_trip(plan)
    assert (config.recompute_method, config.recompute_num_layers) == ("uniform", 1)
    assert config.num_query_groups == 8 and config.gated_linear_unit
    assert config.normalization == "RMSNorm"


def test_fp8_runs_transformer_engine_gemms_with_delayed_scaling():
    """DType.FP8 (FP8 GEMMs, per-tensor scales, bf16 elsewhere) is Megatron-Core's fp8
    "hybrid" (e4m3 forward, e5m2 gradients) with its default delayed-scaling recipe."""
    plan = plan_on("H100-80GB-SXM:64", tp=2, pp=4, dp=8, mbs=1, gbs=128, dtype="fp8")
    config = _round_trip(plan)
    assert (config.fp8, config.fp8_recipe) == ("hybrid", "delayed")


def test_fp8_primary_weights_reach_megatron_core():
    """Training.fp8_params (the memory model's FP8 primary weights: Megatron-Core
    TransformerConfig.fp8_param) is written as --fp8-param-gather, which Megatron-LM's
    arguments hand to the config as fp8_param."""
    base = plan_on("H100-80GB-SXM:64", tp=2, pp=4, dp=8, mbs=1, gbs=128, dtype="fp8",
                   sharding=Sharding(optim=8))
    plan = dataclasses.replace(base, training=dataclasses.replace(base.training,
                                                                   fp8_params=True))
    config = _round_trip(plan)
    assert config.fp8_param and config.fp8 == "hybrid"
    assert not _round_trip(base).fp8_param
    # Megatron-LM's arguments.py asserts "--fp8-param-gather only supported with
    # distributed optimizer, ...": without sharded optimizer states it is refused (it was
    # exported with exit 0, export sweep 2026-12-04)
    bare = plan_on("H100-80GB-SXM:64", tp=2, pp=4, dp=8, mbs=1, gbs=128, dtype="fp8")
    bare = dataclasses.replace(bare, training=dataclasses.replace(bare.training,
                                                                   fp8_params=True))
    assert any(u.startswith("FP8 parameters (training.fp8_params) with unsharded optimizer")
               for u in export_plan(bare, "megatron").unsupported)


def test_fp16_keeps_fp32_main_gradients_as_priced():
    """The plan prices fp32 main gradients (ModelStates.FP32_GRADS, 18 bytes per
    parameter unsharded). Megatron-LM keeps them so in bf16 by itself, in fp16 only with
    --accumulate-allreduce-grads-in-fp32 (the DDP config's grad_reduce_in_fp32; without it
    distributed_data_parallel.py keeps main grads in the parameters' dtype), which the
    export writes; fp32 training needs no flag."""
    for dtype, flag in (("fp16", True), ("bf16", False), ("fp32", False)):
        plan = plan_on("A100-80GB-SXM:8", model="gpt3-1.3b", dp=8, mbs=1, gbs=64, dtype=dtype,
                       sharding=Sharding(optim=8),
                       attention="math" if dtype == "fp32" else "flash")  # flash: 16-bit
        _round_trip(plan)
        text = export_plan(plan, "megatron").text
        assert ("--accumulate-allreduce-grads-in-fp32" in text) == flag, dtype


def test_refused_sharding_is_named():
    out = export_plan(gpt3_on_selene(sharding=Sharding(grads=4, optim=8)), "megatron")
    assert [u for u in out.unsupported if u.startswith("sharding P/G/OS 1/4/8")]


def test_selective_recompute_modules_reach_megatron_core():
    """Training.recompute_modules is Megatron-Core's --recompute-modules (its default,
    core_attn, is left to Megatron); the parser checks the module names."""
    plan = plan_on("H100-80GB-SXM:64", tp=2, pp=4, dp=8, mbs=1, gbs=128,
                   sequence_parallel=True, recompute="selective",
                   recompute_modules=("layernorm", "mlp"))
    config = _round_trip(plan)
    assert config.recompute_granularity == "selective"
    assert list(config.recompute_modules) == ["layernorm", "mlp"]
    default = plan_on("H100-80GB-SXM:64", tp=2, pp=4, dp=8, mbs=1, gbs=128,
                      recompute="selective", sequence_parallel=True)
    assert "--recompute-modules" not in " ".join(export_plan(default, "megatron").text)


def test_moe_with_tensor_parallelism_round_trips_through_megatron_core():
    """Mixtral with tp 2 and ep 4: Megatron-Core refuses linear biases on experts split by
    expert tensor parallelism ("Bias in Moe is only supported when ETP==1"), and the
    planner prices no biases: the export says --disable-bias-linear and builds."""
    plan = plan_on("H100-80GB-SXM:16", model="mixtral-8x7b", tp=2, dp=8, ep=4, mbs=1,
                   gbs=64, seq_len=4096, sequence_parallel=True)
    config = _round_trip(plan)
    assert config.add_bias_linear is False
    assert (config.num_moe_experts, config.expert_model_parallel_size) == (8, 4)


def test_mla_flags_build_megatron_cores_mla_config():
    """The MLA flags as Megatron-LM's core_transformer_config_from_args reads them: with
    --multi-latent-attention the config is an MLATransformerConfig, each flag its field
    (q_lora_rank None without --q-lora-rank, arguments.py's default)."""
    tc_mod = framework("megatron.core.transformer.transformer_config")
    for model, q_lora in (("deepseek-v2", 1536), ("deepseek-v2-lite", None)):
        plan = plan_on("H100-80GB-SXM:16", model=model, tp=2, dp=8, ep=8, mbs=1, gbs=64,
                       seq_len=4096, sequence_parallel=True)
        out = export_plan(plan, "megatron")
        assert out.unsupported == (), out.unsupported
        kw = {k[2:].replace("-", "_"): v for k, v in _args(out.text).items()}
        names = {f.name for f in dataclasses.fields(tc_mod.MLATransformerConfig)}
        assert kw["multi_latent_attention"]
        fields = {k: kw[k] for k in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                     "v_head_dim", "qk_layernorm", "num_layers",
                                     "hidden_size", "num_attention_heads", "num_moe_experts")
                  if k in kw and k in names}
        config = tc_mod.MLATransformerConfig(
            **fields, q_lora_rank=kw.get("q_lora_rank"), rope_type="rope",
            tensor_model_parallel_size=2, sequence_parallel=True,
            num_moe_experts=kw["num_experts"], moe_router_topk=kw["moe_router_topk"],
            moe_ffn_hidden_size=kw["moe_ffn_hidden_size"], ffn_hidden_size=kw["ffn_hidden_size"],
            expert_model_parallel_size=8, gated_linear_unit=True, bf16=True,
            add_bias_linear=False)  # the planner's models have none
        m = plan.model
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim,
                config.qk_pos_emb_head_dim, config.v_head_dim, config.qk_layernorm) == (
            q_lora, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, True)
        assert kw["attention_backend"] == "fused"


def test_moe_routers_get_load_balancing_as_megatron_recommends():
    """Megatron's --moe-aux-loss-coeff defaults to 0: the export's Mixtral trained with no
    balancing at all. A softmax router gets the auxiliary loss at arguments.py's
    recommended 1e-2; Megatron-Core reads both into its TransformerConfig."""
    plan = plan_on("H100-80GB-SXM:16", model="mixtral-8x7b", tp=2, dp=8, ep=4, mbs=1,
                   gbs=64, seq_len=4096, sequence_parallel=True)
    config = _round_trip(plan)
    assert config.moe_router_load_balancing_type == "aux_loss"
    assert config.moe_aux_loss_coeff == 1e-2


def test_moe_settings_megatron_core_refuses_are_named():
    """Two MoE plans Megatron-Core raises on were exported with exit 0 (export sweep,
    2026-12-04): experts padded to capacity under the DeepEP dispatcher
    (transformer_config.py: "Flex token dispatcher with deepep backend does not support
    moe_pad_expert_input_to_capacity") and optimizer instances not dividing the expert
    data-parallel group (parallel_state.py: "Expert data parallel size should be
    divisible by partial DistOpt shard factor")."""
    base = plan_on("H100-80GB-SXM:64", model="mixtral-8x7b", tp=2, dp=32, ep=8, etp=1,
                   mbs=1, gbs=256, seq_len=4096, sequence_parallel=True)
    padded = dataclasses.replace(base, model=dataclasses.replace(
        base.model, capacity_factor=1.25, pad_to_capacity=True), training=dataclasses.replace(
        base.training, comm=dataclasses.replace(base.training.comm, moe_dispatcher="deepep")))
    assert any("padded to the capacity with the DeepEP dispatcher" in u
               for u in export_plan(padded, "megatron").unsupported)
    # pp 4 ep 8 etp 1 on 64 GPUs: expert dp = 2; dp x cp 8 / optim 2 = 4 instances
    partial = plan_on("H100-80GB-SXM:64", model="mixtral-8x7b", tp=2, pp=4, dp=8, ep=8,
                      etp=1, mbs=1, gbs=256, seq_len=4096, sequence_parallel=True,
                      sharding=Sharding(optim=2))
    assert any(u.startswith("optimizer states sharded within 4 instances (P/G/OS 1/1/2) "
                            "with an expert data-parallel group of 2")
               for u in export_plan(partial, "megatron").unsupported)
