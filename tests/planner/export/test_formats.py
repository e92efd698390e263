import dataclasses
import json

import pytest

from planner.export.formats import export_plan
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Kernels, Sharding


def _plan(**kw):
    cfg = dict(tp=8, pp=4, dp=4, vp=2, mbs=2, gbs=256, seq_len=2048, recompute="selective",
               sequence_parallel=True, sharding=Sharding(optim=4))
    cfg.update(kw)
    return homogeneous_plan(preset("gpt3-175b"), parse_gpus_arg("A100-80GB-SXM:128"),
                            ParallelConfig(**cfg), kernels=Kernels(attention="flash"))


def test_megatron_flags():
    out = export_plan(_plan(), "megatron")
    args = out.text.replace("\\\n", " ").split()
    pairs = dict(zip(args, args[1:], strict=False))
    assert pairs["--tensor-model-parallel-size"] == "8"
    assert pairs["--pipeline-model-parallel-size"] == "4"
    assert pairs["--micro-batch-size"] == "2" and pairs["--global-batch-size"] == "256"
    assert pairs["--num-layers-per-virtual-pipeline-stage"] == "12"
    assert pairs["--recompute-granularity"] == "selective"
    assert pairs["--attention-backend"] == "flash"  # megatron-core 0.16: AttnBackend.flash
    for flag in ("--use-distributed-optimizer", "--sequence-parallel", "--bf16"):
        assert flag in args
    assert out.unsupported == ()


def test_megatron_full_recompute_and_unexpressible_sharding():
    out = export_plan(_plan(recompute="full", sharding=Sharding(params=2, grads=4, optim=4)),
                      "megatron")
    assert "--recompute-granularity full" in out.text and "--recompute-method uniform" in out.text
    assert "--use-distributed-optimizer" not in out.text
    assert any("P/G/OS 2/4/4" in u for u in out.unsupported)


def test_deepspeed_zero_stages_and_mics():
    for sharding, stage in ((Sharding(optim=4), 1), (Sharding(grads=4, optim=4), 2),
                            (Sharding(params=4, grads=4, optim=4), 3)):
        config = json.loads(export_plan(_plan(sharding=sharding), "deepspeed").text)
        assert config["zero_optimization"]["stage"] == stage
        assert config["train_batch_size"] == 256 and config["gradient_accumulation_steps"] == 32
    mics = _plan(tp=4, pp=2, dp=16, vp=1, gbs=256, sharding=Sharding(params=2, grads=2, optim=2))
    config = json.loads(export_plan(mics, "deepspeed").text)
    assert config["zero_optimization"]["mics_shard_size"] == 2


def test_torchtitan_degrees():
    out = export_plan(_plan(sharding=Sharding(params=4, grads=4, optim=4)), "torchtitan")
    assert "data_parallel_shard_degree = 4" in out.text
    assert "tensor_parallel_degree = 8" in out.text and "pipeline_parallel_degree = 4" in out.text
    assert 'pipeline_parallel_schedule = "Interleaved1F1B"' in out.text
    assert 'mode = "selective"' in out.text


def test_zero_bubble_schedule():
    """ZB-H1 (Qi et al. 2024): upstream Megatron-LM lacks it; torch.distributed.pipelining's
    ScheduleInterleavedZeroBubble runs it with one stage per rank."""
    plan = _plan(vp=1, schedule="zb-h1")
    megatron = export_plan(plan, "megatron")
    assert any("zb-h1" in u and "--enable-zero-bubble" in u for u in megatron.unsupported)
    assert "zero-bubble" not in megatron.text
    titan = export_plan(plan, "torchtitan")
    assert 'pipeline_parallel_schedule = "InterleavedZeroBubble"' in titan.text
    assert "pipeline_parallel_layers_per_stage = 24" in titan.text  # 96 layers / pp 4
    assert any("at least 2 stages per rank" in u for u in titan.unsupported)
    deepspeed = export_plan(plan, "deepspeed")
    assert any("--enable-zbh1-pipeline" in u for u in deepspeed.unsupported)
    assert not any("zb-h1" in u for u in export_plan(_plan(vp=1), "megatron").unsupported)


def test_sharding_per_stage_is_listed_as_unexpressible():
    from dataclasses import replace

    plan = _plan()
    per_stage = (Sharding(grads=4, optim=4), Sharding(), Sharding(optim=4),
                 Sharding(grads=4, optim=4))  # gpt3-175b ties its embeddings: ends alike
    plan = replace(plan, sharding=per_stage[-1], stage_sharding=per_stage)
    plan.check("plan")
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        out = export_plan(plan, fmt)
        assert any("differs between stages (P/G/OS per stage 1/4/4, 1/1/1, 1/1/4, 1/4/4)" in u
                   for u in out.unsupported), (fmt, out.unsupported)


def _mla_plan(model: str, **kw):
    cfg = dict(tp=2, pp=1, dp=8, ep=8, mbs=1, gbs=64, seq_len=4096, recompute="none",
               sequence_parallel=True)
    cfg.update(kw)
    return homogeneous_plan(preset(model), parse_gpus_arg("H100-80GB-SXM:16"),
                            ParallelConfig(**cfg), kernels=Kernels(attention="flash"))


def test_megatron_mla_flags():
    """Megatron-LM's MLA arguments (MLATransformerConfig): the latent ranks, the head
    widths, --qk-layernorm for the latent norms; cuDNN's fused attention, as Transformer
    Engine turns FlashAttention off when d_qk != d_v."""
    text = export_plan(_mla_plan("deepseek-v2"), "megatron").text
    for flag in ("--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512",
                 "--qk-head-dim 128", "--qk-pos-emb-head-dim 64", "--v-head-dim 128",
                 "--qk-layernorm", "--attention-backend fused"):
        assert flag in text, flag
    lite = export_plan(_mla_plan("deepseek-v2-lite"), "megatron").text
    assert "--multi-latent-attention" in lite and "--q-lora-rank" not in lite
    plain = export_plan(_mla_plan("mixtral-8x7b"), "megatron").text
    assert "--multi-latent-attention" not in plain and "--attention-backend flash" in plain


def test_torchtitan_names_its_deepseek_flavors():
    """torchtitan 0.2.2 models/deepseek_v3/__init__.py: "16B" (V2-Lite's shape), "236B",
    "671B"."""
    text = export_plan(_mla_plan("deepseek-v2", tp=1, dp=16, ep=16,
                                 sequence_parallel=False), "torchtitan").text
    assert 'name = "deepseek_v3"' in text and 'flavor = "236B"' in text


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama3-405b", "deepseek-v2-lite",
                                  "deepseek-v2", "deepseek-v3"])
def test_a_torchtitan_flavor_is_named_only_for_its_shape(name):
    """A model file that kept a preset's name with another shape (16 of llama3-8b's 32
    layers) was exported as flavor "8B": torchtitan would build the real 8B, not the
    planned model (audit of 2026-12-06). The flavor goes by the shape, not the name; the
    training settings (sequence, dropout, routing balance) are not part of it."""
    from planner.export.formats import _titan_flavor

    model = preset(name)
    assert _titan_flavor(model) is not None
    assert _titan_flavor(dataclasses.replace(model, seq_len=1024, dropout=True,
                                             load_imbalance=1.5)) is not None
    assert _titan_flavor(dataclasses.replace(model, num_layers=model.num_layers // 2)) is None
    assert _titan_flavor(dataclasses.replace(model, vocab_size=model.vocab_size + 1)) is None


def test_geglu_is_refused_by_megatron_only():
    """Megatron-LM's command line (megatron/training/arguments.py, core_transformer_config_
    from_args) gates the MLP with SiLU (--swiglu) or quick GELU x * sigmoid(1.702 x)
    (--quick-geglu), never GELU: a GeGLU model (grok-1) would be exported as a GELU one, so
    it is refused in one line naming the field, the value and what Megatron-LM has.
    DeepSpeed's config and torchtitan's (a model the user registers) carry no activation."""
    plan = _mla_plan("grok-1", tp=1, dp=16, ep=8, sequence_parallel=False)
    megatron = export_plan(plan, "megatron")
    refused = [u for u in megatron.unsupported if u.startswith("activation")]
    assert refused == [
        "activation geglu: megatron-core 0.16.1 (Megatron-LM core_r0.16.0) has gelu, swiglu "
        "(Megatron-LM's arguments gate the MLP with SiLU (--swiglu) or x * sigmoid(1.702 x) "
        "(--quick-geglu), not GELU; Megatron-Core's TransformerConfig takes activation_func "
        "F.gelu with gated_linear_unit from Python code only)"]
    assert "--swiglu" not in megatron.text
    swiglu = export_plan(_mla_plan("mixtral-8x7b", tp=1, dp=16, ep=8,
                                   sequence_parallel=False), "megatron")
    assert "--swiglu" in swiglu.text and not swiglu.unsupported
    for fmt in ("deepspeed", "torchtitan"):
        assert not any("activation" in u for u in export_plan(plan, fmt).unsupported), fmt
    titan = export_plan(plan, "torchtitan").text
    assert "# grok-1: set name and flavor" in titan and "GELU-gated feed-forward (GeGLU" in titan


def test_every_format_takes_a_tf32_plan_without_a_traceback():
    """A tf32 plan (fp32 storage, TF32 GEMMs) crashed the Megatron export with a KeyError
    (its dtype map had no tf32): every format lists it as a dtype the framework does not
    train in, or writes it."""
    from planner.export.formats import FORMATS

    plan = homogeneous_plan(preset("gpt3-350m"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(tp=1, pp=1, dp=8, mbs=8, gbs=256, seq_len=2048,
                                           dtype="tf32"), kernels=Kernels(attention="math"))
    for fmt in FORMATS:
        out = export_plan(plan, fmt)
        assert any("dtype tf32" in u for u in out.unsupported), (fmt, out.unsupported)


def test_the_tp_overlap_the_plan_was_priced_with_is_exported_or_refused():
    # A Hopper plan with sequence parallelism is priced with its tp collectives under the
    # GEMMs (Communication.tp_comm_overlap, the Megatron default here): Megatron-LM runs
    # that only with --tp-comm-overlap (its own default is off); a framework that cannot
    # (torchtitan without async TP) lists it. On Ampere, which hides none, it is neither.
    import dataclasses

    from planner.specs.plan import Communication

    def h100(comm=None):
        plan = homogeneous_plan(preset("llama2-13b"), parse_gpus_arg("H100-80GB-SXM:16"),
                                ParallelConfig(tp=8, dp=2, mbs=1, gbs=16, seq_len=4096,
                                               sequence_parallel=True))
        if comm is not None:
            plan = dataclasses.replace(plan, training=dataclasses.replace(plan.training,
                                                                          comm=comm))
        return plan

    assert "--tp-comm-overlap" in export_plan(h100(), "megatron").text
    assert "--tp-comm-overlap" not in export_plan(
        h100(Communication(tp_comm_overlap=False)), "megatron").text
    assert "--tp-comm-overlap" not in export_plan(_plan(), "megatron").text  # A100
    titan = export_plan(h100(), "torchtitan").unsupported
    assert any("tp collectives under the GEMMs" in u for u in titan)
    inline = Communication.preset("fsdp2", dtype="bf16")
    assert not any("tp collectives" in u
                   for u in export_plan(h100(inline), "torchtitan").unsupported)


def test_megatron_trains_moe_models_in_bf16_only():
    # Megatron-LM's arguments.py asserts "Expert parallelism is not supported with fp16
    # training", and the grouped expert GEMM the export writes (--moe-grouped-gemm) takes
    # bf16 only: an fp16 MoE plan was exported with exit 0 and failed at start-up.
    import pytest

    from planner.search.search import search_dtype
    from profiler.devices import device
    from profiler.schema import SpecError

    model = preset("olmoe-1b-7b")

    def plan(dtype):
        return homogeneous_plan(model, parse_gpus_arg("A100-80GB-SXM:8"),
                                ParallelConfig(dp=8, ep=8, mbs=1, gbs=8, seq_len=4096,
                                               dtype=dtype))

    assert any("dtype fp16 on an MoE model" in u
               for u in export_plan(plan("fp16"), "megatron").unsupported)
    assert not any("MoE model" in u for u in export_plan(plan("bf16"), "megatron").unsupported)
    assert search_dtype("megatron", model, [device("A100-80GB-SXM")], None) == "bf16"
    with pytest.raises(SpecError, match="trains an MoE model in bf16, fp8, which "
                       "V100-32GB-SXM2 lack; --framework deepspeed plans it in fp16"):
        search_dtype("megatron", model, [device("V100-32GB-SXM2")], None)
    assert search_dtype("megatron", preset("llama2-7b"), [device("V100-32GB-SXM2")],
                        None) == "fp16"


def test_torchtitan_takes_ep_over_the_tp_ranks_with_etp_1_and_deepep():
    # torchtitan 0.2.2 parallel_dims.py: efsdp = dp_shard x cp x tp / (etp x ep), so with
    # etp 1 the ep groups take the tp ranks too (ep 16 over dp 4 x tp 4 was refused), and
    # job_config.py `expert_parallel_comm_backend = "deepep"` runs DeepEP's dispatch (a
    # plan priced with it was exported without it).
    import dataclasses

    from planner.specs.plan import Communication

    plan = homogeneous_plan(preset("qwen3-30b-a3b"), parse_gpus_arg("H100-80GB-SXM:16"),
                            ParallelConfig(tp=4, dp=4, ep=16, etp=1, mbs=1, gbs=16,
                                           seq_len=4096, sequence_parallel=True,
                                           sharding=Sharding(params=4, grads=4, optim=4),
                                           comm=Communication.preset("fsdp2", dtype="bf16")))
    out = export_plan(plan, "torchtitan")
    assert not any("ep 16" in u for u in out.unsupported), out.unsupported
    assert "expert_tensor_parallel_degree = 1" in out.text
    assert "expert_parallel_comm_backend" not in out.text
    deepep = dataclasses.replace(plan, training=dataclasses.replace(
        plan.training, comm=dataclasses.replace(plan.training.comm, moe_dispatcher="deepep")))
    assert 'expert_parallel_comm_backend = "deepep"' in export_plan(deepep, "torchtitan").text


def test_capacity_routing_is_refused_where_the_framework_routes_dropless():
    # torchtitan 0.2.2's MoE routes every token (no capacity factor, no padding), and
    # trainplan's executor drops over-capacity copies but pads nothing: a plan priced
    # with them was exported with exit 0, and searched for those frameworks.
    import dataclasses

    import pytest

    from planner.search.search import check_framework
    from profiler.schema import SpecError

    capped = dataclasses.replace(preset("mixtral-8x7b"), capacity_factor=1.25)
    padded = dataclasses.replace(capped, pad_to_capacity=True)
    plan = homogeneous_plan(capped, parse_gpus_arg("H100-80GB-SXM:8"),
                            ParallelConfig(dp=8, ep=8, mbs=1, gbs=8, seq_len=4096,
                                           sharding=Sharding(params=8, grads=8, optim=8)))
    assert any("capacity factor 1.25" in u for u in export_plan(plan, "torchtitan").unsupported)
    assert not any("capacity" in u for u in export_plan(plan, "megatron").unsupported)
    with pytest.raises(SpecError, match="capacity factor 1.25 is not in torchtitan"):
        check_framework("torchtitan", capped, "bf16")
    check_framework("trainplan", capped, "bf16")
    with pytest.raises(SpecError, match="padded to capacity .* not in trainplan"):
        check_framework("trainplan", padded, "bf16")
    check_framework("megatron", padded, "bf16")


def test_megatron_gets_the_models_rope_base():
    """Llama 3 rotates with base 500,000 (Llama 3 Herd §3.2), Mixtral and Qwen3 with
    1,000,000 (their config.json): the export wrote no --rotary-base, so Megatron-LM
    trained with its default 10,000, another model than the plan's (CLI audit,
    2026-12-06). torchtitan's comment for a model it has no flavor of names it too."""
    def rotary(name, **kw):
        cfg = {"tp": 8, "pp": 1, "dp": 1, "mbs": 1, "gbs": 8, "seq_len": 2048, **kw}
        plan = homogeneous_plan(preset(name), parse_gpus_arg("H100-80GB-SXM:8"),
                                ParallelConfig(**cfg))
        args = export_plan(plan, "megatron").text.replace("\\\n", " ").split()
        return dict(zip(args, args[1:], strict=False)).get("--rotary-base"), plan

    assert rotary("llama3-8b")[0] == "500000"
    assert rotary("llama2-7b")[0] == "10000"
    assert rotary("gpt3-1.3b", tp=1, dp=8)[0] is None  # learned positions
    _, qwen = rotary("qwen3-30b-a3b", tp=1, dp=8, ep=8)
    assert ", rope_theta 1e+06)" in export_plan(qwen, "torchtitan").text
    odd = dataclasses.replace(qwen, model=dataclasses.replace(qwen.model, rope_theta=1e4 + 0.5))
    assert "rope_theta 10000.5: Megatron-LM's --rotary-base takes an integer" in (
        export_plan(odd, "megatron").unsupported)


@pytest.mark.parametrize("dropout, attention_dropout, flags", [
    (True, None, []),
    (False, None, ["--attention-dropout", "--hidden-dropout"]),
    (True, False, ["--attention-dropout"]),  # GPT-Neo in Megatron-DeepSpeed
    (False, True, ["--hidden-dropout"]),
])
def test_megatron_sets_attention_and_hidden_dropout_apart(dropout, attention_dropout, flags):
    """Megatron-LM's --attention-dropout and --hidden-dropout (0.1 each by default) are
    written 0 for the dropout the model does not apply, each on its own."""
    plan = _plan()
    plan = dataclasses.replace(plan, model=dataclasses.replace(
        plan.model, dropout=dropout, attention_dropout=attention_dropout))
    args = export_plan(plan, "megatron").text.replace("\\\n", " ").split()
    pairs = dict(zip(args, args[1:], strict=False))
    assert [f for f in ("--attention-dropout", "--hidden-dropout") if f in pairs] == flags
    assert all(pairs[f] == "0" for f in flags)


def test_torchtitan_says_its_models_apply_no_dropout():
    """torchtitan 0.2.2's LLMs (llama3, llama4, qwen3, deepseek_v3) have no dropout: a plan
    priced with dropout says which it priced and torchtitan does not train."""
    def header(**dropout):
        cfg = dict(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_len=2048)
        model = dataclasses.replace(preset("gpt3-1.3b"), **dropout)
        plan = homogeneous_plan(model, parse_gpus_arg("A100-80GB-SXM:8"), ParallelConfig(**cfg))
        return export_plan(plan, "torchtitan").text.split("[training]")[0]

    assert "the plan's attention and hidden dropout: torchtitan" in header()
    assert "the plan's hidden dropout: torchtitan" in header(attention_dropout=False)
    assert "dropout" not in header(dropout=False)
