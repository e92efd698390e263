"""The process groups of a plan, created the same way on every rank.

torch.distributed needs every rank to take part in creating every group, in the same
order: the groups are listed from the Topology (pure Python), sorted, and created once;
each rank keeps the ones it belongs to.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

from executor.pipeline import ACTIVATION, GRADIENT
from executor.sharding import ShardLayout
from executor.topology import Topology
from planner.specs.plan import Plan

__all__ = ["ProcessGroups", "create_groups", "expert_shard_layout", "shard_layout"]


def shard_layout(plan: Plan, topo: Topology, rank: int) -> ShardLayout:
    """How this rank's stage shards its model states (AMSP, at the stage's own sharding;
    a tied embedding's twins, summed buffer to buffer, are on stages that shard alike;
    alone at a stage position of mixed tp, whose gradients executor/mixed_tp.py sums)."""
    role = topo.roles[rank]
    if topo.mixed_tp(plan, role.stage):  # no sharding there (preflight): nothing to shard
        return ShardLayout((rank,), rank)
    sh = plan.sharding_of(role.stage)
    return ShardLayout(topo.dp_group(plan, role.stage, role.tp_rank), rank, sh.params,
                       sh.grads, sh.optim)


def expert_shard_layout(plan: Plan, topo: Topology, rank: int) -> ShardLayout:
    """How this rank shards its routed experts' states with ep > 1: over the
    expert-data-parallel group, each of P/G/OS divided by ep (at least 1), as
    planner/costs/memory.py `model_state_bytes` prices them (preflight keeps them whole
    numbers)."""
    ep, sh = plan.training.ep, plan.sharding_of(topo.roles[rank].stage)
    return ShardLayout(topo.expert_dp_group(plan, rank), rank, max(1, sh.params // ep),
                       max(1, sh.grads // ep), max(1, sh.optim // ep))


def _collective_groups(plan: Plan, topo: Topology) -> list[tuple[int, ...]]:
    groups: set[tuple[int, ...]] = {tuple(sorted(g)) for g in topo.tp_groups(plan)}
    for rank in range(topo.world_size):
        groups |= shard_layout(plan, topo, rank).groups()
    groups |= {tuple(sorted(p)) for p in topo.embedding_pairs(plan)}
    if plan.training.ep > 1:
        for rank in range(topo.world_size):
            groups.add(topo.ep_group(plan, rank))
            groups |= expert_shard_layout(plan, topo, rank).groups()
    groups |= {topo.position_group(plan, s) for s in range(topo.pp) if topo.mixed_tp(plan, s)}
    return sorted(g for g in groups if len(g) > 1)


def _links(plan: Plan, topo: Topology) -> list[tuple[int, int, int]]:
    """(source, destination, kind) of every pipeline message flow."""
    if topo.pp == 1:
        return []
    out: set[tuple[int, int, int]] = set()
    for rank, role in enumerate(topo.roles):
        wraps_next = role.stage == topo.pp - 1  # to stage 0: only interleaving uses it
        wraps_prev = role.stage == 0
        if topo.vp > 1 or not wraps_next:
            out.update((rank, d, ACTIVATION) for d in topo.forward_targets(plan, rank))
        if topo.vp > 1 or not wraps_prev:
            out.update((rank, d, GRADIENT) for d in topo.backward_targets(plan, rank))
    return sorted(out)


@dataclass
class ProcessGroups:
    collectives: dict[tuple[int, ...], dist.ProcessGroup]  # sorted ranks -> group
    links: dict[tuple[int, int, int], dist.ProcessGroup]  # (src, dst, kind) -> group


def create_groups(plan: Plan, topo: Topology, rank: int, *,
                  timeout: datetime.timedelta) -> ProcessGroups:
    """Every group of the plan (collective call); returns this rank's."""
    collectives, links = {}, {}
    for ranks in _collective_groups(plan, topo):
        pg = dist.new_group(list(ranks), timeout=timeout)
        if rank in ranks:
            collectives[ranks] = pg
    for key in _links(plan, topo):
        pg = dist.new_group(sorted({key[0], key[1]}), timeout=timeout)
        if rank in key[:2]:
            links[key] = pg
    world = tuple(range(topo.world_size))
    if world not in collectives:
        collectives[world] = dist.group.WORLD  # type: ignore[assignment]
    return ProcessGroups(collectives, links)
