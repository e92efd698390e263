"""Who does what in a run of a Plan: ranks, their roles and the groups they talk in.

Pure Python (no torch), so the launcher and the tests use it without starting anything.

Ranks are the plan's GPUs in global order (node by node, as torchrun numbers them), so a
plan that leaves some of a cluster's GPUs idle runs on the ones it names. A rank has a
role: pipeline (data-parallel replica) r, stage s, tensor-parallel rank t. Groups:

* tensor-parallel: the `tp` ranks of one stage of one pipeline;
* pipeline neighbours: rank t of stage s + 1 receives from rank t mod tp_s of stage s;
* data-parallel: rank t of stage position s in every pipeline (the executor needs every
  replica to split the layers at the same boundaries); where the replicas' tp differs at
  a stage position ("mixed tp"), all ranks of that position in every pipeline instead
  (`position_group`: they sum full-size gradients, executor/mixed_tp.py);
* expert-parallel (ep > 1, tp = 1): the data-parallel group of a stage position cut into
  consecutive blocks of ep ranks, which split each MoE layer's routed experts and trade
  tokens; the expert-data-parallel group (stride ep in the data-parallel group) holds
  the same experts and reduces their gradients (Megatron-Core parallel_state.py);
* embedding: with tied embeddings and pp > 1, the first and the last stage hold copies of
  the token embedding whose gradients are summed (Megatron-LM's embedding group).

With interleaving (vp > 1) a stage's layer range only gives its layer count: its chunk c
is model chunk c * pp + s, and model chunks take consecutive layers in that order
(Narayanan et al. 2021 §2.2.2), as Megatron-LM assigns them.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs.layout import stage_layer_ranges
from planner.specs.plan import Plan

__all__ = ["RankRole", "Topology", "chunk_layers", "sample_ranges"]


@dataclass(frozen=True)
class RankRole:
    rank: int
    device: int  # global GPU index in the cluster
    node: int  # global node index
    local_device: int  # index of the GPU inside its node
    pipeline: int
    stage: int
    tp_rank: int

    def describe(self) -> str:
        return (f"rank {self.rank} (pipeline {self.pipeline}, stage {self.stage}, "
                f"tp rank {self.tp_rank}, GPU {self.device} on node {self.node})")


def chunk_layers(counts: tuple[int, ...], vp: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """[stage][chunk] -> (first, last) layers, for stages of `counts` layers with `vp`
    chunks each; chunk c of stage s is model chunk c * pp + s (vp = 1: stages in order), as
    the planner lays them out (`layout.stage_layer_ranges`)."""
    return tuple(tuple((r.start, r.stop) for r in chunks)
                 for chunks in stage_layer_ranges(tuple(counts), vp))


def sample_ranges(plan: Plan) -> tuple[int, ...]:
    """The first global sample index of each pipeline (replicas take consecutive slices of
    the global batch, in pipeline order)."""
    out, start = [], 0
    for pipe in plan.pipelines:
        out.append(start)
        start += pipe.samples
    return tuple(out)


@dataclass(frozen=True)
class Topology:
    """Ranks, roles and groups of one plan (build with `Topology.of(plan)`)."""

    roles: tuple[RankRole, ...]
    rank_of_device: dict[int, int]
    layers: tuple[tuple[tuple[int, int], ...], ...]  # [stage][chunk] -> (first, last)
    pp: int
    vp: int
    tied: bool  # tied embeddings across first and last stage (pp > 1)

    @staticmethod
    def of(plan: Plan) -> Topology:
        slots = plan.cluster.slots
        used = sorted(d for p in plan.pipelines for s in p.stages for d in s.devices)
        rank_of = {d: r for r, d in enumerate(used)}
        roles: dict[int, RankRole] = {}
        for pi, pipe in enumerate(plan.pipelines):
            for si, stage in enumerate(pipe.stages):
                for t, d in enumerate(stage.devices):
                    roles[rank_of[d]] = RankRole(rank_of[d], d, slots[d].node, slots[d].local,
                                                 pi, si, t)
        first = plan.pipelines[0]
        counts = tuple(s.num_layers for s in first.stages)
        pp, vp = len(counts), plan.training.virtual_stages
        return Topology(roles=tuple(roles[r] for r in range(len(used))), rank_of_device=rank_of,
                        layers=chunk_layers(counts, vp), pp=pp, vp=vp,
                        tied=plan.model.tied_embeddings and pp > 1)

    @property
    def world_size(self) -> int:
        return len(self.roles)

    def stage_ranks(self, plan: Plan, pipeline: int, stage: int) -> tuple[int, ...]:
        """The ranks of one stage in tp order."""
        return tuple(self.rank_of_device[d]
                     for d in plan.pipelines[pipeline].stages[stage].devices)

    def tp_groups(self, plan: Plan) -> list[tuple[int, ...]]:
        return [self.stage_ranks(plan, pi, si) for pi, pipe in enumerate(plan.pipelines)
                for si in range(len(pipe.stages))]

    def dp_group(self, plan: Plan, stage: int, tp_rank: int) -> tuple[int, ...]:
        """Rank `tp_rank` of stage position `stage` in every pipeline, in rank order."""
        return tuple(sorted(self.stage_ranks(plan, pi, stage)[tp_rank]
                            for pi in range(plan.dp)))

    def ep_group(self, plan: Plan, rank: int) -> tuple[int, ...]:
        """The ep ranks, at this rank's stage position, that split the experts with it."""
        role = self.roles[rank]
        members = self.dp_group(plan, role.stage, role.tp_rank)
        start = members.index(rank) // plan.training.ep * plan.training.ep
        return members[start:start + plan.training.ep]

    def expert_dp_group(self, plan: Plan, rank: int) -> tuple[int, ...]:
        """The ranks holding the same experts as this one (dp / ep of them)."""
        role = self.roles[rank]
        members = self.dp_group(plan, role.stage, role.tp_rank)
        return members[members.index(rank) % plan.training.ep::plan.training.ep]

    def mixed_tp(self, plan: Plan, stage: int) -> bool:
        """Whether the replicas' tp differs at stage position `stage`."""
        return len({p.stages[stage].tp for p in plan.pipelines}) > 1

    def position_group(self, plan: Plan, stage: int) -> tuple[int, ...]:
        """Every rank of stage position `stage` in every pipeline, in rank order."""
        return tuple(sorted(r for pi in range(plan.dp)
                            for r in self.stage_ranks(plan, pi, stage)))

    def dp_groups(self, plan: Plan) -> list[tuple[int, ...]]:
        tps = [s.tp for s in plan.pipelines[0].stages]
        return [self.dp_group(plan, s, t) for s in range(self.pp) for t in range(tps[s])]

    def embedding_pairs(self, plan: Plan) -> list[tuple[int, int]]:
        """(first-stage rank, last-stage rank) at the same data-parallel position and tp
        rank: their tied-embedding gradient shards cover the same elements. With mixed tp
        (the same tp on a replica's first and last stage, preflight) each replica's pair."""
        if not self.tied:
            return []
        if self.mixed_tp(plan, 0):  # no dp groups there: each replica's twins pair up
            return [(self.stage_ranks(plan, pi, 0)[t], self.stage_ranks(plan, pi, self.pp - 1)[t])
                    for pi, pipe in enumerate(plan.pipelines) for t in range(pipe.stages[0].tp)]
        out = []
        for t in range(plan.pipelines[0].stages[0].tp):
            out.extend(zip(self.dp_group(plan, 0, t), self.dp_group(plan, self.pp - 1, t),
                           strict=True))
        return out

    def _neighbour(self, plan: Plan, rank: int, step: int) -> tuple[RankRole, tuple[int, ...],
                                                                    int, int]:
        role = self.roles[rank]
        pipe = plan.pipelines[role.pipeline]
        there = (role.stage + step) % self.pp
        return (role, self.stage_ranks(plan, role.pipeline, there), pipe.stages[role.stage].tp,
                pipe.stages[there].tp)

    def forward_source(self, plan: Plan, rank: int) -> int:
        """The rank of the previous stage this rank receives activations from (the last
        stage precedes stage 0 for interleaving)."""
        role, ranks, _, tp_prev = self._neighbour(plan, rank, -1)
        return ranks[role.tp_rank % tp_prev]

    def forward_targets(self, plan: Plan, rank: int) -> tuple[int, ...]:
        """The ranks of the next stage this rank sends its activations to."""
        role, ranks, tp_mine, _ = self._neighbour(plan, rank, 1)
        return tuple(r for t, r in enumerate(ranks) if t % tp_mine == role.tp_rank)

    def backward_source(self, plan: Plan, rank: int) -> int:
        """The rank of the next stage this rank receives its output's gradient from."""
        role, ranks, _, tp_next = self._neighbour(plan, rank, 1)
        return ranks[role.tp_rank % tp_next]

    def backward_targets(self, plan: Plan, rank: int) -> tuple[int, ...]:
        """The ranks of the previous stage this rank sends its input's gradient to."""
        role, ranks, tp_mine, _ = self._neighbour(plan, rank, -1)
        return tuple(r for t, r in enumerate(ranks) if t % tp_mine == role.tp_rank)
