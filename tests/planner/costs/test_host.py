"""Host-side costs (issue 17): profile rows of kind "host" priced on the right stream —
FSDP2's units blocking the compute thread one by one, DTensor's per-block cost on the
compute stream, CPU ranks sharing a host slowed only while they compute at once — and the
analytic defaults (with their source) where a profile has none."""

import dataclasses

import pytest

from planner.costs.host import (
    HOST_ANALYTIC_GPU_SOURCE,
    HOST_ANALYTIC_SOURCE,
    at_size,
    collective_cpu_share,
    fsdp_root_s,
    fsdp_unit_s,
    host_families,
    host_source,
    launch_s,
    optimizer_shared,
    p2p_host_s,
    shared_cores,
    sync_skew,
)
from planner.costs.stages import cost_sources, plan_costs
from planner.simulator import simulate, simulate_detailed
from planner.simulator.build import _chunk_parts, shared_hosts, simulate_graph
from planner.simulator.graph import schedule
from planner.specs.cluster import load_cluster, parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Communication, Kernels, PipelineP2P, Sharding
from profiler.devices import device
from profiler.store import (
    PROFILE_SCHEMA_VERSION,
    ProfileMeta,
    ProfileRow,
    Profiles,
    load_profile,
    save_profile,
)

CPU = load_cluster("cluster_specs/local-cpu.yaml")
SMALL = preset("debug-small")
META = ProfileMeta(schema_version=PROFILE_SCHEMA_VERSION, device="CPU", device_detail="test cpu",
                   dtype="fp32", torch_version="2.13.0", host="h", created="2026-01-01T00:00:00Z",
                   num_threads=1, warmup=3, repeats=15, world_size=2)


def _host(name, t, variant="gloo", ranks=2, size=0):
    return ProfileRow(kind="host", name=name, variant=variant, shape=(size,), flops=0.0,
                      bytes=float(size), ranks=ranks, time_s=t, p10_s=t, p90_s=t, samples=9,
                      calls=1)


def _collectives(ranks=2):
    return tuple(ProfileRow(kind="collective", name=kind, shape=(size,), flops=0.0,
                            bytes=float(size), ranks=ranks, time_s=1e-4 + size / 1e9,
                            p10_s=1e-4 + size / 1e9, p90_s=1e-4 + size / 1e9, samples=9,
                            calls=1)
                 for kind in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
                 for size in (1024, 1 << 20, 8 << 20))


HOST = (_host("fsdp_unit_forward", 4e-4), _host("fsdp_unit_backward", 6e-4),
        _host("dtensor_layer_forward", 1e-3, variant="gloo"),
        _host("dtensor_layer_backward", 2e-3, variant="gloo"),
        _host("dtensor_root_forward", 3e-3, variant="gloo"),
        _host("dtensor_root_backward", 4e-3, variant="gloo"),
        _host("dispatch_forward", 5e-6, variant=None, ranks=1))


def _profiles(tmp_path, rows, name="p.csv"):
    path = str(tmp_path / name)
    save_profile(path, META, rows)
    return Profiles((("CPU", load_profile(path)),))


def _plan(**knobs):
    cfg = ParallelConfig(seq_len=64, dtype="fp32", mbs=8, **knobs)
    return homogeneous_plan(SMALL, CPU, cfg, kernels=Kernels(attention="flash",
                                                              optimizer="fused"))


def test_a_profile_without_host_rows_loads_and_answers_none(tmp_path):
    old = _profiles(tmp_path, _collectives()).get("CPU")
    assert old.host_rows == () and old.host_s("fsdp_unit_forward", variant="gloo") is None
    assert fsdp_unit_s(device("CPU"), old, 2) is None
    new = _profiles(tmp_path, _collectives() + HOST, "new.csv").get("CPU")
    assert new.op_rows == ()  # host rows are not op rows (a collective profile stays one)
    assert new.host_s("fsdp_unit_forward", variant="gloo", ranks=2) == 4e-4
    assert new.host_s("fsdp_unit_forward", variant="gloo", ranks=4) == 4e-4  # nearest size
    assert new.host_s("fsdp_unit_forward", variant="nccl") is None


def test_dispatch_is_in_each_cpu_op_but_issues_gpu_kernels(tmp_path):
    profile = _profiles(tmp_path, HOST).get("CPU")
    assert launch_s(device("CPU"), profile) == 0.0  # the CPU runs each op as it dispatches
    gpu = device("A100-80GB-SXM")
    assert launch_s(gpu, profile) == 5e-6
    assert launch_s(gpu, None) > 0.0  # the catalog's launch overhead


def test_fsdp2_units_block_the_compute_thread_where_measured(tmp_path):
    plan = _plan(dp=2, gbs=16, sharding=Sharding(params=2, grads=2, optim=2))
    bare = _profiles(tmp_path, _collectives())
    measured = _profiles(tmp_path, _collectives() + HOST, "host.csv")
    before = plan_costs(plan, bare).costs[0][0].dp
    after = plan_costs(plan, measured).costs[0][0].dp
    # a framework's units: a block each, the embedding and the head (torchtitan); the
    # executor's FSDP2 measured here: a block each and the root holding the rest
    assert before.gather_units == SMALL.num_layers + 2
    units = SMALL.num_layers + 1
    assert after.gather_units == units
    assert before.prefetch >= 1 and after.prefetch == 0  # no gather runs ahead
    assert after.grad_microbatch_s == 0.0  # the reduce-scatters are held by the backward
    piece = 4 * plan_costs(plan, None).costs[0][0].num_params / units
    profile = measured.get("CPU")
    assert after.param_microbatch_s == pytest.approx(units * (
        2 * profile.collective_time_s("all_gather", piece, 2)
        + profile.collective_time_s("reduce_scatter", piece, 2) + 4e-4 + 6e-4), rel=1e-6)
    slower = simulate(plan, profiles=measured).iteration_time_s
    assert slower > simulate(plan, profiles=bare).iteration_time_s + units * 1e-3 * 0.99
    # ZeRO-1 runs on flat buffers, not FSDP2: unchanged
    zero1 = _plan(dp=2, gbs=16, sharding=Sharding(optim=2))
    assert plan_costs(zero1, measured).costs[0][0].dp == plan_costs(zero1, bare).costs[0][0].dp


def test_whole_fsdp2_units_pay_their_collectives_at_the_profiles_own_price(tmp_path):
    """A unit measured with its collectives in (`fsdp_unit_total_*`, from 2026-12-04) is
    priced as measured where the plan's units have the measured size: the profile's price
    of the gathers and reduce-scatter it takes out is the price it adds back, whatever a
    noisy collective row says (a bimodal gloo gather put up to 1 ms a unit between a
    gather timed alone and the collective rows, profiler/hostcost.py)."""
    unit_bytes = 1 << 20
    fwd, bwd = 3e-3, 7e-3
    whole = (_host("fsdp_unit_total_forward", fwd, size=unit_bytes),
             _host("fsdp_unit_total_backward", bwd, size=unit_bytes))
    plan = _plan(dp=2, gbs=16, sharding=Sharding(params=2, grads=2, optim=2))
    units = SMALL.num_layers + 1  # the executor's: a block each and the root
    params = plan_costs(plan, None).costs[0][0].num_params
    for slow in (0.5, 2.0, 4.0):  # the collective rows measured fast, or slower
        rows = tuple(dataclasses.replace(r, time_s=r.time_s * slow, p10_s=r.p10_s * slow,
                                         p90_s=r.p90_s * slow) for r in _collectives())
        profiles = _profiles(tmp_path, rows + whole, f"whole{slow}.csv")
        dp = plan_costs(plan, profiles).costs[0][0].dp
        assert dp.prefetch == 0 and dp.grad_microbatch_s == 0.0
        profile = profiles.get("CPU")
        gather = profile.collective_time_s("all_gather", unit_bytes, 2)
        scatter = profile.collective_time_s("reduce_scatter", unit_bytes, 2)
        assert fsdp_unit_s(device("CPU"), profile, 2).comm_bytes == unit_bytes
        plan_gather = profile.collective_time_s("all_gather", 4 * params / units, 2)
        plan_scatter = profile.collective_time_s("reduce_scatter", 4 * params / units, 2)
        # per unit: the plan's own collectives plus the measured unit less those at its
        # size, never less than nothing (at 4x the collectives outprice the whole unit)
        assert dp.param_microbatch_s == pytest.approx(units * (
            2 * plan_gather + plan_scatter + max(0.0, fwd - gather)
            + max(0.0, bwd - gather - scatter)), rel=1e-6)
        if slow == 4.0:
            assert fwd < gather and bwd < gather + scatter  # the clamp was exercised


def test_dtensor_costs_each_tp_block_and_the_root(tmp_path):
    bare = _profiles(tmp_path, _collectives())
    measured = _profiles(tmp_path, _collectives() + HOST, "host.csv")
    tp2 = _plan(tp=2, gbs=8)
    b, a = plan_costs(tp2, bare).costs[0][0], plan_costs(tp2, measured).costs[0][0]
    assert a.layer_forward.host_s - b.layer_forward.host_s == pytest.approx(1e-3)
    assert a.layer_backward.host_s - b.layer_backward.host_s == pytest.approx(2e-3)
    assert a.head_forward.host_s - b.head_forward.host_s == pytest.approx(3e-3)
    assert a.forward_s - b.forward_s == pytest.approx(SMALL.num_layers * 1e-3 + 3e-3)
    # sequence parallelism measured apart: no "+sp" rows, no cost
    sp = _plan(tp=2, gbs=8, sequence_parallel=True)
    assert plan_costs(sp, measured).costs[0][0].forward_s == \
        pytest.approx(plan_costs(sp, bare).costs[0][0].forward_s)
    dp2 = _plan(dp=2, gbs=16)  # no tp: no DTensor
    assert plan_costs(dp2, measured).costs[0][0].forward_s == \
        pytest.approx(plan_costs(dp2, bare).costs[0][0].forward_s)


def test_whole_dtensor_blocks_pay_their_tp_collectives_at_the_profiles_own_price(tmp_path):
    """A tp block measured with its two tp collectives a pass in (`dtensor_layer_total_*`,
    from 2026-12-04): the block's host time is the measurement less those collectives at
    the profile's price for the measured size (all-reduces; with sequence parallelism an
    all-gather and a reduce-scatter each), never below nothing."""
    act = 4096
    rows = _collectives() + tuple(
        _host(f"dtensor_layer_total_{p}", t, variant=v, size=act)
        for v, ts in (("gloo", (3e-3, 5e-3)), ("gloo+sp", (1e-4, 9e-3)))
        for p, t in zip(("forward", "backward"), ts, strict=True))
    profiles = _profiles(tmp_path, rows, "whole.csv")
    bare = _profiles(tmp_path, _collectives())
    profile = profiles.get("CPU")
    price = {k: profile.collective_time_s(k, act, 2)
             for k in ("all_reduce", "all_gather", "reduce_scatter")}
    for sp, (fwd, bwd), comm in ((False, (3e-3, 5e-3), 2 * price["all_reduce"]),
                                 (True, (1e-4, 9e-3),
                                  2 * (price["all_gather"] + price["reduce_scatter"]))):
        plan = _plan(tp=2, gbs=8, sequence_parallel=sp)
        a, b = plan_costs(plan, profiles).costs[0][0], plan_costs(plan, bare).costs[0][0]
        assert a.layer_forward.host_s - b.layer_forward.host_s == \
            pytest.approx(max(0.0, fwd - comm))
        assert a.layer_backward.host_s - b.layer_backward.host_s == \
            pytest.approx(max(0.0, bwd - comm))
    assert 1e-4 < 2 * (price["all_gather"] + price["reduce_scatter"])  # the floor was met


def test_the_sources_say_what_priced_the_host_costs(tmp_path):
    plan = _plan(dp=2, gbs=16)
    assert cost_sources(plan, None)["host"] == HOST_ANALYTIC_SOURCE
    assert cost_sources(plan, _profiles(tmp_path, _collectives()))["host"] == \
        HOST_ANALYTIC_SOURCE
    measured = _profiles(tmp_path, _collectives() + HOST, "host.csv")
    tp = cost_sources(_plan(tp=2, gbs=8), measured)["host"]
    assert tp.startswith(f"measured host costs {tmp_path / 'host.csv'} (DTensor layers")
    # only the rows that price the plan are named: a dp-2 plan uses neither FSDP2 nor
    # DTensor, and on the CPU the dispatch is inside each op's time (a one-rank plan was
    # told its host costs came from a collectives profile it never used: profile sweep)
    named = tp.split(f"; {HOST_ANALYTIC_SOURCE}")[0]
    assert "FSDP2" not in named and "dispatch" not in named
    assert cost_sources(plan, measured)["host"] == HOST_ANALYTIC_SOURCE
    zero3 = cost_sources(_plan(dp=2, gbs=16, sharding=Sharding(params=2, grads=2, optim=2)), measured)["host"]
    assert "FSDP2 units" in zero3 and "DTensor" not in zero3.split(f"; {HOST_ANALYTIC_SOURCE}")[0]


def test_a_gpu_plan_names_only_the_gpu_host_defaults():
    """A plan on GPUs only names the defaults that price it (the catalog's launch overhead),
    not the CPU ranks' (`make demo` printed "CPU ranks compute as fast as one process
    alone" for GPT-3 on Selene)."""
    plan = homogeneous_plan(preset("debug-small"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_len=64))
    host = cost_sources(plan, None)["host"]
    assert host == HOST_ANALYTIC_GPU_SOURCE and "CPU" not in host


def test_old_profile_rows_are_read_unchanged(tmp_path):
    """A profile written before host rows existed reads back exactly."""
    rows = _collectives()
    profile = _profiles(tmp_path, rows).get("CPU")
    assert profile.rows == rows
    assert dataclasses.replace(profile, rows=rows + HOST).host_rows == HOST


def _shared(*seconds: float) -> tuple:
    """`gemm_shared` rows: a GEMM's seconds with 1, 2, ... ranks computing at once."""
    return tuple(_host("gemm_shared", t, variant=None, ranks=n)
                 for n, t in enumerate(seconds, start=1))


def test_the_shared_core_slowdown_is_the_measured_ratio_per_rank_count(tmp_path):
    profile = _profiles(tmp_path, _collectives() + _shared(1e-3, 1.2e-3, 1.5e-3, 2.2e-3)).get("CPU")
    k = shared_cores(device("CPU"), profile)
    assert k is not None and k.measured == pytest.approx((1.0, 1.2, 1.5, 2.2))
    assert k(0.5) == k(1.0) == 1.0
    assert k(2.5) == pytest.approx(1.35)  # between the measured counts
    assert k(8.0) == pytest.approx(2.2 * 2)  # beyond: a fair share of 4 ranks' throughput
    assert shared_cores(device("A100-80GB-SXM"), profile) is None  # GPUs share no compute
    # noise is never a speed-up: at least 1, never less for more ranks
    noisy = _profiles(tmp_path, _shared(1e-3, 0.9e-3, 1.4e-3, 1.3e-3), "noisy.csv").get("CPU")
    assert shared_cores(device("CPU"), noisy).measured == pytest.approx((1.0, 1.0, 1.4, 1.4))
    assert shared_cores(device("CPU"), _profiles(tmp_path, _collectives(), "bare.csv")
                        .get("CPU")) is None
    # bursts of other load in some samples (the medians) are not the host's own sharing
    bursts = (dataclasses.replace(_host("gemm_shared", 1e-3, variant=None, ranks=1),
                                  time_s=1.1e-3, p90_s=1.1e-3),
              dataclasses.replace(_host("gemm_shared", 1.1e-3, variant=None, ranks=2),
                                  time_s=2e-3, p90_s=2e-3))
    k = shared_cores(device("CPU"), _profiles(tmp_path, bursts, "bursts.csv").get("CPU"))
    assert k.measured == pytest.approx((1.0, 1.1))
    # two measurements (2 and 4 processes), one of them beside a busy core: the least
    busy = _shared(1e-3, 2e-3, 3e-3, 4e-3) + _shared(1.05e-3, 1.2e-3)
    k = shared_cores(device("CPU"), _profiles(tmp_path, busy, "busy.csv").get("CPU"))
    assert k.measured == pytest.approx((1.0, 1.2, 3.0, 4.0))


def _pass_shared(size, *seconds):
    """`pass_shared` rows: the model's pass, at activation `size`, with 1, 2, ... ranks."""
    return tuple(_host("pass_shared", t, variant=None, ranks=n, size=size)
                 for n, t in enumerate(seconds, start=1))


def test_the_models_own_pass_prices_the_sharing_where_the_profile_measured_it(tmp_path):
    """A pass slows more than a GEMM in cache while other ranks compute (its memory-bound
    ops share the memory bandwidth and cache): where the profile timed the model's own
    pass (`pass_shared`), its ratio is the slowdown, at the measured activation size
    nearest the plan's (the largest without one); the GEMM's otherwise."""
    gemm = _shared(1e-3, 1.01e-3)
    rows = gemm + _pass_shared(1 << 16, 8e-3, 8.64e-3) + _pass_shared(1 << 20, 0.1, 0.104)
    profile = _profiles(tmp_path, _collectives() + rows).get("CPU")
    cpu = device("CPU")
    assert shared_cores(cpu, profile, 1 << 15).measured == pytest.approx((1.0, 1.08))
    assert shared_cores(cpu, profile, 1 << 17).measured == pytest.approx((1.0, 1.08))
    assert shared_cores(cpu, profile, 1 << 19).measured == pytest.approx((1.0, 1.04))
    assert shared_cores(cpu, profile, 1 << 24).measured == pytest.approx((1.0, 1.04))
    assert shared_cores(cpu, profile).measured == pytest.approx((1.0, 1.04))
    only_gemm = _profiles(tmp_path, _collectives() + gemm, "gemm.csv").get("CPU")
    assert shared_cores(cpu, only_gemm, 1 << 17).measured == pytest.approx((1.0, 1.01))
    # a dp2 plan is priced with the pass's slowdown, and says it measured it
    dp2 = _plan(dp=2, gbs=16)
    by_gemm = simulate(dp2, profiles=_profiles(tmp_path, _collectives() + gemm, "g.csv"))
    by_pass = simulate(dp2, profiles=_profiles(tmp_path, _collectives() + gemm
                                               + _pass_shared(1 << 18, 1e-2, 1.2e-2), "p.csv"))
    compute = by_gemm.breakdown.compute_s + by_gemm.breakdown.host_overhead_s
    assert by_pass.iteration_time_s == pytest.approx(by_gemm.iteration_time_s
                                                     + (1.2 - 1.01) * compute, rel=0.02)
    families = host_families(gpus=False, cpu_ranks=2, fsdp=False, tp=False)
    said = host_source(_profiles(tmp_path, _collectives() + gemm
                                 + _pass_shared(1 << 18, 1e-2, 1.2e-2), "s.csv"),
                       {"CPU"}, families=families)
    assert "measured on the model's own pass" in said
    assert "compute at once;" not in said and "compute at once)" not in said


def test_cpu_ranks_are_slowed_only_while_they_compute_at_once(tmp_path):
    """dp ranks compute side by side the whole step: their compute is slowed by k(2);
    two pipeline stages compute partly in turn (fill, drain, waits for the other stage):
    slowed by less; one rank alone on its host: not at all."""
    bare = _profiles(tmp_path, _collectives())
    measured = _profiles(tmp_path, _collectives() + _shared(1e-3, 1.25e-3), "share.csv")
    dp2 = _plan(dp=2, gbs=16)
    before, after = simulate(dp2, profiles=bare), simulate(dp2, profiles=measured)
    compute = before.breakdown.compute_s + before.breakdown.host_overhead_s
    assert after.iteration_time_s == pytest.approx(before.iteration_time_s + 0.25 * compute,
                                                   rel=0.02)
    assert plan_costs(dp2, measured).costs == plan_costs(dp2, bare).costs  # costs unchanged
    pp2 = _plan(pp=2, gbs=32)
    slower = simulate(pp2, profiles=measured).iteration_time_s
    alone = simulate(pp2, profiles=bare).iteration_time_s
    assert alone < slower < 1.2 * alone
    cfg = ParallelConfig(seq_len=64, dtype="fp32", mbs=8, gbs=8)
    one = homogeneous_plan(SMALL, CPU.take(1), cfg, kernels=Kernels(attention="flash",
                                                                     optimizer="fused"))
    assert simulate(one, profiles=measured).iteration_time_s == \
        simulate(one, profiles=bare).iteration_time_s


def _optimizer_shared(params, *seconds):
    """`optimizer_shared` rows: a step over `params` parameters with 1, 2, ... ranks
    stepping at once."""
    return tuple(_host("optimizer_shared", t, variant=None, ranks=n, size=16 * params)
                 for n, t in enumerate(seconds, start=1))


def test_ranks_stepping_at_once_share_the_hosts_memory_bandwidth(tmp_path):
    """The optimizer step streams its states through memory: where the profile timed it
    with n ranks stepping at once (`optimizer_shared`), a dp2 plan's two ranks, which
    step together after the reduction, take the measured ratio longer for it, at the
    measured size nearest the step (16 bytes a parameter); the passes keep their own
    slowdown, and one rank alone steps as measured alone."""
    cpu = device("CPU")
    rows = (_optimizer_shared(400_000, 1e-3, 1.02e-3)
            + _optimizer_shared(25_000_000, 15e-3, 25.5e-3))
    profile = _profiles(tmp_path, _collectives() + rows).get("CPU")
    assert optimizer_shared(cpu, profile, 800_000).measured == pytest.approx((1.0, 1.02))
    assert optimizer_shared(cpu, profile, 20e6).measured == pytest.approx((1.0, 1.7))
    assert optimizer_shared(device("A100-80GB-SXM"), profile, 20e6) is None
    assert optimizer_shared(cpu, _profiles(tmp_path, _collectives(), "bare.csv").get("CPU"),
                            20e6) is None
    dp2 = _plan(dp=2, gbs=16)
    params = SMALL.num_params()
    base = _collectives() + _shared(1e-3, 1.1e-3)
    without = _profiles(tmp_path, base, "without.csv")
    streaming = _profiles(tmp_path, base + _optimizer_shared(params, 1e-3, 1.7e-3), "with.csv")
    step = plan_costs(dp2, without).costs[0][0].optimizer_s
    assert step > 0
    assert simulate(dp2, profiles=streaming).iteration_time_s == pytest.approx(
        simulate(dp2, profiles=without).iteration_time_s + (1.7 - 1.1) * step, rel=1e-3)
    families = host_families(gpus=False, cpu_ranks=2, fsdp=False, tp=False)
    assert "memory bandwidth while they step at once" in host_source(streaming, {"CPU"},
                                                                     families=families)
    cfg = ParallelConfig(seq_len=64, dtype="fp32", mbs=8, gbs=8)
    one = homogeneous_plan(SMALL, CPU.take(1), cfg, kernels=Kernels(attention="flash",
                                                                     optimizer="fused"))
    assert simulate(one, profiles=streaming).iteration_time_s == \
        simulate(one, profiles=without).iteration_time_s


def _blocking(plan):
    """`plan` with DeepSpeed's blocking pipeline sends."""
    return dataclasses.replace(plan, training=dataclasses.replace(
        plan.training, comm=Communication(pipeline_p2p=PipelineP2P.BLOCKING)))


def test_a_pipeline_sends_receiver_on_the_same_host_is_counted_busy(tmp_path):
    """A batched send (the executor's isend / irecv) is one task on the sender's stream;
    its receiving stage's ranks, on the same host, are busy for the same share of it
    (`cpu.send_recv` halves a ping-pong, each rank sending once and receiving once), so
    the shared-host load counts them (`peer_ranks`); a blocking receive (DeepSpeed) is its
    own task on the receiver's compute stream and adds nothing."""
    profiles = _profiles(tmp_path, _collectives() + _cpu_rows(0.5) + _shared(1e-3, 1.1e-3))
    pp2 = _plan(pp=2, gbs=32)
    blocking = _blocking(pp2)
    for plan, receivers in ((pp2, 1.0), (blocking, 0.0)):
        g = simulate_graph(plan, profiles=profiles).graph
        load = shared_hosts(plan, plan_costs(plan, profiles), g, profiles)
        sends = [t for t in range(len(g)) if g.kinds[t] == "send"]
        assert sends and all(load.peer_ranks[t] == receivers for t in sends)
        assert all(load.cpu_share[t] > 0 for t in sends)
        assert not any(load.peer_ranks[t] for t in range(len(g)) if g.kinds[t] != "send")
    # the passes beside the sends see both ends busy: the step is longer than with the
    # sender alone counted
    g = simulate_graph(pp2, profiles=profiles)
    load = shared_hosts(pp2, plan_costs(pp2, profiles), g.graph, profiles)
    kw = dict(shared=load.hosts, cpu_share=load.cpu_share, ref_load=load.ref_load,
              in_situ=load.in_situ, own_slowdown=load.own_slowdown)
    assert max(schedule(g.graph, **kw, peer_ranks=load.peer_ranks).end) > \
        max(schedule(g.graph, **kw).end)


def _p2p_rows(send_s, recv_s):
    """`p2p_send` / `p2p_recv` rows at two message sizes (the larger twice as dear)."""
    return tuple(_host(name, t * k, size=size) for name, t in (("p2p_send", send_s),
                                                                ("p2p_recv", recv_s))
                 for size, k in ((4096, 1.0), (1 << 22, 2.0)))


def test_a_pipeline_pass_holds_its_compute_thread_for_its_sends_and_receives(tmp_path):
    """The executor's batched isend / irecv are called by the thread that computes: a
    forward takes its input (but on the model's first chunk) and sends its output (but
    on the last), a backward the reverse, each at the measured `p2p_send` / `p2p_recv`
    cost at the message's size; a blocking receive (DeepSpeed) is its own task, and one
    stage, or a GPU, has none."""
    bare = _profiles(tmp_path, _collectives())
    measured = _profiles(tmp_path, _collectives() + _p2p_rows(1e-4, 3e-4), "p2p.csv")
    pp2 = _plan(pp=2, gbs=32)
    cost, with_calls = (plan_costs(pp2, p).costs[0] for p in (bare, measured))
    size = SMALL.hidden_size * 8 * 64 * 4  # a micro-batch's activation, fp32
    assert cost[0].p2p_transfer.size_bytes == size
    share = (size - 4096) / ((1 << 22) - 4096)
    send_s, recv_s = 1e-4 * (1 + share), 3e-4 * (1 + share)
    assert p2p_host_s(device("CPU"), measured.get("CPU"), size) == pytest.approx(
        (send_s, recv_s))
    assert p2p_host_s(device("A100-80GB-SXM"), measured.get("CPU"), size) == (0.0, 0.0)
    for si, (sends, takes) in enumerate(((1, 0), (0, 1))):  # stage 0 sends, stage 1 takes
        plain = _chunk_parts(cost[si], 0, 1, si == 1, False, first_stage=si == 0)
        calls = _chunk_parts(with_calls[si], 0, 1, si == 1, False, first_stage=si == 0)
        assert calls["F"].total_s - plain["F"].total_s == pytest.approx(
            sends * send_s + takes * recv_s)
        assert calls["B"].total_s - plain["B"].total_s == pytest.approx(
            sends * recv_s + takes * send_s)
    before = simulate(pp2, profiles=bare).iteration_time_s
    assert simulate(pp2, profiles=measured).iteration_time_s > before + 4 * (send_s + recv_s)
    blocking = _blocking(pp2)
    assert simulate(blocking, profiles=measured).iteration_time_s == \
        simulate(blocking, profiles=bare).iteration_time_s
    dp2 = _plan(dp=2, gbs=16)
    assert simulate(dp2, profiles=measured).iteration_time_s == \
        simulate(dp2, profiles=bare).iteration_time_s
    said = cost_sources(pp2, measured)["host"]
    assert "pipeline sends and receives" in said
    assert "pipeline sends" not in cost_sources(dp2, measured)["host"]


def test_the_estimate_prices_a_passs_transfer_calls_as_the_simulation_does(tmp_path):
    """`--method estimate` (and the search's ranking) counts the compute thread's part of
    each batched transfer too: each stage of a 2-stage pipeline sends one and takes one
    per micro-batch, so with m micro-batches the pipeline's critical path (the first
    stage's fill, then the last stage's m micro-batches) grows by (m + 1) x (send +
    receive), as the event simulation has it; blocking sends and one stage are
    unchanged."""
    from planner.predict.estimate import estimate

    bare = _profiles(tmp_path, _collectives())
    measured = _profiles(tmp_path, _collectives() + _p2p_rows(1e-4, 3e-4), "p2p.csv")
    pp2 = _plan(pp=2, gbs=32)
    m = pp2.pipelines[0].num_microbatches
    send_s, recv_s = (p.total_s for p in (plan_costs(pp2, measured).costs[0][0].p2p_send_host,
                                         plan_costs(pp2, measured).costs[0][0].p2p_recv_host))
    assert send_s > 0 and recv_s > 0
    grown = estimate(pp2, profiles=measured).iteration_time_s - \
        estimate(pp2, profiles=bare).iteration_time_s
    assert grown == pytest.approx((m + 1) * (send_s + recv_s), rel=1e-6)
    simulated = simulate(pp2, profiles=measured).iteration_time_s - \
        simulate(pp2, profiles=bare).iteration_time_s
    assert grown == pytest.approx(simulated, rel=0.25)
    for plan in (_blocking(pp2), _plan(dp=2, gbs=16)):
        assert estimate(plan, profiles=measured).iteration_time_s == \
            estimate(plan, profiles=bare).iteration_time_s


def _cpu_rows(share, ranks=2):
    """`cpu.<collective>` rows: `share` of each `_collectives` row's time on the CPU."""
    return tuple(_host(f"cpu.{r.name}", share * r.time_s, ranks=ranks, size=int(r.bytes))
                 for r in _collectives(ranks))


def test_a_collective_cpu_share_is_the_median_measured_ratio(tmp_path):
    rows = _collectives() + _cpu_rows(0.6) + _collectives(4) + _cpu_rows(0.3, ranks=4)
    profile = _profiles(tmp_path, rows).get("CPU")
    assert collective_cpu_share(device("CPU"), profile, 2) == pytest.approx(0.6)
    assert collective_cpu_share(device("CPU"), profile, 4) == pytest.approx(0.3)
    assert collective_cpu_share(device("CPU"), profile, 3) == pytest.approx(0.6)  # nearest
    assert collective_cpu_share(device("CPU"), profile, 16) == pytest.approx(0.3)
    # never above 1 (threads beside the caller); none on GPUs or without the rows
    busy = _profiles(tmp_path, _collectives() + _cpu_rows(1.5), "busy.csv").get("CPU")
    assert collective_cpu_share(device("CPU"), busy, 2) == 1.0
    assert collective_cpu_share(device("A100-80GB-SXM"), profile, 2) is None
    bare = _profiles(tmp_path, _collectives(), "bare.csv").get("CPU")
    assert collective_cpu_share(device("CPU"), bare, 2) is None


def test_gloo_collectives_load_the_cores_the_ranks_compute_on(tmp_path):
    """ZeRO-3 on 2 CPU ranks: its gathers and reduce-scatters run on the ranks' cores
    (gloo), so where the profile measured their CPU share they slow the ranks computing
    meanwhile and are slowed by them; a share near 0 prices them as before, and costs are
    the same either way (the schedule moves, not the ops)."""
    shared = _collectives() + _shared(1e-3, 1.6e-3)
    plan = _plan(dp=2, gbs=16, sharding=Sharding(params=2, grads=2, optim=2))
    before = simulate(plan, profiles=_profiles(tmp_path, shared)).iteration_time_s
    idle = simulate(plan, profiles=_profiles(tmp_path, shared + _cpu_rows(1e-6), "idle.csv"))
    assert idle.iteration_time_s == pytest.approx(before, rel=1e-5)
    busy = _profiles(tmp_path, shared + _cpu_rows(0.7), "busy.csv")
    after = simulate(plan, profiles=busy).iteration_time_s
    assert after > before * 1.01
    assert plan_costs(plan, busy).costs == plan_costs(plan, _profiles(tmp_path, shared)).costs
    # one rank alone on its host shares nothing
    cfg = ParallelConfig(seq_len=64, dtype="fp32", mbs=8, gbs=8)
    one = homogeneous_plan(SMALL, CPU.take(1), cfg, kernels=Kernels(attention="flash",
                                                                     optimizer="fused"))
    assert simulate(one, profiles=busy).iteration_time_s == \
        simulate(one, profiles=_profiles(tmp_path, shared)).iteration_time_s


def _skew(lateness_per_s, floor=2e-4, ranks=2):
    """`arrival_skew` / `arrival_segment` rows: the last rank `floor` + `lateness_per_s`
    x the segment late after segments of 3, 11 and 45 ms."""
    rows = []
    for calls, seconds in ((8, 3e-3), (32, 11e-3), (128, 45e-3)):
        rows += [_host("arrival_segment", seconds, variant=None, ranks=ranks, size=calls),
                 _host("arrival_skew", floor + lateness_per_s * seconds, variant=None,
                       ranks=ranks, size=calls)]
    return tuple(rows)


def test_the_lateness_of_the_slowest_rank_is_the_slope_over_the_segment(tmp_path):
    """Hoefler et al. 2010: a collective waits for its last rank, whose lateness grows
    with the compute before it; the intercept (a collective's own wake-up) is left to
    the collective rows."""
    profile = _profiles(tmp_path, _collectives() + _skew(0.04) + _skew(0.09, ranks=4)
                        ).get("CPU")
    assert sync_skew(device("CPU"), profile, 2) == pytest.approx(0.04)
    assert sync_skew(device("CPU"), profile, 4) == pytest.approx(0.09)
    assert sync_skew(device("CPU"), profile, 3) == pytest.approx(0.04)  # the nearest, lower
    assert sync_skew(device("CPU"), profile, 1) is None  # nobody to wait for
    assert sync_skew(device("A100-80GB-SXM"), profile, 2) is None
    assert sync_skew(device("CPU"), _profiles(tmp_path, _collectives(), "bare.csv")
                     .get("CPU"), 2) is None
    noisy = _profiles(tmp_path, _skew(-0.01, floor=1e-3), "noisy.csv").get("CPU")
    assert sync_skew(device("CPU"), noisy, 2) == 0.0  # noise is not a speed-up


def test_ranks_in_step_compute_at_the_pace_of_the_slowest(tmp_path):
    """dp and tp ranks synchronise every step: their passes are longer by the measured
    lateness per second of compute; one rank alone, and pipeline stages that are each one
    rank, wait for no peer's lateness (their sends are priced by the schedule)."""
    bare = _profiles(tmp_path, _collectives())
    late = _profiles(tmp_path, _collectives() + _skew(0.05), "late.csv")
    for plan in (_plan(dp=2, gbs=16), _plan(tp=2, gbs=8)):
        before, after = simulate(plan, profiles=bare), simulate(plan, profiles=late)
        compute = before.breakdown.compute_s + before.breakdown.host_overhead_s
        assert after.iteration_time_s == pytest.approx(before.iteration_time_s + 0.05 * compute,
                                                       rel=0.02)
        assert after.breakdown.compute_s == pytest.approx(
            before.breakdown.compute_s + 0.05 * compute, rel=0.02)
        assert plan_costs(plan, late).costs == plan_costs(plan, bare).costs  # costs unchanged
    for plan in (_plan(pp=2, gbs=32),
                 homogeneous_plan(SMALL, CPU.take(1), ParallelConfig(seq_len=64, dtype="fp32",
                                                                     mbs=8, gbs=8),
                                  kernels=Kernels(attention="flash", optimizer="fused"))):
        assert simulate(plan, profiles=late).iteration_time_s == \
            simulate(plan, profiles=bare).iteration_time_s


@pytest.mark.parametrize("pp", [1, 2])
def test_the_runner_is_paid_once_per_micro_batch_pass_of_each_stage(tmp_path, pp):
    """The executor's runner per micro-batch (`runner_microbatch`, measured on this host)
    lengthens each stage's forward by its cost, so a single stage of m micro-batches by
    m x that; on GPUs it is not priced (the runner runs ahead of the device)."""
    runner = 2e-3
    base = _profiles(tmp_path, _collectives(), "base.csv")
    priced = _profiles(tmp_path, (*_collectives(),
                                  _host("runner_microbatch", runner, variant=None, ranks=1)))
    plan = _plan(pp=pp, gbs=32)
    m = plan.pipelines[0].num_microbatches
    for stage in range(pp):
        with_runner = plan_costs(plan, priced).costs[0][stage]
        without = plan_costs(plan, base).costs[0][stage]
        assert with_runner.forward_s - without.forward_s == pytest.approx(runner)
        assert with_runner.backward_s == pytest.approx(without.backward_s)
    if pp == 1:
        gained = (simulate(plan, profiles=priced).iteration_time_s
                  - simulate(plan, profiles=base).iteration_time_s)
        assert gained == pytest.approx(m * runner, rel=0.05)
    assert "the executor's runner per micro-batch" in cost_sources(plan, priced)["host"]
    h100 = homogeneous_plan(SMALL, parse_gpus_arg("H100-80GB-SXM:8"),
                            ParallelConfig(seq_len=64, mbs=8, gbs=32))
    from planner.costs.host import runner_microbatch_s

    assert runner_microbatch_s(device("H100-80GB-SXM"), priced.get("CPU")) == 0.0
    assert simulate(h100, profiles=priced).iteration_time_s == \
        simulate(h100, profiles=base).iteration_time_s


def test_at_size_is_linear_between_the_sizes_measured_and_the_ends_beyond():
    """`at_size`: a block measured at several activation sizes, read at the plan's."""
    rows = [_host("dtensor_layer_total_forward", t, size=s)
            for s, t in ((1000, 1e-3), (3000, 5e-3))]
    assert at_size(rows, 2000) == (2000, pytest.approx(3e-3))
    assert at_size(rows, 500) == (1000, 1e-3) and at_size(rows, 9000) == (3000, 5e-3)
    assert at_size(rows, None) == (1000, 1e-3) and at_size(rows[1:], 1000) == (3000, 5e-3)


def _tp_pass_s(cost, part):
    """A pass's DTensor machinery and tp collectives together."""
    p = getattr(cost, part)
    return p.host_s + p.tp_s


@pytest.mark.parametrize("sp", [False, True])
def test_a_tp_block_measured_at_the_plans_activation_stands_whole(tmp_path, sp):
    """DTensor's rows measured on the plan's own blocks at its activation size (a tp
    collective in a block costs more than one timed back to back): at that size the
    priced block (its host time and its tp collectives) is the measured one whole; at a
    size between two measured, the line between them; beyond the largest, the largest's
    with its collectives priced again at the plan's size. The embedding, head and loss
    (the root) alike, their own tp collectives taken out at the size measured. Before,
    the first row measured (the tiny block's) priced every plan."""
    v = "gloo+sp" if sp else "gloo"
    tiny, act = 4096, 8 * 64 * SMALL.hidden_size * 4  # mbs 8, seq 64, fp32
    totals = {tiny: (3e-3, 4e-3, 20e-3, 30e-3), act: (9e-3, 12e-3, 40e-3, 50e-3)}
    rows = _collectives() + tuple(
        _host(name, t, variant=v, size=size) for size, ts in totals.items()
        for name, t in zip(("dtensor_layer_total_forward", "dtensor_layer_total_backward",
                            "dtensor_root_forward", "dtensor_root_backward"), ts, strict=True))
    profiles = _profiles(tmp_path, rows)
    bare = _profiles(tmp_path, _collectives(), "bare.csv")

    def priced(mbs):
        plan = homogeneous_plan(SMALL, CPU, ParallelConfig(seq_len=64, dtype="fp32", mbs=mbs,
                                                           gbs=mbs, tp=2, sequence_parallel=sp),
                                kernels=Kernels(attention="flash", optimizer="fused"))
        a, b = plan_costs(plan, profiles).costs[0][0], plan_costs(plan, bare).costs[0][0]
        layer = (_tp_pass_s(a, "layer_forward") - b.layer_forward.host_s,
                 _tp_pass_s(a, "layer_backward") - b.layer_backward.host_s)
        root = tuple(_tp_pass_s(a, f"embed_{p}") + _tp_pass_s(a, f"head_{p}")
                     - getattr(b, f"head_{p}").host_s for p in ("forward", "backward"))
        return layer, root

    layer, root = priced(8)
    assert layer == pytest.approx(totals[act][:2]) and root == pytest.approx(totals[act][2:])
    share = (act / 2 - tiny) / (act - tiny)  # mbs 4: between the two
    layer, root = priced(4)
    line = [lo + share * (hi - lo) for lo, hi in zip(totals[tiny], totals[act], strict=True)]
    assert layer == pytest.approx(line[:2]) and root == pytest.approx(line[2:])
    profile = profiles.get("CPU")
    kinds = ("all_gather", "reduce_scatter") if sp else ("all_reduce",)

    def moved(size):  # a pass's two tp collectives at 2x the largest size against at it
        return 2 * sum(profile.collective_time_s(k, size, 2) for k in kinds)

    layer, _ = priced(16)
    assert layer == pytest.approx([t - moved(act) + moved(2 * act) for t in totals[act][:2]])


def test_dtensor_host_time_is_marked_as_measured_with_the_tp_ranks_at_once(tmp_path):
    """DTensor's rows were timed on every tp rank at once: the block's and the root's
    DTensor seconds are marked (`Part.measured_shared_s`), so that the shared-core
    simulation does not slow them by the tp ranks' sharing a second time; ops measured by
    one process alone are not marked."""
    act = 8 * 64 * SMALL.hidden_size * 4
    rows = _collectives() + tuple(
        _host(name, t, variant="gloo", size=act)
        for name, t in zip(("dtensor_layer_total_forward", "dtensor_layer_total_backward",
                            "dtensor_root_forward", "dtensor_root_backward"),
                           (9e-3, 12e-3, 40e-3, 50e-3), strict=True))
    plan = homogeneous_plan(SMALL, CPU, ParallelConfig(seq_len=64, dtype="fp32", mbs=8, gbs=8,
                                                       tp=2),
                            kernels=Kernels(attention="flash", optimizer="fused"))
    cost = plan_costs(plan, _profiles(tmp_path, rows)).costs[0][0]
    bare = plan_costs(plan, _profiles(tmp_path, _collectives(), "bare.csv")).costs[0][0]
    for name in ("layer_forward", "layer_backward", "head_forward", "head_backward"):
        part = getattr(cost, name)
        assert 0.0 < part.measured_shared_s <= part.host_s
        assert part.measured_shared_s == pytest.approx(
            part.host_s - getattr(bare, name).host_s)
        assert getattr(bare, name).measured_shared_s == 0.0


def test_fsdp2_units_at_the_plans_block_size_and_the_root_apart(tmp_path):
    """The executor's FSDP2 (executor/fsdp.py) frames a chunk as a unit per block and the
    root holding the rest (embedding, final norm, head). The unit rows measured at several
    block sizes (the tiny preset's and the plan model's own) are read at the plan's block
    bytes; the root's rows price the root unit, which FSDP2 gathers once per step (the
    root's parameters stay gathered from forward to backward: torch FSDP2's root state
    has no post-forward reshard) and reduce-scatters once."""
    tiny_block, block, root = 4 * 49408, 4 * SMALL.params_per_layer(), 4 * 41216
    rows = (_host("fsdp_unit_total_forward", 1e-3, size=tiny_block),
            _host("fsdp_unit_total_backward", 2e-3, size=tiny_block),
            _host("fsdp_unit_total_forward", 3e-3, size=block),
            _host("fsdp_unit_total_backward", 7e-3, size=block),
            _host("fsdp_root_total_forward", 2e-3, size=root),
            _host("fsdp_root_total_backward", 2.5e-3, size=root))
    profiles = _profiles(tmp_path, _collectives() + rows, "sized.csv")
    profile = profiles.get("CPU")
    assert fsdp_unit_s(device("CPU"), profile, 2, block).forward_s == 3e-3
    assert fsdp_unit_s(device("CPU"), profile, 2, tiny_block).forward_s == 1e-3
    assert fsdp_root_s(device("CPU"), profile, 2, root).comm_bytes == root
    plan = _plan(dp=2, gbs=16, sharding=Sharding(params=2, grads=2, optim=2))
    assert 4 * plan_costs(plan, None).costs[0][0].num_params == SMALL.num_layers * block + root
    dp = plan_costs(plan, profiles).costs[0][0].dp
    units = SMALL.num_layers + 1
    assert dp.gather_units == units

    def gather(size):
        return profile.collective_time_s("all_gather", size, 2)

    def scatter(size):
        return profile.collective_time_s("reduce_scatter", size, 2)

    piece = (SMALL.num_layers * block + root) / units
    blocks = SMALL.num_layers * (3e-3 + 7e-3 - 2 * gather(block) - scatter(block))
    the_root = 2e-3 + 2.5e-3 - gather(root) - scatter(root)
    assert dp.param_microbatch_s == pytest.approx(
        (2 * units - 1) * gather(piece) + units * scatter(piece) + blocks + the_root,
        rel=1e-6)
    # a profile without the root's rows prices the root as one more block
    old = _profiles(tmp_path, _collectives() + rows[:4], "unrooted.csv")
    assert plan_costs(plan, old).costs[0][0].dp.param_microbatch_s == pytest.approx(
        2 * units * gather(piece) + units * scatter(piece) + blocks * units
        / SMALL.num_layers, rel=1e-6)


def test_fsdp2_gathers_inside_the_pass_load_the_shared_host_once(tmp_path):
    """Without prefetch (the executor's FSDP2 on gloo) each pass issues its units' gathers
    and waits for them: they are in the pass, not a gather stream's work beside it. Two
    ranks on a host whose two cores share nothing (k(2) = 1) then run as if alone; the
    pass and a copy of its gathers on the gather stream loaded the host 2 + 2 x gloo's
    share and slowed the dp2 ZeRO-3 step by a quarter (debug-small's benchmark, +28%)."""
    plan = _plan(dp=2, gbs=16, sharding=Sharding(params=2, grads=2, optim=2))
    fsdp = (_host("fsdp_unit_total_forward", 3e-3, size=4 * SMALL.params_per_layer()),
            _host("fsdp_unit_total_backward", 7e-3, size=4 * SMALL.params_per_layer()))
    alone = _profiles(tmp_path, _collectives() + fsdp, "alone.csv")
    shared = _profiles(tmp_path, _collectives() + fsdp + _shared(1e-3, 1e-3), "shared.csv")
    result, sim = simulate_detailed(plan, profiles=shared)
    gathers = [n for n in sim.graph.names if n.startswith("all-gather")]
    assert gathers and all("unit 1/" in n for n in gathers)  # the rest are in the passes
    assert result.iteration_time_s == pytest.approx(
        simulate(plan, profiles=alone).iteration_time_s, rel=1e-9)


def _four_ranks():
    """One host of 4 CPU ranks (the benchmark's 4-rank kinds on 2 cores)."""
    from planner.specs.cluster import ClusterSpec, NodeGroup

    return ClusterSpec(name="4 CPU ranks", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=1, gpus_per_node=4,
        intra_node_link="loopback"),)).resolved()


def _crowd(factor, ranks=2, at_once=4):
    """`crowd<N>` rows: the groups of `ranks` timed all at once, `factor` x alone."""
    return tuple(dataclasses.replace(r, variant=f"crowd{at_once}", time_s=factor * r.time_s,
                                     p10_s=factor * r.p10_s, p90_s=factor * r.p90_s)
                 for r in _collectives(ranks) if r.name != "send_recv")


def test_groups_reducing_at_once_are_priced_as_measured_in_a_crowd(tmp_path):
    """AMSP on 4 CPU ranks of one host (P/G/OS 1/2/4): after the backward every rank
    reduce-scatters in its group of 2 at once. On 2 cores gloo's 2-rank collectives then
    take 2.5-3x their time alone (a rank waiting for its peer waits for the peer's CPU
    work, queued behind the other group's; profiler/collectives.py), which the alone
    measurement slowed on its CPU share by the load did not reach (debug-small's
    benchmark -11%, three runs alike). Where the profile timed the groups at once
    (`crowd4`), those collectives are priced from it and, as measured with the host's 4
    ranks in them, not slowed again while the 4 ranks reduce."""
    from planner.costs.comm import collective_time_s, group_tiers, measured_crowd

    four = _four_ranks()
    rows = (_collectives(2) + _collectives(4) + _cpu_rows(0.6) + _cpu_rows(0.6, ranks=4)
            + _shared(1e-3, 1.03e-3, 1.6e-3, 2.2e-3))
    alone = _profiles(tmp_path, rows, "alone.csv")
    crowded = _profiles(tmp_path, rows + _crowd(3.0), "crowd.csv")
    cfg = ParallelConfig(seq_len=64, dtype="fp32", mbs=4, gbs=16, dp=4,
                         sharding=Sharding(params=1, grads=2, optim=4))
    plan = homogeneous_plan(SMALL, four, cfg, kernels=Kernels(attention="flash",
                                                              optimizer="fused"))
    before, after = (plan_costs(plan, p).costs[0][0].dp for p in (alone, crowded))
    assert after.grad_iteration_s == pytest.approx(3 * before.grad_iteration_s, rel=1e-6)
    assert after.grad_microbatch_s == pytest.approx(3 * before.grad_microbatch_s, rel=1e-6)
    # the gather after the step spans the whole host: its alone row is the crowd already
    assert after.param_iteration_s == before.param_iteration_s > 0
    assert after.crowd("grad_iteration") == 4 and after.crowd("param_iteration") == 0
    assert "measured with 4 of the host's ranks at once" in after.about("grad_iteration")
    # the reduction runs for its crowd-measured time (its reference load is the crowd's)
    _, sim = simulate_detailed(plan, profiles=crowded)
    t = next(i for i, n in enumerate(sim.graph.names) if n.startswith("grad-sync"))
    assert sim.schedule.end[t] - sim.schedule.start[t] == pytest.approx(
        sim.graph.durations[t], rel=1e-9)
    _, old = simulate_detailed(plan, profiles=alone)
    slowed = old.schedule.end[t] - old.schedule.start[t]
    assert old.graph.durations[t] < slowed < 1.5 * old.graph.durations[t]
    assert simulate(plan, profiles=crowded).iteration_time_s > \
        simulate(plan, profiles=alone).iteration_time_s + sim.graph.durations[t] / 2
    # the nearest crowd measured; a group alone on its host, GPUs, no rows: alone
    tiers = group_tiers(four, (0, 1))
    two = _profiles(tmp_path, rows + _crowd(3.0) + _crowd(5.0, at_once=8), "two.csv")
    assert [measured_crowd("all_reduce", tiers, two, n) for n in (0, 2, 3, 4, 6, 7, 64)] \
        == [0, 0, 0, 4, 4, 8, 8]
    assert measured_crowd("send_recv", tiers, two, 4) == 0
    assert measured_crowd("all_reduce", tiers, alone, 4) == 0
    assert collective_time_s("all_reduce", 1 << 20, tiers, profiles=two, crowd=7) == \
        pytest.approx(5 * collective_time_s("all_reduce", 1 << 20, tiers, profiles=two))
    dp2 = _plan(dp=2, gbs=16, sharding=Sharding(grads=2, optim=2))
    assert plan_costs(dp2, crowded).costs == plan_costs(dp2, alone).costs
    # the crowd rows are not the collectives' CPU share
    assert collective_cpu_share(device("CPU"), crowded.get("CPU"), 2) == pytest.approx(0.6)


def test_fsdp2_collectives_inside_the_passes_stay_priced_alone(tmp_path):
    """ZeRO-3 over 2 of 4 ranks (HSDP): FSDP2's gathers and reduce-scatters inside the
    passes alternate with the other group's compute (the host's load slows them, as the
    passes); the replicas' all-reduce after the backward meets the whole host."""
    rows = (_collectives(2) + _collectives(4) + _cpu_rows(0.6) + _crowd(3.0)
            + (_host("fsdp_unit_total_forward", 3e-3, size=4 * SMALL.params_per_layer()),
               _host("fsdp_unit_total_backward", 7e-3, size=4 * SMALL.params_per_layer())))
    cfg = ParallelConfig(seq_len=64, dtype="fp32", mbs=4, gbs=16, dp=4,
                         sharding=Sharding(params=2, grads=2, optim=2))
    plan = homogeneous_plan(SMALL, _four_ranks(), cfg, kernels=Kernels(attention="flash",
                                                                       optimizer="fused"))
    dp = plan_costs(plan, _profiles(tmp_path, rows)).costs[0][0].dp
    assert dp.crowd("param_microbatch") == 0 and dp.crowd("grad_iteration") == 4


def _mixed_tp_plan():
    """3 CPU ranks: a replica at tp 1 (3 micro-batches of 8) beside one at tp 2 (1 of 8),
    as benchmarks/run_vs_prediction.py's mixed-tp-dp2 kind."""
    from planner.specs.cluster import ClusterSpec, NodeGroup
    from planner.specs.plan import Pipeline, Plan, Stage, Training

    three = ClusterSpec(name="3 CPU ranks", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=1, gpus_per_node=3,
        intra_node_link="loopback"),)).resolved()
    pipes = (Pipeline(micro_batch_size=8, num_microbatches=3,
                      stages=(Stage(layers=(0, SMALL.num_layers), devices=(0,)),)),
             Pipeline(micro_batch_size=8, num_microbatches=1,
                      stages=(Stage(layers=(0, SMALL.num_layers), devices=(1, 2), tp=2),)))
    plan = Plan(model=SMALL, cluster=three, pipelines=pipes,
                training=Training(global_batch_size=32, seq_len=64, dtype="fp32"),
                kernels=Kernels(attention="flash", optimizer="fused"))
    plan.check("plan")
    return plan


def test_dtensor_time_measured_off_the_cpu_loads_no_core(tmp_path):
    """A tp block's DTensor time is partly a rank waiting for its peer in a tp collective
    (gloo blocks in a socket read): its `cpu.` twin rows give the CPU seconds the ranks'
    processes used. Measured on this VM at debug-small's plan size: 0.65 of the time
    (`plan profile --collectives --host-costs --nprocs 2 --host-model debug-small --mbs 8
    --seq 64`), where the simulation took it as CPU work whole and the collectives at
    their own share (0.85 of a tp pass busy). With the rows, the share of the DTensor
    time (host and tp collectives) the profile measured off the CPU loads no core: a
    replica at tp 1 beside a tp-2 pair on 3 ranks of a 2-core host computes faster
    (measured 151.9-158.4 ms, priced 164.7 before and 155.9 after, docs/executor.md).
    Costs stay as they were (the schedule moves, not the ops); without the rows, on GPUs
    and without tp, nothing changes."""
    from planner.costs.host import dtensor_cpu_share

    act = 8 * 64 * SMALL.hidden_size * 4
    names = ("dtensor_layer_total_forward", "dtensor_layer_total_backward",
             "dtensor_root_forward", "dtensor_root_backward")
    walls = (6e-3, 6.4e-3, 10e-3, 4e-3)
    base = (_collectives() + _collectives(3) + _cpu_rows(0.6) + _shared(1e-3, 1.1e-3, 1.7e-3)
            + tuple(_host(n, t, size=act) for n, t in zip(names, walls, strict=True)))
    busy_rows = tuple(_host("cpu." + n, t * 0.5, size=act)
                      for n, t in zip(names, walls, strict=True))
    without = _profiles(tmp_path, base, "without.csv")
    with_rows = _profiles(tmp_path, base + busy_rows, "with.csv")
    cpu = device("CPU")
    assert dtensor_cpu_share(cpu, with_rows.get("CPU"), 2, False, act) == pytest.approx(0.5)
    assert dtensor_cpu_share(cpu, without.get("CPU"), 2, False, act) is None
    assert dtensor_cpu_share(cpu, with_rows.get("CPU"), 1, False, act) is None
    assert dtensor_cpu_share(device("H100-80GB-SXM"), with_rows.get("CPU"), 2, False,
                             act) is None

    plan = _mixed_tp_plan()
    a, b = plan_costs(plan, with_rows).costs, plan_costs(plan, without).costs
    pair, alone = a[1][0].layer_forward, b[1][0].layer_forward
    # the DTensor seconds and the tp collectives busy at half their time, the rest off
    dtensor_s = pair.measured_shared_s
    assert pair.off_cpu_s == pytest.approx(dtensor_s + 0.6 * pair.tp_s
                                           - 0.5 * (dtensor_s + pair.tp_s))
    assert alone.off_cpu_s == 0.0 and a[0][0].layer_forward.off_cpu_s == 0.0
    assert dataclasses.replace(pair, off_cpu_s=0.0) == alone
    faster = simulate(plan, profiles=with_rows).iteration_time_s
    slower = simulate(plan, profiles=without).iteration_time_s
    assert faster < slower * 0.98
    # a plan without tp prices the same with or without the rows
    dp = _plan(dp=2, gbs=16)
    assert simulate(dp, profiles=with_rows).iteration_time_s == \
        simulate(dp, profiles=without).iteration_time_s


def test_cpu_ranks_collectives_are_credited_to_gloo(tmp_path):
    """CPU ranks talk over gloo on loopback; their unmeasured collectives were credited to
    "NCCL's cost model (2.20.3 ...)" (CLI audit, 2026-12-06)."""
    from planner.costs.comm import COMM_SOURCE, CPU_COMM_SOURCE

    plan = _plan(dp=2, gbs=16)
    assert cost_sources(plan, None)["communication"] == CPU_COMM_SOURCE
    assert cost_sources(plan, _profiles(tmp_path, _collectives()))["communication"].endswith(
        f"; {CPU_COMM_SOURCE} for the rest")
    gpus = homogeneous_plan(preset("debug-small"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_len=64))
    assert cost_sources(gpus, None)["communication"] == COMM_SOURCE
