"""Plans and stage costs with chosen durations, for exact simulator checks."""

import dataclasses
import math

from planner.costs.stages import DPSync, Part, bucket_params, plan_costs
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset


def make_plan(*, pp=4, dp=1, m=8, vp=1, schedule="1f1b", layers=None, tp=1, gpus=None,
              **extra):
    model = preset("gpt3-1.3b")
    if layers:
        model = dataclasses.replace(model, num_layers=layers)
    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, vp=vp, mbs=1, gbs=m * dp, seq_len=2048,
                         schedule=schedule, **extra)
    cluster = parse_gpus_arg(gpus or f"A100-80GB-SXM:{tp * pp * dp}")
    return homogeneous_plan(model, cluster, cfg)


def flat_costs(plan, *, fwd=1.0, bwd=2.0, wgrad=0.0, p2p=0.0, grad_sync=0.0, optimizer=0.0):
    """Every stage: forward `fwd` s and backward `bwd` s per micro-batch in total (spread
    over its layers, nothing on embedding or head; `wgrad` s of the backward are weight
    gradients, W), the given transfer, sync, optimizer."""
    out = []
    bucket = bucket_params(plan.training.comm, plan.dp)
    for pipe_costs in plan_costs(plan).costs:
        row = []
        for c in pipe_costs:
            n = c.num_layers
            row.append(dataclasses.replace(
                c, layer_forward=Part(compute_s=fwd / n), layer_backward=Part(compute_s=bwd / n),
                layer_weight_grad=Part(compute_s=wgrad / n),
                embed_forward=Part(), embed_backward=Part(), head_forward=Part(),
                head_backward=Part(), p2p_s=p2p,
                dp=DPSync(grad_iteration_s=grad_sync,
                          buckets=max(1, math.ceil(c.num_params / bucket))),
                optimizer_s=optimizer))
        out.append(row)
    return out


def h100_beside_a100(*, a100_replicas, h100_microbatches, a100_microbatches, sharding=None):
    """gpt3-1.3b (pp 1) on 8 H100 replicas at tp 1 beside `a100_replicas` A100-40GB
    replicas at tp 2: replicas of unlike tp, whose ranks hold unlike shares of the same
    gradients."""
    from planner.specs.cluster import ClusterSpec
    from planner.specs.plan import Pipeline, Sharding, Stage
    from profiler.schema import parse

    cluster = parse(ClusterSpec, {"name": "c", "node_groups": [
        {"name": "h", "gpu": "H100-80GB-SXM", "num_nodes": 1},
        {"name": "a", "gpu": "A100-40GB-SXM", "num_nodes": math.ceil(a100_replicas / 4)}]},
        where="t").resolved()
    model = preset("gpt3-1.3b")
    layers = (0, model.num_layers)
    pipelines = tuple(
        [Pipeline(stages=(Stage(layers=layers, devices=(d,), tp=1),), micro_batch_size=1,
                  num_microbatches=h100_microbatches) for d in range(8)]
        + [Pipeline(stages=(Stage(layers=layers, devices=(8 + 2 * i, 9 + 2 * i), tp=2),),
                    micro_batch_size=1, num_microbatches=a100_microbatches)
           for i in range(a100_replicas)])
    base = homogeneous_plan(model, parse_gpus_arg("H100-80GB-SXM:8"),
                            ParallelConfig(dp=8, mbs=1, gbs=8 * h100_microbatches,
                                           seq_len=2048))
    training = dataclasses.replace(base.training, global_batch_size=sum(
        p.micro_batch_size * p.num_microbatches for p in pipelines))
    return dataclasses.replace(base, cluster=cluster, pipelines=pipelines, training=training,
                               sharding=sharding or Sharding())
