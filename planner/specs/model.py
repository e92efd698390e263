"""ModelSpec: the shape of a decoder-only transformer, with presets by name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

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

__all__ = ["ModelSpec", "load_model", "model_presets", "preset"]


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
                                      help="MLP inner size (per gate for swiglu)")
    num_heads: int = spec_field(min=1, max=16_384)
    num_kv_heads: int | None = spec_field(default=None, min=1, max=16_384,
                                          help="GQA; default num_heads")
    vocab_size: int = spec_field(min=1, max=16_777_216)
    seq_len: int = spec_field(min=1, max=MAX_SEQ_LEN, help="default training sequence length")
    activation: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = False
    position_embedding: Literal["learned", "rope", "alibi"] = "rope"
    # Megatron-LM's default (attention and hidden dropout 0.1); Llama-style presets set false.
    dropout: bool = spec_field(default=True, help="dropout on attention probs and outputs")
    lm_head: bool = spec_field(default=True, help="false: no output projection, the loss "
                               "runs on the final hidden states (Megatron-DeepSpeed's "
                               "GPTNeoModelPipe)")

    def check(self, where: str) -> None:
        if self.hidden_size % self.num_heads:
            fail(at(where, "num_heads"), self.num_heads,
                 f"must divide hidden_size {self.hidden_size}")
        if self.num_heads % self.kv_heads:
            fail(at(where, "num_kv_heads"), self.num_kv_heads,
                 f"must divide num_heads {self.num_heads}")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_in_width(self) -> int:
        """Output width of the first MLP GEMM (gate and up fused for swiglu)."""
        return self.ffn_hidden_size * (2 if self.activation == "swiglu" else 1)

    def params_per_layer(self) -> int:
        """Weights of one transformer layer (no linear biases; norm weights counted)."""
        h = self.hidden_size
        attention = h * (h + 2 * self.kv_dim) + h * h
        mlp = h * self.mlp_in_width + self.ffn_hidden_size * h
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        return attention + mlp + norms

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
        return (self.num_layers * self.params_per_layer() + self.embedding_params()
                + self.head_params())


@cache
def _preset_table() -> dict[str, dict]:
    text = resources.files("planner").joinpath("data", "models.yaml").read_text("utf-8")
    raw = load_yaml_text(text, where="planner/data/models.yaml")
    families = raw.pop("families")
    table = {}
    for name, entry in raw.items():
        entry = dict(entry)
        family = families[entry.pop("family")]
        table[name] = {"name": name, **family, **entry}
    return table


def model_presets() -> dict[str, ModelSpec]:
    """Every preset by name, in file order."""
    return {name: parse(ModelSpec, data, where=f"models.{name}")
            for name, data in _preset_table().items()}


def preset(name: str) -> ModelSpec:
    """A preset by name (case-insensitive); unknown names are a SpecError with suggestions."""
    table = _preset_table()
    key = name.lower()
    if key not in table:
        near = difflib.get_close_matches(key, list(table), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(near)}?" if near else "see `plan models`"
        raise SpecError(f"model: {name!r} is not a known preset ({hint})")
    return parse(ModelSpec, table[key], where=f"models.{key}")


def load_model(path: str) -> ModelSpec:
    """A ModelSpec from a YAML file; errors name the file and the field."""
    return parse(ModelSpec, load_yaml(path), where=f"{path}:")
