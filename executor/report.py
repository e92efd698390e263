"""A run measured beside its prediction: iteration time, tokens/s, memory per rank.

Imports no torch: it reads the ranks' `metrics.json` (executor/runtime.py) and the
planner's prediction (the simulator's SimResult, or the plan's `predicted`).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from executor.topology import Topology
from planner.predict.results import SimResult
from planner.specs.plan import Plan, describe_layout

__all__ = ["RankMemory", "RunReport", "make_report", "to_markdown"]

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


def make_report(plan: Plan, metrics: dict, *, prediction: SimResult | None, source: str,
                warmup: int, name: str) -> RunReport:
    """The report of one run (`metrics` as executor/runtime.py writes them)."""
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
        loss_scales=metrics.get("loss_scales"), skipped_steps=metrics.get("skipped_steps", []))


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
    if r.loss_scales:
        skipped = ", ".join(map(str, r.skipped_steps)) or "none"
        lines += [f"fp16 loss scale: {r.loss_scales[0]:g} at step {r.first_step + 1}, "
                  f"{r.loss_scales[-1]:g} at step {r.first_step + len(r.loss_scales)}; "
                  f"steps skipped on an overflow: {skipped}.", ""]
    return "\n".join(lines)
