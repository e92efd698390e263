"""Per-GPU memory against Korthikanti et al. 2022 Figure 1 (configs of their Table 3)."""

import dataclasses

import pytest

from planner.costs.memory import in_flight_chunks, stage_memory
from planner.costs.stages import plan_costs
from planner.costs.workload import WorkloadShape
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Sharding
from profiler.devices import device

GIB = 1024**3
# model, tp, pp, vp, figure 1: (params+optimizer, activations no recompute, activations sp+selective)
FIGURE_1 = [
    ("megatron-22b", 8, 1, 1, 45.6, 59.3, 9.6),
    ("megatron-175b", 8, 8, 3, 45.6, 66.8, 12.4),
    ("megatron-530b", 8, 35, 3, 31.6, 114.0, 23.1),
    ("megatron-1t", 8, 64, 1, 33.0, 131.3, 26.6),
]


def _first_stage(name, tp, pp, vp, recompute, sp):
    m = preset(name)
    shape = WorkloadShape(micro_batch_size=1 if pp > 1 else 4, seq_len=2048, tp=tp,
                          sequence_parallel=sp, dtype="fp16", attention="math")
    m_batches = 4 * pp
    flight = in_flight_chunks(schedule="interleaved-1f1b" if vp > 1 else "1f1b", stage=0, pp=pp,
                              num_microbatches=m_batches, virtual_stages=vp)
    # A middle stage's model states: Figure 1 counts transformer layers only.
    states_stage = stage_memory(m, device=device("A100-80GB-SXM"), shape=shape,
                                num_layers=m.num_layers // pp, first=pp == 1, last=pp == 1,
                                pp=pp, recompute=recompute, sharding=Sharding(),
                                layers_in_flight=flight * (m.num_layers // pp) / vp)
    return states_stage


@pytest.mark.parametrize("name, tp, pp, vp, states, act_none, act_sel", FIGURE_1)
def test_figure_1(name, tp, pp, vp, states, act_none, act_sel):
    none = _first_stage(name, tp, pp, vp, "none", False)
    sel = _first_stage(name, tp, pp, vp, "selective", True)
    assert none.model_states_bytes / GIB == pytest.approx(states, rel=0.10)
    assert none.activations_bytes / GIB == pytest.approx(act_none, rel=0.10)
    assert sel.activations_bytes / GIB == pytest.approx(act_sel, rel=0.10)


def test_sharding_divides_each_state():
    m = preset("llama2-7b")
    shape = WorkloadShape(micro_batch_size=1, seq_len=4096)
    kw = dict(device=device("A100-80GB-SXM"), shape=shape, num_layers=32, first=True, last=True,
              pp=1, recompute="full", layers_in_flight=32)
    base = stage_memory(m, sharding=Sharding(), **kw)
    amsp = stage_memory(m, sharding=Sharding(params=2, grads=4, optim=8), **kw)
    assert amsp.params_bytes == pytest.approx(base.params_bytes / 2)
    assert amsp.grads_bytes == pytest.approx(base.grads_bytes / 4)
    assert amsp.optimizer_bytes == pytest.approx(base.optimizer_bytes / 8)
    assert amsp.buffers_bytes > base.buffers_bytes  # gathered layers for sharded params
    # 18 bytes per parameter unsharded (Korthikanti et al. 2022 Figure 1).
    assert base.model_states_bytes == pytest.approx(18 * m.num_params(), rel=1e-3)


@pytest.mark.parametrize("schedule, stage, expect", [
    ("1f1b", 0, 4), ("1f1b", 3, 1), ("gpipe", 3, 16), ("interleaved-1f1b", 0, 4 * 2 + 3 * 2 + 1 - 2),
    ("zb-h1", 0, 4), ("zb-h1", 3, 4),  # every stage holds p: W frees them (Qi et al. 2024)
])
def test_in_flight(schedule, stage, expect):
    vp = 2 if schedule.startswith("interleaved") else 1
    # interleaved rank 0 of p=4, v=2: (p-1)*2 + (v-1)*p + 1 = 6 + 4 + 1 = 11 chunks
    got = in_flight_chunks(schedule=schedule, stage=stage, pp=4, num_microbatches=16,
                           virtual_stages=vp)
    assert got == (11 if schedule.startswith("interleaved") else expect)


def test_without_master_weights_states_are_sixteen_bit():
    """`Training.master_weights` false: no fp32 master copy, and gradients and Adam's two
    moments take the weights' dtype (PyTorch's Adam allocates its state with
    zeros_like(param); a parameter's gradient has its dtype; FSDP2 casts reduced gradients
    back to the sharded parameter's dtype, torch _fsdp_collectives.foreach_reduce): 2 + 2 +
    4 = 8 bytes per bf16 parameter, against mixed precision's 2 + 4 + 12 = 18 (NeMo
    AutoModel builds its MoE models in bf16 and trains them with torch.optim.Adam)."""
    m = preset("llama2-7b")
    kw = dict(device=device("A100-80GB-SXM"), num_layers=32, first=True, last=True, pp=1,
              recompute="full", layers_in_flight=32, sharding=Sharding(optim=8))
    bf16 = WorkloadShape(micro_batch_size=1, seq_len=4096, dtype="bf16")
    mixed = stage_memory(m, shape=bf16, **kw)
    pure = stage_memory(m, shape=bf16, master_weights=False, **kw)
    n = m.num_params()
    assert pure.params_bytes == pytest.approx(mixed.params_bytes) == pytest.approx(2 * n, rel=1e-3)
    assert pure.grads_bytes == pytest.approx(2 * n, rel=1e-3)
    assert mixed.grads_bytes == pytest.approx(4 * n, rel=1e-3)
    assert pure.optimizer_bytes == pytest.approx(4 * n / 8, rel=1e-3)  # m, v in bf16, sharded
    assert mixed.optimizer_bytes == pytest.approx(12 * n / 8, rel=1e-3)
    # fp32 training has no master copy either way: 4 + 4 + 8 = 16 bytes
    fp32 = WorkloadShape(micro_batch_size=1, seq_len=4096, dtype="fp32")
    assert (stage_memory(m, shape=fp32, master_weights=False, **kw).model_states_bytes
            == pytest.approx(stage_memory(m, shape=fp32, **kw).model_states_bytes))


# ---- model-state bytes per parameter as each framework keeps them -------------------------
def _per_param(states: str, sizes: tuple[int, int, int], dtype: str = "bf16") -> float:
    from planner.costs.memory import state_bytes_per_param
    from planner.specs.choices import ModelStates

    return sum(state_bytes_per_param(dtype=dtype, master_weights=True, sizes=sizes,
                                     states=ModelStates(states)))


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_megatron_keeps_18_bytes_6_plus_12_over_d_with_the_distributed_optimizer(d):
    """Megatron-Core's distributed-optimizer guide (docs.nvidia.com/megatron-core
    developer-guide, Distributed Optimizer): "bf16 parameters, fp32 gradients: 18"
    without it, "6 + 12/d" with it (16-bit weights and fp32 main grads whole, fp32 main
    parameters and Adam's moments over the d data-parallel ranks)."""
    assert _per_param("fp32_grads", (1, 1, 1)) == 18
    assert _per_param("fp32_grads", (1, 1, d)) == pytest.approx(6 + 12 / d)
    # fp32 training: "fp32 parameters, fp32 gradients: 16, 8 + 8/d" (no master copy)
    assert _per_param("fp32_grads", (1, 1, d), dtype="fp32") == pytest.approx(8 + 8 / d)


@pytest.mark.parametrize("k", [2, 8, 128])
def test_fsdp2_keeps_16_bytes_over_k_its_fp32_shard_being_the_master(k):
    """torch FSDP2, fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=
    fp32) (torch/distributed/fsdp/_fully_shard/_fsdp_api.py: "FSDP does not require any
    extra memory to keep a high-precision copy of the parameters for the optimizer step";
    "The optimizer step uses the sharded parameter in the original dtype"): fp32 parameter
    shards, fp32 gradient shards, Adam's fp32 moments: (4 + 4 + 8)/k, not Megatron's 18/k
    (the 16-bit layer gathered for compute is the memory model's `gathered` buffer)."""
    assert _per_param("fp32_grads", (k, k, k)) == pytest.approx(16 / k)
    # HSDP / ZeRO-2 on AMSP's nested groups: only P = OS drops the 16-bit copy
    assert _per_param("fp32_grads", (1, k, k)) == pytest.approx(2 + 16 / k)


@pytest.mark.parametrize("nd", [1, 4, 64])
def test_deepspeed_zero_keeps_16_bytes_2_plus_2_plus_12_each_over_its_stage(nd):
    """Rajbhandari et al. 2020 (ZeRO) §3 and Figure 1: mixed-precision Adam keeps
    2Ψ + 2Ψ + KΨ with K = 12 (16-bit parameters and gradients, fp32 parameters, momentum
    and variance): 16Ψ replicated; P_os 4Ψ + 12Ψ/Nd, P_os+g 2Ψ + 14Ψ/Nd, P_os+g+p 16Ψ/Nd.
    DeepSpeed 0.19.6 keeps gradients in the model dtype (runtime/engine.py
    get_data_types: data_types.grad_accum_dtype unset is the model dtype)."""
    assert _per_param("deepspeed", (1, 1, 1)) == 16
    assert _per_param("deepspeed", (1, 1, nd)) == pytest.approx(4 + 12 / nd)
    assert _per_param("deepspeed", (1, nd, nd)) == pytest.approx(2 + 14 / nd)
    assert _per_param("deepspeed", (nd, nd, nd)) == pytest.approx(16 / nd)


def test_the_rule_is_the_plans_and_reaches_the_stage_costs():
    """`Training.model_states` reaches every stage's memory through `plan_costs`: a ZeRO-3
    bf16 plan holds 16/k bytes per parameter under fp32_grads and deepspeed alike, and
    ZeRO-1 differs by DeepSpeed's 16-bit gradients (2 bytes per parameter, whole)."""
    import dataclasses

    from planner.costs.stages import plan_costs
    from planner.specs.cluster import ClusterSpec, NodeGroup
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    m = preset("gpt3-1.3b")
    cluster = ClusterSpec(name="8x A100", node_groups=(NodeGroup(
        name="g", gpu="A100-80GB-SXM", num_nodes=1, gpus_per_node=8, nic="infiniband",
        nics_per_node=8, nic_bandwidth_gbit_per_s=200),)).resolved()

    def states(sharding: Sharding, rule: str) -> tuple[float, float]:
        cfg = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq_len=2048, dtype="bf16",
                             sharding=sharding)
        plan = homogeneous_plan(m, cluster, cfg)
        plan = dataclasses.replace(plan, training=dataclasses.replace(
            plan.training, model_states=rule))
        costs = plan_costs(plan).costs[0][0]
        return costs.memory.model_states_bytes, costs.num_params

    zero3 = Sharding(params=8, grads=8, optim=8)
    for rule in ("fp32_grads", "deepspeed"):
        held, n = states(zero3, rule)
        assert held == pytest.approx(16 * n / 8)
    megatron, n = states(Sharding(optim=8), "fp32_grads")
    deepspeed, _ = states(Sharding(optim=8), "deepspeed")
    assert megatron - deepspeed == pytest.approx(2 * n)


@pytest.mark.parametrize("layers, pp, vp", [(80, 8, 8), (80, 4, 6), (61, 4, 3), (64, 4, 4)])
def test_stage_memory_holds_the_layers_its_pass_order_keeps(layers, pp, vp):
    """Megatron's interleaved order runs (pp - s - 1) x 2 + (vp - 1) x pp warm-up forwards
    (schedules.py); with chunks of unequal layers (80 layers in 8 x 8 chunks: 2, 2, 1, ...)
    the warm-up takes the first, larger chunks and the steady state frees the last,
    smaller ones, so a stage holds more than its chunks in flight x the average chunk.
    The cost model priced the average (Llama 3 70B on 1,024 H100: 71 layers where the
    simulation holds 89, 'fits' at 80 GiB by the search's estimate, 83.6 GiB simulated);
    it holds what the simulated pass order does."""
    from planner.simulator import simulate_detailed

    model = dataclasses.replace(preset("llama2-7b"), num_layers=layers)
    cfg = ParallelConfig(tp=8, pp=pp, dp=1, vp=vp, mbs=1, gbs=4 * pp, seq_len=4096)
    plan = homogeneous_plan(model, parse_gpus_arg(f"A100-80GB-SXM:{8 * pp}"), cfg)
    _, sim = simulate_detailed(plan)
    costs = plan_costs(plan).costs[0]
    for si, cost in enumerate(costs):
        per_layer = cost.memory.activations_per_layer_bytes
        assert cost.memory.activations_bytes == pytest.approx(
            sim.in_flight_layers[(0, si)] * per_layer, rel=1e-9), si
