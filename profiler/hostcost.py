"""Measure the host-side costs a training step pays besides its ops' and collectives' own
times: per-op dispatch, each collective's fixed cost per backend and group size, and the
framework's per-layer blocking points (FSDP2's per-unit gathers, DTensor's dispatch of a
tensor-parallel layer). They become profile rows of kind "host" (docs/profiles.md):

* `dispatch_forward`, `dispatch_backward` (ranks 1): host seconds per op a forward records
  with autograd, and per node the autograd engine runs in a backward (a chain of tiny
  ops, so the time is dispatch, not work); `autograd_call`: the fixed cost of one
  backward call. On CUDA they time the host issuing the kernels (no synchronisation).
* `latency.<collective>` (ranks N, variant the backend): a collective of a tiny tensor
  (one element per rank), the fixed cost every call of it pays.
* `fsdp_unit_total_forward`, `fsdp_unit_total_backward` (ranks N, variant the backend,
  size the unit's bytes): what one FSDP2 unit (`fully_shard` of a transformer block, as
  executor/fsdp.py wraps it) adds to a forward and to a backward, its all-gather (and
  reduce-scatter) of that unit's bytes included: pre/post hooks, copy-in and copy-out
  and the collectives. The marginal cost of one more block (a tiny model with 5 blocks
  against 1, sharded against plain). The planner takes the collectives out at the
  profile's own price for that size (planner/costs/stages.py `dp_sync`): gloo's small
  collectives are bimodal on a busy host (0.5 or 2.5 ms for 0.2 MB), so a median timed
  alone here and another in the collective rows differed by up to 1 ms a unit, and the
  unit's cost with them (profiles before 2026-12-04: `fsdp_unit_forward` / `_backward`,
  less the collectives timed alone here; still read). Measured on the tiny preset, and
  (since 2026-12-05) on the `--host-model`'s own blocks, once per model: a unit's copies
  and collectives grow with its bytes (debug-small's 0.79 MB block: 2.9 + 6.7 ms a
  forward + backward on this VM, the tiny preset's 0.2 MB one 1.3-1.7 + 3.5).
  `fsdp_root_total_forward` / `_backward` (size the root's bytes): the same for the root
  unit (embedding, final norm and head), which FSDP2 gathers once per step (it keeps the
  root's parameters from forward to backward) and reduce-scatters once.
* `dtensor_layer_total_forward`, `dtensor_layer_total_backward` (ranks N = tp, variant
  the backend, "+sp" with sequence parallelism, size the activation's bytes): what a
  tensor-parallel block under DTensor (executor/tensor_parallel.py) adds to a pass, its
  two tp collectives included (the planner takes them out at the profile's own price for
  that size, as for FSDP2's units): DTensor's Python dispatch of each sharded op and the
  redistributions, and the backward's gradient hand-off as the executor does it after
  every backward (`grad_hand_off`: with sequence parallelism each norm weight's and
  bias's partial gradient all-reduced, one blocking redistribution per parameter).
  `dtensor_root_*`: the same for the embedding and head (the final norm's gradients).
  Each has a `cpu.` twin: the same marginal in the CPU seconds the ranks' processes used
  (a rank waiting for its peer in a tp collective is off its core).
  Profiles before 2026-12-04: `dtensor_layer_forward` / `_backward`, less the two
  collectives timed alone here (still read).
* `arrival_skew`, `arrival_segment` (ranks N, size the segment's GEMM calls): after the
  same segment of compute on every rank, how much later than the ranks' mean the last one
  arrives at the collective that ends it, and the segment's duration. A synchronising
  group waits for its slowest rank at every collective; the slope of the one over the
  other is how much longer ranks of this host compute when they must keep in step. The
  rounds are taken in shares spread over the run (`Lateness`, LATENESS_SHARES), as the
  host's noise changes from minute to minute.
* `gemm_shared` (ranks n = 1..N, measured among N processes): a 256^3 fp32 GEMM's seconds
  per call while n of the N ranks compute it at once (the others wait in a collective),
  ~30 ms a sample. On the CPU the ranks of a host share its cores, caches and memory
  bandwidth (and any other load on the machine), so a rank computes slower while others
  compute too: the time at n against the time at 1 is that slowdown, measured now on this
  host; the event simulation applies it only while n ranks compute at once.
* `pass_shared` (ranks n = 1..N, size the activation's bytes): the same slowdown on the
  plan model's own forward + backward at a plan's micro-batch and sequence (`plan profile
  --host-model M --mbs B --seq S`), whole and at tp 1. A training pass is not all GEMMs in
  cache: its memory-bound ops (norms, activations, softmax, the loss over the vocabulary,
  the gradients' writes) share the host's memory bandwidth and last-level cache, which a
  256^3 GEMM does not, so the pass slows more than the GEMM (measured on this VM, two
  ranks at once: debug-tiny 1.03-1.09, debug-small 1.08, debug-medium 1.03, against the
  GEMM's 1.00-1.01 in the same processes). The planner prefers these rows where the
  profile has them.
* `p2p_send`, `p2p_recv` (ranks N, variant the backend, size the message's bytes): the
  compute thread's part of a pipeline transfer as the executor issues it
  (executor/pipeline.py `Links`), rank 0 sending to rank 1: the `isend` call and, once the
  message has left, the `wait` on it (`Links.wait_sends`); allocating the buffer and
  posting the `irecv`, and, once the message has arrived, the `wait` (`Links.recv`). The
  transfer itself is the `send_recv` collective row's, on its own stream; these are what
  the ranks' compute threads spend on it in line with their passes. Timed as a pipeline
  runs them: both ranks compute (a GEMM loop of P2P_SETTLE_S) after the send is issued
  and the receive posted; then the receiver waits, and the sender waits on its send once
  the message is gone (as `wait_sends` at the iteration's end). With the cores busy a
  gloo call now and then waits for a transport thread to get one (the loopback socket
  drains only while the receiver's thread runs), so the samples are skewed far to the
  right (this VM, 256 KB: receive median 0.04 ms, p90 2 ms), and a step pays every call:
  the rows' time is the mean of P2P_MIN_SAMPLES samples (`host_row(..., mean=True)`;
  0.16-0.37 ms to send, 0.28-0.71 to receive in four measurements, against the
  executor's 0.19-0.27 and 0.06-0.36 a call in 2-rank pipelines, where the receiver is
  not always computing when a message lands; the median of idle ranks' calls, 0.05 ms,
  priced a fifth of the sends).
* `optimizer_shared` (ranks n = 1..N, size 16 bytes a parameter): a fused fp32 AdamW step
  and the gradients' zeroing after it, over the `--host-model`'s parameters and their 1/N
  shard, while n of the N ranks step at once. The step streams its states through memory
  once; beyond the last-level cache the ranks stepping at once share the memory bandwidth
  (this VM, 25 M parameters: 19 ms alone, 31 ms with two at once; 0.8 M: no slower).

All are measured per host with the framework this repository runs, never fitted to a
plan. torch and the executor are imported only inside the functions that measure.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from profiler.store import ProfileRow, summary_row

__all__ = ["FRAMEWORK_LAYERS", "HOST_COLLECTIVES", "MAX_PASS_PARAMS", "activation_bytes",
           "dispatch_rows", "framework_rows",
           "grad_hand_off", "host_row", "runner_rows"]

HOST_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
FRAMEWORK_LAYERS = (1, 5)  # blocks of the two tiny models whose difference is one block
_CHAIN = 32  # tiny ops per dispatch sample
_TINY_SEQ = 16  # tokens of the tiny models' micro-batch (one sequence)
# The rows on a model's own blocks (FSDP2's units, DTensor's blocks with and without sp):
# up to BLOCK_ROUNDS rounds within about BLOCK_BUDGET_S a variant. A row is a median of
# paired differences of four passes; on debug-small's units (2 ranks, 8 x 64) a median of
# 25 rounds moved by 7-10% (relative standard deviation, bootstrapped from 100-round
# probes), of 100 rounds by 3-6% (docs/executor.md, "2026-12-06, 01:10-02:10")
BLOCK_ROUNDS = 100
BLOCK_BUDGET_S = 30.0
# The `pass_shared` rows: seconds of samples for one (micro-batch, sequence) at most (and
# at least PASS_SHARED_MIN rounds of every count), the rounds at most, and the largest
# model whose whole forward + backward they time (N processes hold a copy each, with its
# gradients: 100M parameters are ~1.2 GB a process in fp32)
PASS_SHARED_BUDGET_S = 8.0
PASS_SHARED_MIN, PASS_SHARED_MAX = 7, 150
MAX_PASS_PARAMS = 100_000_000
P2P_SIZES = (1 << 12, 1 << 18, 1 << 22)  # message bytes of the `p2p_send` / `p2p_recv` rows
P2P_SETTLE_S = 0.005  # time a message is given to leave (arrive) before it is waited on
P2P_MIN_SAMPLES = 100  # a mean over a skewed sample needs more of them than a median


def host_row(name: str, times: Sequence[float], *, variant: str | None = None,
             ranks: int = 1, size_bytes: int = 0, calls: int = 1,
             mean: bool = False) -> ProfileRow:
    """A "host" row from samples of seconds per call: their median, or with `mean` their
    mean (a cost paid at every call whose samples are skewed, where the sum over a step
    is the mean's; `_p2p_rows`; `summary_row`); never below 0.1 us: a cost is never
    free, and a difference of two noisy times may come out below zero."""
    return summary_row("host", name, times, variant=variant, ranks=ranks,
                       size_bytes=size_bytes, calls=calls, mean=mean, floor_s=1e-7)


# -- one process: dispatch -------------------------------------------------------------

def dispatch_rows(device: str = "cpu", *, repeats: int = 15) -> list[ProfileRow]:
    """Per-op forward and backward dispatch and the fixed cost of a backward call."""
    import torch

    cuda = device.startswith("cuda")
    leaf = torch.ones(1, device=device, requires_grad=True)
    grad = torch.ones(1, device=device)

    def chain() -> torch.Tensor:
        y = leaf
        for _ in range(_CHAIN):
            y = y * 1.0
        return y

    def backward_of(out: torch.Tensor) -> Callable[[], object]:
        return lambda: torch.autograd.grad(out, (leaf,), grad, retain_graph=True)

    one = leaf * 1.0
    long = chain()
    fwd, call, bwd = [], [], []
    for _ in range(repeats + 3):
        fwd.append(_host_s(chain, 5) / _CHAIN)
        call.append(_host_s(backward_of(one), 20))
        bwd.append(_host_s(backward_of(long), 5))
        if cuda:
            torch.cuda.synchronize()
    fwd, call, bwd = fwd[3:], call[3:], bwd[3:]
    per_node = [max(b - c, 0.0) / _CHAIN for b, c in zip(bwd, call, strict=True)]
    return [host_row("dispatch_forward", fwd, calls=5 * _CHAIN),
            host_row("dispatch_backward", per_node, calls=5 * _CHAIN),
            host_row("autograd_call", call, calls=20)]


RUNNER_MICROBATCHES = 8  # micro-batches of the runner's pass schedule (`runner_rows`)


def runner_rows(*, repeats: int = 15) -> list[ProfileRow]:
    """The executor's pass runner per micro-batch beyond the model's own forward and
    backward, on the CPU: a one-stage StageRunner (executor/pipeline.py `run`: each
    micro-batch's samples drawn, the loss weighted by its batch share, activations kept per
    (chunk, micro-batch), progress reported) over RUNNER_MICROBATCHES micro-batches of the
    tiny model, against the same module's forward and backward on the same batches in a
    bare loop, taken in turn. The gradients stay in the parameters (no state to hand them
    to), so the hand-off `add_grads` is not in it."""
    import torch

    from executor.model import GPT
    from executor.pipeline import Chunk, Links, MicroBatches, StageRunner
    from executor.train import sample_batch

    spec = _tiny("debug-tiny", 2)
    module = GPT(spec, attention="math")
    m = RUNNER_MICROBATCHES

    def draw(step: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_batch(spec, seq_len=_TINY_SEQ, seed=0, step=step, first=first,
                            count=count)

    runner = StageRunner(
        chunks=[Chunk(index=0, module=module, states=[], first=True, last=True)],
        links=Links(forward_source=-1, forward_targets=(), backward_source=-1,
                    backward_targets=(), groups={}, rank=0),
        data=MicroBatches(draw=draw, first_sample=0, size=1, count=m, run_count=m,
                          weight=1.0 / m),
        schedule="1f1b", stage=0, pp=1, vp=1, activation_shape=(1, _TINY_SEQ, spec.hidden_size),
        dtype=torch.float32, device=torch.device("cpu"), tensor_parallel=False,
        progress=lambda what: None)
    batches = [draw(0, j, 1) for j in range(m)]

    def bare() -> None:
        for tokens, targets in batches:
            (module(tokens, targets) * (1.0 / m)).backward()

    extra = []
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        runner.run(0)
        t1 = time.perf_counter()
        bare()
        t2 = time.perf_counter()
        module.zero_grad(set_to_none=True)
        if i >= 3:
            extra.append(((t1 - t0) - (t2 - t1)) / m)
    return [host_row("runner_microbatch", extra, calls=m)]


def _host_s(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


# -- N processes: collective latency and the framework's blocking points -------------------

def framework_rows(rank: int, world: int, *, backend: str, family_model: str = "debug-tiny",
                   repeats: int = 15, blocks: Sequence[tuple[Any, int, int]] = ()
                   ) -> list[ProfileRow]:
    """Run on every rank of an initialised process group of `world` ranks (gloo on the
    CPU): rows of tiny collectives' fixed costs, FSDP2's per-unit cost and DTensor's
    per-layer cost (the tiny model of `family_model`'s family; and for each (ModelSpec,
    micro-batch, sequence) of `blocks`, that model's at that activation size, within
    about BLOCK_BUDGET_S a variant). Rank 0's are kept."""
    from profiler.collectives import _ops

    rows = [host_row(f"latency.{kind}", _samples(_ops(kind, 4 * world, rank, world, "cpu"),
                                                 repeats, calls=20),
                     variant=backend, ranks=world, size_bytes=4 * world, calls=20)
            for kind in HOST_COLLECTIVES]
    late = Lateness(rank, world, rounds=max(repeats, 15), shares=LATENESS_SHARES)
    late.take()
    rows += _share_rows(rank, world, repeats=max(repeats, 15))
    rows += _p2p_rows(rank, world, backend=backend, repeats=max(repeats, 15))
    late.take()
    repeats = max(repeats, 25)  # differences of noisy times: more samples
    rounds = max(repeats, BLOCK_ROUNDS)
    rows += _fsdp_rows(rank, world, backend=backend, family_model=family_model,
                       repeats=repeats)
    for model, mbs, seq in _fsdp_blocks(blocks):
        rows += _fsdp_rows(rank, world, backend=backend, family_model=model, repeats=rounds,
                           batch=(mbs, seq), budget_s=BLOCK_BUDGET_S)
    late.take()
    for sequence_parallel in (False, True):
        rows += _dtensor_rows(rank, world, backend=backend, family_model=family_model,
                              sequence_parallel=sequence_parallel, repeats=repeats)
        for model, mbs, seq in blocks:
            if sequence_parallel and model.num_experts:  # the executor runs MoE layers on
                continue  # the whole sequence: no sequence parallelism (preflight)
            rows += _dtensor_rows(rank, world, backend=backend, family_model=model,
                                  sequence_parallel=sequence_parallel, repeats=rounds,
                                  batch=(mbs, seq), budget_s=BLOCK_BUDGET_S)
        late.take()
    for model, mbs, seq in blocks:
        if model.num_params() <= MAX_PASS_PARAMS:
            rows += _pass_share_rows(rank, world, model, (mbs, seq))
    for model, _, _ in _fsdp_blocks(blocks):
        if model.num_params() <= MAX_PASS_PARAMS:
            rows += _optimizer_share_rows(rank, world, int(model.num_params()))
    return rows + late.rows()


def _fsdp_blocks(blocks: Sequence[tuple[Any, int, int]]) -> list[tuple[Any, int, int]]:
    """Each model of `blocks` once, at its smallest activation: FSDP2's cost is its
    units' (their bytes), not the pass's, and a short pass leaves the difference of
    framed and plain least noise."""
    smallest: dict[Any, tuple[Any, int, int]] = {}
    for model, mbs, seq in blocks:
        if model not in smallest or mbs * seq < smallest[model][1] * smallest[model][2]:
            smallest[model] = (model, mbs, seq)
    return list(smallest.values())


def _share_rows(rank: int, world: int, *, repeats: int) -> list[ProfileRow]:
    """A GEMM's time while n of the `world` ranks compute it at once, n = 1..world
    (`_at_each_count`), `repeats` rounds after 3 untimed."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)

    # ~30 ms a sample: several scheduler time slices, so that sharing the cores with the
    # other ranks (and other load) shows as it does over a training step, not a burst
    def gemm_s(calls: int = 100) -> float:
        return _host_s(lambda: torch.mm(a, b), calls)

    times = _at_each_count(rank, world, gemm_s, warmup=3, rounds=repeats)
    return [host_row("gemm_shared", ts, ranks=n, calls=100, size_bytes=3 * 4 * 256 * 256)
            for n, ts in times.items()]


def _pass_share_rows(rank: int, world: int, spec: Any, batch: tuple[int, int], *,
                     budget_s: float = PASS_SHARED_BUDGET_S) -> list[ProfileRow]:
    """The `spec` model's forward + backward on `batch` (micro-batch, sequence) tokens
    while n of the `world` ranks run it at once, n = 1..world (`_at_each_count`); as
    many rounds as fit in `budget_s`, PASS_SHARED_MIN to PASS_SHARED_MAX."""
    import torch

    from executor.model import GPT

    mbs, seq = batch
    model = GPT(dataclasses.replace(spec, seq_len=seq), attention="flash")
    tokens = torch.randint(spec.vocab_size, (mbs, seq))

    def one_pass() -> float:
        start = time.perf_counter()
        model(tokens, tokens).backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times = _at_each_count(rank, world, one_pass, warmup=2, rounds=PASS_SHARED_MAX,
                           budget=(PASS_SHARED_MIN, budget_s))
    return [host_row("pass_shared", ts, ranks=n, size_bytes=activation_bytes(mbs, seq, spec))
            for n, ts in times.items()]


def _optimizer_share_rows(rank: int, world: int, params: int, *,
                          rounds: int = 15) -> list[ProfileRow]:
    """A fused fp32 AdamW step and the gradients' zeroing after it (profiler/measure.py
    `adamw_step`, what the op profile's optimizer row times) over `params` parameters,
    and over their 1/`world` shard, while n of the `world` ranks step at once, n = 1..world
    (`_at_each_count`), `rounds` rounds after 2 untimed. Size: 16 bytes a parameter
    (weight, gradient, two moments), what the step streams through memory."""
    from profiler.measure import adamw_step

    rows = []
    for n_params in sorted({params, max(1, params // world)}):
        step = adamw_step((n_params,))

        def step_s(step: Callable[[], object] = step) -> float:
            start = time.perf_counter()
            step()
            return time.perf_counter() - start

        times = _at_each_count(rank, world, step_s, warmup=2, rounds=rounds)
        rows += [host_row("optimizer_shared", ts, ranks=n, size_bytes=16 * n_params)
                 for n, ts in times.items()]
        del step  # its states, before the next size's
    return rows


def activation_bytes(mbs: int, seq: int, spec: Any) -> int:
    """The size the rows timed on a model at (micro-batch, sequence) carry: the
    activation [b, s, h] in fp32 (the DTensor rows' tp collectives ran at it)."""
    return 4 * mbs * seq * spec.hidden_size


def _at_each_count(rank: int, world: int, seconds: Callable[[], float], *, warmup: int,
                   rounds: int, budget: tuple[int, float] | None = None
                   ) -> dict[int, list[float]]:
    """`seconds()` (what one sample took) while n of the `world` ranks take it at once,
    n = 1..world (the others wait in the all-reduce that collects the slowest rank's
    time), the counts sampled in turn so that a burst of other load hits them alike:
    `warmup` untimed rounds, then `rounds`; with `budget` (least, seconds), as many as fit
    in those seconds at the warm-up's pace, from least to `rounds` (`_budget_rounds`)."""
    import torch
    import torch.distributed as dist

    times: dict[int, list[float]] = {n: [] for n in range(1, world + 1)}
    total, i, start = warmup + rounds, 0, time.perf_counter()
    while i < total:
        if i == warmup and budget is not None:
            total = warmup + _budget_rounds(start, warmup, least=budget[0], most=rounds,
                                            budget_s=budget[1])
        for n in times:
            dist.barrier()
            slowest = torch.tensor([seconds() if rank < n else 0.0], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times[n].append(float(slowest))
        i += 1
    return times


def _budget_rounds(start: float, done: int, *, least: int, most: int, budget_s: float) -> int:
    """How many rounds fit in `budget_s` at the slowest rank's pace over the `done` rounds
    since `start` (a collective: every rank agrees on the count), `least` to `most`."""
    import torch
    import torch.distributed as dist

    per_round = torch.tensor([(time.perf_counter() - start) / done], dtype=torch.float64)
    dist.all_reduce(per_round, op=dist.ReduceOp.MAX)
    return min(most, max(least, int(budget_s / float(per_round))))


# GEMM calls (256^3 fp32, ~0.35 ms each on a 2020s x86 core) between two synchronisations:
# segments of ~3 to ~45 ms, the compute a training step's ranks do between collectives
SKEW_SEGMENTS = (8, 32, 128)


# The lateness probe's rounds are taken in this many shares spread over a collectives
# run (`Lateness`): a virtual machine's two cores drift apart and together by the minute
# (measured 2026-12-07: one 1.4 s burst's slope 1.2-13.4% from minute to minute), so one
# burst prices a plan by whichever minute it fell in
LATENESS_SHARES = 6


class Lateness:
    """How long the ranks of a synchronising group wait for the slowest (Hoefler et al.
    2010, "Characterizing the Influence of System Noise on Large-Scale Applications by
    Simulation", SC10: a collective completes when its last rank arrives, so every rank's
    noise between two collectives adds up as the maximum over the ranks). Every rank
    computes the same segment of K GEMMs after a barrier; `arrival_skew` is the latest
    rank's arrival less the ranks' mean arrival (one host: one monotonic clock),
    `arrival_segment` the segment's mean duration, per K (the row's size), the segments
    sampled in turn.

    `rounds` rounds in all, `take` runs the next of `shares` near-equal shares of them
    (every rank calls it at the same point of the run; `rows` takes what is left): taken
    between the run's other measurements, the rows are medians over its minutes, not over
    one burst's. Three untimed rounds before the first share, one before each later one
    (the work before it left other data in the caches)."""

    def __init__(self, rank: int, world: int, *, rounds: int, shares: int = 1) -> None:
        import torch

        self.rank, self.world = rank, world
        self.rounds, self.shares = rounds, max(1, shares)  # shares: those not yet taken
        self.a, self.b = torch.randn(256, 256), torch.randn(256, 256)
        self.skew: dict[int, list[float]] = {k: [] for k in SKEW_SEGMENTS}
        self.segment: dict[int, list[float]] = {k: [] for k in SKEW_SEGMENTS}

    @property
    def left(self) -> int:
        """The rounds not yet timed."""
        return self.rounds - len(self.skew[SKEW_SEGMENTS[0]])

    def take(self) -> None:
        """The next share of the rounds (none once all are taken)."""
        import torch
        import torch.distributed as dist

        timed = -(-self.left // self.shares)  # the rounds left, shared out evenly
        if timed <= 0:
            return
        untimed = 1 if self.left < self.rounds else 3
        for i in range(untimed + timed):
            for k in SKEW_SEGMENTS:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(k):
                    torch.mm(self.a, self.b)
                arrive = time.perf_counter()
                times = torch.zeros(2, self.world, dtype=torch.float64)
                times[0, self.rank], times[1, self.rank] = start, arrive
                dist.all_reduce(times)  # every rank's own slots: the sum is the table
                if i >= untimed:
                    self.skew[k].append(float(times[1].max() - times[1].mean()))
                    self.segment[k].append(float((times[1] - times[0]).mean()))
        self.shares = max(1, self.shares - 1)

    def rows(self) -> list[ProfileRow]:
        """The rows, after the shares not yet taken."""
        while self.left > 0:
            self.take()
        return [row for k in SKEW_SEGMENTS
                for row in (host_row("arrival_segment", self.segment[k], ranks=self.world,
                                     size_bytes=k, calls=k),
                            host_row("arrival_skew", self.skew[k], ranks=self.world,
                                     size_bytes=k, calls=k))]


def _p2p_rows(rank: int, world: int, *, backend: str, repeats: int) -> list[ProfileRow]:
    """`p2p_send` / `p2p_recv` (module docstring): rank 0 sends each size of P2P_SIZES
    to rank 1 as `Links` does, the other ranks idle. Both compute for P2P_SETTLE_S after
    the send is issued and the receive posted, so the message moves while the cores are
    busy, as in a pipeline; then rank 1 waits for it (a pass's `recv`), and once every
    rank is past a barrier (the message gone) rank 0 waits on its send, as `wait_sends`
    does at the iteration's end. At least P2P_MIN_SAMPLES samples; the mean."""
    import torch
    import torch.distributed as dist

    samples = max(repeats, P2P_MIN_SAMPLES)
    sent: dict[int, list[float]] = {size: [] for size in P2P_SIZES}
    taken: dict[int, list[float]] = {size: [] for size in P2P_SIZES}
    messages = {size: torch.ones(size // 4) for size in P2P_SIZES}
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def compute() -> None:
        until = time.perf_counter() + P2P_SETTLE_S
        while time.perf_counter() < until:
            torch.mm(a, b)

    for i in range(samples + 3):
        for size in P2P_SIZES:
            dist.barrier()
            spent = torch.zeros(2, dtype=torch.float64)
            work = None
            if rank in (0, 1):
                start = time.perf_counter()
                if rank == 0:
                    work = dist.isend(messages[size], 1)
                else:
                    work = dist.irecv(torch.empty(size // 4), 0)
                assert work is not None
                spent[rank] = time.perf_counter() - start
                compute()
                if rank == 1:
                    start = time.perf_counter()
                    work.wait()
                    spent[1] += time.perf_counter() - start
            dist.barrier()
            if rank == 0 and work is not None:
                start = time.perf_counter()
                work.wait()
                spent[0] += time.perf_counter() - start
            dist.all_reduce(spent)  # each side's own slot: the sum is both
            if i >= 3:
                sent[size].append(float(spent[0]))
                taken[size].append(float(spent[1]))
    return [row for size in P2P_SIZES
            for row in (host_row("p2p_send", sent[size], variant=backend, ranks=world,
                                 size_bytes=size, mean=True),
                        host_row("p2p_recv", taken[size], variant=backend, ranks=world,
                                 size_bytes=size, mean=True))]


def _samples(fn: Callable[[], None], repeats: int, *, calls: int) -> list[float]:
    """The slowest rank's seconds per call, `repeats` samples after 3 untimed ones."""
    from profiler.collectives import _sample_s

    return [_sample_s(fn, calls, "cpu")[0] for _ in range(repeats + 3)][3:]


def _tiny(family_model: str, num_layers: int) -> Any:
    """Tiny preset `family_model` with `num_layers` blocks."""
    from planner.specs.model import preset

    base = preset(family_model)
    return dataclasses.replace(base, num_layers=num_layers, seq_len=_TINY_SEQ)


def _pass_times(models: dict[tuple[str, int], tuple[object, object]], repeats: int, *,
                vocab_parallel: bool = False,
                hand_off: Callable[[object], object] | None = None,
                budget_s: float | None = None,
                cpu: dict[tuple[str, int], tuple[list[float], list[float]]] | None = None
                ) -> dict[tuple[str, int], tuple[list[float], list[float]]]:
    """Forward and backward seconds (the slowest rank's) of each model (with its tokens),
    `repeats` samples taken in turn, so that a burst of load on the machine hits every
    model alike; `vocab_parallel`: the framed models' loss on vocabulary shards, as the
    executor's tp runs it; `hand_off`: what the executor does with a model's gradients
    after each backward, timed as part of it; `budget_s`: fewer samples (down to 7) where
    `repeats` rounds of every model would take longer (the ranks agree on the count from
    the slowest's warm-up). `cpu`, where given, receives the same samples of the CPU
    seconds a rank's process used in each pass (the ranks' mean): a pass that waits for a
    peer in a collective is off the CPU for that part of its time."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import loss_parallel

    out: dict[tuple[str, int], tuple[list[float], list[float]]] = {k: ([], []) for k in models}
    rounds, i, start = repeats + 3, 0, time.perf_counter()
    while i < rounds:
        if i == 3 and budget_s is not None:
            rounds = 3 + _budget_rounds(start, 3, least=7, most=repeats, budget_s=budget_s)
        for key, (model, tokens) in models.items():
            framed = key[0] == "framed"
            dist.barrier()
            with loss_parallel() if vocab_parallel and framed else contextlib.nullcontext():
                c0, t0 = time.process_time(), time.perf_counter()
                loss = model(tokens, tokens)  # type: ignore[operator]  # an executor GPT
                c1, t1 = time.process_time(), time.perf_counter()
                loss.backward()
                if hand_off is not None:
                    hand_off(model)
                c2, t2 = time.process_time(), time.perf_counter()
            model.zero_grad(set_to_none=True)  # type: ignore[attr-defined]  # an nn.Module
            both = torch.tensor([t1 - t0, t2 - t1], dtype=torch.float64)
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
            if cpu is not None:  # every rank's own CPU seconds, summed, then their mean
                used = torch.tensor([c1 - c0, c2 - c1], dtype=torch.float64)
                dist.all_reduce(used)
                used /= dist.get_world_size()
            if i >= 3:
                out[key][0].append(float(both[0]))
                out[key][1].append(float(both[1]))
                if cpu is not None:
                    fwd_cpu, bwd_cpu = cpu.setdefault(key, ([], []))
                    fwd_cpu.append(float(used[0]))
                    bwd_cpu.append(float(used[1]))
        i += 1
    return out


def _marginal(times: dict[tuple[str, int], tuple[list[float], list[float]]]
              ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per pass (forward, backward): what one more block adds framed against plain, and
    what the rest (embedding, head) adds: differences of sample pairs taken in turn."""
    lo, hi = FRAMEWORK_LAYERS

    def extra(layers: int, which: int) -> list[float]:
        return [f - p for f, p in zip(times[("framed", layers)][which],
                                      times[("plain", layers)][which], strict=True)]

    out = []
    for which in (0, 1):
        at_lo, at_hi = extra(lo, which), extra(hi, which)
        per_layer = [(h - lo_) / (hi - lo) for h, lo_ in zip(at_hi, at_lo, strict=True)]
        out.append(per_layer)
        mid = statistics.median(per_layer)
        out.append([x - lo * mid for x in at_lo])
    return out[0], out[2], out[1], out[3]


def _models(family_model: str | Any, frame: Callable[[object], None], *,
            batch: tuple[int, int] = (1, _TINY_SEQ),
            reference: Callable[[Any], Any] | None = None
            ) -> dict[tuple[str, int], tuple[object, object]]:
    """Plain and framed models at each of FRAMEWORK_LAYERS, with their tokens: the tiny
    preset of `family_model`'s family (a name), or blocks of that model (a ModelSpec) on
    `batch` (micro-batch, sequence) tokens. The plain ones are `reference(spec)` where
    given (what a rank of the framed model computes, `tp_rank_spec`), else the same model."""
    import torch

    from executor.model import GPT

    mbs, seq = batch
    models: dict[tuple[str, int], tuple[object, object]] = {}
    for layers in FRAMEWORK_LAYERS:
        spec = (_tiny(family_model, layers) if isinstance(family_model, str)
                else dataclasses.replace(family_model, num_layers=layers, seq_len=seq))
        plain = spec if reference is None else reference(spec)
        # tokens every model's vocabulary holds (a reference's may be a shard's)
        tokens = torch.randint(min(spec.vocab_size, plain.vocab_size), (mbs, seq))
        for framed in (False, True):
            model = GPT(spec if framed else plain, attention="math")
            if framed:
                frame(model)
            models[("framed" if framed else "plain", layers)] = (model, tokens)
    return models


def tp_rank_spec(spec: Any, tp: int) -> Any:
    """The whole model that computes what one rank of `spec` under tensor parallelism
    `tp` computes (executor/tensor_parallel.py): a tp-th of the heads (their width kept),
    of the MLP's inner size (an MoE layer stays whole there) and of the vocabulary, the
    hidden size and norms whole. The DTensor rows time the framed model against it, so
    that what they hold is DTensor's machinery and the tp collectives, not a share of the
    compute, at any size."""
    return dataclasses.replace(
        spec, num_heads=spec.num_heads // tp,
        num_kv_heads=None if spec.num_kv_heads is None else spec.num_kv_heads // tp,
        attention_head_dim=spec.head_dim,
        ffn_hidden_size=spec.ffn_hidden_size // tp if not spec.num_experts
        else spec.ffn_hidden_size,
        vocab_size=-(-spec.vocab_size // tp))


def _fsdp_rows(rank: int, world: int, *, backend: str, family_model: str | Any,
               repeats: int, batch: tuple[int, int] = (1, _TINY_SEQ),
               budget_s: float | None = None) -> list[ProfileRow]:
    """FSDP2's unit and root rows, on the tiny preset of `family_model`'s family (a name)
    or on blocks of that model (a ModelSpec) at `batch` (micro-batch, sequence), framed as
    executor/fsdp.py frames a chunk (each block a unit, the root the rest): the unit rows'
    size is a block's bytes, the root rows' the bytes the root holds (embedding, final
    norm, head), at which their collectives ran."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from executor.model import GPT

    mesh = init_device_mesh("cpu", (world,))

    def frame(model: object) -> None:
        for unit in model.blocks.values():  # type: ignore[attr-defined]  # the root holds the rest
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for u in model.modules():  # type: ignore[attr-defined]
            if hasattr(u, "set_force_sum_reduction_for_comms"):
                u.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM

    times = _pass_times(_models(family_model, frame, batch=batch), repeats, budget_s=budget_s)
    spec = (_tiny(family_model, 1) if isinstance(family_model, str)
            else dataclasses.replace(family_model, num_layers=1, seq_len=batch[1]))
    one = GPT(spec)  # as measured (a learned position table holds `seq` rows)
    block_bytes = 4 * sum(p.numel() for p in one.blocks["0"].parameters())
    root_bytes = 4 * sum(p.numel() for p in one.parameters()) - block_bytes
    fwd, bwd, root_fwd, root_bwd = _marginal(times)
    return [host_row(name, ts, variant=backend, ranks=world, size_bytes=size)
            for name, ts, size in (("fsdp_unit_total_forward", fwd, block_bytes),
                                   ("fsdp_unit_total_backward", bwd, block_bytes),
                                   ("fsdp_root_total_forward", root_fwd, root_bytes),
                                   ("fsdp_root_total_backward", root_bwd, root_bytes))]


def grad_hand_off(model: object) -> list[object]:
    """The gradients of `model` as the executor takes them after each backward of a
    tensor-parallel chunk (executor/data_parallel.py `add_grads` calls `local_grad` on
    every parameter of a DTensor model): a DTensor gradient that is still a partial sum,
    as a sequence-parallel norm's weight and bias are (their input is split over the
    sequence), is all-reduced to the parameter's layout here, one blocking
    redistribution per parameter. On the plain models it only reads `.grad`."""
    from executor.data_parallel import local_grad

    return [local_grad(p) for p in model.parameters()]  # type: ignore[attr-defined]  # an nn.Module


def _dtensor_rows(rank: int, world: int, *, backend: str, family_model: str | Any,
                  sequence_parallel: bool, repeats: int, batch: tuple[int, int] = (1, _TINY_SEQ),
                  budget_s: float | None = None) -> list[ProfileRow]:
    """DTensor's block and root rows, on the tiny preset of `family_model`'s family (a
    name) or on blocks of that model (a ModelSpec) at `batch` (micro-batch, sequence):
    the row's size is the activation's bytes, at which the tp collectives inside it ran."""
    from torch.distributed.device_mesh import init_device_mesh

    from executor.tensor_parallel import apply_tensor_parallel

    spec = _tiny(family_model, 1) if isinstance(family_model, str) else family_model
    if any(n % world for n in (spec.num_heads, spec.kv_heads, spec.ffn_hidden_size)):
        return []
    mesh = init_device_mesh("cpu", (world,))

    def frame(model: object) -> None:
        apply_tensor_parallel(model, mesh, sequence_parallel=sequence_parallel)

    models = _models(family_model, frame, batch=batch,
                     reference=lambda s: tp_rank_spec(s, world))
    used: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
    times = _pass_times(models, repeats, vocab_parallel=True, hand_off=grad_hand_off,
                        budget_s=budget_s, cpu=used)
    act_bytes = activation_bytes(*batch, spec)
    variant = backend + ("+sp" if sequence_parallel else "")
    names = ("dtensor_layer_total_forward", "dtensor_layer_total_backward",
             "dtensor_root_forward", "dtensor_root_backward")
    # the same marginals in the CPU seconds the ranks' processes used (`cpu.` rows, as the
    # collectives' are): the share of a block's DTensor time a rank loads its core with
    return [host_row(prefix + name, ts, variant=variant, ranks=world, size_bytes=act_bytes)
            for prefix, marginals in (("", _marginal(times)), ("cpu.", _marginal(used)))
            for name, ts in zip(names, marginals, strict=True)]
