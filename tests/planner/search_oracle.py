"""Oracles for the search: every candidate with every sharding option the framework
runs, each simulated one by one (only feasible for small spaces); its answer against the
baselines it priced beside it."""

from planner.costs.kernels import default_kernels
from planner.export.frameworks import CAPABILITIES
from planner.search.sharding import allowed_options, sharding_levels
from planner.search.space import candidates, default_space, for_framework, layouts
from planner.simulator import simulate
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.plan import Communication


def exhaustive_best(model, cluster, *, gbs, seq_len, dtype="bf16", framework="trainplan"):
    """(best simulated iteration time, its plan, number simulated), each plan with the
    framework's model-state rule and communication, as its search writes them."""
    group, caps = cluster.node_groups[0], CAPABILITIES[framework]
    space = for_framework(default_space(model, num_gpus=(cluster.num_gpus,),
                                        nvlink_domain_gpus=group.nvlink_domain_gpus,
                                        seq_len=seq_len),
                          caps)
    kernels = default_kernels([group.device])
    best, best_plan, count = float("inf"), None, 0
    for lo in layouts(space, model, gbs=gbs, seq_len=seq_len):
        # as the search counts them (`LayoutModel.levels`): the dp x cp ranks holding the
        # same parameters, of which an NVLink domain holds nvlink_domain_gpus / tp
        levels = sharding_levels(lo.dp * lo.cp, max(1, group.nvlink_domain_gpus // lo.tp))
        for mi in candidates(space, model, lo, gbs=gbs, seq_len=seq_len):
            for sh in allowed_options(levels, dp=lo.dp * lo.cp,
                                      patterns=space.sharding_patterns(lo.pp)):
                cfg = ParallelConfig(tp=lo.tp, pp=lo.pp, dp=lo.dp, cp=lo.cp, vp=mi.vp,
                                     mbs=mi.mbs, gbs=gbs, seq_len=seq_len,
                                     recompute=mi.recompute,
                                     sequence_parallel=mi.sequence_parallel, sharding=sh,
                                     dtype=dtype, schedule=mi.schedule,
                                     model_states=caps.model_states,
                                     comm=Communication.preset(caps.comm, dtype=dtype))
                plan = homogeneous_plan(model, cluster, cfg, kernels=kernels)
                r = simulate(plan)
                count += 1
                if r.fits and r.iteration_time_s < best:
                    best, best_plan = r.iteration_time_s, plan
    return best, best_plan, count


def assert_never_worse_than_a_baseline(found) -> None:
    """The search's best plan is no slower than any baseline it priced that fits."""
    best = found.ranked[0].result.iteration_time_s
    for b in found.baselines:
        if b.result is not None and b.result.fits:
            assert best <= b.result.iteration_time_s * (1 + 1e-9), b.name
