"""The homogeneous configuration space, declared as data and pruned by named predicates.

A *layout* fixes how GPUs are split (tp, cp, pp, dp); a *candidate* adds what runs on
it (interleaving, micro-batch size, recompute, sequence parallel, pipeline schedule). The
sharding of model states is chosen per candidate (planner/search/sharding.py) among the
patterns the space allows. `for_framework` narrows a space to what one training framework
runs, from its `FrameworkCapabilities` (planner/export/frameworks.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from planner.export.frameworks import ANY_SHARDING, FrameworkCapabilities, ShardPattern
from planner.specs.choices import EpLayout, Recompute, Schedule
from planner.specs.model import ModelSpec
from planner.specs.rules import (
    batch_problem,
    chunks_problem,
    cp_problem,
    ep_problem,
    interleaving_problem,
    schedule_problem,
    sp_problem,
    tp_problem,
)
from profiler.schema import coerce_choices

__all__ = ["Layout", "Micro", "SearchSpace", "candidates", "default_space", "for_framework",
           "layouts", "missing_for"]


@dataclass(frozen=True)
class Layout:
    num_gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int = 1  # MoE: routed experts split over ep of the dp x cp ranks
    etp: int | None = None  # MoE: expert tp, 1 or tp (None: tp)
    ep_layout: EpLayout = EpLayout.FOLDED  # which ranks an ep group is


@dataclass(frozen=True)
class Micro:
    vp: int
    mbs: int
    recompute: Recompute
    sequence_parallel: bool
    schedule: Schedule = Schedule.ONE_F_ONE_B  # interleaved when vp > 1

    def num_microbatches(self, gbs: int, dp: int) -> int:
        return gbs // (self.mbs * dp)

    def __post_init__(self) -> None:
        coerce_choices(self)


@dataclass(frozen=True)
class SearchSpace:
    """Values each knob may take; `layouts` and `candidates` combine them."""

    num_gpus: tuple[int, ...]
    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]
    vp: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    mbs: tuple[int, ...] = (1, 2, 4, 8, 16)
    recompute: tuple[Recompute, ...] = tuple(Recompute)
    sequence_parallel: tuple[bool, ...] = (False, True)  # where tp > 1 (off at tp 1)
    # ZB-H1 (Qi et al. 2024) defers weight gradients into the drain bubble: faster than
    # 1F1B, with more activations held on later stages (GPipe is never faster than 1F1B
    # and holds more, so it is not searched)
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.ZB_H1)
    # model-state sharding patterns over (P, G, OS) (planner/export/frameworks.py); the
    # second set, when given, replaces the first where pp > 1
    sharding: tuple[ShardPattern, ...] = (ANY_SHARDING,)
    sharding_with_pp: tuple[ShardPattern, ...] | None = None
    tp_with_pp: bool = True  # tp > 1 and pp > 1 in one layout
    uneven_stages: bool = True  # stages (and chunks) of different layer counts
    kv_heads_split: bool = False  # tp must divide the key/value heads (the framework's rule)
    ep: tuple[int, ...] = (1,)  # expert-parallel degrees (MoE models)
    # MoE limits of a framework (FrameworkCapabilities): ep groups of data-parallel ranks
    # only; schedules and recompute modes with ep > 1 (None: any); expert tp 1 where
    # tp > 1; sequence parallelism on MoE models with tp > 1 (Megatron-Core requires it)
    ep_within_dp: bool = False
    ep_schedules: tuple[Schedule, ...] | None = None
    ep_recompute: tuple[Recompute, ...] | None = None
    expert_tp_one: bool = False
    moe_sequence_parallel: bool = True
    ep_sharding_multiple: bool = False  # with ep > 1 sharding degrees <= ep or k x ep
    zb_full_recompute: bool = True  # FrameworkCapabilities.zb_full_recompute
    # 16-bit compute with tp or pp only where parameters are sharded over dp x cp > 1, or
    # cp > 1 (FrameworkCapabilities.amp_needs_sharding_with_tp_pp: torchtitan)
    amp_needs_sharding_with_tp_pp: bool = False
    fsdp_data_parallel: bool = False  # FrameworkCapabilities.fsdp_data_parallel: torchtitan

    def sharding_patterns(self, pp: int) -> tuple[ShardPattern, ...]:
        """The sharding patterns a layout of `pp` stages may take."""
        return self.sharding_with_pp if pp > 1 and self.sharding_with_pp else self.sharding

    @property
    def size(self) -> int:
        return (len(self.num_gpus) * len(self.tp) * len(self.cp) * len(self.pp) * len(self.ep)
                * len(self.vp)
                * len(self.mbs) * len(self.recompute) * len(self.sequence_parallel)
                * len(self.schedule))


def _powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(limit.bit_length()) if 1 << i <= limit)


def default_space(model: ModelSpec, *, num_gpus: tuple[int, ...], nvlink_domain_gpus: int,
                  seq_len: int) -> SearchSpace:
    """Tensor parallel inside an NVLink domain (a node; a GB200 NVL72 rack), context parallel for long sequences (chunks of at
    least 1,024 tokens), any pipeline depth up to the layer count; for an MoE model,
    every power-of-two expert-parallel degree that divides the experts."""
    most = max(num_gpus)
    return SearchSpace(
        num_gpus=num_gpus,
        tp=_powers_of_two(nvlink_domain_gpus),
        cp=tuple(c for c in _powers_of_two(16) if c == 1 or seq_len // c >= 2048),
        pp=tuple(p for p in range(1, min(model.num_layers, most) + 1) if most % p == 0),
        ep=tuple(e for e in _powers_of_two(min(model.num_experts, most))
                 if not model.num_experts % e) if model.is_moe else (1,),
    )


def for_framework(space: SearchSpace, caps: FrameworkCapabilities) -> SearchSpace:
    """The part of `space` that the framework `caps` runs: its parallelisms, schedules
    (interleaving only where it has interleaved 1F1B), recompute modes, sequence
    parallelism, sharding patterns, tp with pp, uneven stages."""
    def within(values: tuple, allowed: object) -> tuple:
        return tuple(v for v in values if v in allowed)  # type: ignore[operator]  # a set or tuple

    def degrees(axis: str, values: tuple[int, ...]) -> tuple[int, ...]:
        return values if axis in caps.parallelisms else within(values, (1,))

    interleaves = "vp" in caps.parallelisms and Schedule.INTERLEAVED_1F1B in caps.schedules
    sequence_parallel = {"optional": space.sequence_parallel, "never": (False,),
                         "with tp": (True,)}[caps.sequence_parallel]
    return replace(
        space, tp=degrees("tp", space.tp), cp=degrees("cp", space.cp), pp=degrees("pp", space.pp),
        ep=degrees("ep", space.ep),
        vp=space.vp if interleaves else within(space.vp, (1,)),
        recompute=within(space.recompute, caps.recompute),
        sequence_parallel=sequence_parallel,
        schedule=(within(space.schedule, caps.schedules)
                  or within(Schedule.chosen(), caps.schedules)),
        sharding=caps.sharding, sharding_with_pp=caps.sharding_with_pp,
        tp_with_pp=space.tp_with_pp and caps.tp_with_pp,
        uneven_stages=space.uneven_stages and caps.uneven_stages,
        kv_heads_split=space.kv_heads_split or caps.kv_heads_split,
        ep_within_dp=caps.ep_within_dp,
        ep_schedules=None if caps.ep_schedules is None
        else tuple(s for s in Schedule if s in caps.ep_schedules),
        ep_recompute=None if caps.ep_recompute is None
        else tuple(r for r in Recompute if r in caps.ep_recompute),
        expert_tp_one=not caps.moe_expert_tp, moe_sequence_parallel=caps.moe_sequence_parallel,
        ep_sharding_multiple=caps.ep_sharding_multiple,
        zb_full_recompute=space.zb_full_recompute and caps.zb_full_recompute,
        amp_needs_sharding_with_tp_pp=caps.amp_needs_sharding_with_tp_pp,
        fsdp_data_parallel=caps.fsdp_data_parallel)


# Named predicates: a layout or candidate is kept when every one holds (the rules are
# planner/specs/rules.py, which the layout check and Plan.check also ask).

def tp_fits_heads(model: ModelSpec, tp: int) -> bool:
    return tp_problem(model, tp) is None


def kv_heads_split_where_needed(space: SearchSpace, model: ModelSpec, tp: int) -> bool:
    """tp divides the key/value heads, where the space's framework copies none."""
    return not space.kv_heads_split or model.kv_heads % tp == 0


def cp_fits_sequence(seq_len: int, cp: int) -> bool:
    return cp_problem(seq_len, cp) is None


def ep_fits(model: ModelSpec, ep: int, dp: int, cp: int, *, within_dp: bool = False) -> bool:
    return ep_problem(model, ep, dp=dp, cp=cp) is None and not (within_dp and dp % ep)


def expert_tp(space: SearchSpace, model: ModelSpec, tp: int) -> int | None:
    """The layout's expert tp: 1 where the framework keeps experts whole on every tp rank,
    else tp (None)."""
    return 1 if space.expert_tp_one and model.is_moe and tp > 1 else None


def ep_layout(space: SearchSpace, ep: int) -> EpLayout:
    """The ranks a layout's ep groups are made of: data-parallel replicas where the
    framework forms them so (trainplan's executor), else Megatron-Core's folding."""
    return EpLayout.DATA_PARALLEL if space.ep_within_dp and ep > 1 else EpLayout.FOLDED


def ep_allows(space: SearchSpace, layout: Layout, micro: Micro) -> bool:
    """With ep > 1, only the schedules and recompute modes the framework runs with it."""
    if layout.ep == 1:
        return True
    return ((space.ep_schedules is None or micro.schedule.for_chunks(micro.vp)
             in space.ep_schedules)
            and (space.ep_recompute is None or micro.recompute in space.ep_recompute))


def split_fits_gpus(n: int, tp: int, cp: int, pp: int) -> bool:
    return n % (tp * cp * pp) == 0


def pp_fits_layers(model: ModelSpec, pp: int, vp: int = 1) -> bool:
    return chunks_problem(model.num_layers, pp, vp) is None


def batch_divides(gbs: int, dp: int, mbs: int) -> bool:
    return batch_problem(gbs, mbs, dp) is None


def interleaving_valid(layout: Layout, micro: Micro, gbs: int) -> bool:
    return interleaving_problem(layout.pp, micro.vp, micro.schedule,
                                micro.num_microbatches(gbs, layout.dp)) is None


def schedule_valid(layout: Layout, micro: Micro) -> bool:
    return schedule_problem(micro.schedule, layout.pp, micro.vp) is None


def zb_recompute_allowed(space: SearchSpace, layout: Layout, micro: Micro) -> bool:
    """Full recomputation on the stages past the first under ZB-H1, where the framework
    runs it (its W pass is a second backward, which would re-run each layer)."""
    return (space.zb_full_recompute or micro.schedule != Schedule.ZB_H1 or layout.pp == 1
            or micro.recompute != Recompute.FULL)


def tp_with_pp_allowed(space: SearchSpace, tp: int, pp: int) -> bool:
    return space.tp_with_pp or tp == 1 or pp == 1


def stages_even_where_needed(space: SearchSpace, model: ModelSpec, pp: int, vp: int = 1) -> bool:
    """Every stage (and every interleaved chunk) the same number of layers, where the
    space takes no uneven ones."""
    return space.uneven_stages or model.num_layers % (pp * vp) == 0


def sequence_parallel_values(space: SearchSpace, layout: Layout,
                             model: ModelSpec | None = None, *,
                             seq_len: int) -> tuple[bool, ...]:
    """Sequence parallelism splits what tensor parallelism splits: off at tp 1. MoE with
    tp > 1 needs it (Megatron-Core: "When using MoE with expert parallelism and tensor
    parallelism, sequence parallelism must be enabled"). It splits the sequence evenly
    over tp (`sp_problem`), so it is out where tp does not divide `seq_len`."""
    if layout.tp == 1:
        return (False,)
    values = space.sequence_parallel
    if model is not None and model.is_moe:
        values = tuple(sp for sp in values if sp == space.moe_sequence_parallel)
    if sp_problem(seq_len, layout.tp, layout.cp) is not None:
        values = tuple(sp for sp in values if not sp)
    return values


def missing_for(space: SearchSpace, model: ModelSpec, layout: Layout) -> list[str]:
    """What `layout` needs that `space` (a framework's) does not take, by the predicates
    `layouts` prunes with."""
    checks = (("tp", layout.tp in space.tp), ("context parallelism", layout.cp in space.cp),
              ("pp", layout.pp in space.pp),
              ("tp with pp", tp_with_pp_allowed(space, layout.tp, layout.pp)),
              ("uneven stages", stages_even_where_needed(space, model, layout.pp)),
              ("tp beyond the key/value heads",
               kv_heads_split_where_needed(space, model, layout.tp)))
    return [what for what, ok in checks if not ok]


def layouts(space: SearchSpace, model: ModelSpec, *, gbs: int, seq_len: int) -> Iterator[Layout]:
    for n, tp, cp, pp in itertools.product(space.num_gpus, space.tp, space.cp, space.pp):
        if not (split_fits_gpus(n, tp, cp, pp) and tp_fits_heads(model, tp)
                and kv_heads_split_where_needed(space, model, tp)
                and cp_fits_sequence(seq_len, cp) and pp_fits_layers(model, pp)
                and tp_with_pp_allowed(space, tp, pp)
                and stages_even_where_needed(space, model, pp)):
            continue
        dp = n // (tp * cp * pp)
        if gbs % dp:  # not even one sequence per replica and micro-batch
            continue
        for ep in space.ep:
            if ep_fits(model, ep, dp, cp, within_dp=space.ep_within_dp):
                yield Layout(n, tp, cp, pp, dp, ep, expert_tp(space, model, tp),
                             ep_layout(space, ep))


def candidates(space: SearchSpace, model: ModelSpec, layout: Layout, *, gbs: int,
               seq_len: int) -> Iterator[Micro]:
    for vp, mbs, rc, sp, schedule in itertools.product(
            space.vp, space.mbs, space.recompute,
            sequence_parallel_values(space, layout, model, seq_len=seq_len), space.schedule):
        micro = Micro(vp, mbs, rc, sp, schedule)
        if (batch_divides(gbs, layout.dp, mbs) and pp_fits_layers(model, layout.pp, vp)
                and interleaving_valid(layout, micro, gbs) and schedule_valid(layout, micro)
                and zb_recompute_allowed(space, layout, micro)
                and stages_even_where_needed(space, model, layout.pp, vp)
                and ep_allows(space, layout, micro)):
            yield micro
