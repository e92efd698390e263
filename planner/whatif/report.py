"""What-if reports: the best plan of each scenario, what it costs, and pictures of why.

Every scenario is planned by the same search as `plan search` (so a row's numbers equal
that command's for the same cluster), then priced for the token budget: time to train,
GPU-hours at the cluster's prices, and the traffic billed across island links.
"""

from __future__ import annotations

import base64
import csv
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import InfeasiblePlan
from planner.predict.results import SimResult
from planner.search import Ranked, SearchRequest, prepare, search
from planner.specs.plan import Plan, save_plan
from planner.whatif.scenarios import Scenario, Setting, apply
from profiler.progress import ProgressBar
from profiler.schema import dump
from profiler.store import Profiles

__all__ = ["COLUMNS", "Row", "best_row", "bottleneck",
           "cluster_file", "plan_scenarios", "replica_kinds", "request_for", "table_rows", "write_report"]



@dataclass(frozen=True)
class Row:
    setting: Setting
    ranked: Ranked | None
    note: str  # why there is no plan, or what to know about this one

    @property
    def label(self) -> str:
        return self.setting.label

    @property
    def result(self) -> SimResult | None:
        return None if self.ranked is None else self.ranked.result

    @property
    def time_to_train_s(self) -> float | None:
        return None if self.ranked is None else self.ranked.time_to_train_s(self.setting.tokens)

    @property
    def gpu_cost_usd(self) -> float | None:
        return None if self.ranked is None else self.ranked.gpu_cost_usd(self.setting.tokens)

    @property
    def egress_usd(self) -> float | None:
        return None if self.ranked is None else self.ranked.egress_usd(self.setting.tokens)

    @property
    def total_usd(self) -> float | None:
        return None if self.ranked is None else self.ranked.run_cost_usd(self.setting.tokens)

    @property
    def usd_per_million_tokens(self) -> float | None:
        return None if self.ranked is None else self.ranked.usd_per_million_tokens

    @property
    def gpus_used(self) -> int:
        return 0 if self.result is None else self.result.num_gpus

    @property
    def gpus_idle(self) -> int:
        return self.setting.cluster.num_gpus - self.gpus_used

    @property
    def bottleneck(self) -> str:
        return "-" if self.result is None else bottleneck(self.ranked.plan, self.result)  # type: ignore[union-attr]  # ranked is set whenever result is


def bottleneck(plan: Plan, result: SimResult) -> str:
    """What limits the iteration: the largest part after compute if it takes over 15% of
    it (which communication, the bubble), else compute; with memory pressure noted."""
    b = result.breakdown
    parts = {"tensor-parallel comm": b.tp_comm_s, "context-parallel comm": b.cp_comm_s,
             "pipeline comm": b.pp_comm_s, "data-parallel comm": b.dp_comm_s,
             "pipeline bubble": b.bubble_s, "kernel launch": b.host_overhead_s,
             "optimizer": b.optimizer_s}
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    label = name if seconds > 0.15 * result.iteration_time_s else "compute"
    recompute = {s.recompute for p in plan.pipelines for s in p.stages}
    if "full" in recompute or any(sh.params > 1 for sh in plan.shardings):
        label += "; memory (full recompute or sharded parameters needed)"
    return label


def plan_scenarios(base: Setting, scenarios: Sequence[Scenario], *, gbs: int, seq_len: int | None,
                   objective: str, dtype: str = "bf16", max_budget_usd: float | None = None,
                   profiles: Profiles | None = None) -> list[Row]:
    """The baseline first, then each scenario: its best plan by `objective` (the search
    of `plan search`), or why there is none."""
    settings = [base] + [apply(s, base) for s in scenarios]
    kw = dict(gbs=gbs, seq_len=seq_len, objective=objective, dtype=dtype,
              max_budget_usd=max_budget_usd, profiles=profiles)
    # every scenario's pure search work at once (shared where scenarios share it)
    prepare([request_for(s, **kw) for s in settings],  # type: ignore[arg-type]  # keyword arguments collected in kw
            title="searching every scenario")
    bar = ProgressBar(len(settings), title="planning scenarios")
    rows = []
    for i, setting in enumerate(settings, 1):
        rows.append(_plan_one(setting, **kw))
        bar(i, setting.label)
    bar.close()
    return rows


def request_for(setting: Setting, *, gbs: int, seq_len: int | None, objective: str, dtype: str,
                max_budget_usd: float | None, profiles: Profiles | None) -> SearchRequest:
    return SearchRequest(model=setting.model, cluster=setting.cluster, gbs=gbs,
                         seq_len=seq_len or setting.model.seq_len, dtype=dtype,
                         objective=objective, tokens=setting.tokens,
                         max_budget_usd=max_budget_usd, top=1, profiles=profiles)


def _plan_one(setting: Setting, **kw: object) -> Row:
    req = request_for(setting, **kw)  # type: ignore[arg-type]  # keyword arguments collected in kw
    try:
        found = search(req)
    except InfeasiblePlan as err:
        return Row(setting, None, f"no plan: {err}")
    best = found.ranked[0]
    notes = list(found.notes)
    unpriced = sorted({g.gpu for g in setting.cluster.node_groups
                       if g.price_per_gpu_hour_usd is None})
    if unpriced:
        notes.append(f"no price per GPU-hour for {', '.join(unpriced)} (add 'price TYPE USD' "
                     "to the scenario)")
    return Row(setting, best, "; ".join(notes))


# --- output -------------------------------------------------------------------------

COLUMNS = ["scenario", "model", "GPUs", "used", "idle", "plan", "iteration s", "tokens/s",
           "MFU %", "time to train (days)", "GPU $", "egress $", "total $", "$ per 1M tokens",
           "bottleneck", "note"]


def replica_kinds(plan: Plan) -> list[tuple[int, int, str]]:
    """The plan's distinct replicas (pipelines): (index of the first of its kind, how
    many, a description: stages by GPU type, tensor parallelism, micro-batch size)."""
    c = plan.cluster
    kinds: dict[str, list[int]] = {}
    for i, pipe in enumerate(plan.pipelines):
        runs: list[list] = []
        for s in pipe.stages:
            g = c.node_groups[c.slots[s.devices[0]].group].gpu.split("-")[0]
            key = f"{g} tp{s.tp}"
            if not runs or runs[-1][0] != key:
                runs.append([key, 0])
            runs[-1][1] += 1
        stages = " + ".join(k if n == 1 else f"{n}x {k}" for k, n in runs)
        kinds.setdefault(f"[{stages}] mbs {pipe.micro_batch_size}", []).append(i)
    return [(ids[0], len(ids), text) for text, ids in kinds.items()]


def _plan_text(row: Row) -> str:
    if row.ranked is None:
        return "-"
    plan = row.ranked.plan
    stages = plan.pipelines[0].stages
    replicas = " + ".join(f"{n}x {text}" for _, n, text in replica_kinds(plan))
    pp = len(stages)
    schedule = f" {plan.training.schedule}" if pp > 1 else ""
    return (f"{replicas}; {pp} stage{'s' if pp > 1 else ''}{schedule}, {stages[0].recompute} "
            f"recompute, {plan.sharding_label}")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        res = r.result
        ttt = r.time_to_train_s
        out.append([
            r.label, r.setting.model.name, str(r.setting.cluster.num_gpus), str(r.gpus_used),
            str(r.gpus_idle), _plan_text(r),
            _fmt(None if res is None else res.iteration_time_s, ".3f"),
            _fmt(None if res is None else res.tokens_per_s, ",.0f"),
            _fmt(None if res is None else res.mfu * 100, ".1f"),
            _fmt(None if ttt is None else ttt / 86400, ".2f"),
            _fmt(r.gpu_cost_usd, ",.0f"), _fmt(r.egress_usd, ",.0f"),
            _fmt(r.total_usd, ",.0f"), _fmt(r.usd_per_million_tokens, ".3f"),
            r.bottleneck, r.note,
        ])
    return out


def write_report(rows: Sequence[Row], out_dir: str, *, title: str, command: str,
                 profiles: Profiles | None = None) -> dict[str, str]:
    """report.html (self-contained), report.md, table.csv, the figures and the best
    plan; returns their paths."""
    from planner.whatif import figures

    os.makedirs(out_dir, exist_ok=True)
    paths = {"csv": os.path.join(out_dir, "table.csv")}
    with open(paths["csv"], "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(table_rows(rows))
    paths.update(figures.draw_all(rows, out_dir, profiles=profiles))
    paths["clusters"] = _write_clusters(rows, os.path.join(out_dir, "clusters"))
    best = best_row(rows)
    if best is not None:
        paths["plan"] = os.path.join(out_dir, "best-plan.yaml")
        save_plan(best.ranked.plan, paths["plan"])  # type: ignore[union-attr]  # best rows are planned
    paths["md"] = os.path.join(out_dir, "report.md")
    with open(paths["md"], "w", encoding="utf-8") as fh:
        fh.write(_markdown(rows, paths, title=title, command=command))
    paths["html"] = os.path.join(out_dir, "report.html")
    with open(paths["html"], "w", encoding="utf-8") as fh:
        fh.write(_html(rows, paths, title=title, command=command))
    return paths


def cluster_file(index: int, row: Row) -> str:
    """The file name of scenario `index`'s cluster (1 is the baseline)."""
    slug = "".join(c if c.isalnum() else "-" for c in row.label.lower()).strip("-")
    return f"{index:02d}-{'-'.join(w for w in slug.split('-') if w)[:40]}.yaml"


def _write_clusters(rows: Sequence[Row], folder: str) -> str:
    """Each scenario's cluster as a ClusterSpec file, so any row can be re-planned with
    `plan search --cluster FILE` (the report's numbers are that command's)."""
    import yaml

    os.makedirs(folder, exist_ok=True)
    for i, r in enumerate(rows, 1):
        with open(os.path.join(folder, cluster_file(i, r)), "w", encoding="utf-8") as fh:
            fh.write(f"# what-if scenario {i}: {r.label} (model {r.setting.model.name}, "
                     f"{r.setting.tokens:.3g} tokens)\n")
            yaml.safe_dump(dump(r.setting.cluster), fh, sort_keys=False, width=100)
    return folder


def best_row(rows: Sequence[Row]) -> Row | None:
    planned = [r for r in rows if r.ranked is not None]
    if not planned:
        return None
    return min(planned, key=lambda r: (r.total_usd is None, r.time_to_train_s or 0.0))


FIGURES = [("cost_vs_time", "Cost against time to train; the Pareto front (no scenario both "
            "cheaper and faster) is marked."),
           ("breakdown", "Where each scenario's iteration goes (event simulation of its best "
            "plan)."),
           ("memory", "Memory per stage of the overall best plan against each GPU's capacity."),
           ("gantt", "Pipeline timeline of the overall best plan (first replica).")]


def _summary(rows: Sequence[Row]) -> list[str]:
    base = rows[0]
    lines = []
    best = best_row(rows)
    if (best is not None and best.time_to_train_s is not None
            and base.time_to_train_s is not None and best is not base):
        lines.append(f"Fastest scenario: **{best.label}**, {best.time_to_train_s / 86400:.2f} "
                     f"days against {base.time_to_train_s / 86400:.2f} for the baseline.")
    priced = [r for r in rows if r.total_usd is not None]
    if priced:
        cheap = min(priced, key=lambda r: r.total_usd)  # type: ignore[arg-type, return-value]  # rows with a total only
        if cheap is not best:
            lines.append(f"Cheapest scenario: **{cheap.label}**, ${cheap.total_usd:,.0f} in "
                         f"{cheap.time_to_train_s / 86400:.2f} days.")  # type: ignore[operator]  # priced rows are planned
    for r in rows:
        if r.ranked is None:
            lines.append(f"**{r.label}**: {r.note}")
    return lines


def _markdown(rows: Sequence[Row], paths: dict[str, str], *, title: str, command: str) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    body = "".join("| " + " | ".join(c.replace("|", "/") for c in row) + " |\n"
                   for row in table_rows(rows))
    figs = "".join(f"![{name}]({os.path.basename(paths[name])})\n\n{text}\n\n"
                   for name, text in FIGURES if name in paths)
    return (f"# {title}\n\n`{command}`\n\n" + "\n\n".join(_summary(rows)) + "\n\n" + head + body
            + "\n" + _REPRODUCE + "\n\n" + figs + _sources_md(rows))


_REPRODUCE = ("Each scenario's cluster is in `clusters/` (numbered as the rows); `plan search "
              "--cluster clusters/NN-....yaml` with the same model, batch and tokens gives "
              "that row's plan and numbers.")


def _sources_md(rows: Sequence[Row]) -> str:
    r = next((r for r in rows if r.result is not None), None)
    if r is None:
        return ""
    items = "".join(f"- {k}: {v}\n" for k, v in r.result.sources.items())  # type: ignore[union-attr]  # planned rows have a result
    return ("## Where the numbers come from\n\n" + items + "- cost: GPU-hours at the node "
            "groups' prices for the token budget; egress: bytes crossing priced island "
            "links at their price (an estimate, planner/costs/egress.py)\n")


def _html(rows: Sequence[Row], paths: dict[str, str], *, title: str, command: str) -> str:
    def img(name: str) -> str:
        with open(paths[name], "rb") as fh:
            data = base64.b64encode(fh.read()).decode("ascii")
        return f'<img src="data:image/png;base64,{data}" alt="{name}">'

    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in table_rows(rows))
    figs = "".join(f"<figure>{img(name)}<figcaption>{html.escape(text)}</figcaption></figure>"
                   for name, text in FIGURES if name in paths)
    summary = "".join(f"<p>{html.escape(s).replace('**', '')}</p>" for s in _summary(rows))
    r = next((r for r in rows if r.result is not None), None)
    sources = "" if r is None else "<ul>" + "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
        for k, v in r.result.sources.items()) + "</ul>"  # type: ignore[union-attr]  # planned rows have a result
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}"
             "table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top}"
             "th{background:#f0f0f0}tr:first-child td{background:#fbfbe8}"
             "img{max-width:100%}figure{margin:1.5em 0}figcaption{color:#555}"
             "code{background:#f4f4f4;padding:2px 4px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p><code>{html.escape(command)}</code></p>{summary}<table><tr>{head}</tr>{body}"
            f"</table><p>{html.escape(_REPRODUCE)}</p>{figs}<h2>Where the numbers come from</h2>{sources}</body></html>\n")

