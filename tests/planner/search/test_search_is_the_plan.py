"""The search prices what it writes: one cost builder answers the search, `plan simulate`
and the estimate, so a candidate's estimate equals the closed-form estimate of the Plan it
becomes, and a leader's confirmed time equals `plan simulate --plan` of the written file,
exactly (relative 1e-9). Random configurations on homogeneous and mixed clusters."""

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.costs.kernels import default_kernels
from planner.errors import InfeasiblePlan
from planner.hetero.candidates import price
from planner.hetero.placement import pools_by_type
from planner.hetero.search import templates
from planner.predict.estimate import estimate
from planner.search import SearchRequest, search
from planner.search.evaluate import LayoutModel
from planner.search.sharding import sharding_options
from planner.search.space import Layout, Micro, SearchSpace
from planner.simulator import simulate
from planner.specs.choices import DType, Recompute, Schedule
from planner.specs.cluster import ClusterSpec, NodeGroup, load_cluster, train_dtype
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan
from planner.specs.model import ModelSpec
from planner.specs.plan import Sharding, load_plan, save_plan
from profiler.schema import SpecError
from tests.planner.search_oracle import assert_never_worse_than_a_baseline

EXACT = 1e-9
GPUS = ("A100-80GB-SXM", "V100-32GB-SXM2", "H100-80GB-SXM", "L40S-48GB")


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    heads = draw(st.sampled_from((4, 8, 16)))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8, 16) if heads % k == 0]))
    swiglu = draw(st.booleans())
    hidden = heads * draw(st.sampled_from((32, 64)))
    return ModelSpec(name="random", num_layers=draw(st.integers(2, 13)), hidden_size=hidden,
                     ffn_hidden_size=hidden * draw(st.sampled_from((2, 3, 4))),
                     num_heads=heads, num_kv_heads=kv, vocab_size=draw(st.sampled_from(
                         (1000, 32000, 50257))), seq_len=draw(st.sampled_from((512, 2048))),
                     activation="swiglu" if swiglu else "gelu",
                     norm="rmsnorm" if swiglu else "layernorm",
                     tied_embeddings=draw(st.booleans()))


@st.composite
def clusters(draw: st.DrawFn, *, types: int) -> ClusterSpec:
    gpus = draw(st.lists(st.sampled_from(GPUS), min_size=types, max_size=types, unique=True))
    islands = draw(st.integers(1, min(2, types)))
    groups = tuple(NodeGroup(name=f"g{i}", gpu=g, num_nodes=draw(st.integers(1, 4)),
                             gpus_per_node=draw(st.sampled_from((2, 4, 8))),
                             island=f"i{i % islands}",
                             nic=draw(st.sampled_from(("infiniband", "roce", "ethernet"))))
                   for i, g in enumerate(gpus))
    links = () if islands == 1 else ({"islands": ("i0", "i1"), "bandwidth_gbit_per_s": 100.0,
                                       "latency_ms": 1.0},)
    from profiler.schema import dump, parse
    data = {"name": "random", "node_groups": [dump(g) for g in groups],
            "island_links": list(links)}
    return parse(ClusterSpec, data, where="random:").resolved()


@st.composite
def domain_clusters(draw: st.DrawFn, *, types: int) -> ClusterSpec:
    """GB200 node groups whose NVLink domain spans 1-4 of their nodes (NVL72's rack, made
    small), with a node group of another type where `types` is 2: domains change which
    groups share the inner tier, so the search's keys must tell them apart."""
    per_node = draw(st.sampled_from((1, 2, 4)))
    groups = [NodeGroup(name="g0", gpu="GB200-186GB", num_nodes=draw(st.integers(1, 6)),
                        gpus_per_node=per_node,
                        nvlink_domain_gpus=per_node * draw(st.sampled_from((1, 2, 4))),
                        island="i0")]
    if types == 2:
        groups.append(NodeGroup(name="g1", gpu=draw(st.sampled_from(GPUS)),
                                num_nodes=draw(st.integers(1, 3)),
                                gpus_per_node=draw(st.sampled_from((2, 4))), island="i0"))
    from profiler.schema import dump, parse
    return parse(ClusterSpec, {"name": "domains", "node_groups": [dump(g) for g in groups]},
                 where="domains:").resolved()


def _dtype(cluster: ClusterSpec) -> DType:
    """What `plan search` trains in by default: bf16, or fp16 with a V100 in the cluster."""
    return train_dtype((g.device for g in cluster.node_groups), None, where="--dtype")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def homogeneous_candidate_is_its_plan(model, cluster, data):
    """LayoutModel (the search's fast path) = estimate() of the Plan, time and memory."""
    n = cluster.num_gpus
    tp = data.draw(st.sampled_from([d for d in _divisors(n) if d <= 8]))
    pp = data.draw(st.sampled_from([d for d in _divisors(n // tp) if d <= model.num_layers]))
    cp = data.draw(st.sampled_from(_divisors(n // (tp * pp))[:2]))
    dp = n // (tp * pp * cp)
    vp = data.draw(st.sampled_from((1, 2))) if pp > 1 else 1
    schedule = data.draw(st.sampled_from(
        (Schedule.ONE_F_ONE_B,) if vp > 1 else (Schedule.ONE_F_ONE_B, Schedule.ZB_H1,
                                                Schedule.GPIPE)))
    mbs = data.draw(st.sampled_from((1, 2)))
    gbs = mbs * dp * pp * data.draw(st.integers(1, 3))
    micro = Micro(vp, mbs, data.draw(st.sampled_from(tuple(Recompute))),
                  data.draw(st.booleans()) and tp > 1, schedule)
    layout = Layout(n, tp, cp, pp, dp)
    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, mbs=mbs, gbs=gbs,
                         seq_len=model.seq_len, recompute=micro.recompute,
                         sequence_parallel=micro.sequence_parallel, schedule=schedule)
    dtype = _dtype(cluster)
    try:
        check_parallel(cfg, model, cluster)
        kernels = default_kernels([cluster.node_groups[0].device], dtype=dtype,
                                  attention="flash" if cp > 1 else None)
    except SpecError:  # an invalid draw (the rules are tested on their own)
        assume(False)
    _priced_as_its_plan(model, cluster, layout, cfg, micro, gbs=gbs, dtype=dtype,
                        kernels=kernels, data=data)


def _priced_as_its_plan(model, cluster, layout, cfg, micro, *, gbs, dtype, kernels, data):
    """The layout model's price of `layout` at a drawn sharding = estimate() of the Plan it
    writes (time and peak memory); returns the Plan."""
    lm = LayoutModel(model, cluster, layout, dtype=dtype, seq_len=model.seq_len, gbs=gbs,
                     kernels=kernels)
    sharding = data.draw(st.sampled_from(sharding_options(lm.levels)))
    costs = lm.sharded(lm.stage_costs(micro), sharding)
    plan = homogeneous_plan(model, cluster, ParallelConfig(
                                **{**cfg.__dict__, "sharding": sharding, "dtype": dtype}),
                            kernels=kernels)
    result = estimate(plan)
    assert math.isclose(lm.iteration_s(costs, micro), result.iteration_time_s, rel_tol=EXACT)
    assert math.isclose(max(c.memory.total_bytes for c in costs),
                        max(s.memory.total_bytes for s in result.stages), rel_tol=EXACT)
    return plan


def mixed_candidate_is_its_plan(model, cluster, data):
    """The heterogeneous pricing (hetero/candidates.py) = estimate() of the Plan."""
    pools = pools_by_type(cluster)
    found = list(templates(model, pools, 64))
    assume(found)
    t = data.draw(st.sampled_from(found))
    mbs = data.draw(st.sampled_from((1, 2)))
    gbs = mbs * t.dp * data.draw(st.integers(1, 4))
    schedule = data.draw(st.sampled_from((Schedule.ONE_F_ONE_B, Schedule.ZB_H1)))
    options = [Sharding(), Sharding(optim=t.dp), Sharding(grads=t.dp, optim=t.dp)]
    kernels = default_kernels([g.device for g in cluster.node_groups])
    p = price(model, cluster, t, pools=pools, mbs=mbs,
              recompute=data.draw(st.sampled_from(tuple(Recompute))),
              sharding=data.draw(st.sampled_from(options)), seq_len=model.seq_len,
              dtype="fp16", gbs=gbs, kernels=kernels, schedule=schedule,
              relax=options if data.draw(st.booleans()) else ())
    assume(p is not None)
    plan = p.plan(model, cluster, seq_len=model.seq_len, dtype="fp16", kernels=kernels)
    assert math.isclose(p.iteration_s, estimate(plan).iteration_time_s, rel_tol=EXACT)


@st.composite
def moe_models(draw: st.DrawFn) -> ModelSpec:
    """MoE variants of `models` (SwiGLU experts, top-k routing, dense layers first)."""
    from dataclasses import replace

    base = draw(models())
    experts = draw(st.sampled_from((4, 8, 16)))
    return replace(base, activation="swiglu", norm="rmsnorm", num_experts=experts,
                   experts_per_token=draw(st.sampled_from((1, 2))),
                   expert_ffn_hidden_size=base.hidden_size * draw(st.sampled_from((1, 2))),
                   first_k_dense=draw(st.sampled_from((0, 1))) if base.num_layers > 2 else 0)


def mixed_moe_candidate_is_its_plan(model, cluster, data):
    """With expert parallelism over unlike replicas (ep groups in GPU order, each stage
    waiting for its slowest ep peer), the heterogeneous pricing = estimate() of the Plan."""
    from dataclasses import replace

    from planner.export.frameworks import CAPABILITIES
    from planner.hetero.search import MixedSpace

    space = replace(MixedSpace.for_framework(CAPABILITIES["trainplan"], model),
                    tp=(1, 2))  # expert tp = tp where tp > 1 (other frameworks' MoE)
    pools = pools_by_type(cluster)
    found = [t for t in templates(model, pools, 64, space) if t.ep > 1]
    assume(found)
    t = data.draw(st.sampled_from(found))
    mbs = data.draw(st.sampled_from((1, 2)))
    gbs = mbs * t.dp * data.draw(st.integers(1, 4))
    options = [Sharding(), Sharding(optim=t.dp), Sharding(grads=t.dp, optim=t.dp)]
    kernels = default_kernels([g.device for g in cluster.node_groups])
    p = price(model, cluster, t, pools=pools, mbs=mbs,
              recompute=data.draw(st.sampled_from((Recompute.NONE, Recompute.SELECTIVE))),
              sharding=data.draw(st.sampled_from(options)), seq_len=model.seq_len,
              dtype="fp16", gbs=gbs, kernels=kernels,
              relax=options if data.draw(st.booleans()) else ())
    assume(p is not None)
    assert len(set(p.microbatches)) == 1  # ep peers run the same passes
    plan = p.plan(model, cluster, seq_len=model.seq_len, dtype="fp16", kernels=kernels)
    assert plan.training.ep == t.ep
    assert math.isclose(p.iteration_s, estimate(plan).iteration_time_s, rel_tol=EXACT)


def homogeneous_moe_candidate_is_its_plan(model, cluster, data):
    """With expert parallelism, its ep groups laid out either way (Megatron's folding over
    tp x dp, or trainplan's executor's data-parallel replicas: `EpLayout`), LayoutModel =
    estimate() of the Plan, time and memory (expert states shard over the expert-dp group
    each layout gives)."""
    from planner.specs.choices import EpLayout

    n = cluster.num_gpus
    tp = data.draw(st.sampled_from([d for d in _divisors(n) if d <= 4]))
    pp = data.draw(st.sampled_from([d for d in _divisors(n // tp) if d <= model.num_layers]))
    dp = n // (tp * pp)
    ep_layout = data.draw(st.sampled_from(tuple(EpLayout)))
    ranks = dp * tp if ep_layout is EpLayout.FOLDED else dp  # what ep groups are cut from
    ep = data.draw(st.sampled_from([e for e in _divisors(ranks)
                                    if e > 1 and not model.num_experts % e] or [1]))
    assume(ep > 1)
    mbs = data.draw(st.sampled_from((1, 2)))
    gbs = mbs * dp * pp * data.draw(st.integers(1, 3))
    micro = Micro(1, mbs, data.draw(st.sampled_from((Recompute.NONE, Recompute.SELECTIVE))),
                  ep_layout is EpLayout.FOLDED and tp > 1, Schedule.ONE_F_ONE_B)
    etp = 1 if tp > 1 else None
    layout = Layout(n, tp, 1, pp, dp, ep, etp, ep_layout)
    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=gbs, seq_len=model.seq_len,
                         recompute=micro.recompute, sequence_parallel=micro.sequence_parallel,
                         ep=ep, etp=etp, ep_layout=ep_layout)
    dtype = _dtype(cluster)
    try:
        check_parallel(cfg, model, cluster)
        kernels = default_kernels([cluster.node_groups[0].device], dtype=dtype)
    except SpecError:
        assume(False)
    plan = _priced_as_its_plan(model, cluster, layout, cfg, micro, gbs=gbs, dtype=dtype,
                               kernels=kernels, data=data)
    assert plan.training.ep_layout is ep_layout


def _check_written(found, tmp_path):
    for i, r in enumerate(found.ranked):
        assert math.isclose(r.estimate_s, estimate(r.plan).iteration_time_s, rel_tol=EXACT)
        path = tmp_path / f"plan{i}.yaml"
        save_plan(r.plan, str(path))
        again = simulate(load_plan(str(path))).iteration_time_s
        assert math.isclose(r.result.iteration_time_s, again, rel_tol=EXACT)


SMALL_SPACE = dict(vp=(1, 2), mbs=(1, 2), sequence_parallel=(True,))


def search_writes_what_it_ranked(model, types, data, tmp_path):
    """Every listed plan: its estimate is estimate() of the Plan, its time is `plan
    simulate --plan` of the file written."""
    cluster = data.draw(clusters(types=types))
    gbs = data.draw(st.sampled_from((16, 32, 64)))
    space = None
    if types == 1:
        n = cluster.num_gpus
        space = SearchSpace(num_gpus=(n,), tp=(1, 2), cp=(1,),
                            pp=tuple(p for p in (1, 2, 4) if p <= model.num_layers),
                            **SMALL_SPACE)
    try:
        found = search(SearchRequest(model=model, cluster=cluster, gbs=gbs,
                                     seq_len=model.seq_len, top=3, confirm=3, space=space,
                                     dtype=_dtype(cluster)))
    except (SpecError, InfeasiblePlan):  # nothing to write (tested elsewhere)
        assume(False)
    _check_written(found, tmp_path)


HOMOGENEOUS = given(model=models(), cluster=clusters(types=1), data=st.data())
MIXED = given(model=models(), cluster=clusters(types=2), data=st.data())
SEARCHES = given(model=models(), types=st.integers(1, 2), data=st.data())
test_a_homogeneous_candidate_is_priced_as_its_plan = examples(300)(
    HOMOGENEOUS(homogeneous_candidate_is_its_plan))
test_a_mixed_candidate_is_priced_as_its_plan = examples(300)(MIXED(mixed_candidate_is_its_plan))
HOMOGENEOUS_MOE = given(model=moe_models(), cluster=clusters(types=1), data=st.data())
test_a_homogeneous_moe_candidate_is_priced_as_its_plan = examples(100)(
    HOMOGENEOUS_MOE(homogeneous_moe_candidate_is_its_plan))
MIXED_MOE = given(model=moe_models(), cluster=clusters(types=2), data=st.data())
test_a_mixed_moe_candidate_is_priced_as_its_plan = examples(150)(
    MIXED_MOE(mixed_moe_candidate_is_its_plan))
test_the_search_writes_what_it_ranked = examples(20)(SEARCHES(search_writes_what_it_ranked))
# 60 searches, 40 s: `make test-slow`
test_the_search_writes_what_it_ranked_60 = pytest.mark.slow(examples(60)(
    SEARCHES(search_writes_what_it_ranked)))
test_a_candidate_over_nvlink_domains_is_priced_as_its_plan = examples(100)(
    given(model=models(), cluster=domain_clusters(types=1), data=st.data())(
        homogeneous_candidate_is_its_plan))
test_a_mixed_candidate_over_nvlink_domains_is_priced_as_its_plan = examples(60)(
    given(model=models(), cluster=domain_clusters(types=2), data=st.data())(
        mixed_candidate_is_its_plan))
# The long run (python -m pytest -m fuzz): not in `make test`.
test_long_homogeneous = pytest.mark.fuzz(examples(3000)(
    HOMOGENEOUS(homogeneous_candidate_is_its_plan)))
test_long_mixed = pytest.mark.fuzz(examples(3000)(MIXED(mixed_candidate_is_its_plan)))
test_long_mixed_moe = pytest.mark.fuzz(examples(1500)(MIXED_MOE(mixed_moe_candidate_is_its_plan)))
test_long_searches = pytest.mark.fuzz(examples(400)(SEARCHES(search_writes_what_it_ranked)))


@pytest.mark.parametrize("name, path, gbs", [
    ("gpt3-175b", "cluster_specs/selene-a100.yaml", 1536),
    ("llama3-70b", "cluster_specs/dgx-h100.yaml", 1024),
    ("llama2-13b", "cluster_specs/mixed-a100-v100.yaml", 256),
    ("llama2-7b", "cluster_specs/three-types.yaml", 320),
    ("llama2-13b", "cluster_specs/mixed-nic.yaml", 384),
    ("llama3-70b", "cluster_specs/two-datacenter.yaml", 512),
    ("debug-small", "cluster_specs/local-cpu.yaml", 16),
])
def test_shipped_clusters_write_what_they_ranked(name, path, gbs, tmp_path):
    from planner.specs.model import preset

    cluster, model = load_cluster(path), preset(name)
    # 4096 tokens, or as many as a model of learned positions has (trainplan's executor
    # has no position past its table: `rules.seq_problem`)
    seq_len = min(4096, model.seq_len) if model.position_embedding == "learned" else 4096
    found = search(SearchRequest(model=model, cluster=cluster, gbs=gbs, seq_len=seq_len,
                                 top=2, confirm=2, dtype=_dtype(cluster)))
    _check_written(found, tmp_path)
    # and never worse than a baseline that fits (the same search as
    # tests/planner/hetero/test_hetero_search.py's for the mixed clusters, done once here)
    if len({g.gpu for g in cluster.node_groups}) > 1:
        assert len(found.baselines) == 3
    assert_never_worse_than_a_baseline(found)


@pytest.mark.slow
def test_three_types_on_one_fabric(tmp_path):
    """16 A100-80GB, 16 V100-32GB and 8 H100 nodes on one InfiniBand island (the search
    once died building a baseline with a negative micro-batch count)."""
    from planner.specs.model import preset

    cluster = ClusterSpec(name="three", node_groups=(
        NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=16, island="ib"),
        NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=16, island="ib"),
        NodeGroup(name="h", gpu="H100-80GB-SXM", num_nodes=8, island="ib"))).resolved()
    found = search(SearchRequest(model=preset("llama2-7b"), cluster=cluster, gbs=512,
                                 seq_len=4096, top=1, dtype=_dtype(cluster)))
    _check_written(found, tmp_path)
    assert all(b.result is None or all(p.num_microbatches >= 1 for p in b.plan.pipelines)
               for b in found.baselines)
