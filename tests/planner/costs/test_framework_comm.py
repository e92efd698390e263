"""How frameworks issue communication (Training.comm): reduction dtype, buckets, ZeRO-3 /
FSDP units and prefetch, blocking pipeline sends, with the defaults each framework's own
code sets (planner/data/reference/framework_defaults.md) and published runs
(planner/data/reference/zero3_at_scale.csv)."""

import dataclasses

import pytest

from planner.costs.stages import DPSync, bucket_params, dp_sync, gather_stall_s, plan_costs
from planner.predict.estimate import estimate
from planner.simulator import simulate, simulate_detailed
from planner.specs.choices import PipelineP2P
from planner.specs.cluster import ClusterSpec, NodeGroup, parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan, sharding_preset
from planner.specs.model import ModelSpec, preset
from planner.specs.plan import Communication, Sharding, Training
from profiler.schema import dump, parse

MEGATRON = Communication()


def with_comm(plan, comm):
    return dataclasses.replace(plan, training=dataclasses.replace(plan.training, comm=comm))


def test_defaults_are_megatrons_and_round_trip():
    """Megatron-Core: batched p2p, fp32 main-grad reduction under bf16, bucket
    max(4e7, 1e6 x dp); DeepSpeed: blocking p2p, reduce_bucket_size 5e8 elements, the
    training dtype, no overlap below ZeRO-3 (framework_defaults.md A, C, E)."""
    assert Training(global_batch_size=8, seq_len=128).comm == MEGATRON
    assert MEGATRON.pipeline_p2p is PipelineP2P.BATCHED and MEGATRON.grad_reduce_dtype == "fp32"
    assert bucket_params(MEGATRON, 8) == 40e6 and bucket_params(MEGATRON, 128) == 128e6
    ds = Communication.preset("deepspeed", dtype="bf16")
    assert (ds.pipeline_p2p, ds.grad_reduce_dtype, ds.overlap_grad_reduce) == \
        (PipelineP2P.BLOCKING, "bf16", False)
    assert bucket_params(ds, 8) == 5e8
    t = parse(Training, {"global_batch_size": 8, "seq_len": 128,
                         "comm": {"pipeline_p2p": "blocking", "shard_prefetch": 0}})
    assert parse(Training, dump(t)) == t and t.comm.shard_prefetch == 0


def test_gradients_reduced_in_half_precision_move_half_the_bytes():
    c = parse_gpus_arg("A100-80GB-SXM:64")
    group = tuple(range(0, 64, 8))  # one GPU per node, as a tp-8 layout's dp group
    args = (c, group, 1e9, 8, Sharding(), "bf16")
    fp32 = dp_sync(*args, comm=MEGATRON)
    bf16 = dp_sync(*args, comm=dataclasses.replace(MEGATRON, grad_reduce_dtype="bf16"))
    assert bf16.grad_iteration_s == pytest.approx(fp32.grad_iteration_s / 2, rel=0.05)


def test_every_bucket_pays_the_groups_latency():
    c = parse_gpus_arg("A100-80GB-SXM:1024")
    group = tuple(range(0, 1024, 8))
    one = dp_sync(c, group, 2e8, 8, Sharding(), "bf16",
                  comm=dataclasses.replace(MEGATRON, grad_bucket_params=2e8))
    many = dp_sync(c, group, 2e8, 8, Sharding(), "bf16",
                   comm=dataclasses.replace(MEGATRON, grad_bucket_params=1e6))
    assert (one.buckets, many.buckets) == (1, 200)
    assert many.grad_iteration_s > 1.2 * one.grad_iteration_s


def test_zero3_gathers_unit_by_unit_forward_and_backward():
    """ZeRO-3 / FSDP: parameters all-gathered per layer (FSDP2's fully_shard per block) or
    per bucket of `shard_unit_params`, before the forward and again before the backward;
    ring latency grows with the group, so the same gathers cost more at 512 GPUs."""
    c = parse_gpus_arg("A100-80GB-SXM:512")
    z3 = Sharding(params=64, grads=64, optim=64)
    small = dp_sync(c, tuple(range(0, 512, 8)), 1.3e9, 8, z3, "bf16", comm=MEGATRON, units=24)
    assert small.gather_units == 24 and small.param_microbatch_s == \
        pytest.approx(2 * 24 * small.gather_unit_s)
    whole = dp_sync(c, tuple(range(0, 512, 8)), 1.3e9, 8, z3, "bf16", comm=MEGATRON, units=1)
    assert small.param_microbatch_s > whole.param_microbatch_s  # 24 latencies, not one
    buckets = dp_sync(c, tuple(range(0, 512, 8)), 1.3e9, 8, z3, "bf16",
                      comm=dataclasses.replace(MEGATRON, shard_unit_params=5e7), units=24)
    assert buckets.gather_units == 26
    z3_512 = Sharding(params=512, grads=512, optim=512)
    wide = dp_sync(c, tuple(range(512)), 1.3e9 / 8, 1, z3_512, "bf16", comm=MEGATRON, units=24)
    narrow = dp_sync(c, tuple(range(64)), 1.3e9 / 8, 1, Sharding(params=64, grads=64, optim=64),
                     "bf16", comm=MEGATRON, units=24)
    assert wide.gather_unit_s > narrow.gather_unit_s


def test_a_pass_waits_where_a_unit_gathers_slower_than_one_computes():
    sync = DPSync(param_microbatch_s=2 * 10 * 0.002, gather_units=10)  # 2 ms per unit
    assert gather_stall_s(sync, compute_s=10 * 0.003, units=10) == 0.0  # 3 ms of compute each
    assert gather_stall_s(sync, compute_s=10 * 0.001, units=10) == pytest.approx(9 * 0.001)
    serial = dataclasses.replace(sync, prefetch=0)
    assert gather_stall_s(serial, compute_s=10 * 0.003, units=10) == pytest.approx(9 * 0.002)


def _fsdp_throughput(nic: dict, model: ModelSpec, mbs: int, recompute: str) -> float:
    """Tokens/s per GPU of FSDP (ZeRO-3) over 64 H100 (8 nodes of Azure ND H100 v5)."""
    group = NodeGroup(name="nd", gpu="H100-80GB-SXM", num_nodes=8, **nic)
    cluster = ClusterSpec(name="azure", node_groups=(group,)).resolved()
    cfg = ParallelConfig(dp=64, mbs=mbs, gbs=64 * mbs, seq_len=2048, recompute=recompute,
                         sharding=sharding_preset("zero3", 64))
    plan = homogeneous_plan(dataclasses.replace(model, seq_len=2048), cluster, cfg)
    plan = with_comm(plan, Communication.preset("fsdp2", dtype="bf16"))
    return mbs * 2048 / simulate(plan).iteration_time_s


def test_fsdp_over_tcp_sockets_against_infiniband():
    """Qwen2.5-7B and -72B with FSDP FULL_SHARD on 64 H100 (JingchaoZhang's 2025 runs,
    zero3_at_scale.csv rows 20-23): over TCP on the ~45 Gb/s eth0 292 and 12 tokens/s per
    GPU, 26.9x slower than over 8 x 400 Gb/s InfiniBand for the 7B."""
    qwen7 = ModelSpec(name="qwen2.5-7b", num_layers=28, hidden_size=3584,
                      ffn_hidden_size=18944, num_heads=28, num_kv_heads=4,
                      vocab_size=152064, seq_len=2048, activation="swiglu", norm="rmsnorm")
    qwen72 = dataclasses.replace(qwen7, name="qwen2.5-72b", num_layers=80, hidden_size=8192,
                                 ffn_hidden_size=29568, num_heads=64, num_kv_heads=8)
    tcp = {"nic": "ethernet", "nics_per_node": 1, "nic_bandwidth_gbit_per_s": 45}
    assert _fsdp_throughput(tcp, qwen7, 2, "none") == pytest.approx(292, rel=0.3)
    assert _fsdp_throughput(tcp, qwen72, 1, "full") == pytest.approx(12, rel=0.35)
    ib = _fsdp_throughput({}, qwen7, 2, "none")
    assert ib / _fsdp_throughput(tcp, qwen7, 2, "none") > 10


def _pipeline(p2p: PipelineP2P):
    model = dataclasses.replace(preset("gpt3-1.3b"), num_layers=8)
    cluster = ClusterSpec(name="slow", node_groups=(NodeGroup(
        name="g", gpu="A10G-24GB", num_nodes=4, gpus_per_node=1, nic="ethernet",
        nic_bandwidth_gbit_per_s=10),)).resolved()
    cfg = ParallelConfig(pp=4, mbs=2, gbs=16, seq_len=2048)
    plan = homogeneous_plan(model, cluster, cfg)
    return with_comm(plan, dataclasses.replace(MEGATRON, pipeline_p2p=p2p))


def test_blocking_pipeline_sends_hold_both_stages():
    """DeepSpeed's PipelineEngine sends and receives with blocking dist.send/recv
    (deepspeed/runtime/pipe/p2p.py): each transfer holds the sender's and the receiver's
    compute; Megatron's batched isend/irecv runs beside it. Over 10 GbE a middle stage's
    compute then holds four transfers per micro-batch (an activation and a gradient in,
    an activation and a gradient out)."""
    batched, blocking = _pipeline(PipelineP2P.BATCHED), _pipeline(PipelineP2P.BLOCKING)
    t = plan_costs(blocking).costs[0][1].p2p_s
    assert t > 5e-3  # 2 x 2048 x 2048 x 2 B over ~5.8 Gb/s
    m = 8
    for predict in (simulate, estimate):
        assert predict(blocking).iteration_time_s > predict(batched).iteration_time_s + m * t
    _, sim = simulate_detailed(blocking)
    g = sim.graph
    middle = g.stream("p0.s1.compute")
    held = [g.durations[i] for i in range(len(g))
            if g.kinds[i] in ("send", "recv") and g.streams[i] == middle]
    assert len(held) == 4 * m and sum(held) == pytest.approx(4 * m * t)
    assert not [k for k in g.stream_names if "pipeline sends" in k]


def test_gradients_reduced_after_the_backward_are_exposed():
    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:16"),
                            ParallelConfig(dp=16, mbs=4, gbs=64, seq_len=2048))
    late = with_comm(plan, dataclasses.replace(MEGATRON, overlap_grad_reduce=False))
    sync = plan_costs(late).costs[0][0].dp.grad_iteration_s
    for predict in (simulate, estimate):
        gap = predict(late).iteration_time_s - predict(plan).iteration_time_s
        assert gap == pytest.approx(sync - sync / plan_costs(plan).costs[0][0].dp.buckets,
                                    rel=0.15)


@pytest.mark.parametrize("pp", [1, 2])
def test_sharded_gradients_reduced_in_line_hold_every_micro_batch(pp):
    """ZeRO-2 reduce-scatters the gradients of every micro-batch (Rajbhandari et al.
    2020, section 5.2). DeepSpeed without `overlap_comm` reduces each bucket on the
    compute stream (deepspeed/runtime/zero/stage_1_and_2.py: its `reduction_stream`
    only with overlap_comm, else the current stream), and trainplan's executor calls the
    reduce-scatter at the backward's end (executor/data_parallel.py `add_grads`): the next
    pass waits for it. So all m of them are exposed, where overlapped buckets expose only
    what outlasts the next micro-batch."""
    m = 4
    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:16"),
                            ParallelConfig(dp=16 // pp, pp=pp, mbs=1, gbs=m * 16 // pp,
                                           seq_len=2048,
                                           sharding=sharding_preset("zero2", 16 // pp)))
    in_line = with_comm(plan, dataclasses.replace(MEGATRON, overlap_grad_reduce=False))
    costs = plan_costs(in_line).costs[0]
    rs = min(c.dp.grad_microbatch_s for c in costs)
    most = max(c.dp.grad_microbatch_s + c.dp.grad_iteration_s + c.dp.param_iteration_s
               for c in costs)  # the iteration's reduction and gather: not overlapped either
    assert rs > 1e-3 and min(c.forward_s for c in costs) > rs  # overlapped, they hide
    for predict in (simulate, estimate):
        gap = predict(in_line).iteration_time_s - predict(plan).iteration_time_s
        # in line: each stage's m reduce-scatters (the pipeline's fill and drain cross
        # the others'), the iteration's reduction and the gather after the step;
        # overlapped: the last micro-batch's exposed buckets
        assert (m - 1) * rs < gap < (m + pp - 1) * most + 1e-9
    _, sim = simulate_detailed(in_line)
    g, start, binding = sim.graph, sim.schedule.start, sim.schedule.binding
    held = [i for i in range(len(g)) if g.names[i].startswith("reduce-scatter p0s")]
    assert len(held) == pp * (m - 1)
    for i in held:  # the pass after each one waits for it
        nxt = [k for k in g.succs[i] if g.kinds[k] in ("F", "B")]
        assert nxt and all(start[k] >= sim.schedule.end[i] - 1e-12 for k in nxt)
        # (in a pipeline the pass may wait longer, for the other stage)
        assert pp > 1 or any(binding[k] == i for k in nxt)


def test_tp_collectives_run_under_the_gemms_only_where_the_framework_overlaps_them():
    """Transformer Engine's userbuffer overlap (Megatron --tp-comm-overlap) hides the
    sequence-parallel all-gathers and reduce-scatters under the GEMMs beside them, as far
    as the architecture's calibrated share says (Hopper 1.0: the Megatron-Core H100 rows
    ran it, docs/calibration.md); a framework that issues them in line (DeepSpeed, FSDP2 /
    torchtitan, trainplan's executor, whose DTensor collectives block) pays them whole.
    The share was the architecture's alone, so a torchtitan or trainplan plan on H100 was
    priced with every tp collective hidden."""
    model = preset("llama2-13b")
    cfg = ParallelConfig(tp=8, dp=2, mbs=1, gbs=16, seq_len=4096, sequence_parallel=True)
    for gpu, hides in (("H100-80GB-SXM", True), ("A100-80GB-SXM", False)):
        plan = homogeneous_plan(model, parse_gpus_arg(f"{gpu}:16"), cfg)
        inline = with_comm(plan, dataclasses.replace(MEGATRON, tp_comm_overlap=False))
        tp_on = plan_costs(plan).costs[0][0].layer_forward.tp_s
        tp_off = plan_costs(inline).costs[0][0].layer_forward.tp_s
        assert tp_off > 0
        assert (tp_on == 0) if hides else (tp_on == pytest.approx(tp_off))
        assert simulate(inline).iteration_time_s >= simulate(plan).iteration_time_s
    assert MEGATRON.tp_comm_overlap
    assert not any(Communication.preset(f, dtype="bf16").tp_comm_overlap
                   for f in ("deepspeed", "fsdp2", "trainplan"))
