"""What the executor refuses before any process starts (no processes here)."""

import pytest

from executor.preflight import check_runnable
from planner.layout import ParallelConfig, homogeneous_plan
from planner.specs.cluster import parse_gpus_arg
from planner.specs.model import preset
from profiler.schema import SpecError
from tests.executor.distributed import explicit, homogeneous

SMALL, LLAMA = preset("debug-small"), preset("debug-tiny-llama")


def _refused(plan, needle, cuda_devices=0):
    with pytest.raises(SpecError, match=needle):
        check_runnable(plan, cuda_devices=cuda_devices)


def test_gpu_plans_need_enough_gpus_on_this_host():
    plan = homogeneous_plan(SMALL, parse_gpus_arg("H100-80GB-SXM:4"),
                            ParallelConfig(dp=4, mbs=1, gbs=4, seq_len=32))
    _refused(plan, "this host has no CUDA device")
    _refused(plan, r"'GPU 3 of node 0' is not allowed \(a node of this host has 2 GPUs\)",
             cuda_devices=2)
    check_runnable(plan, cuda_devices=8)


def test_tensor_parallel_limits():
    _refused(homogeneous(LLAMA, world=4, tp=4, mbs=1, gbs=4),
             "must divide num_kv_heads 2")
    mixed = [(0, 3, [0, 1], 2, "none"), (3, 4, [2], 1, "none")]
    _refused(explicit(SMALL, world=3, sequence_parallel=True, pipelines=[(1, 2, mixed)]),
             "sequence parallelism needs equal tp on neighbouring stages")
    _refused(explicit(SMALL, world=3, pipelines=[(1, 2, mixed)]),
             "tied embeddings need the same tp on the first and the last stage")


def test_interleaving_needs_micro_batches_in_multiples_of_the_stages():
    stages = [(0, 2, [0], 1, "none"), (2, 4, [1], 1, "none")]
    _refused(explicit(SMALL, world=2, schedule="interleaved-1f1b", vp=2,
                      pipelines=[(1, 3, stages)]), "a multiple of the 2 stages")
    check_runnable(explicit(SMALL, world=2, schedule="interleaved-1f1b", vp=2,
                            pipelines=[(1, 4, stages)]), cuda_devices=0)


def test_a_launch_of_the_wrong_size_stops_before_joining(monkeypatch, tmp_path):
    """A hand-typed torchrun line with the wrong process count: refused at once."""
    from executor.runtime import RunSettings, run_rank

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    plan = homogeneous(SMALL, world=2, dp=2, mbs=1, gbs=2)
    with pytest.raises(SystemExit, match="the plan has 2 ranks; this launch has 3"):
        run_rank(plan, RunSettings(steps=1, run_dir=str(tmp_path)))


def test_zero_bubble_refuses_full_recompute_where_it_splits_the_backward():
    """ZB-H1's W is a second autograd pass: checkpointed layers would be recomputed twice."""
    def plan(first, second):
        return explicit(SMALL, world=2, schedule="zb-h1", pipelines=[
            (1, 4, [(0, 2, [0], 1, first), (2, 4, [1], 1, second)])])

    _refused(plan("none", "full"), r"pipelines\[0\]\.stages\[1\]\.recompute: 'full' is not "
             r"allowed \(zb-h1 .* allowed: none, selective \(full on stage 0\)\)")
    for first, second in (("full", "selective"), ("none", "none")):
        check_runnable(plan(first, second), cuda_devices=0)
