"""Which GPUs share an island link when data-parallel groups reduce their gradients
(`planner/costs/stages.py` `island_concurrency`, `replica_specs`).

Every tp rank of a stage reduces its own shard over the stage's data-parallel group, all
at the end of the step, so the GPUs of every stage whose group crosses an island link
share that link; a stage whose group stays inside one island sends nothing over it. The
Sailor artifact's logged gradient reductions (rows 34-36, `test_sailor.py`) measure it.
"""

import pytest

from planner.costs.stages import PlacedStage, island_concurrency, replica_specs
from planner.specs.choices import Recompute
from planner.specs.cluster import ClusterSpec, IslandLink, NodeGroup
from planner.specs.plan import Sharding


def _two_islands() -> ClusterSpec:
    """Node 0 (8 GPUs) on island "far", nodes 1-3 (8 GPUs each) on "main", joined by a
    1 Gb/s link; 25 GbE inside "main"."""
    far = NodeGroup(name="far", gpu="RTX3090-24GB", num_nodes=1, gpus_per_node=8,
                    island="far")
    main = NodeGroup(name="main", gpu="RTX2080-8GB", num_nodes=3, gpus_per_node=8,
                     island="main")
    return ClusterSpec(name="two islands", node_groups=(far, main),
                       island_links=(IslandLink(islands=("far", "main"),
                                                bandwidth_gbit_per_s=1.0, kind="ethernet"),)
                       ).resolved()


def _stage(first: int, tp: int = 8) -> PlacedStage:
    return PlacedStage(devices=tuple(range(first, first + tp)), tp=tp, cp=1, num_layers=4,
                       recompute=Recompute.NONE)


def test_only_stages_whose_group_crosses_share_the_island_link():
    """Two replicas of two stages, tp 8: stage 0 on node 0 (far) and node 2 (main), its
    group crosses the link; stage 1 on nodes 1 and 3, both main. Stage 0's 8 tp rings
    share the link (8), stage 1 crosses none (1); counting the whole replica gave 16 to
    both."""
    cluster = _two_islands()
    replicas = [[_stage(0), _stage(8)], [_stage(16), _stage(24)]]
    groups = [(0, 16), (8, 24)]  # each position's first GPU in every replica
    specs = replica_specs(cluster, replicas[0], groups=groups, shardings=[Sharding()] * 2)
    assert [s.concurrency for s in specs] == [8, 1]
    assert island_concurrency(cluster, [(0,) * 8, (8,) * 8], groups) == [8, 1]


def test_every_crossing_stage_shares_the_link():
    """Both positions cross (stage 0 far with main, stage 1 main with far): all 16 GPUs
    of the replica send over the link at once."""
    cluster = _two_islands()
    stages = [_stage(0, tp=4), _stage(8)]
    groups = [(0, 16), (8, 4)]  # stage 1's other replica sits on node 0 (far)
    assert island_concurrency(cluster, [s.devices for s in stages], groups) == [12, 12]


def test_one_replica_crosses_nothing():
    cluster = _two_islands()
    assert island_concurrency(cluster, [tuple(range(8)), tuple(range(8, 16))], None) == [1, 1]


def test_one_island_shares_no_link_whatever_the_groups():
    """One island: no island link to share (the fast path that took a 131,072-GPU search
    from more than 10 minutes to about a minute: each replica had asked every group)."""
    one = ClusterSpec(name="one", node_groups=(
        NodeGroup(name="a", gpu="RTX3090-24GB", num_nodes=1, gpus_per_node=8),
        NodeGroup(name="b", gpu="RTX2080-8GB", num_nodes=3, gpus_per_node=8))).resolved()
    groups = [(0, 16), (8, 24)]
    assert island_concurrency(one, [(0,) * 8, (8,) * 8], groups) == [1, 1]


def test_replicas_sending_over_one_island_link_share_it():
    """Pipeline sends: every replica's stage 0 on "main" sends each micro-batch to its
    stage 1 on "far" at the same moment (replicas run one schedule), so the 1 Gb/s link
    (`IslandLink`: aggregate bandwidth, shared by all traffic on it) is shared by every
    crossing replica's tp slices. Each replica was priced as if the link were its own:
    8 replicas of a cross-island pipeline moved 8x the bytes the link can carry."""
    from planner.costs.comm import collective_time_s
    from planner.costs.stages import _link_tiers

    cluster = _two_islands()
    # 4 replicas: stage 0 on main (nodes 1-3, tp 2), stage 1 on far (node 0, tp 2)
    stage0 = [_stage(8 + 2 * r, tp=2) for r in range(4)]
    stage1 = [_stage(2 * r, tp=2) for r in range(4)]
    groups = [tuple(s.devices[0] for s in stage0), tuple(s.devices[0] for s in stage1)]
    crossing = replica_specs(cluster, [stage0[0], stage1[0]], groups=groups,
                             shardings=[Sharding()] * 2)
    assert [s.p2p_replicas for s in crossing] == [4, 4]  # 1 -> 0 crosses back as well
    alone = replica_specs(cluster, [stage0[0], stage1[0]], groups=None,
                          shardings=[Sharding()] * 2)
    assert [s.p2p_replicas for s in alone] == [1, 1]
    size = 64e6
    t4 = collective_time_s("send_recv", size, _link_tiers(cluster, crossing[0])[1])
    t1 = collective_time_s("send_recv", size, _link_tiers(cluster, alone[0])[1])
    # bandwidth-bound at 64 MB over 1 Gb/s: 4 replicas x 2 tp slices share the link
    assert t4 / t1 == pytest.approx(4.0, rel=0.05)
    assert t4 >= 8 * size / (1e9 / 8)  # the link carries every slice of every replica
    # a send inside one island shares nothing
    inside = replica_specs(cluster, [_stage(8, tp=2), _stage(16, tp=2)],
                           groups=[(8, 10), (16, 18)], shardings=[Sharding()] * 2)
    assert inside[0].p2p_replicas == 1


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_an_island_link_faster_than_the_nics_costs_what_one_island_does(kind):
    """A ring over 4 nodes of 8 A100s leaves each node through its 8 NICs, every channel
    crossing by another NIC (NCCL's rings, one per NIC: rails); split over two islands
    joined by a link far faster than those NICs, it is bound by the NICs, as inside one
    island. The island tier began at one rank's share of its node's NICs, so a 32-rank
    group across two islands took 1/8 of a node's NIC bandwidth whatever the link
    (llama2-7b, dp 32 ZeRO-3: 0.82 s on one island, 1.66 s over a 100 Tb/s link). A slow
    link still bounds it."""
    from planner.costs.comm import collective_time_s, group_tiers

    def cluster(links, islands):
        groups = tuple(NodeGroup(name=f"g{i}", gpu="A100-80GB-SXM", num_nodes=2,
                                 gpus_per_node=8, island=isl) for i, isl in enumerate(islands))
        return ClusterSpec(name="c", node_groups=groups, island_links=links).resolved()

    one = cluster((), ("a", "a"))
    fast = cluster((IslandLink(islands=("a", "b"), bandwidth_gbit_per_s=100_000,
                               kind="infiniband"),), ("a", "b"))
    slow = cluster((IslandLink(islands=("a", "b"), bandwidth_gbit_per_s=100,
                               kind="infiniband"),), ("a", "b"))
    group, size = tuple(range(32)), 256e6
    t_one, t_fast, t_slow = (collective_time_s(kind, size, group_tiers(c, group))
                             for c in (one, fast, slow))
    assert t_fast == pytest.approx(t_one, rel=0.05)
    # 100 Gb/s at its efficiency, crossed once per ring direction: at least size / link
    assert t_slow > 3 * t_one and t_slow >= size / (100e9 / 8) * 31 / 32 * (
        2 if kind == "all_reduce" else 1)
