"""Pipeline schedules: the order of forward and backward passes on each stage.

GPipe (Huang et al. 2019): all forwards, then all backwards. 1F1B (PipeDream-Flush,
Narayanan et al. 2021): p - s - 1 warm-up forwards on stage s, then one forward and one
backward alternately. Interleaved 1F1B (Narayanan et al. 2021 §2.2.2, as Megatron-LM
orders it): each stage holds v model chunks; micro-batches advance in groups of p.
ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1): each
backward is split into B (activation gradients, on the critical path) and W (weight
gradients, deferrable); the F/B order is 1F1B's and W of micro-batch k follows B of
micro-batch k + s on stage s, so later stages send their gradients back sooner and run
the deferred W's while the last backward travels to stage 0 (torch.distributed.pipelining
builds the same order for one stage per rank). A step may run its micro-batches as
several such schedules in a row (`flushes`), each with its own fill and drain.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.specs.choices import Schedule

__all__ = ["Pass", "stage_order"]

Pass = tuple[str, int, int]  # ("F" | "B" | "W", chunk, micro-batch)


def _gpipe(stage: int, pp: int, m: int) -> list[Pass]:
    return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]


def _one_f_one_b(stage: int, pp: int, m: int) -> list[Pass]:
    warmup = min(pp - stage - 1, m)
    order: list[Pass] = [("F", 0, j) for j in range(warmup)]
    for k in range(m - warmup):
        order += [("F", 0, warmup + k), ("B", 0, k)]
    order += [("B", 0, k) for k in range(m - warmup, m)]
    return order


def _zb_h1(stage: int, pp: int, m: int) -> list[Pass]:
    """1F1B's F/B order with W(k - stage) right after B(k), the rest of the W's at the end.
    Stage s then holds min(m, p) micro-batches' activations at its peak (released at W),
    the same as 1F1B's first stage."""
    order: list[Pass] = []
    for phase, c, k in _one_f_one_b(stage, pp, m):
        order.append((phase, c, k))
        if phase == "B" and k >= stage:
            order.append(("W", c, k - stage))
    done = max(m - stage, 0)
    return order + [("W", 0, k) for k in range(done, m)]


def _interleaved(stage: int, pp: int, m: int, vp: int) -> list[Pass]:
    total = m * vp

    def fwd(k: int) -> Pass:
        return ("F", (k // pp) % vp, (k // (pp * vp)) * pp + k % pp)

    def bwd(k: int) -> Pass:
        return ("B", vp - 1 - (k // pp) % vp, (k // (pp * vp)) * pp + k % pp)

    warmup = min((pp - stage - 1) * 2 + (vp - 1) * pp, total)
    order = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [fwd(warmup + k), bwd(k)]
    order += [bwd(k) for k in range(total - warmup, total)]
    return order


_ORDERS: dict[Schedule, Callable[[int, int, int], list[Pass]]] = {
    Schedule.GPIPE: _gpipe, Schedule.ONE_F_ONE_B: _one_f_one_b, Schedule.ZB_H1: _zb_h1}


def stage_order(schedule: Schedule, *, stage: int, pp: int, num_microbatches: int,
                virtual_stages: int = 1, flushes: int = 1) -> list[Pass]:
    """The passes stage `stage` runs, in order: `flushes` schedules one after the other,
    each over the next num_microbatches / flushes micro-batches (NeMo AutoModel calls
    torch.distributed.pipelining's `schedule.step` once per local batch). A schedule's
    first forward on a stage follows the stage's last pass of the one before, so each
    pays its own fill and drain."""
    schedule = Schedule(schedule)
    assert num_microbatches % flushes == 0, "validated: m must be a multiple of the flushes"
    m = num_microbatches // flushes
    if schedule.interleaved:
        assert m % pp == 0, "validated: m per schedule must be a multiple of pp"
        one = _interleaved(stage, pp, m, virtual_stages)
    else:
        one = _ORDERS[schedule](stage, pp, m)
    return [(phase, chunk, k * m + j) for k in range(flushes) for phase, chunk, j in one]
