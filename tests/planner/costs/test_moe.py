"""Mixture-of-experts work, memory and all-to-all (issue 18.2). Each formula's source is
named beside its test."""

import dataclasses

import pytest

from planner.costs.memory import model_state_bytes, rank_expert_param_count, rank_param_count
from planner.costs.stages import plan_costs
from planner.costs.workload import (
    Comm,
    Op,
    WorkloadShape,
    layer_work,
    model_flops_per_token,
)
from planner.specs.cluster import homogeneous_cluster
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan, split_layers
from planner.specs.model import preset
from planner.specs.plan import Sharding
from profiler.schema import SpecError

MIXTRAL = preset("mixtral-8x7b")


def _shape(**fields):
    return WorkloadShape(**{"micro_batch_size": 1, "seq_len": 4096, **fields})


def _expert_flops(model, shape):
    return sum(op.flops for op in layer_work(model, shape).forward
               if isinstance(op, Op) and op.name.startswith("moe.expert.fc"))


def test_expert_gemm_flops_are_tokens_times_topk():
    # Fedus et al. 2022 §2.2 / Megatron-Bridge flop_utils: each token runs top-k experts,
    # an expert MLP is 2 x 3 x h x f FLOPs per token (SwiGLU: fc1 of width 2f, fc2).
    n, h, f, k = 4096, MIXTRAL.hidden_size, MIXTRAL.expert_ffn, MIXTRAL.experts_per_token
    expected = 2.0 * n * k * 3 * h * f
    for ep in (1, 2, 8):  # expert parallelism moves tokens, not work
        assert _expert_flops(MIXTRAL, _shape(ep=ep)) == pytest.approx(expected, rel=1e-6)


def test_load_imbalance_scales_the_busiest_expert_and_capacity_caps_it():
    # Megatron MoE README: capacity = tokens x top-k x capacity_factor / experts; tokens
    # beyond it are dropped, so the busiest expert computes at most that many.
    base = _expert_flops(MIXTRAL, _shape(ep=8))
    skewed = dataclasses.replace(MIXTRAL, load_imbalance=1.5)
    capped = dataclasses.replace(MIXTRAL, load_imbalance=1.5, capacity_factor=1.25)
    assert _expert_flops(skewed, _shape(ep=8)) == pytest.approx(1.5 * base, rel=1e-3)
    assert _expert_flops(capped, _shape(ep=8)) == pytest.approx(1.25 * base, rel=1e-3)


def test_dispatch_and_combine_are_all_to_alls_of_every_routed_copy():
    # Megatron-Core MoEAlltoAllTokenDispatcher: each rank sends its n x top-k token copies
    # of h elements (bf16) to the ep group and gets them back, forward and backward.
    work = layer_work(MIXTRAL, _shape(ep=8))
    comms = [c for c in (*work.forward, *work.backward) if isinstance(c, Comm) and c.axis == "ep"]
    assert [c.kind for c in comms] == ["all_to_all"] * 4
    assert {c.bytes for c in comms} == {4096 * 2 * MIXTRAL.hidden_size * 2}
    assert not [c for c in layer_work(MIXTRAL, _shape(ep=1)).forward
                if isinstance(c, Comm) and c.axis == "ep"]


def test_dense_models_have_no_moe_ops():
    names = {op.name for op in layer_work(preset("llama3-8b"), _shape()).forward}
    assert "mlp.fc1" in names and not any(n.startswith("moe.") for n in names)


def test_model_flops_count_active_parameters():
    # Megatron-Bridge flop_utils (and Narayanan et al. 2021 App.): 6 x the weights a token
    # uses (routed experts top-k times; embeddings excluded, logits included) plus
    # 6 x layers x seq x heads x (d_qk + d_v) for the scores and context (12 x layers x
    # seq x attention width for ordinary heads; MLA's latent norms count as weights, as
    # Megatron-LM's MLA branch counts them).
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
        m, s = preset(name), 4096
        norms = (2 * m.num_layers + 1) * m.hidden_size
        active = m.num_active_params() - m.embedding_params() - norms
        expected = (6.0 * active
                    + 6.0 * m.num_layers * s * m.num_heads * (m.head_dim_qk + m.head_dim_v))
        assert model_flops_per_token(m, s) == pytest.approx(expected, rel=1e-6), name


def test_expert_states_are_split_by_ep_and_sharded_over_expert_data_parallel():
    # Megatron-Core parallel_state.py: experts split over ep, their distributed-optimizer
    # states over the expert-data-parallel group dp x cp / ep.
    layers, tp = 8, 1
    dense = rank_param_count(MIXTRAL, num_layers=layers, first=False, last=False, tp=tp, pp=4)
    split = rank_param_count(MIXTRAL, num_layers=layers, first=False, last=False, tp=tp, pp=4,
                             ep=8)
    experts = layers * MIXTRAL.expert_params_per_moe_layer()
    assert dense - split == pytest.approx(experts * 7 / 8)
    local = rank_expert_param_count(MIXTRAL, num_layers=layers, etp=tp, ep=8)
    assert local == pytest.approx(experts / 8)
    _, _, optim, _ = model_state_bytes(MIXTRAL, params=split, dtype="bf16",
                                       sharding=Sharding(optim=16), tp=tp, pp=4,
                                       expert_params=local, ep=8)
    assert optim == pytest.approx(12 * ((split - local) / 16 + local / 2))


def test_activations_of_dispatched_tokens_are_kept():
    # the permuted tokens, expert activations and outputs scale with top-k
    one = dataclasses.replace(MIXTRAL, experts_per_token=1)
    two = layer_work(MIXTRAL, _shape(ep=8)).activation_bytes
    assert two > layer_work(one, _shape(ep=8)).activation_bytes * 1.3


def _mixtral_plan(gpus, *, tp=1, ep, dp, pp=1):
    cluster = homogeneous_cluster("H100-80GB-SXM", gpus)
    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, mbs=1, gbs=dp * 4, seq_len=4096,
                         sharding=Sharding(optim=dp), ep=ep)
    check_parallel(cfg, MIXTRAL, cluster)
    return homogeneous_plan(MIXTRAL, cluster, cfg)


def _ep_s(plan):
    return plan_costs(plan).costs[0][0].layer_forward.ep_s


def test_all_to_all_crosses_the_links_of_its_group():
    # NCCL alltoall: (n-1)/n of the buffer leaves each rank (nccl-tests PERFORMANCE.md bus
    # bandwidth factor), over NVLink inside a node and the rank's NIC across nodes.
    # Megatron order tp-cp-ep-dp: with tp 1 the ep group is 2 neighbours in one node;
    # with tp 8 it is GPU 0 and GPU 8, in two nodes. Same bytes (no sequence parallel).
    nvlink = _ep_s(_mixtral_plan(16, ep=2, dp=16))
    network = _ep_s(_mixtral_plan(16, tp=8, ep=2, dp=2))
    assert 0 < nvlink < network / 3
    # ep 8 inside the node sends 7/8 of the copies off the rank, ep 2 sends 1/2
    assert _ep_s(_mixtral_plan(16, ep=8, dp=16)) > nvlink
    # ep groups of the stages of a pipeline alike: pp does not change them
    assert _ep_s(_mixtral_plan(64, ep=8, dp=16, pp=4)) == pytest.approx(
        _ep_s(_mixtral_plan(16, ep=8, dp=16)), rel=1e-6)


def test_ep_groups_of_data_parallel_replicas():
    # Megatron-Core folds ep over tp x dp (parallel_state.py, etp-ep-dp order): at tp 4,
    # etp 1, ep 4 the group is a replica's 4 tp ranks, GPUs 0-3 in one node. trainplan's
    # executor (executor/topology.py `ep_group`) takes tp rank 0 of 4 replicas: GPUs 0, 4,
    # 8, 12 over two nodes, so its all-to-all crosses the network. Expert states with
    # ZeRO-1 over the 4 replicas: folded, the expert-dp group is dp x tp / ep = 4 ranks;
    # over data-parallel replicas only dp / ep = 1 (executor/groups.py
    # `expert_shard_layout`: each degree divided by ep).
    from planner.specs.choices import EpLayout

    def plan(layout):
        cluster = homogeneous_cluster("H100-80GB-SXM", 16)
        cfg = ParallelConfig(tp=4, dp=4, mbs=1, gbs=16, seq_len=4096, ep=4, etp=1,
                             sharding=Sharding(optim=4), ep_layout=layout)
        check_parallel(cfg, MIXTRAL, cluster)
        return homogeneous_plan(MIXTRAL, cluster, cfg)

    folded, replicas = plan(EpLayout.FOLDED), plan(EpLayout.DATA_PARALLEL)
    assert plan_costs(folded).specs[0][0].ep_group == (0, 1, 2, 3)
    assert plan_costs(replicas).specs[1][0].ep_group == (0, 4, 8, 12)
    assert _ep_s(replicas) > 2 * _ep_s(folded)
    layers = MIXTRAL.num_layers
    params = rank_param_count(MIXTRAL, num_layers=layers, first=True, last=True, tp=4, pp=1,
                              ep=4, etp=1)
    local = rank_expert_param_count(MIXTRAL, num_layers=layers, etp=1, ep=4)
    optim = {layout: model_state_bytes(MIXTRAL, params=params, dtype="bf16",
                                       sharding=Sharding(optim=4), tp=4, pp=1,
                                       expert_params=local, ep=4, etp=1,
                                       ep_layout=layout)[2] for layout in EpLayout}
    assert optim[EpLayout.FOLDED] == pytest.approx(12 * ((params - local) / 4 + local / 4))
    assert optim[EpLayout.DATA_PARALLEL] == pytest.approx(12 * ((params - local) / 4 + local))
    for p, layout in ((folded, EpLayout.FOLDED), (replicas, EpLayout.DATA_PARALLEL)):
        assert plan_costs(p).costs[0][0].memory.optimizer_bytes == pytest.approx(optim[layout])


def test_ep_over_data_parallel_replicas_divides_dp():
    from planner.specs.choices import EpLayout

    cluster = homogeneous_cluster("H100-80GB-SXM", 8)
    cfg = ParallelConfig(tp=4, dp=2, mbs=1, gbs=2, seq_len=4096, ep=4, etp=1)
    check_parallel(cfg, MIXTRAL, cluster)  # folded: 4 divides dp x tp / etp = 8
    with pytest.raises(SpecError, match=r"--ep: 4 .*must divide dp = 2 \(ep_layout"):
        check_parallel(dataclasses.replace(cfg, ep_layout=EpLayout.DATA_PARALLEL), MIXTRAL,
                       cluster)


@pytest.mark.parametrize("ep, dp, message", [
    (3, 6, r"--ep: 3 .*must divide num_experts 8"),
    (8, 4, r"--ep: 8 .*must divide dp x cp = 4"),
])
def test_ep_rules(ep, dp, message):
    cluster = homogeneous_cluster("H100-80GB-SXM", dp)
    cfg = ParallelConfig(tp=1, pp=1, dp=dp, mbs=1, gbs=dp, seq_len=4096, ep=ep)
    with pytest.raises(SpecError, match=message):
        check_parallel(cfg, MIXTRAL, cluster)


def test_ep_needs_an_moe_model():
    cluster = homogeneous_cluster("H100-80GB-SXM", 8)
    cfg = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_len=4096, ep=2)
    with pytest.raises(SpecError, match=r"--ep: 2 .*only for MoE models"):
        check_parallel(cfg, preset("llama3-8b"), cluster)


@pytest.mark.parametrize("etp", [1, 2])
def test_etp_needs_an_moe_model_even_at_tp(etp):
    """--etp 2 with --tp 2 on a dense model was accepted as a no-op (2026-12-05 fuzz): a
    flag that means nothing for the model is refused like --ep."""
    cluster = homogeneous_cluster("H100-80GB-SXM", 8)
    cfg = ParallelConfig(tp=2, pp=1, dp=4, mbs=1, gbs=8, seq_len=4096, etp=etp)
    with pytest.raises(SpecError, match=rf"--etp: {etp} .*only for MoE models"):
        check_parallel(cfg, preset("llama3-8b"), cluster)
    check_parallel(cfg, MIXTRAL, cluster)


def test_deepep_sends_a_token_once_per_node_holding_its_experts():
    # DeepEP README / DeepSeek-V3 report §3.2.2: with 256 experts over 8 nodes and top-8,
    # a token crosses the network to 7 x (1 - C(224, 8) / C(256, 8)) = 4.6 of the other
    # nodes once each, where an all-to-all sends its 8 x 7/8 = 7 remote copies
    from planner.costs.comm import collective_time_s, dispatch_time_s, group_tiers

    cluster = homogeneous_cluster("H800-80GB-SXM", 64)
    tiers = group_tiers(cluster, tuple(range(64)))
    size = 4096 * 8 * 7168 * 2
    plain = collective_time_s("all_to_all", size, tiers)
    deepep = dispatch_time_s(size, tiers, top_k=8, experts=256)
    assert deepep < plain
    import math

    reached = 7 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert deepep / plain == pytest.approx(reached / 7, rel=0.05)


def test_mixed_layers_time_each_kind_by_its_share_of_the_layers():
    # DeepSeek-V3 (first 3 of 61 layers dense, arXiv:2412.19437 §4.2): the average layer
    # runs the dense MLP on 3/61 of the layers, so its time is 3/61 of one dense MLP's,
    # not a whole dense MLP's per layer (the op keeps its shape, its FLOPs are 3/61).
    from planner.costs.compute import ComputeCosts
    from profiler.devices import device

    model = preset("deepseek-v3")
    shape = _shape(ep=64)
    dense_share = 1 - model.moe_layer_fraction
    assert dense_share == pytest.approx(3 / 61)
    costs = ComputeCosts(device("H100-80GB-SXM"), "bf16")
    fc1 = next(op for op in layer_work(model, shape).forward
               if isinstance(op, Op) and op.name == "mlp.fc1")
    assert fc1.share == pytest.approx(dense_share)
    whole = dataclasses.replace(fc1, flops=fc1.flops / fc1.share, bytes=fc1.bytes / fc1.share,
                                share=1.0)
    assert costs.time_s(fc1) == pytest.approx(dense_share * costs.time_s(whole))
    # and the backward's GEMMs carry the share too
    bwd = [op for op in layer_work(model, shape).backward
           if isinstance(op, Op) and op.name.startswith("mlp.fc1.")]
    assert bwd and all(op.share == pytest.approx(dense_share) for op in bwd)


def test_fake_balanced_routing_sends_a_token_to_one_node():
    # NeMo AutoModel's FakeBalancedGate (components/moe/layers.py): token i takes experts
    # 8i .. 8i+7 mod 256, all on one node of 32 experts, another node's for 7/8 of the
    # tokens: DeepEP sends each token over the network 7/8 times, not 4.6 times. On NVLink
    # it goes once to each rank holding its experts (4 per rank: 2 ranks), forwarded by
    # the GPU of its local index there, so 2 x 7/8 copies, not 8 x 63/64.
    from planner.costs.comm import _send_s, dispatch_time_s, group_tiers

    cluster = homogeneous_cluster("H100-80GB-SXM", 64)
    tiers = group_tiers(cluster, tuple(range(64)))
    size = 4096 * 8 * 7168 * 2
    learned = dispatch_time_s(size, tiers, top_k=8, experts=256)
    fake = dispatch_time_s(size, tiers, top_k=8, experts=256, consecutive=True)
    network = _send_s(size / 8 * 7 / 8, tiers)
    nvlink = _send_s(size / 8 * 2 * 7 / 8, tiers[:1])
    assert fake == pytest.approx(max(network, nvlink))
    assert fake < learned
    # and the plan setting reaches the dispatch ops
    shape = _shape(ep=64, dispatcher="deepep", routing="fake_balanced")
    comms = [c for c in layer_work(preset("deepseek-v3"), shape).forward if isinstance(c, Comm)
             and c.axis == "ep"]
    assert comms and all(c.consecutive for c in comms)


def test_ranks_a_token_reaches():
    # The expected number of ranks holding at least one of a token's k experts, E/ep on
    # each: ep x (1 - C(E - E/ep, k) / C(E, k)) for experts drawn as at random; a window
    # of k consecutive experts (FakeBalancedGate: start ik mod E) spans
    # ceil((ik mod E/ep + k) / (E/ep)) ranks.
    import math

    from planner.costs.comm import holders_reached

    # Qwen3-30B-A3B on 8 ranks: 128 experts, 16 per rank, top-8
    random = holders_reached(128, 8, 8)
    assert random == pytest.approx(8 * (1 - math.comb(112, 8) / math.comb(128, 8)))
    assert 5.0 < random < 8.0  # fewer than one rank per expert
    assert holders_reached(128, 8, 8, consecutive=True) == 1.0  # starts at 0 or 8 of 16
    # DeepSeek-V3 on 64 ranks: 4 experts each, a window of 8 spans 2 ranks
    assert holders_reached(256, 64, 8, consecutive=True) == 2.0
    # 6 experts per rank, top-4: starts 0, 2, 4 -> 1, 1, 2 ranks
    assert holders_reached(48, 8, 4, consecutive=True) == pytest.approx(4 / 3)
    # one expert per rank: every expert its own rank
    assert holders_reached(64, 64, 8) == pytest.approx(8.0)
    assert holders_reached(64, 64, 8, consecutive=True) == 8.0
    assert holders_reached(128, 1, 8) == 1.0


def test_deepep_sends_a_token_once_to_each_rank_holding_its_experts():
    # DeepEP (deep_ep/buffer.py `dispatch`: `is_token_in_rank [num_tokens, num_ranks]`,
    # `combine` reduces per rank; Megatron's flex dispatcher calls it, fused_a2a.py
    # `FusedDispatch`) sends a token once to each rank holding one of its experts, where
    # Megatron's all-to-all dispatcher sends one copy per routed expert. Inside one node
    # (Qwen3-30B-A3B, ep 8): (8 - 1) x (1 - C(112, 8) / C(128, 8)) = 4.9 copies of a
    # token leave its rank, not 8 x 7/8 = 7.
    import math

    from planner.costs.comm import _send_s, collective_time_s, dispatch_time_s, group_tiers

    cluster = homogeneous_cluster("H100-80GB-SXM", 8)
    tiers = group_tiers(cluster, tuple(range(8)))
    tokens, k, h = 4096, 8, 2048
    size = tokens * k * h * 2
    others = 7 * (1 - math.comb(112, 8) / math.comb(128, 8))
    deepep = dispatch_time_s(size, tiers, top_k=k, experts=128)
    assert deepep == pytest.approx(_send_s(tokens * h * 2 * others, tiers))
    assert deepep < collective_time_s("all_to_all", size, tiers)
    # the layer's dispatch and combine carry it only for DeepEP
    model = preset("qwen3-30b-a3b")
    for dispatcher, dedup in (("deepep", k), ("alltoall", 0)):
        comms = [c for c in layer_work(model, _shape(ep=8, dispatcher=dispatcher)).forward
                 if isinstance(c, Comm) and c.axis == "ep"]
        assert [c.top_k for c in comms] == [dedup, dedup]


def _two_types_plan(ep, tp=1, **training):
    """Mixtral as two tp-GPU replicas, one on A100s and one on V100s (one DGX node of
    each on one InfiniBand fabric): a mixed-replicas plan."""
    from planner.specs.cluster import ClusterSpec, NodeGroup
    from planner.specs.plan import Kernels, Pipeline, Plan, Stage, Training

    cluster = ClusterSpec(name="a100+v100", node_groups=(
        NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=1, island="ib"),
        NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=1, island="ib"))).resolved()
    pipelines = tuple(Pipeline(stages=(Stage(layers=(0, MIXTRAL.num_layers),
                                             devices=tuple(range(gpu, gpu + tp)), tp=tp),),
                               micro_batch_size=1, num_microbatches=4)
                      for gpu in (0, 8))
    plan = Plan(model=MIXTRAL, cluster=cluster, pipelines=pipelines,
                training=Training(global_batch_size=8, seq_len=4096, dtype="fp16", ep=ep,
                                  **training),
                kernels=Kernels(attention="math"))
    plan.check("plan")
    return plan


def test_a_mixed_ep_group_crosses_its_slowest_link_and_waits_for_its_slowest_peer():
    # The ep group is the two replicas' GPUs (Megatron-Core / executor/topology.py: the
    # data-parallel ranks in rank order, in groups of ep), in two nodes: the all-to-all
    # crosses the NICs, priced on the network tier (nccl-tests alltoall bus bandwidth).
    # An all-to-all is synchronizing (NCCL runs it as grouped send/recv with every peer):
    # the A100's layer ends with the V100's, the difference spent waiting in it (ep_s).
    from planner.costs.comm import group_tiers
    from planner.costs.stages import stage_cost

    plan = _two_types_plan(ep=2)
    alone, paired = plan_costs(_two_types_plan(ep=1)), plan_costs(plan)
    a100, v100 = paired.costs[0][0], paired.costs[1][0]
    own = stage_cost(MIXTRAL, plan.cluster, paired.specs[0][0], paired.runs[0])  # not waiting
    assert paired.specs[0][0].ep_group == paired.specs[1][0].ep_group == (0, 8)
    assert [t.name for t in group_tiers(plan.cluster, (0, 8))] == ["network"]
    assert a100.device == "A100-80GB-SXM" and v100.device == "V100-32GB-SXM2"
    # without ep the A100 runs at its own pace; with it, at the V100's: each pass as long
    # (its embedding and head included), the wait in its layers' all-to-alls
    assert alone.costs[0][0].forward_s < 0.8 * alone.costs[1][0].forward_s
    for pass_s, part in (("forward_s", "layer_forward"), ("backward_s", "layer_backward")):
        assert getattr(a100, pass_s) == pytest.approx(getattr(v100, pass_s), rel=1e-12)
        fast, slow, mine = getattr(a100, part), getattr(v100, part), getattr(own, part)
        assert fast.compute_s == mine.compute_s < 0.8 * slow.compute_s  # its own work
        assert mine.ep_s > 0  # the all-to-alls themselves
        wait = (getattr(v100, pass_s) - getattr(own, pass_s)) / MIXTRAL.num_layers
        assert fast.ep_s == pytest.approx(mine.ep_s + wait, rel=1e-9)
    assert paired.representative == [0, 1]


def test_ep_peers_follow_the_ep_layout_of_mixed_replicas():
    """Laid out over data-parallel replicas (trainplan's executor), tp rank t of the A100
    replica and of the V100 replica are one ep group (0, 8): the replicas are each
    other's peers and pace each other. (Counting tp / etp members per replica, as Megatron
    folds them, paired each replica with itself.)"""
    from planner.costs.stages import ep_peers

    plan = _two_types_plan(ep=2, tp=2, etp=1, ep_layout="data_parallel")
    priced = plan_costs(plan)
    assert priced.specs[0][0].ep_group == priced.specs[1][0].ep_group == (0, 8)
    assert ep_peers(priced.specs) == [((0, 1),), ((0, 1),)]
    a100, v100 = priced.costs[0][0], priced.costs[1][0]
    assert a100.forward_s == pytest.approx(v100.forward_s, rel=1e-12)
    # folded (Megatron), the two tp GPUs of each replica are its ep group: no pacing
    folded = plan_costs(_two_types_plan(ep=2, tp=2, etp=1))
    assert folded.specs[0][0].ep_group == (0, 1)
    assert ep_peers(folded.specs) == [((0,),), ((1,),)]



def _stage_params(model, pp, *, ep=8):
    """Parameters of each stage of a one-replica plan of `model` in `pp` stages (tp 1)."""
    cluster = homogeneous_cluster("H100-80GB-SXM", 8 * pp)
    cfg = ParallelConfig(tp=1, pp=pp, dp=8, ep=ep, mbs=1, gbs=8 * pp,
                         seq_len=model.seq_len)
    check_parallel(cfg, model, cluster)
    costs = plan_costs(homogeneous_plan(model, cluster, cfg))
    return [c.num_params for c in costs.costs[0]]


@pytest.mark.parametrize("name, pps", [("llama4-maverick", (12, 16, 24, 48)),
                                       ("deepseek-v3", (8, 16, 61))])
def test_a_stage_holds_the_experts_of_its_own_moe_layers(name, pps):
    # Llama 4 Maverick: MoE in every other layer after a dense first (Meta's model card,
    # interleave_moe_layer_step 2); DeepSeek-V3: the first 3 of 61 layers dense
    # (arXiv:2412.19437 §4.2). A stage holds the experts of the MoE layers among its own
    # layers (Megatron-Core builds each layer from the pattern, transformer_block.py), so
    # a pipeline's stages hold the model's experts once at any pp, and a stage of dense
    # layers holds none. The model's average layer would put half an MoE layer in each
    # one-layer Maverick stage (rounded to none) and DeepSeek-V3's dense stage 1 of 61 in
    # one.
    model = preset(name)
    per_ep = model.expert_params_per_moe_layer() / 8
    totals = set()
    for pp in pps:
        params = _stage_params(model, pp)
        totals.add(round(sum(params)))
        layers = split_layers(model.num_layers, pp)
        start = 0
        for count, held in zip(layers, params, strict=True):
            moe = sum(model.is_moe_layer(i) for i in range(start, start + count))
            dense_only = rank_param_count(model, num_layers=count, first=start == 0,
                                          last=start + count == model.num_layers, tp=1,
                                          pp=pp, ep=8, moe_layers=0)
            assert held == pytest.approx(dense_only + moe * (per_ep + model.num_experts
                                                             * model.hidden_size
                                                             + _shared(model)))
            start += count
    assert len(totals) == 1  # the same parameters, however the layers are staged


def _shared(model):
    """An MoE layer's router-less, expert-less difference from a dense layer: its shared
    experts in place of the dense MLP."""
    gated = 3 if model.gated else 2
    return gated * model.hidden_size * (model.shared_ffn - model.ffn_hidden_size)


def test_memory_follows_the_moe_layers_a_stage_holds():
    # A 16-stage Maverick pipeline: 3 layers a stage, the first holding layer 0 (dense) and
    # one MoE layer, the next two MoE layers. The first stage's model states are one MoE
    # layer's experts below the second's (the average layer charged both the same two).
    model = preset("llama4-maverick")
    params = _stage_params(model, 16)
    experts = model.expert_params_per_moe_layer() / 8
    assert params[1] - params[0] == pytest.approx(
        experts + model.num_experts * model.hidden_size + _shared(model)
        - model.vocab_size * model.hidden_size)
