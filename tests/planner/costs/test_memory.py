"""Per-GPU memory against Korthikanti et al. 2022 Figure 1 (configs of their Table 3)."""

import pytest

from planner.costs.memory import in_flight_chunks, stage_memory
from planner.costs.workload import WorkloadShape
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
