"""`plan search --framework`: the search explores only what the framework, at the version
planner/export/frameworks.py names, runs; every plan it returns is one the framework
expresses exactly (`unsupported(plan, caps) == []`), on homogeneous and mixed clusters."""

import dataclasses
import importlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import InfeasiblePlan
from planner.export.formats import FORMATS, export_plan
from planner.export.frameworks import CAPABILITIES, FRAMEWORKS, chunk_layer_counts, unsupported
from planner.hetero.search import MixedSpace
from planner.predict.estimate import estimate
from planner.search import SearchRequest, search
from planner.search.sharding import allowed_options
from planner.search.space import SearchSpace, candidates, default_space, for_framework, layouts
from planner.specs.cluster import ClusterSpec, NodeGroup, load_cluster, parse_gpus_arg, runs_dtype
from planner.specs.layout import split_layers
from planner.specs.model import preset
from planner.specs.plan import Sharding
from profiler.schema import SpecError
from tests.planner.search.test_search_is_the_plan import EXACT, clusters, examples, models


def _candidates(framework, model, *, n=64, gbs=128, seq_len=4096):
    space = default_space(model, num_gpus=(n,), nvlink_domain_gpus=8, seq_len=seq_len)
    if framework is not None:
        space = for_framework(space, CAPABILITIES[framework])
    return [(lo, mi) for lo in layouts(space, model, gbs=gbs, seq_len=seq_len)
            for mi in candidates(space, model, lo, gbs=gbs, seq_len=seq_len)]


def test_each_frameworks_space_holds_what_it_runs_and_no_more():
    model = preset("llama2-13b")  # 40 layers, 40 heads
    found = {fw: _candidates(fw, model) for fw in FRAMEWORKS}
    everything = set(_candidates(None, model))

    def seen(fw, what):
        return {what(lo, mi) for lo, mi in found[fw]}

    # megatron-core 0.16.1: cp, interleaving, selective recompute; no ZB-H1
    assert seen("megatron", lambda lo, mi: mi.schedule) == {"1f1b"}
    assert seen("megatron", lambda lo, mi: lo.cp) == {1, 2}
    assert max(seen("megatron", lambda lo, mi: mi.vp)) > 1
    assert seen("megatron", lambda lo, mi: mi.recompute) == {"none", "selective", "full"}
    # deepspeed 0.19.6: no cp, no interleaving, no tp with pp, no sequence parallelism,
    # full recompute only, even stages only
    assert seen("deepspeed", lambda lo, mi: (lo.cp, mi.vp, mi.sequence_parallel)) == {
        (1, 1, False)}
    assert not any(lo.tp > 1 and lo.pp > 1 for lo, _ in found["deepspeed"])
    assert seen("deepspeed", lambda lo, mi: mi.recompute) == {"none", "full"}
    assert all(model.num_layers % lo.pp == 0 for lo, _ in found["deepspeed"])
    assert {lo.pp for lo, _ in found["deepspeed"]} >= {1, 2, 4, 8}
    # torchtitan 0.2.2: sequence parallel exactly where tp > 1, no selective recompute
    assert all(mi.sequence_parallel == (lo.tp > 1) for lo, mi in found["torchtitan"])
    assert seen("torchtitan", lambda lo, mi: mi.recompute) == {"none", "full"}
    assert seen("torchtitan", lambda lo, mi: mi.schedule) == {"1f1b"}
    # trainplan's executor: ZB-H1 and selective recompute, no context parallelism
    assert seen("trainplan", lambda lo, mi: mi.schedule) == {"1f1b", "zb-h1"}
    assert seen("trainplan", lambda lo, mi: lo.cp) == {1}
    for fw in FRAMEWORKS:
        assert found[fw] and set(found[fw]) <= everything


def test_uneven_stages_only_where_the_framework_takes_them():
    model = preset("gpt3-175b")  # 96 layers
    for fw in FRAMEWORKS:
        uneven = [(lo, mi) for lo, mi in _candidates(fw, model, n=256, gbs=256, seq_len=2048)
                  if len(set(chunk_layer_counts(tuple(split_layers(96, lo.pp)), mi.vp))) > 1]
        assert bool(uneven) == CAPABILITIES[fw].uneven_stages, fw


@pytest.mark.parametrize("framework, expected", [
    ("megatron", {(1, 1, 1), (1, 1, 2), (1, 1, 4), (1, 1, 8), (1, 1, 16)}),
    ("deepspeed", {(1, 1, 1), (1, 1, 16), (1, 16, 16), (16, 16, 16), (2, 2, 2), (4, 4, 4),
                   (8, 8, 8)}),
    ("torchtitan", {(1, 1, 1), (16, 16, 16), (2, 2, 2), (4, 4, 4), (8, 8, 8)}),
])
def test_sharding_options_are_the_frameworks_patterns(framework, expected):
    caps = CAPABILITIES[framework]
    got = {(s.params, s.grads, s.optim)
           for s in allowed_options((1, 2, 4, 8, 16), dp=16, patterns=caps.sharding)}
    assert got == expected
    trainplan = allowed_options((1, 2, 4, 8, 16), dp=16,
                                patterns=CAPABILITIES["trainplan"].sharding)
    assert Sharding(params=2, grads=4, optim=16) in trainplan and len(trainplan) > len(got)


def test_deepspeed_pipelines_shard_at_most_the_optimizer():
    space = for_framework(SearchSpace(num_gpus=(16,), tp=(1,), cp=(1,), pp=(1, 2)),
                          CAPABILITIES["deepspeed"])
    with_pp = allowed_options((1, 2, 4, 8), dp=8, patterns=space.sharding_patterns(2))
    assert {(s.params, s.grads, s.optim) for s in with_pp} == {(1, 1, 1), (1, 1, 8)}
    alone = allowed_options((1, 2, 4, 8), dp=8, patterns=space.sharding_patterns(1))
    assert Sharding(params=8, grads=8, optim=8) in alone


def test_mixed_space_per_framework():
    # the executor's limits where tp differs (executor/preflight.py), the rest searched
    assert MixedSpace.for_framework(CAPABILITIES["trainplan"]) == dataclasses.replace(
        MixedSpace(), kv_heads_split=True, tied_ends_any_tp=False, mixed_tp_sharding=False,
        zb_full_recompute=False)
    for fw in ("megatron", "deepspeed", "torchtitan"):
        space = MixedSpace.for_framework(CAPABILITIES[fw])
        assert space.families == () and "mixed GPU types in one job" in space.why_none


def test_mixed_moe_candidates_are_ones_trainplan_runs():
    """Mixed templates split tensors with sequence parallelism and expert tp = tp; the
    trainplan executor runs neither on an MoE model (etp 1, no sp), so a mixed search of
    one keeps tp at 1 — before, 13 of 16 mixed Mixtral candidates were plans it refuses."""
    caps, mixtral = CAPABILITIES["trainplan"], preset("mixtral-8x7b")
    assert MixedSpace.for_framework(caps, mixtral).tp == (1,)
    assert MixedSpace.for_framework(caps, preset("llama2-7b")).tp == MixedSpace().tp
    assert MixedSpace.for_framework(CAPABILITIES["trainplan"]).tp == MixedSpace().tp
    search_module = importlib.import_module("planner.search.search")
    req = SearchRequest(model=mixtral, cluster=load_cluster("cluster_specs/mixed-a100-v100.yaml"),
                        gbs=256, seq_len=4096, dtype="fp16", top=3)
    kernels = search_module._kernels(req, req.cluster)
    mixed = [search_module._evaluate_task(req, task) for task in search_module._tasks(req)
             if task[0] == "mixed"]
    plans = [p.plan(mixtral, req.cluster, seq_len=4096, dtype="fp16", kernels=kernels)
             for found, _, _ in mixed for p in found]
    assert plans
    assert all(unsupported(plan, caps) == [] for plan in plans)


SMALL = SearchSpace(num_gpus=(), tp=(1, 2), cp=(1, 2), pp=(1, 2, 4), vp=(1, 2), mbs=(1, 2))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@examples(15)
@given(model=models(), types=st.integers(1, 2), data=st.data())
def test_every_searched_plan_runs_on_its_framework(framework, model, types, data):
    """Random small models on random clusters of one or two GPU types: every plan listed
    is one the framework expresses exactly, and its estimate is that of its Plan."""
    caps = CAPABILITIES[framework]
    cluster = data.draw(clusters(types=types))
    gbs = data.draw(st.sampled_from((16, 32, 64)))
    # a 16-bit dtype of the framework's that every GPU type of the cluster has (a framework
    # that plans each type alone: that some type has, the others left out); where there is
    # none (torchtitan, bf16 only, and a V100) the request is refused unsearched
    alone = not MixedSpace.for_framework(caps, model).families
    dtypes = [d for d in sorted(caps.dtypes & {"bf16", "fp16"})
              if (any if alone else all)(d in g.device.peak_tflops for g in cluster.node_groups)]
    if not dtypes:
        with pytest.raises(SpecError, match="--dtype: 'bf16' is not allowed .* has no bf16"):
            search(SearchRequest(model=model, cluster=cluster, gbs=gbs, seq_len=model.seq_len,
                                 dtype="bf16", framework=framework))
        return
    dtype = data.draw(st.sampled_from(dtypes))
    space = None
    if types == 1:
        space = SearchSpace(**{**SMALL.__dict__, "num_gpus": (cluster.num_gpus,),
                               "pp": tuple(p for p in SMALL.pp if p <= model.num_layers)})
    req = SearchRequest(model=model, cluster=cluster, gbs=gbs, seq_len=model.seq_len,
                        dtype=dtype, top=3, confirm=3, space=space, framework=framework)
    try:
        found = search(req)
    except InfeasiblePlan:
        return
    for r in found.ranked:
        assert unsupported(r.plan, caps) == [], (framework, r.plan.sharding_label)
        if framework in FORMATS:
            assert export_plan(r.plan, framework).unsupported == ()
        assert math.isclose(r.estimate_s, estimate(r.plan).iteration_time_s, rel_tol=EXACT)
    assert all(runs_dtype(r.plan.cluster.device_of(gpu), dtype) for r in found.ranked
               for gpu in r.plan.gpu_types)
    if types > 1 and not caps.mixed_gpu_types:
        assert all(len(r.plan.gpu_types) == 1 for r in found.ranked)
        kinds = list(dict.fromkeys(g.gpu for g in cluster.node_groups))
        left = [k for k in kinds if not runs_dtype(cluster.device_of(k), dtype)]
        assert any(n.startswith(f"{', '.join(left)} not planned: no {dtype} there")
                   for n in found.notes) == bool(left), found.notes
        assert any(n.startswith("mixed GPU types not planned: ")
                   for n in found.notes) == (len(kinds) - len(left) > 1), found.notes


def test_a_mixed_cluster_with_megatron_is_planned_on_one_type_and_says_so():
    found = search(SearchRequest(model=preset("llama2-7b"),
                                 cluster=load_cluster("cluster_specs/mixed-a100-v100.yaml"),
                                 gbs=128, seq_len=4096, dtype="fp16",  # a V100: no bf16
                                 framework="megatron"))
    caps = CAPABILITIES["megatron"]
    assert found.notes[0] == (
        f"mixed GPU types not planned: {caps.version} lacks mixed GPU types in one job, "
        "unequal micro-batch counts, placement by island (it fixes the rank order); each of "
        "A100-80GB-SXM, V100-32GB-SXM2 planned alone (--framework trainplan mixes them)")
    assert found.baselines == []
    assert found.ranked[0].plan.gpu_types == {"A100-80GB-SXM"}  # the faster type
    assert all(unsupported(r.plan, caps) == [] for r in found.ranked)
    assert any("V100-32GB-SXM2 GPUs idle" in n for n in found.notes)


def test_gpus_the_framework_cannot_use_are_left_out_and_named():
    """40 GPUs at gbs 64 need 5 pipeline stages (uneven over 24 layers) or tp with pp;
    DeepSpeed's pipeline engine has neither, so it plans on 4 nodes and says why."""
    found = search(SearchRequest(model=preset("gpt3-1.3b"),
                                 cluster=parse_gpus_arg("A100-80GB-SXM:40"), gbs=64,
                                 seq_len=2048, framework="deepspeed"))
    assert found.notes == ["deepspeed 0.19.6 cannot use all 40 A100-80GB-SXM GPUs at gbs 64 "
                           "(that needs tp with pp or uneven stages): planned on 32"]
    assert {r.result.num_gpus for r in found.ranked} == {32}
    assert all(unsupported(r.plan, CAPABILITIES["deepspeed"]) == [] for r in found.ranked)
    everything = search(SearchRequest(model=preset("gpt3-1.3b"),
                                      cluster=parse_gpus_arg("A100-80GB-SXM:40"), gbs=64,
                                      seq_len=2048, framework="megatron"))
    assert everything.notes == [] and everything.ranked[0].result.num_gpus == 40


def test_requests_the_framework_cannot_run_are_refused():
    cluster = parse_gpus_arg("A100-80GB-SXM:8")
    base = dict(model=preset("gpt3-1.3b"), cluster=cluster, gbs=16, seq_len=2048)
    with pytest.raises(SpecError, match="--framework: 'nemo'.*allowed: megatron"):
        search(SearchRequest(**base, framework="nemo"))
    with pytest.raises(SpecError, match=r"--dtype: 'fp8'.*trainplan 0\.1\.0 executor trains "
                       r"in bf16, fp16, fp32, tf32; --framework megatron plans fp8\)"):
        search(SearchRequest(**base, dtype="fp8"))  # the executor has no FP8 GEMMs
    with pytest.raises(SpecError, match="--attention: 'memory_efficient'.*megatron"):
        search(SearchRequest(**base, attention="memory_efficient", framework="megatron"))


def test_nothing_fits_names_the_framework():
    with pytest.raises(InfeasiblePlan, match="within what deepspeed 0.19.6 runs"):
        search(SearchRequest(model=preset("gpt3-175b"), cluster=parse_gpus_arg("A100-80GB-SXM:8"),
                             gbs=8, seq_len=2048, framework="deepspeed"))


def test_trainplan_searches_expert_parallelism_within_its_executor():
    """The executor runs ep > 1 (executor/preflight.py `_check_moe`) with ep groups of
    data-parallel ranks, experts whole on every tp rank (etp 1), no sequence parallelism
    on MoE models, and with ep > 1 neither ZB-H1 nor full recomputation: the trainplan
    space takes ep > 1 under exactly those limits; Megatron's folds tp into ep."""
    model = preset("mixtral-8x7b")  # 8 experts, 32 layers
    found = _candidates("trainplan", model, n=32, gbs=64)
    with_ep = [(lo, mi) for lo, mi in found if lo.ep > 1]
    assert {lo.ep for lo, _ in with_ep} == {2, 4, 8}
    assert all(lo.dp % lo.ep == 0 for lo, _ in with_ep)
    assert {mi.schedule for _, mi in with_ep} == {"1f1b"}  # interleaved appears as vp > 1
    assert {mi.recompute for _, mi in with_ep} == {"none", "selective"}
    assert {mi.recompute for lo, mi in found if lo.ep == 1} >= {"full"}
    assert {mi.schedule for lo, mi in found if lo.ep == 1 and lo.pp > 1} >= {"zb-h1"}
    assert all(lo.etp == 1 and not mi.sequence_parallel for lo, mi in found if lo.tp > 1)
    assert any(lo.tp > 1 for lo, _ in with_ep)
    # and prices them on the executor's ep groups (one tp rank of ep replicas)
    assert all(lo.ep_layout == "data_parallel" for lo, _ in with_ep)
    megatron = _candidates("megatron", model, n=32, gbs=64)
    assert any(lo.dp % lo.ep for lo, _ in megatron)  # ep over dp x cp x tp (etp 1) there
    assert all(mi.sequence_parallel for lo, mi in megatron if lo.tp > 1)
    assert all(lo.ep_layout == "folded" for lo, _ in megatron)


def test_a_trainplan_moe_search_returns_plans_its_executor_runs():
    from executor.preflight import check_runnable

    model = dataclasses.replace(preset("mixtral-8x7b"), num_layers=4)
    cluster = parse_gpus_arg("H100-80GB-SXM:16")
    space = SearchSpace(num_gpus=(16,), tp=(1, 2), cp=(1,), pp=(1, 2), vp=(1, 2),
                        mbs=(1, 2), ep=(1, 2, 4, 8))
    found = search(SearchRequest(model=model, cluster=cluster, gbs=64, seq_len=2048,
                                 dtype="bf16", top=20, confirm=3, space=space,
                                 framework="trainplan"))
    assert any(r.plan.training.ep > 1 for r in found.ranked)
    for r in found.ranked:
        if r.plan.training.ep > 1:  # priced on the ep groups the executor forms
            assert r.plan.training.ep_layout == "data_parallel"
        assert unsupported(r.plan, CAPABILITIES["trainplan"]) == []
        check_runnable(r.plan, cuda_devices=8, host=False)
        assert math.isclose(r.estimate_s, estimate(r.plan).iteration_time_s, rel_tol=EXACT)


def test_a_deepspeed_search_prices_and_writes_deepspeeds_model_states(monkeypatch):
    """Each framework's capabilities name what it keeps of the model states, and a search
    for it prices them so. DeepSpeed 0.19.6 keeps gradients in the training dtype
    (runtime/engine.py get_data_types): 2 + 2 + 12 = 16 bytes per parameter unsharded;
    Megatron-Core fp32 main gradients, 18 (its distributed-optimizer guide). GPT-3 2.7B
    whole on one L40S-48GB (45.0 GiB = 48.3 GB): its 2,650,816,000 parameters take
    42.4 GB at 16 bytes, which with the 2 GiB runtime reserve (2.1 GB) fit, and 47.7 GB
    at 18, which with it (49.9 GB) do not before any activation. DeepSpeed's search finds a plan, written with its
    rule and simulated with its bytes; the same search with the rule as the only change,
    and Megatron's, find none."""
    assert {fw: str(CAPABILITIES[fw].model_states) for fw in FRAMEWORKS} == {
        "megatron": "fp32_grads", "deepspeed": "deepspeed", "torchtitan": "fp32_grads",
        "trainplan": "fp32_grads"}
    request = dict(model=preset("gpt3-2.7b"), cluster=parse_gpus_arg("L40S-48GB:1"), gbs=8,
                   seq_len=2048)
    found = search(SearchRequest(**request, framework="deepspeed"))
    plan, result = found.ranked[0].plan, found.ranked[0].result
    assert plan.training.model_states == "deepspeed" and plan.sharding_label == "P/G/OS 1/1/1"
    memory = result.stages[0].memory
    params = 2_650_816_000
    assert memory.params_bytes == memory.grads_bytes == 2 * params  # bf16 gradients
    assert memory.optimizer_bytes == 12 * params
    assert result.fits and memory.capacity_bytes == 45 * 1024**3
    assert 18 * params + memory.reserve_bytes > memory.capacity_bytes > (
        16 * params + memory.reserve_bytes)
    # DeepSpeed with Megatron-Core's rule: fp32 gradients, reduced as they are kept (the
    # rule's gradient buffer takes the reduction's dtype, Megatron-Core's
    # grad_reduce_in_fp32: costs/memory.py `state_bytes_per_param`), so its fp32 reduction
    # goes with it
    monkeypatch.setitem(CAPABILITIES, "deepspeed", dataclasses.replace(
        CAPABILITIES["deepspeed"], model_states="fp32_grads", comm="megatron"))
    with pytest.raises(InfeasiblePlan, match="nothing fits in memory"):
        search(SearchRequest(**request, framework="deepspeed"))
    with pytest.raises(InfeasiblePlan, match="nothing fits in memory"):
        search(SearchRequest(**request, framework="megatron"))


def _ethernet_pair():
    """Two DGX A100 nodes joined by one 25 Gb/s Ethernet NIC each."""
    from planner.specs.cluster import ClusterSpec
    from profiler.schema import parse

    return parse(ClusterSpec, {"name": "ethernet pair", "node_groups": [
        {"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 2, "gpus_per_node": 8,
         "nic": "ethernet", "nics_per_node": 1, "nic_bandwidth_gbit_per_s": 25}]},
        where="test:").resolved()


def _with_comm(plan, **settings):
    return dataclasses.replace(plan, training=dataclasses.replace(
        plan.training, comm=dataclasses.replace(plan.training.comm, **settings)))


def test_a_deepspeed_search_prices_and_writes_deepspeeds_communication(monkeypatch):
    """Each framework's capabilities name how it communicates (`Communication.preset`),
    and a search for it prices its plans so and writes it in them. GPT-3 2.7B (gbs 64,
    seq 2048) on two DGX A100 nodes joined by 25 Gb/s Ethernet: DeepSpeed's best plan puts
    one pipeline stage on each node (pp 2 over the Ethernet link, dp 8 inside the nodes,
    ZeRO-1) and carries DeepSpeed 0.19's settings: blocking sends (runtime/pipe/p2p.py),
    gradients reduced in bf16 after the backward. Its iteration, 1.62 s simulated, is the
    search's; each activation's blocking send over the Ethernet link holds both stages'
    compute, so with Megatron-Core's batched isend / irecv beside the compute it would take
    1.22 s (-25%), and with the reduction overlapped with the backward 1.61 s (the dp 8
    reduction runs over NVLink: 0.02 s of it is exposed). The same search with Megatron's
    communication as the only change finds the same layout at 1.20 s, as does Megatron's
    own search: DeepSpeed's is 35% slower, the direction blocking sends imply."""
    from planner.simulator import simulate
    from planner.specs.choices import PipelineP2P
    from planner.specs.plan import Communication

    assert {fw: CAPABILITIES[fw].comm for fw in FRAMEWORKS} == {
        "megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "fsdp2",
        "trainplan": "trainplan"}
    request = dict(model=preset("gpt3-2.7b"), cluster=_ethernet_pair(), gbs=64, seq_len=2048)
    best = search(SearchRequest(**request, framework="deepspeed")).ranked[0]
    plan = best.plan
    assert plan.training.comm == Communication.preset("deepspeed", dtype="bf16")
    assert plan.training.comm.pipeline_p2p is PipelineP2P.BLOCKING
    assert not plan.training.comm.overlap_grad_reduce
    assert plan.training.comm.grad_reduce_dtype == "bf16"
    assert unsupported(plan, CAPABILITIES["deepspeed"]) == []
    stages = plan.pipelines[0].stages
    assert len(stages) == 2 and plan.dp == 8 and plan.sharding_label == "P/G/OS 1/1/8"
    assert {d // 8 for d in stages[0].devices} != {d // 8 for d in stages[1].devices}
    own = simulate(plan).iteration_time_s
    assert math.isclose(best.result.iteration_time_s, own, rel_tol=EXACT)
    assert own == pytest.approx(1.62, abs=0.01)
    batched = simulate(_with_comm(plan, pipeline_p2p="batched")).iteration_time_s
    overlapped = simulate(_with_comm(plan, overlap_grad_reduce=True)).iteration_time_s
    assert batched == pytest.approx(1.22, abs=0.01) and own > overlapped > batched

    monkeypatch.setitem(CAPABILITIES, "deepspeed", dataclasses.replace(
        CAPABILITIES["deepspeed"], comm="megatron"))
    as_megatron = search(SearchRequest(**request, framework="deepspeed")).ranked[0]
    monkeypatch.undo()
    megatron = search(SearchRequest(**request, framework="megatron")).ranked[0]
    for other in (as_megatron, megatron):
        assert other.plan.training.comm == Communication()
        # priced as written: the second DeepSpeed search reuses none of the first's work
        assert math.isclose(other.estimate_s, estimate(other.plan).iteration_time_s,
                            rel_tol=EXACT)
        assert other.result.iteration_time_s == pytest.approx(1.20, abs=0.01)
        assert own / other.result.iteration_time_s == pytest.approx(1.35, abs=0.01)


def test_each_frameworks_search_plans_with_its_communication():
    """Every framework's search writes its own communication in its plans, the executor's
    (trainplan: gradients reduced after the last backward, executor/data_parallel.py) and
    FSDP2's (torchtitan: in fp32 during the backward) included."""
    from planner.specs.plan import Communication

    request = dict(model=preset("gpt3-1.3b"), cluster=parse_gpus_arg("A100-80GB-SXM:8"),
                   gbs=32, seq_len=2048, top=2)
    for fw in FRAMEWORKS:
        for ranked in search(SearchRequest(**request, framework=fw)).ranked:
            assert ranked.plan.training.comm == Communication.preset(
                CAPABILITIES[fw].comm, dtype="bf16"), fw
            assert unsupported(ranked.plan, CAPABILITIES[fw]) == [], fw
    assert not Communication.preset("trainplan", dtype="bf16").overlap_grad_reduce
    assert Communication.preset("fsdp2", dtype="bf16").overlap_grad_reduce


def test_a_sequence_past_the_learned_positions_is_planned_only_where_it_runs():
    """`plan search` (for trainplan's executor) wrote a plan at seq 2048 of debug-tiny,
    which learns 64 positions, and `plan run` then refused it; Megatron's export sizes
    --max-position-embeddings by the sequence, so it is planned there."""
    req = SearchRequest(model=preset("debug-tiny"), cluster=parse_gpus_arg("CPU:2"), gbs=16,
                        seq_len=2048)
    with pytest.raises(SpecError, match=r"--seq: 2048 is not allowed \(at most 64, the "
                       r"positions debug-tiny learns: trainplan 0.1.0 executor has no "
                       r"embedding past its model's table; --framework megatron or "
                       r"deepspeed or torchtitan plans a longer one\)"):
        search(req)
    assert search(dataclasses.replace(req, framework="megatron")).ranked
    assert search(dataclasses.replace(req, seq_len=64)).ranked


_H100_A100 = ClusterSpec(name="h100-a100", node_groups=(
    NodeGroup(name="h", gpu="H100-80GB-SXM", num_nodes=1, island="ib"),
    NodeGroup(name="a", gpu="A100-40GB-SXM", num_nodes=1, island="ib")))
_GQA = dataclasses.replace(preset("debug-tiny-llama"), name="gqa", num_layers=3,
                           hidden_size=128, ffn_hidden_size=344, num_heads=8, num_kv_heads=2,
                           vocab_size=512, seq_len=128)


@pytest.mark.parametrize("model, cluster, gbs, extra", [
    # tp 4 over 2 key/value heads: the executor splits them, it does not copy them
    (preset("debug-tiny-llama"), "CPU:4", 1, {}),
    (_GQA, "H100-80GB-SXM:64", 36, {}),
    # tied embeddings on a first stage of tp 1 and a last of tp 4 (or 2)
    (preset("gpt3-125m"), "cluster_specs/mixed-a100-v100.yaml", 160, {"dtype": "fp16"}),
    (preset("gpt3-1.3b"), "cluster_specs/mixed-a100-v100.yaml", 256, {"dtype": "fp16"}),
    # replicas of tp 2 and 1 at a position, their states sharded P/G/OS 64/64/64
    (preset("gpt3-1.3b"), "cluster_specs/three-types.yaml", 256, {"dtype": "fp16"}),
    (preset("llama2-7b"), _H100_A100, 64, {"dtype": "fp32"}),
    # zb-h1 with full recomputation past the first stage
    (preset("mixtral-8x7b"), "H100-80GB-SXM:16", 24,
     {"dtype": "tf32", "objective": "time-to-train", "tokens": 5e9}),
    (preset("mixtral-8x7b"), _H100_A100, 64, {}),
], ids=["gqa-cpu", "gqa-h100", "tied-125m", "tied-1.3b", "mixed-tp-zero3", "mixed-tp-fp32",
        "zb-full-moe", "zb-full-mixed"])
def test_what_trainplan_searches_the_executor_runs(model, cluster, gbs, extra):
    """Found by a sweep of `plan search` then `plan run --dry-run` (588 pairs, 37 refused):
    each of these searches ranked first a plan the executor's preflight refuses. Every
    plan ranked now passes it, and nothing of it is `unsupported` by trainplan."""
    from executor.preflight import check_runnable
    from planner.specs.cluster import ClusterSpec as Spec

    if isinstance(cluster, Spec):
        cluster = cluster.resolved()
    elif cluster.endswith(".yaml"):
        cluster = load_cluster(cluster)
    else:
        cluster = parse_gpus_arg(cluster)
    found = search(SearchRequest(model=model, cluster=cluster, gbs=gbs,
                                 seq_len=min(model.seq_len, 4096), top=3, **extra))
    assert found.ranked
    for ranked in found.ranked:
        assert unsupported(ranked.plan, CAPABILITIES["trainplan"]) == []
        check_runnable(ranked.plan, cuda_devices=64, host=False)


@pytest.mark.parametrize("field, value, needle", [
    ("position_embedding", "alibi", "its alibi positions are not among trainplan 0.1.0 "
     "executor's (learned, rope); --framework deepspeed or torchtitan plans it"),
    ("lm_head", False, "it has no output projection (lm_head: false), and trainplan 0.1.0 "
     "executor's models end in one; --framework megatron or deepspeed or torchtitan plans it"),
])
def test_a_model_the_executor_lacks_is_refused_naming_who_plans_it(field, value, needle):
    model = dataclasses.replace(preset("debug-tiny"), **{field: value},
                                **({"tied_embeddings": False} if field == "lm_head" else {}))
    with pytest.raises(SpecError) as err:
        search(SearchRequest(model=model, cluster=parse_gpus_arg("CPU:2"), gbs=8, seq_len=64))
    assert needle in str(err.value), str(err.value)
    framework = "deepspeed"
    assert search(SearchRequest(model=model, cluster=parse_gpus_arg("CPU:2"), gbs=8,
                                seq_len=64, framework=framework)).ranked


def test_no_layout_of_the_gpus_says_which_rules_left_none():
    """Four CPU ranks at gbs 1 leave dp 1, so tp x pp = 4; with one key/value head tp is 1
    (the executor splits them) and pp 4 exceeds the 3 layers. The message blamed the batch
    alone ('no configuration divides gbs 1')."""
    model = dataclasses.replace(preset("debug-tiny-llama"), name="one-kv", num_layers=3,
                                num_kv_heads=1)
    with pytest.raises(InfeasiblePlan) as err:
        search(SearchRequest(model=model, cluster=parse_gpus_arg("CPU:4"), gbs=1, seq_len=64))
    assert str(err.value) == (
        "no configuration of these GPUs runs gbs 1: the data-parallel degree divides the "
        "batch, and tensor x pipeline parallelism takes the rest of the GPUs, tp dividing "
        "one-kv's 4 heads and its 1 key/value head and pp at most its 3 layers (try a gbs "
        "that is a multiple of the GPU count)")
