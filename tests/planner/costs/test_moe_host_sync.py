"""Megatron-Core's all-to-all token dispatcher copies the per-expert token counts to the
host and waits for them in every MoE layer's forward unless the routing is padded to
capacity (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher:
`_maybe_dtoh_and_synchronize`, the d2h copy "before_permutation_1", the sync "before_ep_
alltoall"; skipped with `moe_pad_expert_input_to_capacity`, `drop_and_pad`). DeepEP's
dispatch makes the host wait for the receive counts in the forward too (Megatron-Core /
NeMo AutoModel moe/fused_a2a.py `FusedDispatch.forward`: "the CPU will wait for GPU's
signal to arrive"; DeepEP csrc/deep_ep.cpp, `moe_recv_counter`), not in the backward,
whose dispatch reuses the forward's handle."""

import dataclasses

import pytest

from planner.costs.stages import _issue_queue_s
from planner.costs.workload import HostSync, WorkloadShape, expert_tokens_factor, layer_work
from planner.export.formats import megatron_args
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from profiler.schema import SpecError

QWEN = preset("qwen3-30b-a3b")
PLAN = homogeneous_plan(QWEN, parse_gpus_arg("H100-80GB-SXM:8"),
                        ParallelConfig(dp=8, ep=8, mbs=1, gbs=8, seq_len=4096))
SHAPE = WorkloadShape(micro_batch_size=1, seq_len=4096, ep=8, etp=1)


def _syncs(model, shape):
    work = layer_work(model, shape)
    return ([i.point for i in work.forward if isinstance(i, HostSync)],
            [i for i in work.backward if isinstance(i, HostSync)])


def test_dropless_all_to_all_waits_for_the_token_counts_in_the_forward():
    forward, backward = _syncs(QWEN, SHAPE)
    assert forward == ["record", "wait"] and not backward
    names = [i.name for i in layer_work(QWEN, SHAPE).forward]
    # recorded after the routing, waited for before the dispatch all-to-all
    assert names.index("moe.tokens_per_expert.d2h") == names.index("moe.topk") + 1
    assert names.index("moe.tokens_per_expert.sync") == names.index("moe.dispatch") - 1
    # padded to capacity: the counts are known on the host
    padded = dataclasses.replace(QWEN, capacity_factor=1.0, pad_to_capacity=True)
    assert _syncs(padded, SHAPE) == ([], [])
    assert expert_tokens_factor(padded) == 1.0
    assert "--moe-pad-expert-input-to-capacity" in megatron_args(dataclasses.replace(
        PLAN, model=dataclasses.replace(PLAN.model, capacity_factor=1.0, pad_to_capacity=True)))
    with pytest.raises(SpecError, match="needs capacity_factor"):
        dataclasses.replace(QWEN, pad_to_capacity=True).check("model")


def test_deepeps_dispatch_waits_for_the_receive_counts_in_the_forward():
    deepep = dataclasses.replace(SHAPE, dispatcher="deepep")
    forward, backward = _syncs(QWEN, deepep)
    assert forward == ["record", "wait"] and not backward
    names = [i.name for i in layer_work(QWEN, deepep).forward]
    # the layout and notify kernels follow the routing; the host waits, then launches the
    # transfer, and the received tokens are permuted after it
    assert names.index("moe.tokens_per_expert.d2h") == names.index("moe.topk") + 1
    assert names.index("moe.tokens_per_expert.sync") == names.index("moe.dispatch") - 1
    assert names.index("moe.permute") == names.index("moe.dispatch") + 1
    back = [i.name for i in layer_work(QWEN, deepep).backward]
    assert back.index("moe.dispatch") == back.index("moe.permute.bwd") + 1
    # padding to capacity does not spare it (DeepEP sizes its buffer from the counts)
    padded = dataclasses.replace(QWEN, capacity_factor=1.0, pad_to_capacity=True)
    assert _syncs(padded, deepep)[0] == ["record", "wait"]
    # nothing is dispatched without expert parallelism: no wait
    assert _syncs(QWEN, dataclasses.replace(deepep, ep=1)) == ([], [])


def test_a_host_sync_drains_the_launch_queue():
    """Ten 10 us kernels behind a 1 ms one, 50 us per launch: the host, ahead while the
    long kernel runs, issues them in time; waiting for the GPU first leaves each of them
    launch-bound (the GPU idles for the launches the host could have made early)."""
    launch = 50e-6
    items = [(1e-3, 1)] + [(10e-6, 1)] * 10
    free = _issue_queue_s(items, launch, 1)
    synced = _issue_queue_s([(1e-3, 1), (1.0, -1), (1.0, -2)] + [(10e-6, 1)] * 10, launch, 1)
    assert free == pytest.approx(launch + 1e-3 + 10 * 10e-6)
    assert synced == pytest.approx(launch + 1e-3 + 10 * launch + 10e-6)
    part = _issue_queue_s([(1e-3, 1), (0.9, -1), (0.9, -2)] + [(10e-6, 1)] * 10, launch, 1)
    assert free < part < synced  # 90% of the layers wait
