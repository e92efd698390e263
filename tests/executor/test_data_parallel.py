"""The flat-buffer engine's model-state buffers (executor/data_parallel.py), built in one
process: the layouts are index arithmetic, and building a state needs no collective."""

import pytest

torch = pytest.importorskip("torch")

from executor.checkpoint_layout import ParamPlace  # noqa: E402
from executor.data_parallel import ShardedState  # noqa: E402
from executor.sharding import ShardLayout  # noqa: E402
from planner.costs.memory import state_bytes_per_param  # noqa: E402

# (P, G, OS) over 4 replicas: plain, ZeRO-1, ZeRO-2, AMSP mixes, ZeRO-3
SHARDINGS = [(1, 1, 1), (1, 1, 4), (1, 4, 4), (1, 2, 4), (2, 4, 4), (1, 2, 2), (4, 4, 4)]
MEMBERS = (0, 1, 2, 3)


def _state(sizes, rank, dtype):
    params = [torch.nn.Parameter(torch.randn(6, 8, dtype=dtype)),
              torch.nn.Parameter(torch.randn(16, dtype=dtype))]
    places = [ParamPlace(f"w{i}", tuple(p.shape)) for i, p in enumerate(params)]
    return ShardedState(params, ShardLayout(MEMBERS, rank, *sizes), {},
                        make_optimizer=lambda ps: torch.optim.AdamW(ps), name="bucket",
                        places=places)


@pytest.mark.parametrize("sizes", SHARDINGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_optimizers_gradient_is_its_chunk_of_the_gradient_buffer(sizes, dtype):
    """The fp32 gradients a rank holds are its G-shard, once: the optimizer's gradient is
    the chunk of it that the end-of-iteration reduce-scatter over `grad_reduce_group`
    leaves this member (its index there), written in place, as Megatron-Core's
    distributed optimizer views its shard of the bucket's main_grad. So a rank holds 4
    bytes of fp32 gradient per parameter over G, what planner/costs/memory.py prices
    (`state_bytes_per_param`), and `state_bytes` says so. A separate fp32 copy of the
    optimizer shard's gradient held 4 / OS more: plain data parallelism 8 bytes instead
    of 4, ZeRO-2 8/k instead of 4/k."""
    p, g, os_ = sizes
    for rank in MEMBERS:
        st = _state(sizes, rank, dtype)
        lay = st.layout
        n = st.numel  # 64 elements, a multiple of os
        grad = st.master.grad
        assert grad is not None and grad.numel() == n // os_
        assert grad.untyped_storage().data_ptr() == st.grad.untyped_storage().data_ptr()
        slot = lay.grad_reduce_group.index(rank)
        assert grad.data_ptr() == st.grad.data_ptr() + slot * grad.numel() * 4
        # the G-shard holds chunks g_chunk * os/g .. and this one is the member's own
        assert lay.g_chunk * (os_ // g) + slot == lay.os_chunk
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in (st.grad, grad)}
        assert sum(held.values()) == 4 * n // g == st.state_bytes()["grads_bytes"]
        keeps_master = dtype is not torch.float32
        _, grads_per_param, _ = state_bytes_per_param(
            dtype="bf16" if keeps_master else "fp32", master_weights=True,
            sizes=(p, g, os_))
        assert st.state_bytes()["grads_bytes"] == grads_per_param * n


@pytest.mark.parametrize("sizes", [(1, 1, 1), (1, 1, 4)])
def test_fp32_gradients_accumulate_in_the_buffer_without_a_copy(sizes):
    """G = 1 in fp32: each parameter's `.grad` is its slice of the gradient buffer, so two
    backwards sum into the buffer in place (Megatron-Core's main_grad, DDP's
    gradient_as_bucket_view) and `add_grads` copies nothing; a `.grad` dropped between
    backwards (`zero_grad(set_to_none=True)` elsewhere) is added in and the view set back."""
    st = _state(sizes, 0, torch.float32)
    w, b = st.params
    x = torch.randn(3, 8)
    expected = torch.zeros(st.numel)
    for scale in (1.0, 2.0):
        loss = scale * ((x @ w.t()).sum() + b.pow(2).sum())
        loss.backward()
        st.add_grads()
        expected[:48] += scale * x.sum(0).repeat(6)
        expected[48:64] += scale * 2 * b.detach()
    assert w.grad.data_ptr() == st.grad.data_ptr()
    assert b.grad.data_ptr() == st.grad.data_ptr() + 48 * 4
    torch.testing.assert_close(st.grad[:64], expected[:64])
    w.grad = None
    (x @ w.t()).sum().backward()
    st.add_grads()
    expected[:48] += x.sum(0).repeat(6)
    assert w.grad.data_ptr() == st.grad.data_ptr()
    torch.testing.assert_close(st.grad[:64], expected[:64])


def test_16_bit_and_sharded_gradients_are_still_copied():
    """Only fp32 parameters with G = 1 get views: bf16 parameters' gradients are bf16 (the
    buffer is fp32), and with G > 1 a backward's gradients are reduce-scattered first."""
    assert _state((1, 1, 1), 0, torch.bfloat16).params[0].grad is None
    assert _state((1, 2, 4), 0, torch.float32).params[0].grad is None
