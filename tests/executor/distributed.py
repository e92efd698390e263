"""Running a plan's ranks in forked processes on this host (tests only: fork starts a
rank in 0.1 s where torchrun takes seconds; shared/notes/torch-distributed-on-cpu.md).

A forked rank inherits what this process has already done, so two costs are paid here once
instead of in every rank of every run (measured 2026-12-08 on 2 cores, a 2-rank debug-tiny
run of 5 steps: 1.7 s, 0.55 s without the first, 0.33 s without both):
- the optimizer's constructor (`torch.optim.Optimizer.__init__`, wrapped by
  `torch._dynamo`'s disable decorator) imports `torch._dynamo` on first use, about 1 s of
  each rank; it is imported below;
- a rank runs `gc.collect()` before it leaves the process group (executor/runtime.py),
  which walked every object the test process had made (torch's modules, the test suite's)
  and, touching their reference counts, copied their memory pages; `gc.freeze()` before the
  fork keeps them out of the ranks' collections (the `gc.freeze` documentation's advice for
  processes that fork without exec), and the test process unfreezes them once its ranks
  are started.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import socket

import torch._dynamo  # noqa: F401  (once here, not in every forked rank: above)
import torch.distributed as dist

from executor.runtime import RunSettings, run_rank
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import ModelSpec
from planner.specs.plan import Kernels, Pipeline, Plan, Sharding, Stage, Training

__all__ = ["KERNELS", "TEST_LR", "cpu_cluster", "explicit", "homogeneous", "run_forked"]

TEST_LR = 3e-3  # ten times the default: a wrong gradient then moves the loss by > 1e-4
KERNELS = Kernels(attention="math", optimizer="foreach")


def cpu_cluster(n: int) -> ClusterSpec:
    return ClusterSpec(name=f"{n} CPU ranks", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=1, gpus_per_node=n,
        intra_node_link="loopback"),)).resolved()


def homogeneous(model: ModelSpec, *, world: int, **knobs) -> Plan:
    knobs.setdefault("seq_len", 32)
    cfg = ParallelConfig(dtype="fp32", **knobs)
    return homogeneous_plan(model, cpu_cluster(world), cfg, kernels=KERNELS)


def explicit(model: ModelSpec, *, world: int, pipelines: list[tuple[int, int, list]],
             seq_len: int = 32, schedule: str = "1f1b", vp: int = 1,
             sharding: Sharding | None = None, sequence_parallel: bool = False) -> Plan:
    """pipelines: (micro-batch size, micro-batches, [(first, last, devices, tp, recompute)])."""
    pipes = tuple(Pipeline(micro_batch_size=mbs, num_microbatches=m, stages=tuple(
        Stage(layers=(a, b), devices=tuple(devs), tp=tp, recompute=rc)
        for a, b, devs, tp, rc in stages)) for mbs, m, stages in pipelines)
    gbs = sum(p.samples for p in pipes)
    training = Training(global_batch_size=gbs, seq_len=seq_len, dtype="fp32",
                        schedule=schedule, virtual_stages=vp,  # type: ignore[arg-type]
                        sequence_parallel=sequence_parallel)
    plan = Plan(model=model, cluster=cpu_cluster(world), training=training, pipelines=pipes,
                sharding=sharding or Sharding(), kernels=KERNELS)
    plan.check("plan")
    return plan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host_store(port: int, world: int) -> None:
    import time

    store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)
    while store is not None:
        time.sleep(3600)


def _rank(plan: Plan, settings: RunSettings, rank: int, world: int, port: int) -> None:
    # As under torchrun: the launcher (here the test process) hosts the store.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="True")
    run_rank(plan, settings)


def run_forked(plan: Plan, run_dir: str, *, steps: int = 5, timeout_s: float = 120,
               **settings) -> tuple[list[int], dict | None]:
    """Exit codes of the ranks and the run's metrics (None if it failed)."""
    world = plan.num_gpus_used
    settings.setdefault("learning_rate", TEST_LR)
    rs = RunSettings(steps=steps, run_dir=str(run_dir), **settings)
    port = _free_port()
    ctx = multiprocessing.get_context("fork")
    # A process of its own hosts the store, as torchrun's agent does; not this one: a
    # store's server thread here would be forked mid-lock into the ranks.
    host = ctx.Process(target=_host_store, args=(port, world), daemon=True)
    procs = [ctx.Process(target=_rank, args=(plan, rs, r, world, port)) for r in range(world)]
    gc.freeze()  # this process's objects stay out of the ranks' collections (above)
    try:
        host.start()
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()
    for p in procs:
        p.join(timeout_s)
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    host.kill()
    host.join()
    path = os.path.join(run_dir, "metrics.json")
    metrics = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            metrics = json.load(fh)
    return [p.exitcode for p in procs], metrics

