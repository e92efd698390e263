"""ModelSpec: the shape of a decoder-only transformer, with presets by name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Literal

from planner.specs.files import refuse_other_kind
from planner.specs.limits import MAX_SEQ_LEN
from profiler.schema import (
    SpecError,
    at,
    cached_hash,
    fail,
    load_yaml,
    load_yaml_text,
    parse,
    spec_field,
)

__all__ = ["ROPE_THETA", "ModelSpec", "load_model", "model_presets", "preset"]

ROPE_THETA = 10_000.0  # RoPE's base frequency (Su et al. 2021, RoFormer, eq. 15)


@cached_hash
@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT / Llama-style decoder. Field names are the YAML keys (tools rely on them)."""

    name: str
    # Bounds are generous physical limits (several times the largest published models):
    # they keep every derived size finite and every search bounded.
    num_layers: int = spec_field(min=1, max=1024)
    hidden_size: int = spec_field(min=1, max=262_144)
    ffn_hidden_size: int = spec_field(min=1, max=1_048_576,
                                      help="MLP inner size (per half for the gated swiglu "
                                      "and geglu)")
    num_heads: int = spec_field(min=1, max=16_384)
    num_kv_heads: int | None = spec_field(default=None, min=1, max=16_384,
                                          help="GQA; default num_heads")
    vocab_size: int = spec_field(min=1, max=16_777_216)
    seq_len: int = spec_field(min=1, max=MAX_SEQ_LEN, help="default training sequence length")
    # gelu: h -> ffn -> h with GELU between. swiglu, geglu: gated linear units (Shazeer
    # 2020, "GLU Variants Improve Transformer", arXiv:2002.05202): fc1 computes a gate and
    # an up projection of ffn each, fc2 takes act(gate) * up, with act SiLU (SwiGLU) or
    # GELU (GeGLU; Grok-1: xai-org/grok-1 model.py DenseBlock, gelu(linear(x)) * linear_v(x))
    activation: Literal["gelu", "swiglu", "geglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = False
    position_embedding: Literal["learned", "rope", "alibi"] = "rope"
    rope_theta: float = spec_field(
        default=ROPE_THETA, min=1, max=1e9,
        help="RoPE's base frequency (Su et al. 2021: 10000; Llama 3: 500000; Mixtral, "
        "Qwen3: 1000000); Megatron's --rotary-base")
    # Megatron-LM's default (attention and hidden dropout 0.1); Llama-style presets set false.
    dropout: bool = spec_field(default=True, help="dropout on the attention and MLP "
                               "outputs, and on the attention probs unless "
                               "attention_dropout says otherwise")
    # Megatron's --attention-dropout apart from --hidden-dropout: Megatron-DeepSpeed's
    # GPT-Neo builds its attention dropout and never applies it, while keeping the residual
    # dropouts (third_party/Megatron-DeepSpeed/megatron/model/gpt_neo_model.py in Sailor's
    # artifact, saha18uiuc/sailor@13b7942)
    attention_dropout: bool | None = spec_field(
        default=None, help="dropout on the attention probs; default: as dropout")
    lm_head: bool = spec_field(default=True, help="false: no output projection, the loss "
                               "runs on the final hidden states (Megatron-DeepSpeed's "
                               "GPTNeoModelPipe)")
    attention_head_dim: int | None = spec_field(
        default=None, min=1, max=16_384,
        help="per-head width when num_heads x head_dim != hidden_size (Qwen3); default "
        "hidden_size / num_heads")
    # Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434
    # §2.1; Megatron-Core MLATransformerConfig): K and V come from one compressed latent
    # of kv_lora_rank per token, Q from one of q_lora_rank (or straight from the hidden
    # state), each latent RMS-normed, plus one rotary key of qk_rope_head_dim shared by
    # all heads. A head's scores are over qk_nope_head_dim + qk_rope_head_dim, its values
    # v_head_dim wide. kv_lora_rank none: ordinary (multi-head / grouped-query) attention.
    kv_lora_rank: int | None = spec_field(
        default=None, min=1, max=1_048_576,
        help="MLA's compressed K/V width (Megatron --kv-lora-rank); none: ordinary attention")
    q_lora_rank: int | None = spec_field(
        default=None, min=1, max=1_048_576,
        help="MLA's compressed query width (--q-lora-rank); none: a full-rank query "
        "projection (DeepSeek-V2-Lite)")
    qk_nope_head_dim: int | None = spec_field(
        default=None, min=1, max=16_384,
        help="MLA: a head's query/key width without rotary position (--qk-head-dim)")
    qk_rope_head_dim: int | None = spec_field(
        default=None, min=1, max=16_384,
        help="MLA: the decoupled rotary query/key width (--qk-pos-emb-head-dim)")
    v_head_dim: int | None = spec_field(
        default=None, min=1, max=16_384, help="MLA: a head's value width (--v-head-dim)")
    # Mixture of experts (Shazeer et al. 2017; Fedus et al. 2022). 0 experts: a dense model.
    num_experts: int = spec_field(default=0, min=0, max=65_536,
                                  help="routed experts per MoE layer (0: dense)")
    experts_per_token: int = spec_field(default=0, min=0, max=65_536,
                                        help="top-k routed experts each token goes to")
    expert_ffn_hidden_size: int | None = spec_field(
        default=None, min=1, max=1_048_576,
        help="one routed expert's inner size (per half for swiglu / geglu); default "
        "ffn_hidden_size")
    num_shared_experts: int = spec_field(default=0, min=0, max=1024,
                                         help="experts every token goes through (DeepSeekMoE)")
    shared_expert_ffn_hidden_size: int | None = spec_field(
        default=None, min=1, max=1_048_576,
        help="one shared expert's inner size; default expert_ffn_hidden_size")
    first_k_dense: int = spec_field(default=0, min=0, max=1024,
                                    help="leading layers with a dense FFN (DeepSeek-V3: 3)")
    moe_layer_freq: int = spec_field(
        default=1, min=1, max=1024,
        help="after first_k_dense, layer i is MoE when (i - first_k_dense) % freq == 0 "
        "(Megatron's --moe-layer-freq N; 1: every layer, 2: every other)")
    router: Literal["softmax", "sigmoid"] = "softmax"
    capacity_factor: float | None = spec_field(
        default=None, gt=0, max=64,
        help="tokens an expert takes, as a multiple of its even share; extra tokens are "
        "dropped (Megatron --moe-expert-capacity-factor); none: dropless")
    pad_to_capacity: bool = spec_field(
        default=False, help="pad every expert's tokens to the capacity (Megatron "
        "--moe-pad-expert-input-to-capacity; needs capacity_factor): the token counts are "
        "known without asking the GPU")
    load_imbalance: float = spec_field(
        default=1.0, min=1, max=64,
        help="tokens of the busiest expert / the mean (1: perfectly balanced routing, as "
        "Megatron's --moe-router-force-load-balancing benchmarks run)")

    def check(self, where: str) -> None:
        if self.tied_embeddings and not self.lm_head:  # there is no output layer to tie
            fail(at(where, "tied_embeddings"), True, "needs lm_head: true (it shares the "
                 "input embedding with the output projection)")
        if not self.is_mla:
            for name in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) is not None:
                    fail(at(where, name), getattr(self, name), "applies only to multi-head "
                         "latent attention (set kv_lora_rank)")
        if self.is_mla:
            self._check_mla(where)
        elif self.attention_head_dim is None and self.hidden_size % self.num_heads:
            fail(at(where, "num_heads"), self.num_heads,
                 f"must divide hidden_size {self.hidden_size}")
        if self.num_heads % self.kv_heads:
            fail(at(where, "num_kv_heads"), self.num_kv_heads,
                 f"must divide num_heads {self.num_heads}")
        self._check_rope(where)
        self._check_moe(where)

    def _check_rope(self, where: str) -> None:
        """RoPE rotates pairs of a head's dimensions (Su et al. 2021, eq. 34): the rotated
        width is even (MLA's decoupled rotary key: qk_rope_head_dim)."""
        if self.position_embedding != "rope":
            if self.rope_theta != ROPE_THETA:
                fail(at(where, "rope_theta"), self.rope_theta, "applies only to "
                     "position_embedding: rope")
            return
        if self.is_mla:
            if self.qk_rope_head_dim is not None and self.qk_rope_head_dim % 2:
                fail(at(where, "qk_rope_head_dim"), self.qk_rope_head_dim,
                     "an even width: rope rotates pairs of dimensions")
        elif self.head_dim % 2:
            name = "attention_head_dim" if self.attention_head_dim else "num_heads"
            fail(at(where, name), getattr(self, name),
                 f"an even head width with rope, which rotates pairs of dimensions; a head "
                 f"here is {self.head_dim} wide")

    def _check_mla(self, where: str) -> None:
        """MLA needs its three head widths; every head has its own K and V (up-projected
        from the shared latent) and the position is the decoupled rotary key."""
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) is None:
                fail(at(where, name), None, "required with kv_lora_rank (multi-head latent "
                     "attention)")
        if self.num_kv_heads not in (None, self.num_heads):
            fail(at(where, "num_kv_heads"), self.num_kv_heads,
                 f"with kv_lora_rank (MLA) every head has its own K and V: none or "
                 f"num_heads {self.num_heads}")
        if self.attention_head_dim is not None:
            fail(at(where, "attention_head_dim"), self.attention_head_dim,
                 "not with kv_lora_rank (MLA sets qk_nope_head_dim, qk_rope_head_dim and "
                 "v_head_dim)")
        if self.position_embedding != "rope":
            fail(at(where, "position_embedding"), self.position_embedding,
                 "rope with kv_lora_rank (MLA's decoupled rotary key)")

    def _check_moe(self, where: str) -> None:
        moe_only = {"experts_per_token": 0, "num_shared_experts": 0, "first_k_dense": 0,
                    "moe_layer_freq": 1, "expert_ffn_hidden_size": None,
                    "shared_expert_ffn_hidden_size": None, "capacity_factor": None,
                    "pad_to_capacity": False, "load_imbalance": 1.0}
        if not self.num_experts:
            for name, default in moe_only.items():
                if getattr(self, name) != default:
                    fail(at(where, name), getattr(self, name),
                         "applies only to MoE models (set num_experts > 0)")
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            fail(at(where, "experts_per_token"), self.experts_per_token,
                 f"must be 1..num_experts ({self.num_experts})")
        if self.first_k_dense >= self.num_layers:
            fail(at(where, "first_k_dense"), self.first_k_dense,
                 f"must be below num_layers {self.num_layers} (else no layer is MoE)")
        if self.pad_to_capacity and self.capacity_factor is None:
            fail(at(where, "pad_to_capacity"), True, "needs capacity_factor (the capacity "
                 "the experts' tokens are padded to)")
        # a token takes each expert at most once: the busiest expert holds at most every
        # token, num_experts / experts_per_token times the mean
        most = self.num_experts / self.experts_per_token
        if self.load_imbalance > most:
            fail(at(where, "load_imbalance"), self.load_imbalance,
                 f"at most num_experts / experts_per_token = {most:g} (the busiest expert "
                 "then takes every token)")
        if self.shared_expert_ffn_hidden_size is not None and not self.num_shared_experts:
            fail(at(where, "shared_expert_ffn_hidden_size"), self.shared_expert_ffn_hidden_size,
                 "applies with num_shared_experts > 0 (there is no shared expert to size)")

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (kv_lora_rank set) rather than ordinary attention."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) has routed experts (Megatron's moe_layer_freq
        pattern after `first_k_dense` dense layers)."""
        k = self.first_k_dense
        return self.is_moe and layer >= k and (layer - k) % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        """Layers k, k + f, k + 2f, ... below num_layers (k dense first, every f-th MoE):
        in closed form, since the cost model asks for every stage it prices."""
        if not self.is_moe or self.num_layers <= self.first_k_dense:
            return 0
        return -(-(self.num_layers - self.first_k_dense) // self.moe_layer_freq)

    @cached_property
    def moe_layer_fraction(self) -> float:
        """Share of the layers that are MoE: what a layer is priced as where the stage's
        own layers are not known (`layout.stage_moe_layers` counts them where they are)."""
        return self.num_moe_layers / self.num_layers

    @property
    def expert_ffn(self) -> int:
        """One routed expert's inner size."""
        return self.expert_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_ffn(self) -> int:
        """Inner size of all shared experts together (they run as one MLP)."""
        return self.num_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn)

    @property
    def gated(self) -> bool:
        """A gated linear unit (swiglu, geglu): three matrices, fc1 twice ffn wide (gate and
        up fused), fc2 from ffn; gelu: two, fc1 ffn wide."""
        return self.activation in ("swiglu", "geglu")

    def _mlp_params(self, ffn: int) -> int:
        return self.hidden_size * ffn * (3 if self.gated else 2)

    @property
    def drops_attention(self) -> bool:
        """Whether the attention probs go through dropout (fused attention kernels then
        need a dropout mode, the math path keeps a mask and the dropped probs)."""
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        """An ordinary attention head's width (MLA's widths: `head_dim_qk`, `head_dim_v`)."""
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def head_dim_qk(self) -> int:
        """Width a head's scores are taken over: MLA's no-rope plus rotary part."""
        if self.qk_nope_head_dim is not None and self.qk_rope_head_dim is not None:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim

    @property
    def head_dim_v(self) -> int:
        """Width of a head's values (and of its share of the attention output)."""
        return self.v_head_dim or self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of Q (and of the attention output): num_heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_in_width(self) -> int:
        """Output width of the first MLP GEMM (gate and up fused when gated)."""
        return self.ffn_hidden_size * (2 if self.gated else 1)

    def attention_params(self) -> int:
        """QKV and output projection of one layer (no linear biases); for MLA its down-
        and up-projections, the latents' norms and the output projection."""
        h = self.hidden_size
        if self.is_mla:
            return sum(self.mla_tensors())
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    def mla_tensors(self, tp: int = 1) -> tuple[int, ...]:
        """MLA's weights on one of `tp` ranks, as Megatron-Core's MLASelfAttention splits
        them (megatron/core/transformer/multi_latent_attention.py with the TE layer spec,
        gpt_layer_specs.py): the down-projections to the latents are replicated
        (TELinear, parallel_mode "duplicated"), the latent norms too (fused into the
        column-parallel up-projections, TELayerNormColumnParallelLinear), the up-projections
        split by heads (column parallel), the output projection by its input (row parallel).
        In order: [q_down, q_norm, q_up] or [q_proj], kv_down, kv_norm, kv_up, proj."""
        assert self.kv_lora_rank is not None
        h, heads = self.hidden_size, self.num_heads // tp
        qk, v = self.head_dim_qk, self.head_dim_v
        nope, rope = qk - (self.qk_rope_head_dim or 0), self.qk_rope_head_dim or 0
        norm = 2 if self.norm == "layernorm" else 1
        q = ((h * self.q_lora_rank, norm * self.q_lora_rank, self.q_lora_rank * heads * qk)
             if self.q_lora_rank else (h * heads * qk,))
        r = self.kv_lora_rank
        return (*q, h * (r + rope), norm * r, r * heads * (nope + v), heads * v * h)

    def params_per_layer(self) -> int:
        """Weights of one dense transformer layer (no linear biases; norm weights counted)."""
        h = self.hidden_size
        mlp = h * self.mlp_in_width + self.ffn_hidden_size * h
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        return self.attention_params() + mlp + norms

    def expert_params_per_moe_layer(self) -> int:
        """Routed-expert weights of one MoE layer (what expert parallelism splits)."""
        return self.num_experts * self._mlp_params(self.expert_ffn)

    def params_per_moe_layer(self, *, active: bool = False) -> int:
        """Weights of one MoE layer: attention, norms, router, shared experts and the routed
        experts (only the top-k a token uses when `active`)."""
        h = self.hidden_size
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        routed = self.experts_per_token if active else self.num_experts
        return (self.attention_params() + norms + self.num_experts * h
                + self._mlp_params(self.shared_ffn) + routed * self._mlp_params(self.expert_ffn))

    def embedding_params(self) -> int:
        """Token (and learned position) embedding weights."""
        positions = self.seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + positions

    def head_params(self) -> int:
        """Final norm plus the output projection, unless tied to the embedding or absent."""
        final_norm = self.hidden_size * (2 if self.norm == "layernorm" else 1)
        own = self.lm_head and not self.tied_embeddings
        return final_norm + (self.vocab_size * self.hidden_size if own else 0)

    def num_params(self) -> int:
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.params_per_layer()
                + moe * self.params_per_moe_layer() + self.embedding_params()
                + self.head_params())

    def num_active_params(self) -> int:
        """Parameters one token uses: routed experts counted top-k times, not num_experts
        times (how MoE reports state "active" sizes, embeddings included)."""
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.params_per_layer()
                + moe * self.params_per_moe_layer(active=True) + self.embedding_params()
                + self.head_params())


@cache
def _preset_table() -> dict[str, dict]:
    text = resources.files("planner").joinpath("data", "models.yaml").read_text("utf-8")
    raw = load_yaml_text(text, where="planner/data/models.yaml")
    families = raw.pop("families")
    table = {}
    for name, entry in raw.items():
        entry = dict(entry)
        family = families[entry.pop("family")] if "family" in entry else {}
        table[name] = {"name": name, **family, **entry}
    return table


def model_presets() -> dict[str, ModelSpec]:
    """Every preset by name, in file order."""
    return {name: parse(ModelSpec, data, where=f"models.{name}")
            for name, data in _preset_table().items()}


def preset(name: str, *, where: str = "model") -> ModelSpec:
    """A preset by name (case-insensitive); unknown names are a SpecError naming the field
    `where`, with suggestions."""
    table = _preset_table()
    key = name.lower()
    if key not in table:
        near = difflib.get_close_matches(key, list(table), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(near)}?" if near else "see `plan models`"
        raise SpecError(f"{where}: {name!r} is not a known preset ({hint})")
    return parse(ModelSpec, table[key], where=f"models.{key}")


def load_model(path: str) -> ModelSpec:
    """A ModelSpec from a YAML file; errors name the file and the field."""
    raw = load_yaml(path)
    refuse_other_kind(raw, path, "model", "`name`, `num_layers`, `hidden_size` and the other "
                      "ModelSpec fields: a plan's `model:` section is one")
    return parse(ModelSpec, raw, where=f"{path}:")
