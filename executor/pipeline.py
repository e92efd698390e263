"""One training iteration of one rank's pipeline stage: the plan's schedule, run.

The order of forward and backward passes is the planner's (planner/simulator/schedules.py:
GPipe, 1F1B, interleaved 1F1B, ZB-H1), so the run does what the simulator priced. Under
ZB-H1 a chunk's backward is split (executor/split_backward.py): B computes and sends the
input gradient, W later the layers' weight gradients, which then go where a whole
backward's would (`add_grads`). The first chunk does not split: its input is tokens, and
its W follows its B at once in ZB-H1, so it runs the whole backward at B. Activations and
their gradients go between stages as non-blocking sends and blocking receives; a schedule
never waits on a send, so none can deadlock. Each kind of message (activation or
gradient) between an ordered pair of ranks has a process group of its own: on NCCL a
send blocks its communicator's stream until received, and flows sharing one would block
each other (Megatron-LM batches its sends and receives for the same reason).

In fp16 the last chunk's backward starts from the loss times the loss scale
(executor/precision.py), so the gradients that cross stage boundaries are scaled too, as
in Megatron-LM.

Replicas with unequal micro-batch counts: when sharded parameters or gradients need a
collective in every pass (p > 1 or g > 1), a replica with fewer micro-batches runs the
missing ones as "ghosts" that take part in those collectives only, so the data-parallel
groups stay in step.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from executor.data_parallel import ModelState
from executor.model import GPT
from executor.split_backward import (
    WeightGrads,
    backward_input,
    backward_weight,
    recording_weights,
)
from planner.simulator.schedules import Pass, stage_order
from planner.specs.choices import Schedule

__all__ = ["Chunk", "Links", "MicroBatches", "StageRunner", "splits_backward"]

ACTIVATION, GRADIENT = 0, 1


def splits_backward(schedule: str, *, first: bool) -> bool:
    """Whether a chunk runs its backward as B and W (see the module docstring)."""
    return Schedule(schedule).splits_backward and not first


@dataclass
class Chunk:
    """One model chunk on this rank and the sharded states of its parameters."""

    index: int  # model chunk: c * pp + stage
    module: GPT
    states: list[ModelState]
    first: bool  # holds the embedding
    last: bool  # holds the head and the loss
    split_backward: bool = False  # B and W passes (`splits_backward`)

    def linears(self) -> list[nn.Module]:
        """The layers' linear layers, whose weight gradients W computes."""
        return [m for m in self.module.blocks.modules() if isinstance(m, nn.Linear)]

    def unshard(self) -> None:
        for s in self.states:
            s.unshard()

    def reshard(self) -> None:
        for s in self.states:
            s.reshard()


@dataclass(frozen=True)
class MicroBatches:
    """This replica's share of the global batch: micro-batch j holds global samples
    first_sample + j*size ... + size - 1, each weighted size / global batch."""

    draw: Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, first, count)
    first_sample: int
    size: int
    count: int  # this replica's micro-batches
    run_count: int  # passes run (with ghosts: the largest count of any replica)
    weight: float  # size / global batch size

    def samples(self, step: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draw(step, self.first_sample + j * self.size, self.size)


@dataclass
class Links:
    """Where this rank's chunk boundaries send and receive, and the groups to use.

    Receives are posted one ahead per kind (`expect` gives the iteration's order), so a
    message moves while this rank still computes, as the simulator assumes."""

    forward_source: int
    forward_targets: tuple[int, ...]
    backward_source: int
    backward_targets: tuple[int, ...]
    groups: Mapping[tuple[int, int, int], dist.ProcessGroup]  # (src, dst, kind)
    rank: int
    pending: list[tuple[dist.Work, torch.Tensor]] = field(default_factory=list)
    _order: dict[int, deque[int]] = field(default_factory=dict)  # kind -> tags to come
    _posted: dict[tuple[int, int], tuple[dist.Work, torch.Tensor]] = field(default_factory=dict)

    def send(self, t: torch.Tensor, dests: tuple[int, ...], kind: int, tag: int) -> None:
        t = t.detach().contiguous()
        for d in dests:
            work = dist.isend(t, d, group=self.groups[(self.rank, d, kind)], tag=tag)
            assert work is not None
            self.pending.append((work, t))

    def expect(self, receives: list[tuple[int, int]], shape: tuple[int, ...],
               dtype: torch.dtype, device: torch.device) -> None:
        """The (kind, tag) of this iteration's receives, in order; posts the first ones."""
        self._shape, self._dtype, self._device = shape, dtype, device
        self._order = {ACTIVATION: deque(), GRADIENT: deque()}
        for kind, tag in receives:
            self._order[kind].append(tag)
        for kind, tags in self._order.items():
            if tags:
                self._post(kind, tags[0])

    def _post(self, kind: int, tag: int) -> None:
        src = self.forward_source if kind == ACTIVATION else self.backward_source
        buf = torch.empty(self._shape, dtype=self._dtype, device=self._device)
        work = dist.irecv(buf, src, group=self.groups[(src, self.rank, kind)], tag=tag)
        assert work is not None
        self._posted[(kind, tag)] = (work, buf)

    def recv(self, kind: int, tag: int) -> torch.Tensor:
        """The expected message (kind, tag); then posts the next of its kind."""
        tags = self._order[kind]
        assert tags and tags[0] == tag, (kind, tag, list(tags))
        tags.popleft()
        if (kind, tag) not in self._posted:
            self._post(kind, tag)
        work, buf = self._posted.pop((kind, tag))
        if tags:
            self._post(kind, tags[0])
        work.wait()
        return buf

    def wait_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


class StageRunner:
    """Runs the passes of one iteration on this rank (all its chunks)."""

    def __init__(self, *, chunks: list[Chunk], links: Links, data: MicroBatches,
                 schedule: str, stage: int, pp: int, vp: int,
                 activation_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 tensor_parallel: bool, progress: Callable[[str], None]) -> None:
        self.chunks, self.links, self.data = chunks, links, data
        self.num_chunks = pp * vp
        self.order: list[Pass] = stage_order(schedule, stage=stage, pp=pp,
                                             num_microbatches=data.run_count,
                                             virtual_stages=vp)
        assert all(not c.split_backward for c in chunks) or \
            any(kind == "W" for kind, _, _ in self.order), "a split backward needs W passes"
        self.shape, self.dtype, self.device = activation_shape, dtype, device
        self.tensor_parallel, self.progress = tensor_parallel, progress
        # (chunk, micro-batch) -> input, output, weights W computes (split chunks)
        self.saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor,
                                                list[torch.Tensor]]] = {}
        self.deferred: dict[tuple[int, int], WeightGrads] = {}  # B done, W to come
        # fp16's loss scale (executor/precision.py): the last chunk's backward starts from
        # the loss times it; the trainer sets it before each iteration
        self.loss_scale = 1.0

    def _tag(self, boundary: int, j: int) -> int:
        """Messages across the boundary after model chunk `boundary`, micro-batch j."""
        return j * self.num_chunks + boundary

    def _loss_context(self) -> contextlib.AbstractContextManager:
        if self.tensor_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _receives(self) -> list[tuple[int, int]]:
        """(kind, tag) of every message this rank receives in an iteration, in order."""
        out = []
        for kind, c, j in self.order:
            chunk = self.chunks[c]
            if j >= self.data.count:
                continue
            if kind == "F" and not chunk.first:
                out.append((ACTIVATION, self._tag(chunk.index - 1, j)))
            if kind == "B" and not chunk.last:
                out.append((GRADIENT, self._tag(chunk.index, j)))
        return out

    def run(self, step: int) -> float:
        """One iteration's passes; returns this replica's weighted loss on the stage that
        computes it (else 0)."""
        self.links.expect(self._receives(), self.shape, self.dtype, self.device)
        losses: list[torch.Tensor] = []
        for kind, c, j in self.order:
            chunk = self.chunks[c]
            if j >= self.data.count:
                self._ghost(chunk, kind)
            elif kind == "F":
                self._forward(chunk, j, step, losses)
            elif kind == "B":
                self._backward(chunk, j)
            elif chunk.split_backward:
                self._weight_grads(chunk, j)
            self.progress(f"step {step} {kind} chunk {chunk.index} micro-batch {j}")
        self.links.wait_sends()
        # One host sync per iteration, not per micro-batch.
        return float(torch.stack(losses).sum()) if losses else 0.0

    def _forward(self, chunk: Chunk, j: int, step: int, losses: list[torch.Tensor]) -> None:
        targets = None
        if chunk.first or chunk.last:
            tokens, targets = self.data.samples(step, j)
        if chunk.first:
            x = tokens
        else:
            x = self.links.recv(ACTIVATION, self._tag(chunk.index - 1, j)).requires_grad_()
        chunk.unshard()
        recording = (recording_weights(chunk.linears()) if chunk.split_backward
                     else contextlib.nullcontext([]))
        with recording as weights:
            if chunk.last:
                with self._loss_context():
                    loss = chunk.module(x, targets) * self.data.weight
                    out = loss * self.loss_scale if self.loss_scale != 1.0 else loss
            else:
                out = chunk.module(x)
        if not chunk.last:
            self.links.send(out, self.links.forward_targets, ACTIVATION,
                            self._tag(chunk.index, j))
        chunk.reshard()
        self.saved[(chunk.index, j)] = (x, out, weights)
        if chunk.last:
            value = loss.detach()  # a replicated DTensor under tensor parallelism
            losses.append(value.to_local() if hasattr(value, "to_local") else value)

    def _backward(self, chunk: Chunk, j: int) -> None:
        """A whole backward, or B of a split one: the input gradient only."""
        x, out, weights = self.saved.pop((chunk.index, j))
        chunk.unshard()
        if not chunk.split_backward:
            for s in chunk.states:
                s.before_backward()
        grad = None if chunk.last else self.links.recv(GRADIENT, self._tag(chunk.index, j))
        with self._loss_context() if chunk.last else contextlib.nullcontext():
            if chunk.split_backward:
                dx, self.deferred[(chunk.index, j)] = backward_input(out, grad, x, weights)
            else:
                torch.autograd.backward(out, grad)
                dx = x.grad
        if not chunk.first:
            assert dx is not None
            self.links.send(dx, self.links.backward_targets, GRADIENT,
                            self._tag(chunk.index - 1, j))
        if not chunk.split_backward:
            for s in chunk.states:
                s.add_grads()
        chunk.reshard()

    def _weight_grads(self, chunk: Chunk, j: int) -> None:
        """W of a split backward. It reads saved activations only (no parameter gather),
        then hands the gradients over as a whole backward does."""
        for s in chunk.states:
            s.before_backward()
        backward_weight(self.deferred.pop((chunk.index, j)))
        for s in chunk.states:
            s.add_grads()

    def _ghost(self, chunk: Chunk, kind: str) -> None:
        """A pass this replica does not have: only the data-parallel collectives of the
        real pass (gathers around F and B, gradients after the pass that makes them)."""
        gradients = kind == ("W" if chunk.split_backward else "B")
        if kind != "W":
            chunk.unshard()
        if gradients:
            for s in chunk.states:
                s.add_grads(ghost=True)
        if kind != "W":
            chunk.reshard()
