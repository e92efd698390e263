"""The event simulator: exact schedule arithmetic, overlap, trace and picture outputs."""

import dataclasses
import json

import pytest

from planner.costs.stages import plan_costs
from planner.predict.estimate import estimate
from planner.simulator import simulate, simulate_detailed, write_gantt, write_trace
from planner.simulator.build import MAX_SIMULATED_BUCKETS, simulate_graph
from planner.simulator.graph import Schedule
from planner.simulator.schedules import stage_order
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan, sharding_preset
from planner.specs.model import preset
from tests.planner.simulator_helpers import flat_costs, make_plan


@pytest.mark.parametrize("pp, m", [(1, 4), (2, 8), (4, 8), (4, 5), (8, 32)])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_time_is_m_plus_p_minus_1(pp, m, schedule):
    """No communication, p equal stages: (m + p - 1)(t_f + t_b) (Narayanan et al. 2021)."""
    plan = make_plan(pp=pp, m=m, schedule=schedule)
    sim = simulate_graph(plan, costs=flat_costs(plan, fwd=1.0, bwd=2.0))
    assert sim.schedule.makespan_s == pytest.approx((m + pp - 1) * 3.0, rel=1e-12)


@pytest.mark.parametrize("pp, vp, m", [(2, 2, 8), (4, 2, 8), (4, 3, 12), (4, 4, 16)])
def test_interleaving_divides_the_bubble_by_vp(pp, vp, m):
    """Bubble (p - 1)(t_f + t_b)/v with v chunks per stage (Narayanan et al. 2021 §2.2.2)."""
    plan = make_plan(pp=pp, m=m, vp=vp, schedule="1f1b", layers=pp * vp * 2)
    sim = simulate_graph(plan, costs=flat_costs(plan, fwd=1.0, bwd=2.0))
    assert sim.schedule.makespan_s == pytest.approx(m * 3.0 + (pp - 1) * 3.0 / vp, rel=1e-12)


@pytest.mark.parametrize("pp, m, flushes, vp", [(4, 8, 2, 1), (4, 32, 4, 1), (2, 12, 3, 1),
                                                 (4, 16, 2, 2)])
def test_each_pipeline_flush_pays_its_own_fill_and_drain(pp, m, flushes, vp):
    """m micro-batches run as `flushes` schedules of m / flushes, one after the other (NeMo
    AutoModel: a torch.distributed.pipelining `schedule.step` per local batch): each
    schedule costs (m / flushes + (p - 1) / v)(t_f + t_b) on p equal stages (Narayanan et
    al. 2021), so the step costs `flushes` of them; the closed form agrees."""
    one = make_plan(pp=pp, m=m, vp=vp, schedule="1f1b", layers=pp * vp * 2)
    plan = dataclasses.replace(one, training=dataclasses.replace(
        one.training, pipeline_flushes=flushes))
    costs = flat_costs(plan, fwd=1.0, bwd=2.0)
    sim = simulate_graph(plan, costs=costs)
    expected = flushes * (m / flushes + (pp - 1) / vp) * 3.0
    assert sim.schedule.makespan_s == pytest.approx(expected, rel=1e-12)
    assert estimate(plan, costs=costs).iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert simulate_graph(one, costs=flat_costs(one)).schedule.makespan_s < expected


def test_gantt_title_and_trace_name_the_pipeline_flushes(tmp_path):
    """A step of 2 schedules shows two fills and drains: the picture's title says why, and
    the trace's metadata carries the plan's layout line (flushes included)."""
    from planner.simulator.report import gantt_title

    one = make_plan(pp=4, m=8)
    two = dataclasses.replace(one, training=dataclasses.replace(one.training,
                                                                pipeline_flushes=2))
    assert gantt_title(one, 0, 3.21) == ("gpt3-1.3b: 1f1b, 4 stages, 8 micro-batches, vp 1: "
                                         "iteration 3.21 s (simulated)")
    assert gantt_title(two, 0, 3.21) == ("gpt3-1.3b: 1f1b, 4 stages, 8 micro-batches in 2 "
                                         "pipeline flushes, vp 1: iteration 3.21 s (simulated)")
    _, sim = simulate_detailed(two)
    trace = tmp_path / "t.json"
    write_trace(sim, str(trace))
    layout = json.loads(trace.read_text())["otherData"]["layout"]
    assert "1f1b, 2 pipeline flushes per step" in layout


def test_flushed_order_runs_each_schedule_over_its_own_micro_batches():
    one = stage_order("1f1b", stage=1, pp=4, num_microbatches=4)
    two = stage_order("1f1b", stage=1, pp=4, num_microbatches=8, flushes=2)
    assert two == one + [(ph, c, j + 4) for ph, c, j in one]


@pytest.mark.parametrize("schedule, vp", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 3)])
def test_every_pass_runs_once_in_dependency_order(schedule, vp):
    pp, m = 4, 8
    for stage in range(pp):
        order = stage_order(schedule, stage=stage, pp=pp, num_microbatches=m, virtual_stages=vp)
        assert sorted(order) == sorted((ph, c, j) for ph in "FB" for c in range(vp)
                                       for j in range(m))
        for ph, c, j in order:  # a backward after its own forward on this stage
            if ph == "B":
                assert order.index(("F", c, j)) < order.index(("B", c, j))


def test_graph_is_a_dag_with_pipeline_dependencies():
    import networkx as nx

    plan = make_plan(pp=4, m=8, dp=2)
    sim = simulate_graph(plan)
    g = sim.graph.to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    names = {d["name"]: n for n, d in g.nodes(data=True)}
    # forward of micro-batch 3 on stage 2 waits for stage 1's, via the send between them
    assert nx.has_path(g, names["F3 p0s1"], names["F3 p0s2"])
    assert any(d["kind"] == "dp" for _, d in g.nodes(data=True))


def test_overlap_never_slower_than_no_overlap():
    for kw in (dict(pp=2, dp=4, m=4), dict(pp=1, dp=8, m=2), dict(pp=4, dp=2, m=8, vp=2, layers=16)):
        plan = make_plan(**kw)
        with_overlap = simulate_graph(plan).schedule.makespan_s
        without = simulate_graph(plan, overlap_grad_reduce=False).schedule.makespan_s
        assert with_overlap <= without * (1 + 1e-12)
        assert with_overlap < without  # and here it helps


def test_gradient_sync_hidden_until_the_last_bucket():
    """With dp > 1, sync overlapping the last backward: only the part beyond it is exposed."""
    plan = make_plan(pp=1, dp=2, m=4)
    costs = flat_costs(plan, fwd=1.0, bwd=2.0, grad_sync=0.5, optimizer=0.25)
    sim = simulate_graph(plan, costs=costs)
    buckets = len([k for k in sim.graph.kinds if k == "dp"])
    assert buckets > 1
    assert sim.schedule.makespan_s == pytest.approx(4 * 3.0 + 0.5 / buckets + 0.25, rel=1e-9)


def test_a_plan_of_very_many_buckets_is_simulated_in_a_bounded_number_of_pieces():
    """Tiny buckets (a fuzz-found 73-trillion-parameter model had 1.8 million; its trace
    was 461 MB): the last backward is cut into at most MAX_SIMULATED_BUCKETS pieces, and
    the iteration moves by less than one piece's share of the gradient traffic."""
    plan = make_plan(pp=1, dp=2, m=4)
    tiny = dataclasses.replace(plan, training=dataclasses.replace(
        plan.training, comm=dataclasses.replace(plan.training.comm, grad_bucket_params=1e3)))
    sim = simulate_graph(tiny)
    assert plan_costs(tiny).costs[0][0].dp.buckets > 100 * MAX_SIMULATED_BUCKETS
    assert len([k for k in sim.graph.kinds if k == "dp"]) <= MAX_SIMULATED_BUCKETS + 2
    assert simulate(tiny).iteration_time_s == pytest.approx(
        estimate(tiny).iteration_time_s, rel=0.03)


def test_sends_sit_between_stages():
    """GPipe pays one transfer each way on the critical path. 1F1B with two stages also
    pays a round trip whenever stage 0's backward waits for stage 1's (worked by hand:
    15 s of compute + 4 transfers = 15.4 s)."""
    p2p = 0.1
    plan = make_plan(pp=2, m=4, schedule="gpipe")
    sim = simulate_graph(plan, costs=flat_costs(plan, fwd=1.0, bwd=2.0, p2p=p2p))
    assert sim.schedule.makespan_s == pytest.approx((4 + 1) * 3.0 + 2 * p2p, rel=1e-12)
    plan = make_plan(pp=2, m=4)
    sim = simulate_graph(plan, costs=flat_costs(plan, fwd=1.0, bwd=2.0, p2p=p2p))
    assert sim.schedule.makespan_s == pytest.approx(15.4, rel=1e-12)


def test_simulation_agrees_with_the_closed_form_on_homogeneous_plans():
    for kw in (dict(pp=4, m=16), dict(pp=4, m=16, vp=2, layers=24), dict(pp=2, dp=4, m=8)):
        plan = make_plan(**kw)
        assert simulate(plan).iteration_time_s == pytest.approx(
            estimate(plan).iteration_time_s, rel=0.03)


def test_breakdown_adds_up():
    for kw in (dict(pp=4, m=8), dict(pp=2, dp=4, m=8, tp=2), dict(pp=4, m=8, vp=2, layers=24)):
        r = simulate(make_plan(**kw))
        assert r.breakdown.total_s == pytest.approx(r.iteration_time_s, rel=1e-9)
        assert r.breakdown.bubble_s > 0


def test_in_flight_memory_follows_the_schedule():
    plan = make_plan(pp=4, m=8)
    gpipe = make_plan(pp=4, m=8, schedule="gpipe")
    one = simulate(plan).stages[0].memory.activations_bytes
    all_ = simulate(gpipe).stages[0].memory.activations_bytes
    assert all_ == pytest.approx(one * 8 / 4)  # GPipe holds all m, 1F1B p on stage 0


def test_trace_and_gantt(tmp_path):
    result, sim = simulate_detailed(make_plan(pp=4, dp=2, m=8, vp=2, layers=16))
    trace, png = tmp_path / "t.json", tmp_path / "g.png"
    write_trace(sim, str(trace))
    write_gantt(sim, str(png))
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(sim.graph)
    end_us = max(e["ts"] + e["dur"] for e in slices)
    assert end_us == pytest.approx(result.iteration_time_s * 1e6)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_the_gantt_chart_reads_the_iterations_end_once(tmp_path, monkeypatch):
    """`Schedule.makespan_s` is a max over every task: read once per task, a chart of
    llama3-405b in 32 stages x 256 micro-batches (24,578 tasks drawn) took 14 of its 15 s
    in it."""
    _, sim = simulate_detailed(make_plan(pp=4, dp=2, m=8, vp=2, layers=16))
    reads = []
    end = Schedule.makespan_s.fget
    monkeypatch.setattr(Schedule, "makespan_s", property(lambda s: reads.append(1) or end(s)))
    write_gantt(sim, str(tmp_path / "g.png"))
    assert len(sim.graph) > 100 and len(reads) == 1


def test_trace_shows_each_kind_of_traffic_on_its_own_stream(tmp_path):
    """`plan simulate --trace`: ZeRO-3 parameter gathers, gradient reduce-scatters and
    pipeline sends each on their own stream per stage, every transfer naming its
    collective, size, group and NCCL algorithm; the breakdown still adds up."""
    plan = make_plan(pp=2, dp=8, m=8, sharding=sharding_preset("zero3", 8))
    result, sim = simulate_detailed(plan)
    assert result.breakdown.total_s == pytest.approx(result.iteration_time_s, rel=1e-9)
    trace = tmp_path / "t.json"
    write_trace(sim, str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for stage in (0, 1):
        for kind in ("compute", "param gather (in node)", "grad reduce (in node)",
                     "pipeline sends (network)"):
            assert f"s{stage}.{kind}" in threads
    gathers = [e for e in events if e["ph"] == "X" and e["name"].startswith("all-gather")]
    assert gathers and "all_gather" in gathers[0]["args"]["collective"]
    assert "ring/" in gathers[0]["args"]["collective"]


@pytest.mark.parametrize("comm", ["megatron", "deepspeed"])
def test_a_pipeline_transfer_names_its_chunk_and_micro_batch(tmp_path, comm):
    """Every send (and DeepSpeed's blocking receive) in the trace carries the chunk and
    micro-batch of the pass it moves, as its name does (`send F1.3`: chunk 1, micro-batch
    3); they carried micro-batch -1 and chunk 0."""
    import re

    from planner.specs.plan import Communication

    plan = make_plan(pp=4, dp=1, m=8, vp=2 if comm == "megatron" else 1, layers=16)
    plan = dataclasses.replace(plan, training=dataclasses.replace(
        plan.training, comm=Communication.preset(comm, dtype="bf16")))
    _, sim = simulate_detailed(plan)
    trace = tmp_path / "t.json"
    write_trace(sim, str(trace))
    moves = [e for e in json.loads(trace.read_text())["traceEvents"]
             if e["ph"] == "X" and e["cat"] in ("send", "recv")]
    assert moves
    for e in moves:
        chunk, micro = map(int, re.match(r"(?:send|recv) [FB](\d+)\.(\d+)", e["name"]).groups())
        assert (e["args"]["chunk"], e["args"]["microbatch"]) == (chunk, micro), e


def test_each_stage_priced_at_its_own_sharding():
    """AMSP per stage (Zorse's sharding inside a stage at its own group size): a stage
    whose sharding is overridden costs and holds exactly what it would with that sharding
    for the whole plan; the other stages are untouched."""
    from dataclasses import replace

    from planner.costs.stages import plan_costs
    from planner.specs.plan import Sharding

    cfg = ParallelConfig(tp=2, pp=2, dp=4, mbs=1, gbs=32, seq_len=2048)
    base = homogeneous_plan(preset("llama2-7b"), parse_gpus_arg("A100-80GB-SXM:16"), cfg)
    zero1, zero3 = Sharding(optim=4), Sharding(params=4, grads=4, optim=4)
    whole = {sh: replace(base, sharding=sh) for sh in (zero1, zero3)}
    mixed = replace(base, sharding=zero1, stage_sharding=(zero1, zero3))
    mixed.check("plan")
    got_sim = simulate(mixed)
    for si, sh in enumerate((zero1, zero3)):
        want_sim = simulate(whole[sh])
        assert got_sim.stages[si].memory.total_bytes == pytest.approx(
            want_sim.stages[si].memory.total_bytes)
        assert plan_costs(mixed).costs[0][si].dp == plan_costs(whole[sh]).costs[0][si].dp
    assert (simulate(whole[zero3]).stages[1].memory.total_bytes
            < simulate(whole[zero1]).stages[1].memory.total_bytes)


@pytest.mark.parametrize("schedule,vp,dp", [("1f1b", 1, 2), ("gpipe", 1, 1), ("zb-h1", 1, 2),
                                            ("1f1b", 2, 1)])
def test_processor_sharing_without_a_slowdown_is_the_list_schedule(schedule, vp, dp):
    """The shared-core scheduler (CPU ranks sharing a host) with k = 1 gives the list
    scheduler's start, end and binding of every task, exactly."""
    from planner.simulator.graph import SharedCores
    from planner.simulator.graph import schedule as list_schedule

    plan = make_plan(pp=4, m=8, vp=vp, dp=dp, schedule=schedule, layers=4 * vp * 2)
    g = simulate_graph(plan, costs=flat_costs(plan, fwd=1.0, bwd=2.0)).graph
    computes = {s: 2.0 for s, name in enumerate(g.stream_names) if name.endswith("compute")}
    plain = list_schedule(g)
    shared = list_schedule(g, shared=[SharedCores(computes, lambda load: 1.0)],
                           cpu_share=[1.0] * len(g))
    assert (shared.start, shared.end, shared.binding) == (plain.start, plain.end, plain.binding)
    # a slowdown of 2 for any load above one rank (every stream stands for 2 ranks):
    # every compute task twice as long, the transfers as they were
    slow = list_schedule(g, shared=[SharedCores(computes, lambda load: 2.0 if load > 1 else 1.0)],
                         cpu_share=[1.0] * len(g))
    for t in range(len(g)):
        k = 2.0 if g.streams[t] in computes else 1.0
        assert slow.end[t] - slow.start[t] == pytest.approx(k * g.durations[t], rel=1e-9)


def test_lockstep_ranks_compute_at_once_whatever_their_cpu_share():
    """A stream standing for 4 lockstep ranks (identical replicas running the same ops at
    the same time) whose pass is half compute, half waiting in blocking collectives:
    while it computes all 4 ranks compute, so its CPU half is slowed by k(4), not by k of
    the averaged load 4 x 0.5 = 2. A second stream's ranks count by their share."""
    from planner.simulator.graph import SharedCores, TaskGraph
    from planner.simulator.graph import schedule as list_schedule

    def k(load: float) -> float:  # 2 cores: processor sharing above 2 ranks
        return max(1.0, load / 2.0)

    g = TaskGraph()
    a = g.stream("p0.s0.compute")
    g.add("F", "F", a, 1.0)
    out = list_schedule(g, shared=[SharedCores({a: 4.0}, k)], cpu_share=[0.5])
    assert out.end[0] == pytest.approx(0.5 * k(4.0) + 0.5)  # 1.5 s, not 1.0 s
    # beside a second stream of 2 ranks whose task is all CPU work: each sees its own
    # ranks whole and the other's by share
    b = g.stream("p1.s0.compute")
    g.add("G", "F", b, 10.0)
    both = list_schedule(g, shared=[SharedCores({a: 4.0, b: 2.0}, k)], cpu_share=[0.5, 1.0])
    assert both.end[0] == pytest.approx(0.5 * k(4.0 + 2.0) + 0.5)


def test_a_collective_is_slowed_only_by_load_beyond_what_it_was_measured_at():
    """A gloo collective on a shared host is CPU work for part of its time: measured with
    its group alone (2 ranks busy 60% of the call: load 1.2), it runs as measured when
    nothing else runs, adds its ranks' share to the load a pass beside it sees, and is
    slowed by k(L) / k(1.2) while that pass computes."""
    from planner.simulator.graph import SharedCores, TaskGraph
    from planner.simulator.graph import schedule as list_schedule

    def k(load: float) -> float:  # 1 core: processor sharing above one rank
        return max(1.0, load)

    g = TaskGraph()
    comm = g.stream("p0.s0.grad reduce (in node)")
    g.add("reduce", "dp", comm, 1.0)
    host = [SharedCores({comm: 2.0}, k)]
    alone = list_schedule(g, shared=host, cpu_share=[0.6], ref_load=[1.2])
    assert alone.end[0] == pytest.approx(1.0)
    compute = g.stream("p0.s0.compute")
    g.add("B", "B", compute, 10.0)
    host = [SharedCores({comm: 2.0, compute: 2.0}, k)]
    both = list_schedule(g, shared=host, cpu_share=[0.6, 1.0], ref_load=[1.2, 0.0])
    load = 2.0 * 0.6 + 2.0  # the collective's ranks by share, the pass's whole
    assert both.end[0] == pytest.approx(0.4 + 0.6 * k(load) / k(1.2))
    # the pass computed at k(2 + 1.2) while the collective ran, then at k(2)
    done = both.end[0] / k(load)
    assert both.end[1] == pytest.approx(both.end[0] + (10.0 - done) * k(2.0))
    # without a reference load (older callers) the collective is a pass, as before
    old = list_schedule(g, shared=host, cpu_share=[0.0, 1.0])
    assert old.end[1] == pytest.approx(10.0 * k(2.0))


def test_a_pipeline_send_loads_the_host_for_its_receiver_too():
    """gloo moves a point-to-point transfer on both ends' cores (profiler/collectives.py
    times a ping-pong and halves it: each rank's process is busy that share of a one-way
    send, sending or receiving). A batched send runs on the sender's stream, so a pass
    beside it on a shared host sees the sender's share and, where the receiving stage's
    ranks are on that host, theirs too."""
    from planner.simulator.graph import SharedCores, TaskGraph
    from planner.simulator.graph import schedule as list_schedule

    def k(load: float) -> float:  # 2 cores: processor sharing above 2 ranks
        return max(1.0, load / 2.0)

    g = TaskGraph()
    send = g.stream("p0.s0.pipeline sends (in node)")
    compute = g.stream("p0.s1.compute")
    other = g.stream("p0.s0.compute")
    g.add("send", "send", send, 1.0)
    g.add("F", "F", compute, 10.0)
    g.add("G", "F", other, 10.0)
    host = [SharedCores({send: 1.0, compute: 1.0, other: 1.0}, k)]
    kw = dict(shared=host, cpu_share=[0.5, 1.0, 1.0], ref_load=[1.0, 0.0, 0.0])
    sender_only = list_schedule(g, **kw)
    both_ends = list_schedule(g, **kw, peer_ranks=[1.0, 0.0, 0.0])
    # the send itself: measured at its 2 processes' load (1.0), which it now is
    assert both_ends.end[0] == pytest.approx(0.5 + 0.5 * k(2.0 + 1.0) / k(1.0))
    assert sender_only.end[0] == pytest.approx(0.5 + 0.5 * k(2.0 + 0.5) / k(1.0))
    # a pass beside it computes at k(2 + 1) while it runs, not k(2 + 0.5)
    for out, load in ((both_ends, 3.0), (sender_only, 2.5)):
        done = out.end[0] / k(load)
        assert out.end[1] == pytest.approx(out.end[0] + (10.0 - done) * k(2.0))
    assert both_ends.end[1] > sender_only.end[1]


def test_host_time_measured_with_the_ranks_at_once_is_not_slowed_twice():
    """DTensor's host rows are timed on every tp rank at once, so a tp-2 stage's share of
    them already holds its 2 ranks' sharing: alone on the host that share runs as
    measured (k(2) / k(2)), the rest of its CPU work at k(2); beside a third rank
    computing, the measured share is slowed by k(3) / k(2) only."""
    from planner.simulator.graph import SharedCores, TaskGraph
    from planner.simulator.graph import schedule as list_schedule

    def k(load: float) -> float:  # 2 cores: processor sharing above 2 ranks, 1.2 at 2
        return 1.0 if load <= 1.0 else 1.2 if load <= 2.0 else 1.2 * load / 2.0

    g = TaskGraph()
    tp = g.stream("p0.s0.compute")
    g.add("F", "F", tp, 1.0)
    host = [SharedCores({tp: 2.0}, k)]
    out = list_schedule(g, shared=host, cpu_share=[1.0], in_situ=[(0.25, 2.0)])
    assert out.end[0] == pytest.approx(0.25 + 0.75 * k(2.0))
    twice = list_schedule(g, shared=host, cpu_share=[1.0])  # as before: all of it at k(2)
    assert twice.end[0] == pytest.approx(k(2.0))
    other = g.stream("p1.s0.compute")
    g.add("G", "F", other, 10.0)
    host = [SharedCores({tp: 2.0, other: 1.0}, k)]
    both = list_schedule(g, shared=host, cpu_share=[1.0, 1.0],
                         in_situ=[(0.25, 2.0), (0.0, 1.0)])
    assert both.end[0] == pytest.approx(0.25 * k(3.0) / k(2.0) + 0.75 * k(3.0))


def test_a_slower_replica_is_not_told_as_data_parallel_communication():
    """GB200 NVL72 racks of 72 GPUs: of four tp-32 replicas, the third spans two racks and
    runs its tp collectives over the NICs. The gradient reduction waits for it; the
    breakdown follows that replica's stage (its tp traffic), not the first replica's idle
    wait before the reduction, which it reported as 'dp comm' (0.10 of 0.30 s)."""
    plan = homogeneous_plan(preset("llama2-7b"), parse_gpus_arg("GB200-186GB:128"),
                            ParallelConfig(tp=32, dp=4, mbs=1, gbs=16, seq_len=1024))
    r = simulate(plan)
    b = r.breakdown
    parts = (b.compute_s + b.host_overhead_s + b.tp_comm_s + b.cp_comm_s + b.pp_comm_s
             + b.dp_comm_s + b.bubble_s + b.optimizer_s + b.ep_comm_s)
    assert parts == pytest.approx(r.iteration_time_s)
    assert b.tp_comm_s > 0.5 * r.iteration_time_s
    assert b.dp_comm_s < 0.05 * r.iteration_time_s


def test_rescheduling_with_the_priced_times_gives_the_same_schedule_and_longer_ones_a_longer():
    """`build.rescheduled`: the simulation's graph scheduled again with other task times,
    under the same host sharing (a CPU pipeline on its profile: the shared-core
    scheduler); the priced times give the simulation's own schedule back."""
    import os

    from planner.simulator.build import rescheduled
    from planner.specs.cluster import load_cluster
    from planner.specs.model import preset
    from planner.specs.plan import Communication, Kernels
    from profiler.store import load_profiles

    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    profiles = load_profiles([os.path.join(root, "benchmarks", "results",
                                           "profiles-debug-small-2026-12-05T1511")],
                             devices=["CPU"], dtype="fp32")
    cfg = ParallelConfig(pp=2, vp=2, mbs=8, gbs=32, seq_len=64, dtype="fp32",
                         schedule="interleaved-1f1b",
                         comm=Communication.preset("trainplan", dtype="fp32"))
    plan = homogeneous_plan(preset("debug-small"),
                            load_cluster(os.path.join(root, "cluster_specs", "local-cpu.yaml")),
                            cfg, kernels=Kernels(attention="flash", optimizer="fused"))
    sim = simulate_graph(plan, profiles=profiles)
    assert sim.host_load is not None and sim.host_load.hosts  # cores shared
    same = rescheduled(sim, list(sim.graph.durations))
    assert same.end == sim.schedule.end
    longer = [d * (2.0 if k == "F" else 1.0) for d, k in zip(sim.graph.durations,
                                                             sim.graph.kinds, strict=True)]
    assert max(rescheduled(sim, longer).end) > max(sim.schedule.end) * 1.2
    assert rescheduled(sim, list(sim.graph.durations)).end == sim.schedule.end
    with pytest.raises(ValueError, match="durations"):
        rescheduled(sim, [1.0])


def test_the_order_of_unlike_replicas_changes_nothing():
    """Replicas of unlike tp reduce their gradients together, each rank its share: an H100
    replica at tp 1 holds twice an A100 tp-2 rank's. The reduction took the first
    replica's time, so the same plan with its replicas listed the other way round was
    simulated 11% faster (gpt3-1.3b, 8 H100 and 4 A100 replicas: 0.191 s, 0.170 s). It
    lasts as long as its slowest member's share, whatever the order."""
    from planner.specs.plan import Sharding
    from tests.planner.simulator_helpers import h100_beside_a100

    plan = h100_beside_a100(a100_replicas=4, h100_microbatches=3, a100_microbatches=2,
                            sharding=Sharding(optim=12))
    reversed_plan = dataclasses.replace(plan, pipelines=plan.pipelines[::-1])
    forward, backward = simulate(plan), simulate(reversed_plan)
    assert forward.iteration_time_s == pytest.approx(backward.iteration_time_s, rel=1e-9)
    assert forward.breakdown.dp_comm_s == pytest.approx(backward.breakdown.dp_comm_s, rel=1e-9)
