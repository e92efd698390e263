"""One rank of a plan's run: build its part of the model, train, measure, checkpoint.

`run_rank` is what every process torchrun starts executes (executor/worker.py):

1. the process group (gloo on CPU ranks with one thread each, NCCL on GPUs), the
   watchdog (executor/watchdog.py), and the plan's groups (executor/groups.py);
2. this rank's model chunks (executor/model.py), tensor-parallel if the stage is
   (executor/tensor_parallel.py), their parameters in AMSP-sharded flat buffers
   (executor/data_parallel.py) or FSDP2 units (executor/fsdp.py), a tied embedding in a
   bucket (or unit) of its own; at a stage position where the replicas' tp differs,
   whole-gradient sums (executor/mixed_tp.py);
3. per step: the stage's passes in the plan's schedule (executor/pipeline.py), the tied
   embedding's gradients summed between first and last stage, gradient reduction of every
   bucket, then (fp16) the gradients unscaled and checked for an overflow on any rank
   (executor/precision.py), and the optimizer step of every bucket, or on an overflow none;
   checkpoints every N steps (executor/checkpoint.py);
4. the measurements: loss per step, each rank's time per step (and the slowest rank's),
   peak memory and model-state bytes per rank, in fp16 the loss scale per step and the
   skipped steps, written by rank 0 to `<run dir>/metrics.json`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import json
import os
import resource
import signal
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.distributed as dist

from executor import checkpoint
from executor.checkpoint_layout import ParamPlace, Piece, place_of
from executor.data_parallel import ModelState, ShardedState
from executor.fsdp import FsdpState, data_parallel_mesh, fsdp_applies
from executor.groups import ProcessGroups, create_groups, expert_shard_layout, shard_layout
from executor.mixed_tp import MixedTpState
from executor.model import GPT
from executor.moe import MoE
from executor.pipeline import Chunk, Links, MicroBatches, StageRunner, splits_backward
from executor.precision import (
    DTYPES,
    LossScaler,
    found_inf_anywhere,
    set_matmul_precision,
    unscale_grads,
)
from executor.topology import Topology, sample_ranges
from executor.train import LEARNING_RATE, adamw, sample_batch
from executor.watchdog import Watchdog
from planner.specs.plan import Plan

__all__ = ["LOSS_SCALER", "RunSettings", "run_rank", "seed_dropout"]

EXPERTS = "experts"  # the name of a chunk's routed-expert bucket (ep > 1)
LOSS_SCALER = "loss_scaler"  # its checkpoint key: [scale, growth tracker, hysteresis tracker]


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    steps: int
    run_dir: str  # metrics.json and the ranks' stop notes go here
    seed: int = 0
    learning_rate: float = LEARNING_RATE
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: never
    resume: bool = False
    hang_timeout_s: float = 30.0
    # "RANK:STEP:kill|hang|freeze|error|overflow", for failure tests (overflow: an inf in
    # that rank's gradients at that step)
    fault: str | None = None
    # steps run after the measured ones under torch.profiler, their ops' time summed by
    # kind (executor/trace.py); not timed with the others
    trace_steps: int = 0


@dataclass(frozen=True)
class Metrics:
    first_step: int  # 0-based index of the first step run (after a resume: the next one)
    losses: list[float]  # global mean loss per step run
    step_times_s: list[float]  # per step run: the slowest rank's time
    peak_memory_bytes: list[int]  # per rank
    model_state_bytes: list[dict[str, int]]  # per rank: params, grads, optimizer
    memory_kind: str  # what peak memory measures
    resume: str | None = None  # what a resume took (and skipped), as the run said it
    # fp16: the loss scale of each step run, and the steps (1-based) skipped on overflow
    loss_scales: list[float] | None = None
    skipped_steps: list[int] = field(default_factory=list)
    # ep > 1: per rank, the part of model_state_bytes that is routed experts' (all kinds)
    expert_state_bytes: list[int] = field(default_factory=list)
    # per rank: its own time of each step run (executor/report.py `measured_iteration_s`)
    rank_step_times_s: list[list[float]] = field(default_factory=list)
    # per rank, with RunSettings.trace_steps: its traced steps by kind of op
    # (executor/trace.py `TraceSummary.to_dict`)
    traces: list[dict] = field(default_factory=list)


# glibc mallopt parameters (malloc.h) and the size below which freed memory stays in the
# process: 1 GiB, the largest power of two mallopt's int takes
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _KEEP_BYTES = -1, -3, 1 << 30


def keep_freed_memory() -> bool:
    """Have the C allocator keep the memory a step frees for the next step (glibc: no
    heap trimming, no mmap for blocks under 1 GiB); whether it took. glibc's defaults
    hand the activations freed at the end of each backward back to the kernel and fault
    them in again in the next forward: ~600-1,500 page faults and 1-3 ms of system time a
    debug-small step on this VM, in no op's profile row (the profiler times each op in a
    loop that reuses its memory). PyTorch's performance tuning guide ("CPU specific
    optimizations": switch the memory allocator) recommends allocators that reuse memory
    for the same reason; the glibc manual's "Memory Allocation Tunables" give these two.
    The mmap threshold goes first: a trim threshold alone turns glibc's dynamic mmap
    threshold off at its 128 KiB start, which maps every activation afresh. Not glibc
    (musl, macOS): nothing to set, False."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


def seed_dropout(seed: int, device: torch.device) -> None:
    """Seed the generators the rank's dropout draws from: the CPU's, and on GPU ranks the
    GPUs' too, as `torch.manual_seed` does, without what it does for the backends the
    rank does not use: where CUDA is not initialised (every CPU rank) it queues the CUDA
    seeding with a formatted stack trace (torch.cuda._lazy_call), 75-130 us a call on
    this project's CPU machines, paid every step."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)


def _device(plan: Plan, topo: Topology, rank: int) -> tuple[torch.device, str]:
    if plan.cluster.node_groups[0].device.vendor == "cpu":
        torch.set_num_threads(1)  # one CPU rank is one core
        keep_freed_memory()  # steady memory from step to step, as the op rows had it
        return torch.device("cpu"), "gloo"
    local = topo.roles[rank].local_device
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    set_matmul_precision(plan.training.dtype, device)  # tf32: TF32 matmuls
    return device, "nccl"


def _buckets(module: GPT, topo: Topology, *, ep: int = 1) -> tuple[list, list, list]:
    """(main, tied, experts) parameters of a chunk: with pp > 1 the tied embedding (or
    its copy in the head) is a bucket of its own, summed with its twin before the
    reduction; with ep > 1 so are the routed experts, reduced over their own group."""
    tied = [p for name, p in module.named_parameters()
            if topo.tied and module.init_name(name) == "wte.weight"]
    experts = [p for name, p in module.named_parameters() if ep > 1 and ".experts." in name]
    main = [p for p in module.parameters()
            if all(p is not t for t in tied) and all(p is not e for e in experts)]
    return main, tied, experts


def _module(plan: Plan, topo: Topology, rank: int, c: int, device: torch.device,
            groups: ProcessGroups, *, dtype: torch.dtype, seed: int) -> GPT:
    """Chunk c of this rank's stage, on its device, tensor-parallel if the stage is."""
    role = topo.roles[rank]
    stage = plan.pipelines[role.pipeline].stages[role.stage]
    k, num_chunks = c * topo.pp + role.stage, topo.pp * topo.vp
    ep = plan.training.ep
    ep_ranks = topo.ep_group(plan, rank) if ep > 1 else (rank,)
    module = GPT(plan.model, attention=plan.attention_of(stage), seed=seed,
                 layers=topo.layers[role.stage][c], embedding=k == 0, head=k == num_chunks - 1,
                 recompute=stage.recompute, ep=ep, ep_rank=ep_ranks.index(rank)
                 ).to(device=device, dtype=dtype).train()
    if ep > 1:  # the MoE layers trade tokens in the ep group (executor/moe.py)
        for block in module.blocks.values():
            if isinstance(block.mlp, MoE):
                block.mlp.group = groups.collectives[ep_ranks]
    if stage.tp > 1:
        from torch.distributed.device_mesh import DeviceMesh

        from executor.tensor_parallel import apply_tensor_parallel

        ranks = tuple(sorted(topo.stage_ranks(plan, role.pipeline, role.stage)))
        mesh = DeviceMesh.from_group(groups.collectives[ranks], device.type)
        apply_tensor_parallel(module, mesh, sequence_parallel=plan.training.sequence_parallel)
    return module


def _use_fsdp(plan: Plan) -> bool:
    if len(plan.shardings) > 1 or plan.training.ep > 1:  # experts shard over their own group  # FSDP2 shards every stage alike: AMSP per stage is flat
        return False
    sh = plan.sharding_of(0)
    return fsdp_applies(params=sh.params, grads=sh.grads, optim=sh.optim,
                        equal_counts=len({p.num_microbatches for p in plan.pipelines}) == 1,
                        tp=max(s.tp for p in plan.pipelines for s in p.stages))


def _fused(module: GPT) -> dict[int, list[int]]:
    """id(parameter) -> row blocks of the chunk's fused weights (regrouped under tp)."""
    from executor.tensor_parallel import fused_rows

    rows = fused_rows(module)
    return {id(p): rows[n] for n, p in module.named_parameters() if n in rows}


def _places(module: GPT, params: list, *, tp_rank: int, replica_writes: bool
            ) -> list[ParamPlace]:
    """Where each parameter lies in the whole model, and whether this rank writes it to a
    checkpoint: not a tied head's copy (the embedding is written), a replicated one by tp
    rank 0 only, and at a mixed-tp position only replica 0 (`replica_writes`)."""
    names = {id(p): n for n, p in module.named_parameters()}
    fused = _fused(module)
    out = []
    for p in params:
        name = names[id(p)]
        place = place_of(module.init_name(name), p, widths=fused.get(id(p)))
        copy = place.name != name
        write = (not copy and (place.segments is not None or tp_rank == 0)
                 and replica_writes)
        out.append(replace(place, copy=copy, write=write))
    return out


def build_chunks(plan: Plan, topo: Topology, rank: int, device: torch.device,
                 groups: ProcessGroups, *, learning_rate: float, seed: int) -> list[Chunk]:
    """This rank's model chunks, their parameters sharded as the plan says: by FSDP2
    where it expresses the sharding, else on AMSP flat buffers."""
    role = topo.roles[rank]
    layout = shard_layout(plan, topo, rank)
    dtype = DTYPES[plan.training.dtype]
    fsdp = _use_fsdp(plan)
    num_chunks = topo.pp * topo.vp
    chunks = []
    for c in range(topo.vp):
        k = c * topo.pp + role.stage
        # FSDP2 keeps fp32 parameters and computes in the plan's dtype.
        module = _module(plan, topo, rank, c, device, groups, seed=seed,
                         dtype=torch.float32 if fsdp else dtype)
        main, tied, experts = _buckets(module, topo, ep=plan.training.ep)
        name = f"chunk{k}/tp{role.tp_rank}"
        split = splits_backward(plan.training.schedule, first=k == 0)

        def optimizer(ps: list) -> torch.optim.Optimizer:
            return adamw(ps, implementation=plan.kernels.optimizer, learning_rate=learning_rate)

        mixed = topo.mixed_tp(plan, role.stage)
        places = functools.partial(_places, module, tp_rank=role.tp_rank,
                                   replica_writes=not mixed or role.pipeline == 0)
        if mixed:
            tp = plan.pipelines[role.pipeline].stages[role.stage].tp
            states: list = [MixedTpState(
                ps, rank, groups.collectives, position_group=topo.position_group(
                    plan, role.stage), tp=tp, tp_rank=role.tp_rank, fused=_fused(module),
                make_optimizer=optimizer, tied=kind == "tied", replica=role.pipeline,
                places=places(ps),
                replica_tps=[p.stages[role.stage].tp for p in plan.pipelines],
                optim=plan.sharding_of(role.stage).optim,
                name=f"chunk{k}/tp{role.tp_rank}of{tp}/{kind}")
                for kind, ps in (("main", main), ("tied", tied)) if ps]
        elif fsdp:
            states = [FsdpState(module, data_parallel_mesh(layout, groups.collectives,
                                                           device.type),
                                dtype=dtype, tied=tied, make_optimizer=optimizer,
                                num_microbatches=plan.pipelines[0].num_microbatches,
                                split_backward=split, name=name)]
        else:
            states = [ShardedState(ps, layout, groups.collectives, make_optimizer=optimizer,
                                   name=f"{name}/{kind}", tied=kind == "tied",
                                   places=places(ps))
                      for kind, ps in (("main", main), ("tied", tied)) if ps]
            if experts:  # ep > 1: sharded over the expert-data-parallel group
                states.append(ShardedState(
                    experts, expert_shard_layout(plan, topo, rank), groups.collectives,
                    make_optimizer=optimizer, name=f"{name}/{EXPERTS}",
                    places=places(experts)))
        chunks.append(Chunk(k, module, states, first=k == 0, last=k == num_chunks - 1,
                            split_backward=split))
    return chunks


class Trainer:
    """This rank's chunks, pipeline runner and optimizer step."""

    def __init__(self, plan: Plan, topo: Topology, rank: int, device: torch.device,
                 groups: ProcessGroups, watchdog: Watchdog, settings: RunSettings) -> None:
        self.plan, self.topo, self.rank, self.seed = plan, topo, rank, settings.seed
        role = topo.roles[rank]
        pipe = plan.pipelines[role.pipeline]
        stage = pipe.stages[role.stage]
        self.chunks = build_chunks(plan, topo, rank, device, groups,
                                   learning_rate=settings.learning_rate, seed=settings.seed)
        self.tied_group = next((groups.collectives[tuple(sorted(pair))]
                                for pair in topo.embedding_pairs(plan) if rank in pair), None)
        self.runner = StageRunner(
            chunks=self.chunks, links=_links(plan, topo, rank, groups),
            data=_micro_batches(plan, role.pipeline, settings.seed, device), schedule=plan.training.schedule,
            stage=role.stage, pp=topo.pp, vp=topo.vp,
            activation_shape=_activation_shape(plan, pipe.micro_batch_size, stage.tp),
            dtype=DTYPES[plan.training.dtype], device=device, tensor_parallel=stage.tp > 1,
            progress=watchdog.progress)
        self.device = device
        self.scaler = LossScaler() if plan.training.dtype == "fp16" else None
        self.loss_scales: list[float] = []  # fp16: the scale of each step run
        self.skipped: list[int] = []  # fp16: steps (1-based) skipped on an overflow
        self._scaler_state = torch.zeros(3, dtype=torch.float64)  # its checkpoint form

    @property
    def states(self) -> list[ModelState]:
        return [s for c in self.chunks for s in c.states]

    def iteration(self, step: int, *, overflow: bool = False) -> float:
        """One training step; returns this rank's share of the global loss. `overflow`
        (a test hook): an inf in this rank's gradients, as an fp16 overflow makes."""
        role = self.topo.roles[self.rank]
        # Dropout from (seed, step, stage): a resumed run draws the same masks, and the
        # tp ranks of a stage the same ones for their replicated activations.
        seed_dropout(zlib.crc32(f"{self.seed}:{step}:{role.pipeline}:{role.stage}".encode()),
                     self.device)
        self.runner.loss_scale = self.scaler.scale if self.scaler is not None else 1.0
        loss = self.runner.run(step)
        if self.tied_group is not None:  # Megatron-LM's embedding all-reduce
            for s in self.states:
                for grad in s.tied_grads():
                    dist.all_reduce(grad, group=self.tied_group)
        for s in self.states:
            s.reduce_grads()
        if overflow:
            self.states[0].grads()[0].view(-1)[0] = float("inf")
        if self._steps(step):
            for s in self.states:
                s.step()
        else:
            for s in self.states:
                s.skip_step()
        computes_loss = self.chunks[-1].last and role.tp_rank == 0
        return loss if computes_loss else 0.0

    def _steps(self, step: int) -> bool:
        """fp16: unscale the reduced gradients and decide, with every rank of the job,
        whether to step (no rank found an inf or NaN); update the loss scale. There is no
        gradient clipping to do in between. Other dtypes always step."""
        if self.scaler is None:
            return True
        scale = self.scaler.scale
        local = unscale_grads((g for s in self.states for g in s.grads()), scale)
        found = found_inf_anywhere(local, self.device)
        self.scaler.update(found)
        self.loss_scales.append(scale)
        if found:
            self.skipped.append(step + 1)
        return not found

    def checkpoint_pieces(self) -> list[Piece]:
        """This rank's model state in a checkpoint's layout-independent form; in fp16 the
        loss scaler's state too (written by rank 0, every rank reads it; optional, so that
        a checkpoint of another dtype resumes with a fresh scaler)."""
        pieces = [p for s in self.states for p in s.checkpoint_pieces()]
        if self.scaler is not None:
            self._scaler_state.copy_(torch.tensor(self.scaler.state(), dtype=torch.float64))
            pieces.append(Piece(LOSS_SCALER, (3,), (0,), self._scaler_state,
                                write=self.rank == 0, optional=True))
        return pieces

    def loaded(self) -> None:
        for s in self.states:
            s.loaded()
        if self.scaler is not None:
            self.scaler.load(self._scaler_state.tolist())

    def expert_state_bytes(self) -> int:
        """Bytes of the routed experts' parameters, gradients and optimizer states (their
        own buckets with ep > 1; 0 otherwise)."""
        return sum(sum(s.state_bytes().values()) for s in self.states
                   if s.name.endswith(f"/{EXPERTS}"))

    def state_bytes(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for s in self.states:
            for k, v in s.state_bytes().items():
                total[k] = total.get(k, 0) + v
        return total


def _micro_batches(plan: Plan, pipeline: int, seed: int, device: torch.device) -> MicroBatches:
    tr = plan.training
    pipe = plan.pipelines[pipeline]
    counts = {p.num_microbatches for p in plan.pipelines}
    per_pass = any(sh.params > 1 or sh.grads > 1 for sh in plan.shardings)

    def draw(step: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_batch(plan.model, seq_len=tr.seq_len, seed=seed, step=step, first=first,
                            count=count, device=device)

    return MicroBatches(draw=draw, first_sample=sample_ranges(plan)[pipeline],
                        size=pipe.micro_batch_size, count=pipe.num_microbatches,
                        run_count=max(counts) if per_pass else pipe.num_microbatches,
                        weight=pipe.micro_batch_size / tr.global_batch_size)


def _activation_shape(plan: Plan, mbs: int, tp: int) -> tuple[int, int, int]:
    """What crosses a stage boundary: [b, s, h], the rank's 1/tp of s with sequence
    parallelism."""
    s = plan.training.seq_len
    if plan.training.sequence_parallel and tp > 1:
        s //= tp
    return (mbs, s, plan.model.hidden_size)


def _links(plan: Plan, topo: Topology, rank: int, groups: ProcessGroups) -> Links:
    return Links(forward_source=topo.forward_source(plan, rank),
                 forward_targets=topo.forward_targets(plan, rank),
                 backward_source=topo.backward_source(plan, rank),
                 backward_targets=topo.backward_targets(plan, rank),
                 groups=groups.links, rank=rank)


def _inject_fault(settings: RunSettings, rank: int, step: int) -> bool:
    """Failure tests: this rank dies, hangs, freezes (SIGSTOP: no heartbeat either) or
    raises at the start of `step` (1-based); True for `overflow` (its gradients get an
    inf in that step)."""
    if not settings.fault:
        return False
    who, when, kind = settings.fault.split(":")
    if int(who) != rank or int(when) != step:
        return False
    with open(os.path.join(settings.run_dir, "fault.txt"), "w", encoding="utf-8") as fh:
        fh.write(f"{time.time():.3f} rank {rank} {kind} at step {step}\n")
    if kind == "overflow":
        return True
    if kind in ("kill", "freeze"):
        os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    if kind == "hang":
        while True:
            time.sleep(3600)
    raise RuntimeError(f"injected fault at step {step}")


def _peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """The peak the prediction's stage memory counts: on a GPU its reserve too (CUDA
    context, NCCL buffers, workspaces, allocator fragmentation: `costs.memory`), so the
    allocator's high-water mark of reserved segments plus what the process holds outside
    the allocator now (the device's used memory less the allocator's segments), not the
    tensors alone (max_memory_allocated, 2 GiB and more below it)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        outside = max(0, total - free - torch.cuda.memory_reserved(device))
        return (torch.cuda.max_memory_reserved(device) + outside,
                "torch.cuda.max_memory_reserved + the device memory outside PyTorch's "
                "allocator (torch.cuda.mem_get_info; CUDA context, NCCL; other processes "
                "on the GPU count too)")
    # Linux reports the high-water mark of the resident set in KiB.
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "process peak resident set (ru_maxrss; includes the Python runtime)")


def _resume(trainer: Trainer, settings: RunSettings, plan: Plan, rank: int
            ) -> tuple[int, str | None]:
    """Load the newest intact checkpoint (under any layout: it is resharded); the number
    of steps it had done and the line that says so (rank 0 prints it)."""
    assert settings.checkpoint_dir is not None
    found = checkpoint.resume(settings.checkpoint_dir, trainer.checkpoint_pieces(), plan=plan)
    if found is None:
        return 0, None
    trainer.loaded()
    if rank == 0:
        print(f"[trainplan] {found.note}", file=sys.stderr, flush=True)
    return found.step, found.note


def _train(trainer: Trainer, settings: RunSettings, watchdog: Watchdog, *, start: int,
           rank: int, device: torch.device, plan: Plan) -> tuple[list[float], list[float]]:
    losses, times = [], []
    for step in range(start, settings.steps):
        overflow = _inject_fault(settings, rank, step + 1)
        t0 = time.perf_counter()
        losses.append(trainer.iteration(step, overflow=overflow))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        done = step + 1
        if settings.checkpoint_dir and settings.checkpoint_every and \
                done % settings.checkpoint_every == 0:
            with watchdog.phase("checkpoint"):
                checkpoint.save(settings.checkpoint_dir, done, trainer.checkpoint_pieces(),
                                plan=plan, run={"seed": settings.seed,
                                                "learning_rate": settings.learning_rate})
    return losses, times


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null inside the block (native code's own writes too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w", encoding="utf-8") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _trace(trainer: Trainer, settings: RunSettings, device: torch.device) -> dict:
    """Run `settings.trace_steps` more steps under torch.profiler; their ops' own time by
    kind (`executor.trace.summarize`): self CPU time on CPU ranks, kernel time on GPUs.
    Each step is its own profiling cycle, its events summed and dropped at its end: a
    profiler holding every event of several steps grows the heap through them, and on
    CPU ranks the activations freed in one step then land on untouched pages in the next
    (a debug-small GELU took 256 page faults, 3x its time, in most steps)."""
    import warnings

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    from executor.trace import summarize

    cuda = device.type == "cuda"
    n = settings.trace_steps
    # fp16: the loss scales and skips of the run's own steps only
    scales, skipped = len(trainer.loss_scales), len(trainer.skipped)
    totals: dict[str, list[float]] = {}

    def collect(prof: profile) -> None:
        for e in prof.key_averages():
            if (cuda and e.device_type != DeviceType.CUDA) or e.key.startswith("ProfilerStep"):
                continue  # (the step's own scope: its self time is the time in no op)
            seconds = (e.self_device_time_total if cuda else e.self_cpu_time_total) * 1e-6
            total = totals.setdefault(e.key, [0, 0.0])
            total[0] += e.count
            total[1] += seconds

    with warnings.catch_warnings():  # "won't be using warmup": each step is measured whole
        warnings.simplefilter("ignore")
        prof = profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda
                                                            else [])],
                       schedule=schedule(wait=1, warmup=0, active=1, repeat=n),
                       on_trace_ready=collect)
        with _quiet_stderr():  # Kineto's "USDT: profiler_start" lines, on every rank
            prof.start()
        try:
            wall = 0.0  # the steps' own time, not the profiler's work between them
            for step in range(settings.steps, settings.steps + n):
                # each step starts together, as run steps do; the barrier is in the
                # cycle's unrecorded (wait) part: it is not the step's, nor in `wall`
                dist.barrier()
                with _quiet_stderr():
                    prof.step()
                t0 = time.perf_counter()
                trainer.iteration(step)
                if cuda:
                    torch.cuda.synchronize(device)
                wall += (time.perf_counter() - t0) / n
                with _quiet_stderr():
                    prof.step()
        finally:
            with _quiet_stderr():
                prof.stop()
            del trainer.loss_scales[scales:], trainer.skipped[skipped:]
    events = [(name, int(calls), seconds) for name, (calls, seconds) in totals.items()]
    return summarize(events, steps=n, wall_s=wall, device=cuda).to_dict()


def _metrics(trainer: Trainer, device: torch.device, start: int, losses: list[float],
             times: list[float], resume: str | None, trace: dict | None = None) -> Metrics:
    """Everyone's measurements, combined (collective)."""
    loss_t = torch.tensor(losses, dtype=torch.float64, device=device)
    time_t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(loss_t)  # each replica's last stage holds its weighted share
    dist.all_reduce(time_t, op=dist.ReduceOp.MAX)
    peak, kind = _peak_memory_bytes(device)
    scaling = (trainer.loss_scales, trainer.skipped) if trainer.scaler is not None else None
    mine = {"peak": peak, "scaling": scaling, "experts": trainer.expert_state_bytes(),
            "times": times, "trace": trace, **trainer.state_bytes()}
    everyone: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    scalings = [e.pop("scaling") for e in everyone]
    experts = [e.pop("experts") for e in everyone]
    rank_times = [e.pop("times") for e in everyone]
    traces = [e.pop("trace") for e in everyone]
    if any(s != scaling for s in scalings):  # the found-inf all-reduce makes them agree
        raise RuntimeError(f"the ranks' loss scales and skipped steps differ: {scalings}")
    return Metrics(first_step=start, losses=loss_t.tolist(), step_times_s=time_t.tolist(),
                   peak_memory_bytes=[e.pop("peak") for e in everyone],
                   model_state_bytes=everyone, memory_kind=kind, resume=resume,
                   loss_scales=scaling[0] if scaling else None,
                   skipped_steps=scaling[1] if scaling else [],
                   expert_state_bytes=experts if trainer.plan.training.ep > 1 else [],
                   rank_step_times_s=rank_times,
                   traces=traces if trace is not None else [])


def run_rank(plan: Plan, settings: RunSettings) -> None:
    """The work of one process of a torchrun launch (RANK etc. from the environment)."""
    topo = Topology.of(plan)
    rank = int(os.environ["RANK"])
    if int(os.environ["WORLD_SIZE"]) != topo.world_size:
        raise SystemExit(f"the plan has {topo.world_size} ranks; this launch has "
                         f"{os.environ['WORLD_SIZE']}")
    device, backend = _device(plan, topo, rank)
    # A backstop behind the watchdog, which names a hang after `hang_timeout_s`.
    timeout = datetime.timedelta(seconds=settings.hang_timeout_s + 60)
    dist.init_process_group(backend, timeout=timeout)
    watchdog = Watchdog(rank=rank, names=[r.describe() for r in topo.roles],
                        run_dir=settings.run_dir, hang_timeout_s=settings.hang_timeout_s)
    watchdog.start()
    dist.barrier()
    watchdog.watch()
    try:
        with watchdog.phase("setup"):
            groups = create_groups(plan, topo, rank, timeout=timeout)
            trainer = Trainer(plan, topo, rank, device, groups, watchdog, settings)
            start, note = _resume(trainer, settings, plan, rank) if settings.resume else (0, None)
        losses, times = _train(trainer, settings, watchdog, start=start, rank=rank,
                               device=device, plan=plan)
        traced = _trace(trainer, settings, device) if settings.trace_steps else None
        metrics = _metrics(trainer, device, start, losses, times, note, traced)
        if rank == 0:
            with open(os.path.join(settings.run_dir, "metrics.json"), "w",
                      encoding="utf-8") as fh:
                json.dump(asdict(metrics), fh, indent=1)
        dist.barrier()
        watchdog.stop()
    except Exception as err:  # any failure: name the culprit and stop every rank
        import traceback

        # a refused checkpoint is said in one line; anything else shows where it happened
        refused = isinstance(err, checkpoint.CheckpointError)
        watchdog.fail(err, "" if refused else traceback.format_exc())
    # FSDP-era exit-time aborts at world 4 went away with a collection before destroy
    # (shared/notes/torch-distributed-on-cpu.md).
    gc.collect()
    dist.destroy_process_group()
