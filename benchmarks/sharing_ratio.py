"""How much slower n processes compute at once than one alone on this host, for three
kinds of CPU work: a 256^3 fp32 GEMM (what the profile's `gemm_shared` rows time), an
elementwise add over 8 MB tensors (beyond the caches: memory bandwidth), and a small
transformer block's forward and backward (hidden 256, 8 x 64 tokens: debug-small's
shapes). Prints k(n) = median time per call with n processes / with 1, n = 1..4.

    python -m benchmarks.sharing_ratio [--reps 30]

Issue 17: whether the GEMM's ratio is the right slowdown for a CPU rank's whole pass.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from typing import Any

KINDS = ("gemm", "memory", "block")


def _work(kind: str) -> tuple[Callable[[], Any], int]:
    """The call to time and how many calls make one sample."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if kind == "gemm":
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        return (lambda: a @ b), 100
    if kind == "memory":
        x, y = torch.randn(2**21), torch.randn(2**21)
        return (lambda: x.add_(y)), 20
    h, heads = 256, 4
    x = torch.randn(8, 64, h, requires_grad=True)
    norm = torch.nn.LayerNorm(h)
    qkv, proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
    fc1, fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def block() -> None:
        q, k, v = (t.transpose(1, 2) for t in
                   qkv(norm(x)).view(8, 64, 3, heads, h // heads).unbind(2))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        z = x + proj(att.transpose(1, 2).reshape(8, 64, h))
        z = z + fc2(torch.nn.functional.gelu(fc1(norm(z))))
        z.sum().backward()

    return block, 5


def _measure(kind: str, out: Any, start: Any, reps: int) -> None:
    call, inner = _work(kind)
    for _ in range(3):
        call()
    start.wait()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            call()
        samples.append((time.perf_counter() - t0) / inner)
    out.put(statistics.median(samples))


def ratios(kind: str, reps: int, most: int = 4) -> list[float]:
    """k(n) for n = 1..most: the median of the processes' median call times with n of
    them running at once, over the time with one alone."""
    ctx = mp.get_context("spawn")
    times = []
    for n in range(1, most + 1):
        out, start = ctx.Queue(), ctx.Barrier(n)
        procs = [ctx.Process(target=_measure, args=(kind, out, start, reps)) for _ in range(n)]
        for p in procs:
            p.start()
        got = [out.get() for _ in procs]
        for p in procs:
            p.join()
        times.append(statistics.median(got))
    return [t / times[0] for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30, help="samples per process")
    args = ap.parse_args()
    for kind in KINDS:
        ks = ratios(kind, args.reps)
        print(f"{kind:7s} " + "  ".join(f"k({n})={k:.2f}" for n, k in enumerate(ks, 1)),
              flush=True)


if __name__ == "__main__":
    main()
