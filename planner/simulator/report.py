"""From a scheduled task graph to what users see: SimResult, Chrome trace, Gantt chart."""

from __future__ import annotations

import json

from planner.costs.memory import MEMORY_SOURCE
from planner.costs.stages import cost_sources
from planner.predict.results import Breakdown, SimResult, StageSummary, make_result
from planner.simulator.build import Simulation, TaskMeta, simulate_graph
from planner.specs.plan import Plan, describe_layout
from profiler.store import Profiles

__all__ = ["SIMULATION_SOURCE", "gantt_title", "simulate", "simulate_detailed", "write_gantt",
           "write_trace"]

SIMULATION_SOURCE = ("event simulation (task graph list-scheduled over compute and "
                     "communication streams, planner/simulator)")
_COMPUTE_KINDS = ("F", "B", "W")  # W: weight gradients of zero-bubble schedules


def simulate(plan: Plan, *, profiles: Profiles | None = None) -> SimResult:
    """Simulate one iteration of `plan` (see planner/simulator/build.py), with op and
    collective times from `profiles` where they have them."""
    return _result(simulate_graph(plan, profiles=profiles))


def simulate_detailed(plan: Plan, *, profiles: Profiles | None = None
                      ) -> tuple[SimResult, Simulation]:
    sim = simulate_graph(plan, profiles=profiles)
    return _result(sim), sim


def _critical_stage(sim: Simulation) -> tuple[int, int]:
    """The stage whose compute ends last: the one the step waits for. (The task that ends
    last is a gradient reduction or optimizer step, which waits for every replica; taking
    its stage told a slower replica's time as that stage's data-parallel communication.)"""
    g, end = sim.graph, sim.schedule.end
    last = max((t for t in range(len(g)) if g.kinds[t] in _COMPUTE_KINDS),
               key=end.__getitem__)
    meta: TaskMeta = g.meta[last]
    return meta.pipeline, meta.stage


def _breakdown(sim: Simulation) -> Breakdown:
    """Where the critical stage's time went: its passes' compute and in-line collectives,
    the waits before them (for a transfer: pipeline comm; for a parameter gather:
    data-parallel comm; otherwise pipeline bubble), and what follows its last backward
    (optimizer, exposed data-parallel reduction). The parts add up to the iteration; on
    CPU ranks sharing a host's cores, the time a pass was slowed by the others counts as
    compute."""
    g, sched = sim.graph, sim.schedule
    pi, si = _critical_stage(sim)
    stream = g.stream(f"p{pi}.s{si}.compute")
    passes = sorted((t for t in range(len(g)) if g.streams[t] == stream
                     and g.kinds[t] in _COMPUTE_KINDS), key=sched.start.__getitem__)
    totals = dict.fromkeys(("compute", "host", "tp", "cp", "ep", "pp", "dp", "bubble", "opt"),
                           0.0)
    cursor = 0.0
    for t in passes:
        gap = sched.start[t] - cursor
        b = sched.binding[t]
        if gap > 0 and b >= 0 and g.kinds[b] in ("send", "recv", "dp"):
            waited = min(gap, g.durations[b])
            totals["dp" if g.kinds[b] == "dp" else "pp"] += waited
            gap -= waited
        totals["bubble"] += max(gap, 0.0)
        part = g.meta[t].part
        # CPU ranks sharing a host: the time its compute was slowed by the others'
        totals["compute"] += part.compute_s + (sched.end[t] - sched.start[t] - g.durations[t])
        totals["host"] += part.host_s
        totals["tp"] += part.tp_s
        totals["cp"] += part.cp_s
        totals["ep"] += part.ep_s
        totals["dp"] += part.dp_s
        cursor = sched.end[t]
    tail = sched.makespan_s - cursor
    optimizer = next(sched.end[t] - sched.start[t] for t in range(len(g))
                     if g.kinds[t] == "optimizer" and g.streams[t] == stream)
    totals["opt"] = min(tail, optimizer)
    totals["dp"] += tail - totals["opt"]
    return Breakdown(compute_s=totals["compute"], host_overhead_s=totals["host"],
                     tp_comm_s=totals["tp"],
                     cp_comm_s=totals["cp"], pp_comm_s=totals["pp"], dp_comm_s=totals["dp"],
                     bubble_s=totals["bubble"], optimizer_s=totals["opt"],
                     ep_comm_s=totals["ep"])


def _stage_summaries(sim: Simulation) -> tuple[StageSummary, ...]:
    """Per stage: pass times and peak memory with the activations the simulated schedule
    actually keeps in flight."""
    plan = sim.plan
    out = []
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            cost = sim.costs[pi][si]
            layers = sim.in_flight_layers[(sim.representative[pi], si)]
            memory = cost.memory.with_layers_in_flight(layers)
            out.append(StageSummary(pipeline=pi, stage=si, device=cost.device,
                                    layers=stage.layers,  # type: ignore[arg-type]  # a stage's layers are a checked pair
                                    forward_s=cost.forward_s, backward_s=cost.backward_s,
                                    memory=memory, attention=str(plan.attention_of(stage))))
    return tuple(out)


def _result(sim: Simulation) -> SimResult:
    return make_result(sim.plan, method="event simulation", iteration_s=sim.schedule.makespan_s,
                       breakdown=_breakdown(sim), stages=_stage_summaries(sim),
                       sources={**cost_sources(sim.plan, sim.profiles), "memory": MEMORY_SOURCE,
                                "schedule": SIMULATION_SOURCE})


def write_trace(sim: Simulation, path: str) -> None:
    """Chrome-trace JSON (opens in Perfetto / chrome://tracing): one process per
    simulated pipeline, one thread per stream, one slice per task."""
    g, sched = sim.graph, sim.schedule
    events: list[dict] = []
    pids = {pi: pi for pi in sim.representatives}
    for sid, name in enumerate(g.stream_names):
        pipe = int(name.split(".")[0][1:])
        events.append({"ph": "M", "name": "thread_name", "pid": pids.get(pipe, pipe), "tid": sid,
                       "args": {"name": name.split(".", 1)[1]}})
    for pi in sim.representatives:
        events.append({"ph": "M", "name": "process_name", "pid": pi,
                       "args": {"name": f"pipeline {pi}"}})
    for t in range(len(g)):
        meta: TaskMeta = g.meta[t]
        args: dict[str, float | str] = {"stage": meta.stage, "chunk": meta.chunk,
                                        "microbatch": meta.microbatch}
        if meta.detail:
            args["collective"] = meta.detail
        if meta.part is not None:
            args.update(compute_ms=meta.part.compute_s * 1e3, tp_comm_ms=meta.part.tp_s * 1e3,
                        cp_comm_ms=meta.part.cp_s * 1e3, ep_comm_ms=meta.part.ep_s * 1e3,
                        waiting_for_gathers_ms=meta.part.dp_s * 1e3)
        events.append({"ph": "X", "name": g.names[t], "cat": g.kinds[t], "pid": meta.pipeline,
                       "tid": g.streams[t], "ts": sched.start[t] * 1e6,
                       "dur": (sched.end[t] - sched.start[t]) * 1e6, "args": args})
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"model": sim.plan.model.name, "cluster": sim.plan.cluster.name,
                                 "layout": describe_layout(sim.plan),
                                 "source": SIMULATION_SOURCE}}, fh)


def write_gantt(sim: Simulation, path: str, *, max_stages: int = 32) -> None:
    """A picture of the pipeline schedule: one row per stage of the first simulated
    pipeline, forward passes in blue, backward in green (darker for later chunks), weight
    gradients of zero-bubble schedules in purple, data-parallel traffic in orange and the
    optimizer in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    g, sched, plan = sim.graph, sim.schedule, sim.plan
    pi = sim.representatives[0]
    pp = len(plan.pipelines[pi].stages)
    rows, vp = min(pp, max_stages), plan.training.virtual_stages
    bars: dict[tuple[int, str, int], list[tuple[float, float, int]]] = {}
    labels = []
    makespan = sched.makespan_s  # a max over every task: once, not per task
    for t in range(len(g)):
        meta: TaskMeta = g.meta[t]
        if meta.pipeline != pi or meta.stage >= rows or g.kinds[t] == "send":
            continue
        kind = g.kinds[t]
        bars.setdefault((meta.stage, kind, meta.chunk), []).append(
            (sched.start[t], sched.end[t] - sched.start[t], meta.microbatch))
        if kind in _COMPUTE_KINDS and sched.end[t] - sched.start[t] > makespan / 100:
            labels.append(((sched.start[t] + sched.end[t]) / 2, meta.stage, meta.microbatch))
    fig, ax = plt.subplots(figsize=(14, 0.45 * rows + 1.8))
    shades = {"F": plt.cm.Blues, "B": plt.cm.Greens, "W": plt.cm.Purples}
    for (stage, kind, chunk), spans in bars.items():
        colour: object
        if kind in shades:
            colour, y, h = shades[kind](0.45 + 0.4 * chunk / max(vp - 1, 1)), stage - 0.4, 0.8
        elif kind == "optimizer":
            colour, y, h = "tab:red", stage - 0.4, 0.8
        else:
            colour, y, h = "tab:orange", stage + 0.15, 0.25
        ax.broken_barh(_merged(spans), (y, h), facecolors=colour, edgecolors="white",
                       linewidth=0.2)
    for x, y, j in labels[:2000]:
        ax.text(x, y, str(j), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(rows), [f"stage {s}" for s in range(rows)])
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_xlim(0, makespan * 1.01)
    ax.set_xlabel("time (s)")
    ax.set_title(gantt_title(plan, pi, makespan))
    split = any(kind == "W" for _, kind, _ in bars)
    handles = [Patch(color=plt.cm.Blues(0.6), label="forward"),
               Patch(color=plt.cm.Greens(0.6), label="backward: input grads (B, +recompute)" if split
                     else "backward (+recompute)")]
    if split:
        handles.append(Patch(color=plt.cm.Purples(0.6), label="backward: weight grads (W)"))
    handles += [Patch(color="tab:orange", label="data-parallel comm"),
                Patch(color="tab:red", label="optimizer")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gantt_title(plan: Plan, pipeline: int, makespan_s: float) -> str:
    """'gpt3-1.3b: 1f1b, 4 stages, 8 micro-batches in 2 pipeline flushes, vp 1: iteration
    3.2 s (simulated)': what the picture of pipeline `pipeline` shows (the flushes, where a
    step runs several schedules, are the fills and drains in the middle of the picture)."""
    tr, pipe = plan.training, plan.pipelines[pipeline]
    flushes = (f" in {tr.pipeline_flushes} pipeline flushes" if tr.pipeline_flushes > 1
               else "")
    return (f"{plan.model.name}: {tr.schedule}, {len(pipe.stages)} stages, "
            f"{pipe.num_microbatches} micro-batches{flushes}, vp {tr.virtual_stages}: "
            f"iteration {makespan_s:.3g} s (simulated)")


def _merged(spans: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """(start, width) bars with back-to-back pieces of one micro-batch joined (a backward
    pass split into per-layer tasks draws as one bar)."""
    out: list[list] = []
    for start, width, mb in sorted(spans, key=lambda s: s[0]):
        if out and out[-1][2] == mb and abs(out[-1][0] + out[-1][1] - start) <= 1e-9 * (1 + start):
            out[-1][1] = start + width - out[-1][0]
        else:
            out.append([start, width, mb])
    return [(a, b) for a, b, _ in out]

