"""B and W of a split backward (executor/split_backward.py), in one process: together they
give a whole backward's gradients, B leaves the linear weights to W, and W does not run
the input path again."""

import pytest

torch = pytest.importorskip("torch")

from executor.model import GPT  # noqa: E402
from executor.split_backward import (  # noqa: E402
    backward_input,
    backward_weight,
    recording_weights,
)
from planner.specs.model import preset  # noqa: E402

SMALL = preset("debug-small")


class _CountBackward(torch.autograd.Function):
    """The identity, counting how often its backward runs."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _CountBackward.calls += 1
        return grad


def _chunk(head: bool) -> tuple[GPT, list]:
    model = GPT(SMALL, layers=(1, 4), embedding=False, head=head, seed=1).train()
    return model, [m for m in model.blocks.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("head", [False, True])
def test_b_then_w_equals_a_whole_backward(head):
    torch.manual_seed(0)
    model, linears = _chunk(head)
    x0 = torch.randn(2, 16, SMALL.hidden_size)
    targets = torch.randint(0, SMALL.vocab_size, (2, 16))
    grad = None if head else torch.randn(2, 16, SMALL.hidden_size)

    x = x0.clone().requires_grad_()
    out = model(x, targets) if head else model(x)
    torch.autograd.backward(out, grad)
    want_dx = x.grad
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    # between two layers: on the input path, and on the path to the lower layer's weights
    model.blocks["2"].register_forward_hook(lambda _m, _i, y: _CountBackward.apply(y))
    x = x0.clone().requires_grad_()
    with recording_weights(linears) as weights:
        out = model(x, targets) if head else model(x)
    assert len(weights) == len(linears) == 12
    _CountBackward.calls = 0
    dx, pending = backward_input(out, grad, x, weights)
    assert _CountBackward.calls == 1
    torch.testing.assert_close(dx, want_dx, rtol=1e-5, atol=1e-7)
    for name, p in model.named_parameters():  # B: everything but the linear weights
        deferred = any(p is w for w in weights)
        assert (p.grad is None) == deferred, name
    backward_weight(pending)
    assert _CountBackward.calls == 1  # W ran the weights' branches only, not the path
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-5, atol=1e-7, msg=name)
