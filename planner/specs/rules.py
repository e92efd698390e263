"""Feasibility rules, one home each: what a layout must satisfy to run at all.

Every rule returns None when it holds, else the rule as a user reads it ("must divide
num_heads 96"); `require(where, value, problem)` turns a broken rule into the one-line
`SpecError`. The layout check (`specs/layout.py`), `Plan.check`, the search space's
predicates, the heterogeneous templates and the executor's preflight all ask these, so
a rule and its message are written once.
"""

from __future__ import annotations

from planner.specs.choices import EpLayout, Schedule
from planner.specs.model import ModelSpec
from profiler.schema import fail

__all__ = ["batch_problem", "chunks_problem", "cp_problem", "ep_problem", "etp_problem",
           "interleaving_problem",
           "require", "schedule_problem", "sharding_problem", "sp_problem", "tp_problem"]


def require(where: str, value: object, problem: str | None) -> None:
    """Raise the SpecError of a broken rule (nothing if `problem` is None)."""
    if problem is not None:
        fail(where, value, problem)


def tp_problem(model: ModelSpec, tp: int) -> str | None:
    """Tensor parallelism splits the heads (Shoeybi et al. 2019): tp must divide them, and
    divide the K/V heads or be a multiple of them (which are then replicated), and the
    MLP's inner size (Megatron-LM's column-parallel fc1; the vocabulary is padded instead)."""
    if model.num_heads % tp:
        return f"must divide num_heads {model.num_heads}"
    if model.kv_heads % tp and tp % model.kv_heads:
        return f"must divide num_kv_heads {model.kv_heads} or be a multiple of it"
    if model.ffn_hidden_size % tp:
        return f"must divide ffn_hidden_size {model.ffn_hidden_size}"
    if model.is_moe and model.expert_ffn % tp:  # expert tp = tp (Megatron's default)
        return f"must divide the expert FFN size {model.expert_ffn}"
    return None


def ep_problem(model: ModelSpec, ep: int, *, dp: int, cp: int, tp: int = 1,
               etp: int | None = None, layout: EpLayout = EpLayout.FOLDED) -> str | None:
    """Expert parallelism splits each MoE layer's routed experts over ep ranks taken from
    the data- and context-parallel ranks (Megatron-Core parallel_state.py: ep divides
    dp x cp; MoE README: experts divisible by ep; DeepSpeed-MoE and torchtitan alike).
    With expert tp 1 (MoE Parallel Folding, Liu et al. 2025; torchtitan's etp = 1) the
    ep group also takes the tp ranks: ep divides dp x cp x tp. Laid out over
    data-parallel replicas only (`EpLayout.DATA_PARALLEL`), ep divides dp."""
    if ep == 1:
        return None
    if not model.is_moe:
        return "above 1 only for MoE models (num_experts > 0)"
    if model.num_experts % ep:
        return f"must divide num_experts {model.num_experts}"
    if layout == EpLayout.DATA_PARALLEL:
        if dp % ep:
            return (f"must divide dp = {dp} (ep_layout data_parallel: the ep group is "
                    "data-parallel replicas)")
        return None
    fold = tp // (etp or tp)
    if (dp * cp * fold) % ep:
        if fold > 1:
            return (f"must divide dp x cp x tp / etp = {dp * cp * fold} (the ep group is "
                    "carved out of them)")
        return f"must divide dp x cp = {dp * cp} (the ep group is carved out of them)"
    return None


def etp_problem(model: ModelSpec, etp: int | None, *, tp: int) -> str | None:
    """Expert tensor parallelism is tp or 1 (torchtitan parallel_dims.py: "Currently we
    only support ETP=TP or ETP=1"; Megatron recommends 1 for fine-grained experts)."""
    if etp is None:
        return None
    if not model.is_moe:
        return "only for MoE models (num_experts > 0)"
    if etp not in (1, tp):
        return f"must be 1 or tp ({tp})"
    return None


def cp_problem(seq_len: int, cp: int) -> str | None:
    """Context parallelism cuts the sequence into 2*cp chunks, two per rank, so that the
    causal work balances (Megatron-Core's load-balanced ring attention)."""
    if cp > 1 and seq_len % (2 * cp):
        return f"2*cp must divide the sequence length {seq_len} (load-balanced chunks)"
    return None


def sp_problem(seq_len: int, tp: int, cp: int = 1) -> str | None:
    """Sequence parallelism splits each context-parallel rank's part of the sequence
    (seq/cp tokens) evenly over the tp group (Korthikanti et al. 2022): Megatron-Core's
    scatter and reduce-scatter assert "First dimension of the tensor should be divisible
    by tensor parallel size" (tensor_parallel/mappings.py), torchtitan asserts seq_len
    divisible by tp x 2cp, and the executor's DTensor collectives fail on uneven parts."""
    if tp > 1 and (seq_len // cp) % tp:
        part = f"{seq_len}" if cp == 1 else f"{seq_len // cp} (seq {seq_len} / cp {cp})"
        return (f"with sequence parallelism, tp {tp} must divide the tokens each "
                f"context-parallel rank holds, {part}")
    return None


def seq_problem(model: ModelSpec, seq_len: int) -> str | None:
    """A model with learned positions has one embedding per position up to its own
    sequence length: the executor's model has none to look up past it. (The planner
    prices such a run as the architecture with a longer table, as Megatron's export sizes
    --max-position-embeddings by the training sequence; the executor refuses it, and a
    search for it: `FrameworkCapabilities.positions_past_the_table`.) Rotary and ALiBi
    positions extend to any length."""
    if model.position_embedding == "learned" and seq_len > model.seq_len:
        return (f"{model.name} learns {model.seq_len} positions (position_embedding: learned): "
                f"at most {model.seq_len}")
    return None


def chunks_problem(num_layers: int, pp: int, vp: int = 1) -> str | None:
    """Every model chunk (pp stages x vp interleaved chunks) holds at least one layer."""
    if pp * vp > num_layers:
        return (f"pp*vp = {pp * vp} model chunks need at least that many layers (the model "
                f"has {num_layers})")
    return None


def batch_problem(gbs: int, mbs: int, dp: int) -> str | None:
    """The global batch splits into whole micro-batches over the replicas."""
    if gbs % (mbs * dp):
        return f"must be a multiple of mbs*dp = {mbs * dp}"
    return None


def schedule_problem(schedule: Schedule, pp: int, vp: int) -> str | None:
    """What a schedule needs of the pipeline (see `Schedule`)."""
    if pp < schedule.min_stages or (schedule.splits_backward and vp > 1):
        allowed = [s for s in Schedule.chosen()
                   if pp >= s.min_stages and not (s.splits_backward and vp > 1)
                   and (vp == 1 or s is Schedule.ONE_F_ONE_B)]
        return (f"{schedule} needs pp > {schedule.min_stages - 1}"
                f"{' and vp = 1' if schedule.splits_backward else ''} (here pp {pp}, vp {vp}); "
                f"allowed here: {', '.join(allowed) or 'none'}")
    return None


def interleaving_problem(pp: int, vp: int, schedule: Schedule,
                         num_microbatches: int | None = None) -> str | None:
    """Interleaved 1F1B (Narayanan et al. 2021) runs vp > 1 chunks per stage: it needs a
    pipeline, the 1F1B order, and (Megatron-LM) micro-batches in groups of pp."""
    if vp == 1:
        return None
    if pp == 1 or schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
        return "interleaving needs pp > 1 and the 1f1b schedule"
    if num_microbatches is not None and num_microbatches % pp:
        return (f"interleaving needs micro-batches per pipeline (gbs/(mbs*dp) = "
                f"{num_microbatches}) to be a multiple of pp = {pp}")
    return None


def sharding_problem(size: int, dp: int, *, what: str = "dp") -> str | None:
    """A model-state sharding group (AMSP) divides the dp x cp ranks holding the same
    parameters (`Sharding`); `dp` is that count."""
    if dp % size:
        return f"must divide {what} = {dp}"
    return None
