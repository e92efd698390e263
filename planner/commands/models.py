"""`plan models`: one line per model preset."""

from __future__ import annotations

import argparse

from planner.commands.args import print_json
from planner.specs.model import ModelSpec, model_presets
from profiler.schema import dump

__all__ = ["add_parser", "run"]


def _count(n: float) -> str:
    """'  6.74B', or '  0.87M' below a hundred million (debug models read '0.00B')."""
    return f"{n / 1e9:7.2f}B" if n >= 1e8 else f"{n / 1e6:7.2f}M"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")


def _moe(m: ModelSpec) -> str:
    """", MoE 8 experts top-2 (+1 shared)" for an MoE model."""
    if not m.is_moe:
        return ""
    shared = f" +{m.num_shared_experts} shared" if m.num_shared_experts else ""
    return f", MoE {m.num_experts} experts top-{m.experts_per_token}{shared}"


def _attention(m: ModelSpec) -> str:
    """", MLA q 1536 kv 512 qk 128+64 v 128" for multi-head latent attention."""
    if not m.is_mla:
        return ""
    q = f"q {m.q_lora_rank} " if m.q_lora_rank else "q full "
    return (f", MLA {q}kv {m.kv_lora_rank} qk {m.qk_nope_head_dim}+{m.qk_rope_head_dim} "
            f"v {m.v_head_dim}")


def run(args: argparse.Namespace) -> int:
    presets = model_presets()
    if args.json:
        print_json({name: {**dump(m), "num_params": m.num_params(),
                           "num_active_params": m.num_active_params()}
                    for name, m in presets.items()})
        return 0
    print(f"{'name':18} {'params':>8} {'active':>8} {'layers':>6} {'hidden':>6} {'heads':>7} "
          f"{'ffn':>6} {'vocab':>7} {'seq':>5}  arch")
    for name, m in presets.items():
        heads = f"{m.num_heads}/{m.kv_heads}" if m.kv_heads != m.num_heads else str(m.num_heads)
        print(f"{name:18} {_count(m.num_params())} {_count(m.num_active_params())} "
              f"{m.num_layers:6d} {m.hidden_size:6d} {heads:>7} {m.ffn_hidden_size:6d} "
              f"{m.vocab_size:7d} {m.seq_len:5d}  {m.activation}, {m.norm}, "
              f"{m.position_embedding}{', tied' if m.tied_embeddings else ''}{_attention(m)}"
              f"{_moe(m)}")
    return 0
