import pytest

from planner.specs.model import ModelSpec, load_model, model_presets, preset
from profiler.schema import SpecError

# Published parameter counts (Brown et al. 2020; Touvron et al. 2023; Llama 3 2024;
# BigScience 2022; Narayanan et al. 2021 Table 1).
PUBLISHED = {
    "gpt3-175b": 175e9, "gpt3-6.7b": 6.7e9, "gpt3-125m": 125e6, "llama2-7b": 6.74e9,
    "llama2-70b": 68.98e9, "llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3-405b": 405.8e9,
    "bloom-176b": 176.2e9, "megatron-1t": 1008e9, "megatron-530b": 529.6e9, "mpt-7b": 6.7e9,
}


@pytest.mark.parametrize("name, count", PUBLISHED.items())
def test_parameter_counts_match_published(name, count):
    assert preset(name).num_params() == pytest.approx(count, rel=0.02)


def test_families_present():
    names = set(model_presets())
    for prefix, least in (("gpt3-", 8), ("megatron-", 10), ("llama2-", 3), ("llama3-", 3),
                          ("bloom-", 1), ("mpt-", 6), ("debug-", 2)):
        assert sum(n.startswith(prefix) for n in names) >= least, prefix


def test_debug_models_are_tiny():
    for name in ("debug-tiny", "debug-tiny-llama"):
        assert preset(name).num_params() < 200_000


def test_unknown_preset_suggests():
    with pytest.raises(SpecError, match=r"model: 'gpt3-175' is not a known preset \(did you mean gpt3-175b"):
        preset("gpt3-175")


def test_model_file_errors(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("name: m\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\n"
                 "num_heads: 6\nvocab_size: 100\nseq_len: 32\n")
    with pytest.raises(SpecError, match=r"m.yaml:num_heads: 6 is not allowed \(must divide hidden_size 64\)"):
        load_model(str(f))
    f.write_text("name: m\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\n"
                 "num_heads: 4\nnum_kv_heads: 3\nvocab_size: 100\nseq_len: 32\n")
    with pytest.raises(SpecError, match="num_kv_heads: 3 is not allowed"):
        load_model(str(f))


def test_rope_needs_an_even_rotated_width(tmp_path):
    """RoPE rotates pairs of dimensions (Su et al. 2021, eq. 34): a rope model with
    1-wide heads loaded, then `plan run` failed in the ranks' apply_rope with a
    traceback and `plan profile` dropped its qkv rows."""
    f = tmp_path / "m.yaml"
    base = "name: m\nnum_layers: 1\nffn_hidden_size: 8\nvocab_size: 8\nseq_len: 4\n"
    f.write_text(base + "hidden_size: 6\nnum_heads: 2\n")
    with pytest.raises(SpecError, match=r"m.yaml:num_heads: 2 is not allowed \(an even head "
                                        r"width with rope, which rotates pairs of dimensions; "
                                        r"a head here is 3 wide\)"):
        load_model(str(f))
    f.write_text(base + "hidden_size: 6\nnum_heads: 2\nposition_embedding: learned\n")
    assert load_model(str(f)).head_dim == 3  # nothing rotated
    f.write_text(base + "hidden_size: 8\nnum_heads: 2\nattention_head_dim: 5\n")
    with pytest.raises(SpecError, match=r"m.yaml:attention_head_dim: 5 is not allowed"):
        load_model(str(f))
    f.write_text(base + "hidden_size: 8\nnum_heads: 2\nkv_lora_rank: 4\n"
                 "qk_nope_head_dim: 4\nqk_rope_head_dim: 3\nv_head_dim: 4\n")
    with pytest.raises(SpecError, match=r"m.yaml:qk_rope_head_dim: 3 is not allowed \(an even "
                                        r"width: rope rotates pairs of dimensions\)"):
        load_model(str(f))


def test_a_model_without_lm_head_computes_its_loss_on_hidden_states():
    """Megatron-DeepSpeed's GPTNeoModelPipe (Sailor's GPT-Neo runs) ends in a LayerNorm:
    no output projection, no logits GEMM, no head weights."""
    import dataclasses

    from planner.costs.workload import Op, WorkloadShape, head_work, model_flops_per_token

    m = preset("gpt3-1.3b")
    headless = dataclasses.replace(m, lm_head=False, tied_embeddings=False)
    assert headless.head_params() == m.hidden_size * 2  # the final LayerNorm only
    shape = WorkloadShape(micro_batch_size=1, seq_len=2048)
    fwd, _, saved = head_work(headless, shape)
    assert not any(isinstance(op, Op) and op.kind == "gemm" for op in fwd)
    assert saved < head_work(m, shape)[2] / 10
    assert model_flops_per_token(headless, 2048) < model_flops_per_token(m, 2048)


@pytest.mark.parametrize("field, value, message", [
    ("num_layers", 10**26,
     "num_layers: 100000000000000000000000000 is not allowed (must be ≤ 1,024)"),
    ("hidden_size", 10**26,
     "hidden_size: 100000000000000000000000000 is not allowed (must be ≤ 262,144)"),
    ("vocab_size", 10**9, "must be ≤ 16,777,216"),
    ("seq_len", 2**30, "must be ≤ 16,777,216"),
    ("num_heads", 0, "must be ≥ 1"),
    ("num_layers", 1e3, "expected an integer"),
])
def test_model_numbers_are_bounded(tmp_path, field, value, message):
    """1e26 layers overflowed and a 1e26 hidden size ran out of memory after minutes:
    both are refused where the file is read."""
    import yaml

    data = {"name": "m", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256,
            "num_heads": 4, "vocab_size": 1000, "seq_len": 128, field: value}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as err:
        load_model(str(path))
    assert str(err.value).startswith(f"{path}:{field}") and message in str(err.value)


# Published total / active parameters of the MoE presets (sources in models.yaml):
# Mixtral card 46.7B / 12.9B; NeMo docs 141B / 39B for 8x22B; DeepSeek-V3 report Table 1
# 671B / 37B; Qwen3 model cards 30.5B / 3.3B and 235B / 22B; OLMoE paper 6.9B / 1.3B.
# Totals within 1%; active counts within 5% (Qwen3 ignores its QK-norm weights).
MOE_PUBLISHED = {
    "mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9),
    "deepseek-v3": (671e9, 37e9), "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "qwen3-235b-a22b": (235e9, 22e9), "olmoe-1b-7b": (6.9e9, 1.3e9),
}


@pytest.mark.parametrize("name, counts", MOE_PUBLISHED.items())
def test_moe_parameter_counts_match_published(name, counts):
    m = preset(name)
    assert m.is_moe
    assert m.num_params() == pytest.approx(counts[0], rel=0.01)
    assert m.num_active_params() == pytest.approx(counts[1], rel=0.05)


def test_moe_layer_pattern():
    v3 = preset("deepseek-v3")
    assert [v3.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert v3.num_moe_layers == 58
    every_other = _moe_model(moe_layer_freq=2)
    assert [every_other.is_moe_layer(i) for i in range(4)] == [True, False, True, False]
    assert not preset("llama3-8b").is_moe and preset("llama3-8b").num_moe_layers == 0


def _moe_model(**fields):
    from planner.specs.model import ModelSpec

    base = dict(name="m", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_heads=4,
                vocab_size=100, seq_len=32, num_experts=8, experts_per_token=2)
    return ModelSpec(**{**base, **fields})


def test_dense_model_counts_match_as_before():
    m = preset("llama3-8b")
    assert m.num_active_params() == m.num_params()


@pytest.mark.parametrize("extra, message", [
    ("num_experts: 8\nexperts_per_token: 9\n", r"experts_per_token: 9 .*1\.\.num_experts \(8\)"),
    ("num_experts: 8\nexperts_per_token: 0\n", r"experts_per_token: 0 .*1\.\.num_experts"),
    ("experts_per_token: 2\n", r"experts_per_token: 2 .*only to MoE models"),
    ("num_experts: 8\nexperts_per_token: 2\nfirst_k_dense: 2\n", r"first_k_dense: 2 .*below num_layers 2"),
    ("num_experts: 8\nexperts_per_token: 2\nload_imbalance: 0.5\n", r"load_imbalance"),
    ("num_experts: 8\nexperts_per_token: 2\ncapacity_factor: 0\n", r"capacity_factor"),
    ("num_experts: 8\nexperts_per_token: 2\nrouter: hash\n", r"router"),
])
def test_moe_fields_are_validated(tmp_path, extra, message):
    f = tmp_path / "m.yaml"
    f.write_text("name: m\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\n"
                 "num_heads: 4\nvocab_size: 100\nseq_len: 32\n" + extra)
    with pytest.raises(SpecError, match=message):
        load_model(str(f))


@pytest.mark.parametrize("layers, k, freq", [(61, 3, 1), (32, 0, 2), (7, 2, 3), (5, 4, 1), (9, 0, 4)])
def test_moe_layer_count_in_closed_form_is_the_pattern(layers, k, freq):
    """num_moe_layers (closed form) counts the layers is_moe_layer names (Megatron's
    moe_layer_freq after first_k_dense dense layers)."""
    m = ModelSpec(name="m", num_layers=layers, hidden_size=64, ffn_hidden_size=128, num_heads=4,
                  vocab_size=256, seq_len=64, num_experts=4, experts_per_token=2, first_k_dense=k,
                  moe_layer_freq=freq)
    assert m.num_moe_layers == sum(m.is_moe_layer(i) for i in range(layers))


# DeepSeek's MLA presets (sources in models.yaml): V3 report Table 1 671B / 37B; V2 paper
# §3.1.2 236B / 21B; V2 paper App. B, V2-Lite 15.7B / 2.4B. Totals within 1%. DeepSeek's
# activated counts leave out the input embedding (a lookup, no FLOPs): V3 36.6B, V2
# 20.9B, V2-Lite 2.45B; this project's count (Mixtral's convention) includes it.
MLA_PUBLISHED = {"deepseek-v3": (671e9, 37e9, 0.015), "deepseek-v2": (236e9, 21e9, 0.01),
                 "deepseek-v2-lite": (15.7e9, 2.4e9, 0.025)}


@pytest.mark.parametrize("name, counts", MLA_PUBLISHED.items())
def test_mla_parameter_counts_match_published(name, counts):
    m = preset(name)
    total, active, tolerance = counts
    assert m.is_mla and m.num_params() == pytest.approx(total, rel=0.01)
    assert m.num_active_params() - m.vocab_size * m.hidden_size == pytest.approx(
        active, rel=tolerance)


def test_mla_attention_weights():
    """DeepSeek-V3 (config.json): q_down 7168x1536, q_norm 1536, q_up 1536x128x192,
    kv_down 7168x(512+64), kv_norm 512, kv_up 512x128x(128+128), o 128x128x7168."""
    v3 = preset("deepseek-v3")
    assert v3.head_dim_qk == 192 and v3.head_dim_v == 128
    assert v3.attention_params() == (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576
                                     + 512 + 512 * 128 * 256 + 128 * 128 * 7168)
    lite = preset("deepseek-v2-lite")  # no query latent: q 2048 x 16 x 192
    assert lite.mla_tensors()[0] == 2048 * 16 * 192 and len(lite.mla_tensors()) == 5


MLA_FIELDS = ("kv_lora_rank: 16\nqk_nope_head_dim: 8\nqk_rope_head_dim: 4\n"
              "v_head_dim: 8\nposition_embedding: rope\n")


@pytest.mark.parametrize("extra, message", [
    ("q_lora_rank: 32\n", r"q_lora_rank: 32 .*only to multi-head latent attention"),
    ("v_head_dim: 8\n", r"v_head_dim: 8 .*set kv_lora_rank"),
    ("kv_lora_rank: 16\nposition_embedding: rope\n",
     r"qk_nope_head_dim: null .*required with kv_lora_rank"),
    (MLA_FIELDS + "num_kv_heads: 2\n", r"num_kv_heads: 2 .*none or num_heads 4"),
    (MLA_FIELDS + "attention_head_dim: 16\n", r"attention_head_dim: 16 .*not with kv_lora_rank"),
    (MLA_FIELDS.replace("rope\n", "learned\n"), r"position_embedding: 'learned' .*rope"),
    (MLA_FIELDS.replace("kv_lora_rank: 16", "kv_lora_rank: 0"), r"kv_lora_rank: 0 .*≥ 1"),
])
def test_mla_fields_are_checked(tmp_path, extra, message):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\n"
                    "num_heads: 4\nvocab_size: 256\nseq_len: 64\n" + extra)
    with pytest.raises(SpecError, match=message) as err:
        load_model(str(path))
    assert "\n" not in str(err.value)


def test_mla_model_loads(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nnum_layers: 2\nhidden_size: 60\nffn_hidden_size: 128\n"
                    "num_heads: 8\nvocab_size: 256\nseq_len: 64\n" + MLA_FIELDS)
    m = load_model(str(path))  # heads need not divide hidden_size: MLA sets its own widths
    assert m.is_mla and m.head_dim_qk == 12 and m.head_dim_v == 8


def test_geglu_is_a_gated_unit_with_swiglus_shape(tmp_path):
    """GeGLU (Shazeer 2020, arXiv:2002.05202: GELU(x W) * (x V), then W2) has SwiGLU's three
    matrices; only GELU keeps two. Grok-1's is GeGLU (xai-org/grok-1 model.py DenseBlock:
    jax.nn.gelu(linear(x)) * linear_v(x)) and its 314B parameters count it so."""
    base = dict(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=96, num_heads=4,
                vocab_size=100, seq_len=32)
    gelu, swiglu, geglu = (ModelSpec(**base, activation=a) for a in ("gelu", "swiglu", "geglu"))
    assert not gelu.gated and swiglu.gated and geglu.gated
    assert geglu.mlp_in_width == swiglu.mlp_in_width == 2 * gelu.mlp_in_width == 192
    assert geglu.num_params() == swiglu.num_params() == gelu.num_params() + 2 * 64 * 96
    grok = preset("grok-1")
    assert grok.activation == "geglu"
    assert grok.num_params() == pytest.approx(314e9, rel=0.01)  # "314B parameters" (README)
    f = tmp_path / "m.yaml"
    f.write_text("".join(f"{k}: {v}\n" for k, v in base.items()) + "activation: geglu\n")
    assert load_model(str(f)).activation == "geglu"
    f.write_text("".join(f"{k}: {v}\n" for k, v in base.items()) + "activation: reglu\n")
    with pytest.raises(SpecError, match=r"activation: 'reglu' is not allowed \(allowed: gelu, "
                                        r"swiglu, geglu\)"):
        load_model(str(f))


def test_moe_settings_that_contradict_the_experts_are_refused():
    """load_imbalance 60 with 8 experts, top-2 (the busiest expert takes at most every
    token: 4x the mean) priced 10x the expert compute; a shared expert's FFN size with
    no shared expert was ignored (sweep of 2026-12-03)."""
    import dataclasses

    mixtral = preset("mixtral-8x7b")
    most = mixtral.num_experts / mixtral.experts_per_token
    dataclasses.replace(mixtral, load_imbalance=most).check("m")
    with pytest.raises(SpecError, match=r"m.load_imbalance: 4.5 is not allowed \(at most "
                                        r"num_experts / experts_per_token = 4"):
        dataclasses.replace(mixtral, load_imbalance=4.5).check("m")
    with pytest.raises(SpecError, match=r"m.shared_expert_ffn_hidden_size: 1024 is not allowed"):
        dataclasses.replace(mixtral, shared_expert_ffn_hidden_size=1024).check("m")


def test_tied_embeddings_need_an_output_layer():
    import dataclasses

    gpt = preset("gpt3-125m")
    with pytest.raises(SpecError, match=r"m.tied_embeddings: true is not allowed \(needs "
                                        r"lm_head: true"):
        dataclasses.replace(gpt, lm_head=False).check("m")


def test_rope_theta_is_the_published_base_and_only_for_rope(tmp_path):
    """RoPE's base frequency (Su et al. 2021: 10000; Llama 3 Herd §3.2: 500,000; Mixtral
    and Qwen3 config.json: 1,000,000)."""
    assert preset("llama2-7b").rope_theta == 10_000
    assert preset("llama3-70b").rope_theta == 500_000
    assert preset("mixtral-8x7b").rope_theta == preset("qwen3-235b-a22b").rope_theta == 1e6
    f = tmp_path / "m.yaml"
    base = "name: m\nnum_layers: 1\nhidden_size: 8\nnum_heads: 2\nffn_hidden_size: 8\n" \
           "vocab_size: 8\nseq_len: 4\n"
    f.write_text(base + "rope_theta: 500000\n")
    assert load_model(str(f)).rope_theta == 500_000
    f.write_text(base + "position_embedding: learned\nrope_theta: 500000\n")
    with pytest.raises(SpecError, match=r"m.yaml:rope_theta: 500000(\.0)? is not allowed "
                                        r"\(applies only to position_embedding: rope\)"):
        load_model(str(f))
