"""The executor's GPT/Llama model: parameter count, shapes, determinism, backends, training."""

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from executor.model import GPT  # noqa: E402
from executor.train import make_optimizer, synthetic_batch, train_step  # noqa: E402
from planner.specs.model import preset  # noqa: E402

SPECS = [preset("debug-tiny"), preset("debug-tiny-llama"),
         dataclasses.replace(preset("debug-tiny-llama"), tied_embeddings=True, num_kv_heads=1),
         dataclasses.replace(preset("debug-tiny"), tied_embeddings=False, activation="swiglu",
                             ffn_hidden_size=96, dropout=True),
         dataclasses.replace(preset("debug-tiny-llama"), activation="geglu")]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}-{s.activation}-{s.norm}")
def test_parameters_match_the_spec_and_logits_have_the_right_shape(spec):
    model = GPT(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    tokens, targets = synthetic_batch(spec, batch_size=2, seq_len=16)
    assert model(tokens).shape == (2, 16, spec.vocab_size)
    loss = model(tokens, targets)
    # at initialisation the prediction is close to uniform over the vocabulary
    assert abs(loss.item() - math.log(spec.vocab_size)) < 0.1


def test_same_seed_same_model_and_loss():
    spec = SPECS[1]
    a, b, c = GPT(spec, seed=3), GPT(spec, seed=3), GPT(spec, seed=4)
    tokens, targets = synthetic_batch(spec, batch_size=2, seq_len=16, seed=1)
    assert a(tokens, targets).item() == b(tokens, targets).item()
    assert a(tokens, targets).item() != c(tokens, targets).item()


@pytest.mark.parametrize("spec", SPECS[:2], ids=lambda s: s.name)
def test_attention_backends_agree(spec):
    tokens, targets = synthetic_batch(spec, batch_size=2, seq_len=32)
    losses = [GPT(spec, attention=k)(tokens, targets).item() for k in ("flash", "math")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_attention_is_causal():
    spec = SPECS[1]
    model = GPT(spec).eval()
    tokens, _ = synthetic_batch(spec, batch_size=1, seq_len=16)
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % spec.vocab_size
    torch.testing.assert_close(model(tokens)[:, :-1], model(changed)[:, :-1])


@pytest.mark.parametrize("optimizer", ["fused", "foreach", "for_loop"])
def test_training_steps_lower_the_loss_on_a_fixed_batch(optimizer):
    spec = SPECS[0]
    torch.manual_seed(0)
    model = GPT(spec)
    opt = make_optimizer(model, implementation=optimizer)
    tokens, targets = synthetic_batch(spec, batch_size=4, seq_len=32)
    losses = [train_step(model, opt, tokens, targets).item() for _ in range(15)]
    assert losses[-1] < losses[0] - 0.5


def test_what_the_model_cannot_do_is_a_clear_error():
    with pytest.raises(ValueError, match="alibi"):
        GPT(dataclasses.replace(SPECS[0], position_embedding="alibi"))
    spec = SPECS[0]
    tokens, _ = synthetic_batch(spec, batch_size=1, seq_len=spec.seq_len + 1)
    with pytest.raises(ValueError, match="longer than the 64 learned positions"):
        GPT(spec)(tokens)
    with pytest.raises(ValueError, match="optimizer 'adam' is not one of"):
        make_optimizer(GPT(spec), implementation="adam")



@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_chunks_of_the_model_are_the_model(spec):
    """Pipeline chunks, each built on its own, compute the whole model's loss: parameters
    are initialised by name, a tied output projection as the embedding it copies."""
    whole = GPT(spec, seed=5)
    first = GPT(spec, seed=5, layers=(0, 1), head=False)
    last = GPT(spec, seed=5, layers=(1, 2), embedding=False)
    tokens, targets = synthetic_batch(spec, batch_size=2, seq_len=16)
    assert last(first(tokens), targets).item() == whole(tokens, targets).item()
    assert [n for n, _ in first.named_parameters()][-1].startswith("blocks.0.")
    assert next(n for n, _ in last.named_parameters()).startswith("blocks.1.")
    torch.testing.assert_close(last.lm_head.weight,
                               whole.wte.weight if spec.tied_embeddings else
                               whole.lm_head.weight)


def test_the_gated_mlps_compute_their_unit():
    """fc1 gives [gate | up]; SwiGLU feeds SiLU(gate) * up to fc2, GeGLU GELU(gate) * up
    (Shazeer 2020; Grok-1's DenseBlock: jax.nn.gelu(linear(x)) * linear_v(x))."""
    from executor.moe import MLP

    x = torch.randn(3, 5, 64)
    outs = {}
    for act, f in (("swiglu", torch.nn.functional.silu), ("geglu", torch.nn.functional.gelu)):
        spec = dataclasses.replace(SPECS[1], activation=act)
        torch.manual_seed(0)
        mlp = MLP(spec)
        gate, up = (x @ mlp.fc1.weight.T).chunk(2, dim=-1)
        outs[act] = mlp(x)
        torch.testing.assert_close(outs[act], (f(gate) * up) @ mlp.fc2.weight.T)
    assert not torch.allclose(outs["swiglu"], outs["geglu"])


def test_the_model_rotates_with_its_rope_base():
    """The executor rotated every rope model with base 10000, Llama 3's (500,000) too."""
    spec = SPECS[1]
    tokens, targets = synthetic_batch(spec, batch_size=2, seq_len=16)
    losses = [GPT(dataclasses.replace(spec, rope_theta=theta), seed=0)(tokens, targets).item()
              for theta in (10_000.0, 500_000.0)]
    assert losses[0] != losses[1]
    from profiler.torch_ops import rope_tables

    attention = GPT(dataclasses.replace(spec, rope_theta=500_000.0)).blocks["0"].attn
    cos, _ = attention._rotation(16, torch.device("cpu"))
    torch.testing.assert_close(cos, rope_tables(16, spec.head_dim, base=500_000.0)[0])


@pytest.mark.parametrize("dropout, attention_dropout", [(True, None), (True, False),
                                                        (False, True), (False, None)])
def test_attention_dropout_and_the_residual_dropout_apart(dropout, attention_dropout):
    """The attention probs drop at Megatron's 0.1 where the spec's `drops_attention` says
    so, the two residual branches where `dropout` does (GPT-Neo: only the latter)."""
    spec = dataclasses.replace(preset("debug-tiny"), dropout=dropout,
                               attention_dropout=attention_dropout)
    block = next(iter(GPT(spec).blocks.values()))
    assert (block.attn.dropout_p > 0) == spec.drops_attention
    assert isinstance(block.dropout, torch.nn.Dropout) == dropout
