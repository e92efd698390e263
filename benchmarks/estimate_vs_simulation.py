"""How far the closed-form estimate (what the search ranks candidates by) sits from the event
simulation (what confirms the leaders), over random plans the frameworks run.

    python benchmarks/estimate_vs_simulation.py [--sets fast,pcie,slow,mixed] [--plans N]
        [--seed S]

Four sets, each of random valid plans (`check_parallel`, and `unsupported` for the
plan's framework empty):
  fast   InfiniBand nodes (L40S, A100, H100), 16-64 GPUs, pp 1-4, ZeRO-1/2/3, 1F1B and
         ZB-H1, Megatron, DeepSpeed, FSDP2 and trainplan communication;
  pcie   interleaved pipelines (vp 1-8) on PCIe nodes and InfiniBand ones, pp 2-8;
  slow   2-8 nodes joined by InfiniBand or one 10 / 25 / 100 Gb/s Ethernet NIC each,
         1F1B, ZB-H1 and interleaved, Megatron and trainplan communication;
  mixed  clusters of two GPU types (1-4 nodes each, InfiniBand or one Ethernet NIC): the
         12 leaders of the mixed search's closed form on each (pipelines of unlike
         stages, replicas of unlike types), as it would confirm them.
Prints per set (and group) the mean and largest |estimate / simulation - 1| and the
plans furthest off. The estimate is a ranking heuristic: the search simulates its leaders,
so what matters is that a good plan is not priced far above a worse one.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
from collections.abc import Callable, Iterator

from planner.export.frameworks import CAPABILITIES, unsupported
from planner.predict.estimate import estimate
from planner.simulator import simulate
from planner.specs.cluster import ClusterSpec, parse_gpus_arg
from planner.specs.layout import ParallelConfig, check_parallel, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Communication, Plan, Sharding
from profiler.schema import SpecError, parse

Row = tuple[float, dict[str, object]]


def _fast(rng: random.Random) -> tuple[Plan, dict[str, object]] | None:
    model = rng.choice(["mpt-7b", "llama2-7b", "gpt3-1.3b", "llama2-13b"])
    gpu = rng.choice(["L40S-48GB", "H100-80GB-SXM", "A100-80GB-SXM", "A100-40GB-SXM"])
    n, tp, pp = rng.choice([16, 32, 64]), rng.choice([1, 1, 2, 4]), rng.choice([1, 2, 4])
    if n % (tp * pp):
        return None
    dp = n // (tp * pp)
    zero = rng.choice(["zero1", "zero2", "zero3"])
    sharding = {"zero1": Sharding(optim=dp), "zero2": Sharding(grads=dp, optim=dp),
                "zero3": Sharding(params=dp, grads=dp, optim=dp)}[zero]
    schedule = rng.choice(["1f1b", "zb-h1"]) if pp > 1 else "1f1b"
    framework = rng.choice(["megatron", "fsdp2", "trainplan", "deepspeed"])
    mbs, m = rng.choice([1, 2]), rng.choice([1, 2, 4, 8])
    cfg = dict(tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=dp * mbs * m, sharding=sharding,
               schedule=schedule, recompute=rng.choice(["none", "full"]))
    return _plan(model, parse_gpus_arg(f"{gpu}:{n}"), cfg, framework,
                 dict(gpu=gpu, pp=pp, zero=zero, schedule=schedule))


def _pcie(rng: random.Random) -> tuple[Plan, dict[str, object]] | None:
    model = rng.choice(["llama2-7b", "gpt3-1.3b", "llama2-13b", "mpt-7b"])
    gpu = rng.choice(["L4-24GB", "H100-80GB-PCIe", "A100-80GB-SXM", "L40S-48GB", "A10G-24GB",
                      "H100-80GB-SXM"])
    n, tp, pp = rng.choice([16, 32, 64]), rng.choice([1, 2, 4]), rng.choice([2, 4, 8])
    vp = rng.choice([1, 2, 3, 4, 8])
    if n % (tp * pp):
        return None
    dp = n // (tp * pp)
    zero = rng.choice(["zero1", "zero1", "zero2", "none"])
    sharding = {"none": Sharding(), "zero1": Sharding(optim=dp),
                "zero2": Sharding(grads=dp, optim=dp)}[zero]
    framework = rng.choice(["megatron", "megatron", "fsdp2", "trainplan", "deepspeed"])
    mbs, m = rng.choice([1, 2]), pp * rng.choice([1, 2, 4])
    cfg = dict(tp=tp, pp=pp, dp=dp, vp=vp, mbs=mbs, gbs=dp * mbs * m, sharding=sharding,
               sequence_parallel=tp > 1 and framework == "megatron",
               recompute=rng.choice(["none", "full", "selective"]))
    return _plan(model, parse_gpus_arg(f"{gpu}:{n}"), cfg, framework, dict(gpu=gpu, vp=vp))


def _slow(rng: random.Random) -> tuple[Plan, dict[str, object]] | None:
    model = rng.choice(["llama2-7b", "gpt3-1.3b", "gpt3-2.7b", "llama2-13b", "mpt-7b"])
    gpu = rng.choice(["L4-24GB", "H100-80GB-PCIe", "A100-80GB-SXM", "L40S-48GB", "A10G-24GB",
                      "H100-80GB-SXM", "V100-32GB-SXM2"])
    nic = rng.choice(["infiniband", "ethernet 10", "ethernet 25", "ethernet 100", "infiniband"])
    nodes = rng.choice([2, 4, 8])
    group: dict[str, object] = {"name": "a", "gpu": gpu, "num_nodes": nodes}
    _with_nic(group, nic)
    n = nodes * 8
    tp, pp, vp = rng.choice([1, 2, 4]), rng.choice([2, 4, 8]), rng.choice([1, 1, 2, 3, 4])
    if n % (tp * pp):
        return None
    dp = n // (tp * pp)
    mbs, m = rng.choice([1, 2]), pp * rng.choice([1, 2, 4])
    sharding = rng.choice([Sharding(optim=dp), Sharding(optim=dp), Sharding()])
    framework = rng.choice(["megatron", "megatron", "trainplan", "deepspeed"])
    schedule = rng.choice(["1f1b", "zb-h1"]) if vp == 1 else "1f1b"
    dtype = "fp16" if gpu.startswith("V100") else "bf16"
    cfg = dict(tp=tp, pp=pp, dp=dp, vp=vp, mbs=mbs, gbs=dp * mbs * m, sharding=sharding,
               dtype=dtype, schedule=schedule, sequence_parallel=tp > 1 and framework == "megatron",
               recompute=rng.choice(["none", "full", "selective"]))
    cluster = parse(ClusterSpec, {"name": "c", "node_groups": [group]}, where="t").resolved()
    return _plan(model, cluster, cfg, framework,
                 dict(nic=nic, vp=vp, schedule=schedule if vp == 1 else "interleaved"))


def _with_nic(group: dict[str, object], nic: str) -> None:
    """A node group's NIC: the catalog's InfiniBand, or one Ethernet NIC of "ethernet N"
    Gb/s."""
    if nic != "infiniband":
        group.update(nic="ethernet", nics_per_node=1,
                     nic_bandwidth_gbit_per_s=int(nic.split()[1]))


def _plan(model: str, cluster: ClusterSpec, cfg: dict, framework: str,
          groups: dict[str, object]) -> tuple[Plan, dict[str, object]] | None:
    dtype = cfg.get("dtype", "bf16")
    config = ParallelConfig(**cfg, seq_len=2048,
                            comm=Communication.preset(framework, dtype=dtype))
    spec = preset(model)
    check_parallel(config, spec, cluster)
    plan = homogeneous_plan(spec, cluster, config)
    if unsupported(plan, CAPABILITIES["torchtitan" if framework == "fsdp2" else framework]):
        return None
    return plan, dict(groups, model=model, framework=framework, gpus=cluster.num_gpus,
                      layout=f"tp{config.tp} pp{config.pp} vp{config.vp} dp{config.dp}",
                      mbs=config.mbs, m=config.gbs // (config.dp * config.mbs))


_MIXED_GPUS = ["L4-24GB", "H100-80GB-PCIe", "A100-80GB-SXM", "L40S-48GB", "A10G-24GB",
               "H100-80GB-SXM", "V100-32GB-SXM2", "A100-40GB-SXM"]
_queued: list[tuple[Plan, dict[str, object]]] = []


def _mixed(rng: random.Random) -> tuple[Plan, dict[str, object]] | None:
    """The leaders the mixed search would confirm (its closed form's best 12, layers and
    micro-batches split) on a random cluster of two GPU types, one after the other."""
    if not _queued:
        _queued.extend(_mixed_leaders(rng))
    return _queued.pop(0) if _queued else None


def _mixed_leaders(rng: random.Random) -> list[tuple[Plan, dict[str, object]]]:
    from planner.hetero.search import MixedSpace, hetero_candidates, mixed_templates
    searching = importlib.import_module("planner.search.search")

    model = rng.choice(["llama2-7b", "gpt3-1.3b", "gpt3-2.7b", "llama2-13b"])
    gpus = rng.sample(_MIXED_GPUS, 2)
    nic = rng.choice(["infiniband", "ethernet 10", "ethernet 25", "ethernet 100"])
    groups = []
    for name, gpu in zip("ab", gpus, strict=True):
        group: dict[str, object] = {"name": name, "gpu": gpu, "island": "x",
                                    "num_nodes": rng.choice([1, 2, 4])}
        _with_nic(group, nic)
        groups.append(group)
    cluster = parse(ClusterSpec, {"name": "c", "node_groups": groups}, where="t").resolved()
    dtype = "fp16" if any(g.startswith("V100") for g in gpus) else "bf16"
    req = searching.SearchRequest(model=preset(model), cluster=cluster, gbs=rng.choice(
        [32, 64, 128, 256]), seq_len=2048, dtype=dtype, framework="trainplan")
    space = MixedSpace.for_framework(req.capabilities, req.model)
    kernels = searching._kernels(req, cluster)
    leaders, _, _ = hetero_candidates(
        req.model, cluster, mixed_templates(req.model, cluster, req.gbs, space, seq_len=2048),
        gbs=req.gbs, seq_len=2048, dtype=dtype, kernels=kernels, space=space,
        model_states=req.model_states, comm=req.comm, keep=12,
        score=lambda p: p.iteration_s, bound_score=lambda _, bound: bound)
    about = dict(nic=nic, gpus="+".join(gpus), model=model, framework="trainplan")
    return [(p.plan(req.model, cluster, seq_len=2048, dtype=dtype, kernels=kernels),
             dict(about, schedule=str(p.schedule),
                  layout=f"pp{p.template.pp} dp{p.template.dp} mbs{p.mbs}"))
            for p in leaders]


SETS: dict[str, Callable[[random.Random], tuple[Plan, dict[str, object]] | None]] = {
    "fast": _fast, "pcie": _pcie, "slow": _slow, "mixed": _mixed}


def rows(make: Callable, plans: int, seed: int) -> Iterator[Row]:
    rng, done = random.Random(seed), 0
    _queued.clear()  # a mixed cluster's leaders are of this seed's draws
    while done < plans:
        try:
            made = make(rng)
            if made is None:
                continue
            plan, about = made
            simulated = simulate(plan).iteration_time_s
            estimated = estimate(plan).iteration_time_s
        except (SpecError, ValueError):
            continue
        done += 1
        yield estimated / simulated - 1, about


def _summary(label: str, errors: list[float]) -> str:
    gaps = [abs(e) for e in errors]
    return (f"{label:28s} {len(gaps):4d} plans  mean |gap| {statistics.mean(gaps):6.2%}  "
            f"max {max(gaps):6.1%}  over 5%: {sum(g > 0.05 for g in gaps)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="fast,pcie,slow,mixed")
    ap.add_argument("--plans", type=int, default=400, help="plans per set")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for name in args.sets.split(","):
        found = list(rows(SETS[name], args.plans, args.seed))
        print(_summary(name, [e for e, _ in found]))
        for key in ("nic", "vp", "schedule"):
            for value in sorted({str(a[key]) for _, a in found if key in a}):
                errors = [e for e, a in found if str(a.get(key)) == value]
                print("  " + _summary(f"{key} {value}", errors))
        for e, about in sorted(found, key=lambda r: -abs(r[0]))[:5]:
            print(f"    {e:+7.1%}  " + " ".join(f"{k}={v}" for k, v in about.items()))


if __name__ == "__main__":
    main()
