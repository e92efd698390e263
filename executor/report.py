"""A run measured beside its prediction: iteration time, tokens/s, memory per rank.

Imports no torch: it reads the ranks' `metrics.json` (executor/runtime.py) and the
planner's prediction (the simulator's SimResult, or the plan's `predicted`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from executor.topology import Topology
from planner.predict.results import SimResult
from planner.specs.plan import Plan, describe_layout

__all__ = ["KindTime", "RankMemory", "RankTrace", "RunReport", "diverged", "make_report",
           "to_markdown"]

MIB = 1024**2


@dataclass(frozen=True)
class RankMemory:
    rank: int
    pipeline: int
    stage: int
    peak_bytes: int
    predicted_peak_bytes: int | None
    model_state_bytes: int  # parameters, gradients and optimizer states it holds
    predicted_model_state_bytes: int | None


@dataclass(frozen=True)
class KindTime:
    """A step's time in one kind of op on one rank (executor/trace.py `KINDS`)."""

    kind: str
    predicted_s: float | None  # the cost model's (None: a kind it does not price as ops)
    measured_s: float


@dataclass(frozen=True)
class RankTrace:
    """One rank's traced steps (`plan run --trace`): its time by kind of op beside the
    cost model's (planner/predict/op_kinds.py), and the ops that took longest."""

    rank: int
    pipeline: int
    stage: int
    steps: int
    wall_s: float  # a traced step's wall time, the profiler's overhead included
    kinds: list[KindTime]
    top: list[list]  # [name, kind, calls a step, seconds a step]


@dataclass(frozen=True)
class RunReport:
    name: str
    model: str
    cluster: str
    layout: str
    steps_run: int
    first_step: int
    warmup_steps: int
    losses: list[float]
    measured_iteration_s: float  # each rank's median after warm-up, the slowest rank's
    measured_iteration_range_s: tuple[float, float]
    predicted_iteration_s: float | None
    measured_tokens_per_s: float
    predicted_tokens_per_s: float | None
    prediction_source: str
    memory_kind: str
    ranks: list[RankMemory]
    # fp16 (dynamic loss scaling): the scale of each step run, the steps skipped on overflow
    loss_scales: list[float] | None = None
    skipped_steps: list[int] = field(default_factory=list)
    traces: list[RankTrace] = field(default_factory=list)

    @property
    def iteration_error(self) -> float | None:
        """predicted / measured - 1."""
        if self.predicted_iteration_s is None:
            return None
        return self.predicted_iteration_s / self.measured_iteration_s - 1

    def to_dict(self) -> dict:
        return {**asdict(self), "iteration_error": self.iteration_error}


def _predicted_memory(plan: Plan, prediction: SimResult | None
                      ) -> dict[tuple[int, int], tuple[int, int]]:
    """(pipeline, stage) -> (peak bytes, model-state bytes) predicted."""
    if prediction is not None:
        return {(s.pipeline, s.stage): (int(s.memory.total_bytes),
                                        int(s.memory.model_states_bytes))
                for s in prediction.stages}
    return {}


def _rank_step_times(metrics: dict) -> list[list[float]]:
    """Each rank's time of each step run; metrics without them (older runs): the slowest
    rank's time per step, as one series."""
    return metrics.get("rank_step_times_s") or [metrics["step_times_s"]]


def measured_iteration_s(metrics: dict, warmup: int) -> float:
    """The run's iteration time: each rank's median step after the first `warmup`, then
    the slowest rank's. Every rank runs the same period (the gradient reduction and the
    pipeline flush join them each step), but a rank's step is timed on its own clock from
    its own start: a rank late out of one step (its optimizer step, a preemption) makes
    that step long on it and the next step long on the ranks that then wait for it, so
    the slowest rank of each step counts one delay twice and its median is biased up by
    the spread. Metrics without per-rank times (older runs): the median of the slowest
    rank's time per step."""
    return max(statistics.median(times[warmup:]) for times in _rank_step_times(metrics))


def _traces(plan: Plan, metrics: dict,
            predicted: dict[tuple[int, int], dict[str, float]] | None) -> list[RankTrace]:
    """Each traced rank's kinds of op, measured beside predicted (`stage_op_kinds`)."""
    out = []
    for role, trace in zip(Topology.of(plan).roles, metrics.get("traces") or [], strict=False):
        if not trace:
            continue
        mine = (predicted or {}).get((role.pipeline, role.stage), {})
        out.append(RankTrace(
            rank=role.rank, pipeline=role.pipeline, stage=role.stage, steps=trace["steps"],
            wall_s=trace["wall_s"], top=trace["top"],
            kinds=[KindTime(kind, mine.get(kind), seconds)
                   for kind, seconds in trace["kinds"].items()]))
    return out


def make_report(plan: Plan, metrics: dict, *, prediction: SimResult | None, source: str,
                warmup: int, name: str,
                predicted_kinds: dict[tuple[int, int], dict[str, float]] | None = None
                ) -> RunReport:
    """The report of one run (`metrics` as executor/runtime.py writes them);
    `predicted_kinds`: the cost model's split of each stage's step by kind of op
    (planner/predict/op_kinds.py `stage_op_kinds`), set beside a traced run's."""
    times = metrics["step_times_s"]
    skip = min(warmup, len(times) - 1)
    steady = [t for rank in _rank_step_times(metrics) for t in rank[skip:]]
    measured = measured_iteration_s(metrics, skip)
    tr = plan.training
    if prediction is not None:
        predicted_s: float | None = prediction.iteration_time_s
    else:
        predicted_s = plan.predicted.iteration_time_s if plan.predicted else None
    stored = plan.predicted.peak_memory_bytes if plan.predicted else ()
    memory = _predicted_memory(plan, prediction)
    ranks = []
    for role in Topology.of(plan).roles:
        peak, states = memory.get((role.pipeline, role.stage), (None, None))
        if peak is None and role.stage < len(stored):
            peak = stored[role.stage]
        ranks.append(RankMemory(
            rank=role.rank, pipeline=role.pipeline, stage=role.stage,
            peak_bytes=metrics["peak_memory_bytes"][role.rank], predicted_peak_bytes=peak,
            model_state_bytes=sum(metrics["model_state_bytes"][role.rank].values()),
            predicted_model_state_bytes=states))
    tokens = tr.global_batch_size * tr.seq_len
    return RunReport(
        name=name, model=plan.model.name, cluster=plan.cluster.name,
        layout=describe_layout(plan), steps_run=len(times), first_step=metrics["first_step"],
        warmup_steps=skip, losses=metrics["losses"],
        measured_iteration_s=measured, measured_iteration_range_s=(min(steady), max(steady)),
        predicted_iteration_s=predicted_s, measured_tokens_per_s=tokens / measured,
        predicted_tokens_per_s=tokens / predicted_s if predicted_s else None,
        prediction_source=source, memory_kind=metrics["memory_kind"], ranks=ranks,
        loss_scales=metrics.get("loss_scales"), skipped_steps=metrics.get("skipped_steps", []),
        traces=_traces(plan, metrics, predicted_kinds))


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


def to_markdown(r: RunReport) -> str:
    """The report as a Markdown page (reports/<name>/report.md)."""
    err = r.iteration_error
    pred_s = "-" if r.predicted_iteration_s is None else f"{r.predicted_iteration_s * 1e3:.2f}"
    pred_tok = "-" if r.predicted_tokens_per_s is None else f"{r.predicted_tokens_per_s:,.0f}"
    lines = [
        f"# {r.name}: {r.model} on {r.cluster}", "", f"Layout: {r.layout}.", "",
        f"Steps {r.first_step + 1}-{r.first_step + r.steps_run} run; "
        + (f"the first {r.warmup_steps} are warm-up. " if r.warmup_steps > 1 else
           "the first is warm-up. " if r.warmup_steps == 1 else "no warm-up. ")
        + "Measured: each rank's median step after warm-up, the slowest rank's (range: "
        "every rank's steps). " + f"Prediction: {r.prediction_source}.", "",
        "| | predicted | measured | error |", "|---|---|---|---|",
        f"| iteration (ms) | {pred_s} | {r.measured_iteration_s * 1e3:.2f} "
        f"(range {r.measured_iteration_range_s[0] * 1e3:.2f}-"
        f"{r.measured_iteration_range_s[1] * 1e3:.2f}) | "
        f"{'-' if err is None else f'{err:+.1%}'} |",
        f"| tokens/s | {pred_tok} | {r.measured_tokens_per_s:,.0f} | |", "",
        f"Memory per rank (MiB). Measured peak: {r.memory_kind}; model states: the "
        "parameters, gradients and optimizer states the rank holds.", "",
        "| rank | pipeline | stage | peak predicted | peak measured | model states predicted "
        "| model states measured |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {m.rank} | {m.pipeline} | {m.stage} | {_mib(m.predicted_peak_bytes)} | "
              f"{_mib(m.peak_bytes)} | {_mib(m.predicted_model_state_bytes)} | "
              f"{_mib(m.model_state_bytes)} |" for m in r.ranks]
    lines += ["", "Loss per step: " + ", ".join(f"{x:.4f}" for x in r.losses), ""]
    if (why := diverged(r)) is not None:
        lines += [f"**{why}**", ""]
    if r.loss_scales:
        skipped = ", ".join(map(str, r.skipped_steps)) or "none"
        lines += [f"fp16 loss scale: {r.loss_scales[0]:g} at step {r.first_step + 1}, "
                  f"{r.loss_scales[-1]:g} at step {r.first_step + len(r.loss_scales)}; "
                  f"steps skipped on an overflow: {skipped}.", ""]
    if r.traces:
        lines += _trace_markdown(r.traces, r.measured_iteration_s)
    return "\n".join(lines)


def diverged(r: RunReport) -> str | None:
    """One line if the run's loss stopped being a number (the time it measured stands;
    what it trained does not)."""
    bad = next((i for i, x in enumerate(r.losses) if not math.isfinite(x)), None)
    if bad is None:
        return None
    return (f"the loss is not finite from step {r.first_step + bad + 1}: the run diverged "
            "(a smaller --lr; the times are still measured)")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _trace_markdown(traces: list[RankTrace], measured_s: float) -> list[str]:
    """The traced steps' table: per rank and kind of op, ms a step predicted and measured."""
    slowest = max(t.wall_s for t in traces)
    lines = [f"Time by kind of op (ms a step; `--trace`: {traces[0].steps} more steps after the "
             "measured ones under torch.profiler; measured: each op's own time, the CPU's on "
             "CPU ranks, the kernels' on GPUs; predicted: the cost model's op times over the "
             "step's passes, without the waits, host gaps and sharing the simulation adds; "
             "collectives and the framework's own time are not priced as ops). A traced step "
             f"took {slowest * 1e3:.2f} ms against the measured {measured_s * 1e3:.2f}: the "
             "profiler's own cost is in the traced times.", "",
             "| rank | pipeline.stage | kind | predicted | measured | measured / predicted |",
             "|---|---|---|---|---|---|"]
    for t in traces:
        where = f"{t.pipeline}.{t.stage}"
        for k in t.kinds:
            ratio = (f"{k.measured_s / k.predicted_s:.2f}" if k.predicted_s else "-")
            lines.append(f"| {t.rank} | {where} | {k.kind} | {_ms(k.predicted_s)} | "
                         f"{_ms(k.measured_s)} | {ratio} |")
        in_ops = sum(k.measured_s for k in t.kinds)
        lines.append(f"| {t.rank} | {where} | in no op (idle, waits, Python, the profiler) "
                     f"| - | {_ms(max(0.0, t.wall_s - in_ops))} | - |")
        lines.append(f"| {t.rank} | {where} | traced step (wall) | - | {_ms(t.wall_s)} | - |")
    lines += ["", "Longest ops (rank " + str(traces[0].rank) + "): "
              + "; ".join(f"{name} ({kind}) {calls:g} a step, {seconds * 1e3:.2f} ms"
                          for name, kind, calls, seconds in traces[0].top[:8]), ""]
    return lines
