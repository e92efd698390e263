"""What `plan search` prints: the table of its best plans (different layouts, each with
its memory headroom), and the same as JSON.

The table fits 100 columns (it drops optional columns past that, and writes a split that
is no ZeRO stage as 'P2 G2 OS16'); `wide` adds throughput, the closed-form estimate,
egress and the kernels. Plans whose stages differ in GPU type or tp get a line per kind
of replica under their row.
"""

from __future__ import annotations

import math

from planner.describe import (
    GIB,
    duration_words,
    headroom_bytes,
    is_mixed,
    layout_cell,
    render_table,
    replica_lines,
    sharding_cell,
    wrapped,
)
from planner.search.search import Ranked, SearchRequest, SearchResult, priced_plan
from planner.specs.plan import Pipeline, Plan

__all__ = ["search_json", "search_table"]

WIDTH = 100  # a terminal's columns the table fits without `wide`



def _free_cell(free_bytes: float, low: bool) -> str:
    """GiB free at the peak; below the headroom asked for it is flagged, and rounded down
    (1.96 GiB under a 2 GiB headroom read '2.0 !')."""
    gib = free_bytes / GIB
    return f"{math.floor(gib * 10) / 10:.1f} !" if low else f"{gib:.1f}  "


def _row(r: Ranked, req: SearchRequest) -> dict:
    plan, res = r.plan, r.result
    stage = plan.pipelines[0].stages[0]
    sh = plan.sharding
    gpus = []
    for pipe in plan.pipelines:
        for st in pipe.stages:
            g = plan.group_of(st).gpu
            gpus += [g] * len(st.devices)
    headroom = headroom_bytes(res)
    return {
        "gpu_types": {g: gpus.count(g) for g in dict.fromkeys(gpus)},
        "gpus": res.num_gpus, "tp": stage.tp, "pp": len(plan.pipelines[0].stages),
        "dp": plan.dp, "cp": stage.cp, "vp": plan.training.virtual_stages,
        "ep": plan.training.ep,
        "stages": [[{"gpu": plan.group_of(s).gpu,
                     "tp": s.tp, "cp": s.cp, "layers": s.num_layers} for s in p.stages]
                   for p in _distinct_pipelines(plan)],
        "schedule": plan.training.schedule, "dtype": plan.training.dtype,
        "mbs": plan.pipelines[0].micro_batch_size, "recompute": stage.recompute,
        "sequence_parallel": plan.training.sequence_parallel,
        "sharding": {"params": sh.params, "grads": sh.grads, "optim": sh.optim},
        "stage_sharding": None if plan.stage_sharding is None else [
            {"params": s.params, "grads": s.grads, "optim": s.optim}
            for s in plan.stage_sharding],
        "attention": plan.kernels.attention,
        "iteration_time_s": res.iteration_time_s, "estimate_s": r.estimate_s,
        "tokens_per_s": res.tokens_per_s, "mfu": res.mfu,
        "peak_memory_bytes": int(res.peak_memory_bytes),
        "memory_headroom_bytes": int(headroom),
        "below_headroom": headroom < req.memory_headroom_bytes,
        "usd_per_million_tokens": r.usd_per_million_tokens,
        "time_to_train_s": r.time_to_train_s(req.tokens),
        "run_cost_usd": r.run_cost_usd(req.tokens),
        "egress_usd": r.egress_usd(req.tokens),
        "egress_usd_per_million_tokens": r.egress_usd_per_million_tokens,
        "sources": res.sources,
    }


def _distinct_pipelines(plan: Plan) -> list[Pipeline]:
    """One pipeline of each kind (its stages' GPU types, tp, cp and layers)."""
    seen: dict[tuple, Pipeline] = {}
    for p in plan.pipelines:
        key = tuple((plan.group_of(s).gpu, s.tp, s.cp, s.num_layers)
                    for s in p.stages)
        seen.setdefault(key, p)
    return list(seen.values())


def _baselines(result: SearchResult, req: SearchRequest) -> list[dict]:
    """Each baseline's simulated iteration and how much faster the best plan is, and the
    share of a token's cost it saves against it (`best_is_cheaper_by`, what --objective
    cost prints; negative: it costs more); a baseline whose run
    would cost more than --max-budget says so (the search left such plans out)."""
    best = result.ranked[0]
    out = []
    for b in result.baselines:
        row: dict = {"name": b.name, "iteration_time_s": None, "best_is_faster_by": None,
                     "best_is_cheaper_by": None, "note": b.note}
        out.append(row)
        if b.plan is None or b.result is None or not b.result.fits:
            continue
        t = b.result.iteration_time_s
        row.update(iteration_time_s=t, best_is_faster_by=t / best.result.iteration_time_s - 1)
        ranked = priced_plan(b.plan, b.result)
        usd, mine = ranked.usd_per_million_tokens, best.usd_per_million_tokens
        if usd is not None and mine is not None and usd > 0:
            row["best_is_cheaper_by"] = 1 - mine / usd  # the share of a token's cost saved
        run = ranked.run_cost_usd(req.tokens)
        if req.max_budget_usd is not None and run is not None and run > req.max_budget_usd:
            row["note"] = "; ".join(n for n in (
                b.note, f"${run:,.0f} a run, over the --max-budget") if n)
    return out


def search_json(result: SearchResult, req: SearchRequest) -> dict:
    return {"objective": req.objective, "candidates": result.num_candidates,
            "fitting": result.num_fitting, "layouts": result.num_layouts,
            "search_s": result.elapsed_s, "notes": result.notes,
            "memory_headroom_bytes": int(req.memory_headroom_bytes),
            "baselines": _baselines(result, req),
            "plans": [_row(r, req) for r in result.ranked]}


def _gpus_cell(row: dict, req: SearchRequest) -> str:
    """The GPUs a plan uses; on a cluster of several types, with the type where the plan
    uses one (`8 H100`), since two such rows differ only there (mixed plans: a line per
    kind of replica below their row)."""
    types = row["gpu_types"]
    if len({g.gpu for g in req.cluster.node_groups}) == 1 or len(types) != 1:
        return str(row["gpus"])
    return f"{row['gpus']} {next(iter(types)).split('-')[0]}"


def _days(seconds: float) -> str:
    """A time to train in a table cell: days or hours, and below an hour the minutes or
    seconds that show it (a short run read '0.0 h')."""
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else duration_words(seconds)


def search_table(result: SearchResult, req: SearchRequest, *, wide: bool = False) -> str:
    """The top plans, one row each (a line per kind of replica under mixed ones), then
    what was searched, the baselines, notes, a legend and the sources."""
    headers = ["#", "GPUs", "layout", "mbs", "recompute", "sharding", "iter s", "MFU",
               "mem GiB", "free"]
    priced = any(r.usd_per_million_tokens is not None for r in result.ranked)
    if priced:
        headers.append("$/1M tok")
    if req.tokens:
        headers += ["train", "run $"]
    if wide:
        # without --tokens there is no run to total: egress per million tokens, as $/1M tok
        headers += ["tokens/s", "estimate s", "egress $" if req.tokens else "egress $/1M",
                    "attention"]
    rows, notes = [], []
    flagged = False
    for i, r in enumerate(result.ranked, 1):
        d = _row(r, req)
        plan = r.plan
        low = d["below_headroom"]
        flagged = flagged or low
        shard = ("per stage" if plan.stage_sharding else
                 sharding_cell(plan.sharding, plan.dp_cp, compact=True))
        row = [str(i), _gpus_cell(d, req), layout_cell(plan), str(d["mbs"]), str(d["recompute"]), shard, f"{d['iteration_time_s']:.3f}",
               f"{d['mfu'] * 100:.1f}%", f"{d['peak_memory_bytes'] / GIB:.1f}",
               _free_cell(d["memory_headroom_bytes"], low)]
        if priced:
            usd = d["usd_per_million_tokens"]
            row.append("-" if usd is None else f"{usd:.2f}")
        if req.tokens:
            cost = d["run_cost_usd"]
            row += [_days(d["time_to_train_s"]), "-" if cost is None else f"{cost:,.0f}"]
        if wide:
            egress = (f"{d['egress_usd']:,.0f}" if req.tokens
                      else f"{d['egress_usd_per_million_tokens']:.2f}")
            row += [f"{d['tokens_per_s']:,.0f}", f"{d['estimate_s']:.3f}", egress,
                    str(d["attention"])]
        rows.append(row)
        lines = replica_lines(plan) if is_mixed(plan) else []
        if plan.stage_sharding:
            lines.append("sharding per stage: " + "; ".join(
                sharding_cell(sh, plan.dp_cp) for sh in plan.stage_sharding))
        notes.append(lines)
    right = [h not in ("layout", "recompute", "sharding", "attention") for h in headers]
    # past 100 columns without --wide: drop the cost per token where the run's cost is
    # shown, then the memory peak (its headroom stays)
    optional = [headers.index(h) for h in ("$/1M tok", "mem GiB") if h in headers
                and (h != "$/1M tok" or req.tokens)]
    out = [f"{req.model.name} on {req.cluster.name}: gbs {req.gbs}, seq {req.seq_len}, "
           f"{req.dtype}, objective {req.objective}"]
    out += render_table(headers, rows, right=right, width=None if wide else WIDTH,
                        optional=optional, notes=notes)
    out += _footer(result, req, flagged)
    return "\n".join(out)


def _footer(result: SearchResult, req: SearchRequest, flagged: bool) -> list[str]:
    lines = []
    if flagged:
        lines.append(f"! less than the {req.memory_headroom_bytes / GIB:.1f} GiB of free "
                     "memory asked for (--memory-headroom): it may run out of memory")
    layouts = f"{result.num_layouts} layout{'s' if result.num_layouts != 1 else ''}"
    lines += wrapped(f"searched {result.num_candidates:,} candidates on {layouts} "
                     f"({result.num_fitting:,} fit) in {result.elapsed_s:.1f} s; one "
                     "row per layout, ranked by event simulation")
    for b in _baselines(result, req):
        if b["iteration_time_s"] is None:
            rated = "-"
        elif req.objective == "cost" and b["best_is_cheaper_by"] is not None:
            saved = b["best_is_cheaper_by"]
            more = 1 / (1 - saved) - 1 if saved < 0 else 0.0  # the best costs this much more
            rated = (f"{b['iteration_time_s']:.3f} s/iteration; the best plan's tokens cost "
                     + (f"{saved * 100:.1f}% less" if saved >= 0 else f"{more * 100:.1f}% more"))
        else:
            rated = (f"{b['iteration_time_s']:.3f} s/iteration; the best plan is "
                     f"{abs(b['best_is_faster_by']) * 100:.1f}% "
                     + ("faster" if b["best_is_faster_by"] >= 0 else "slower"))
        lines += wrapped(f"baseline {b['name']}: {rated}"
                         + (f" ({b['note']})" if b["note"] else ""))
    for n in result.notes:
        lines += wrapped(f"note: {n}")
    lines += wrapped("layout: tp tensor, cp context, pp pipeline, vp interleaved chunks, dp "
                     "data parallel, ep expert parallel degrees (+sp: sequence parallel; zb-h1: zero-bubble "
                     "schedule, else 1F1B). free: GiB left at the peak. sharding: ZeRO-1 "
                     "splits optimizer states over the replicas, ZeRO-2 also gradients, "
                     "ZeRO-3 also parameters; 'P2 G2 OS16': parameters over 2 replicas, gradients "
                     "over 2, optimizer states over 16")
    lines.append("sources:")
    for k, v in result.ranked[0].result.sources.items():
        lines += wrapped(f"  {k}: {v}", indent="    ")
    return lines
