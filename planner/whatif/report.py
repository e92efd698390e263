"""What-if reports: the best plan of each scenario, what it costs, and pictures of why.

Every scenario is planned by the same search as `plan search` (so a row's numbers equal
that command's for the same cluster), then priced for the token budget: time to train,
GPU-hours at the cluster's prices, and the traffic billed across island links.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.costs.stages import plan_costs
from planner.describe import gpu_short_names, headroom_bytes, plan_words
from planner.errors import InfeasiblePlan
from planner.outputs import atomic_path, write_text
from planner.predict.results import SimResult
from planner.search import Ranked, SearchRequest, prepare, search
from planner.search.search import DEFAULT_HEADROOM_BYTES, search_dtype
from planner.specs.choices import DType, Recompute
from planner.specs.cluster import check_train_dtype
from planner.specs.plan import Plan, save_plan
from planner.whatif.scenarios import Scenario, Setting, apply
from profiler.progress import ProgressBar
from profiler.schema import SpecError, dump
from profiler.store import Profiles

__all__ = ["COLUMNS", "COSTS", "Row", "best_row", "cluster_file", "fastest_row", "csv_rows", "largest_cost",
           "plan_scenarios", "recompute_seconds", "replica_kinds", "request_for", "same_job",
           "table_rows",
           "values", "write_report"]



@dataclass(frozen=True)
class Row:
    setting: Setting
    ranked: Ranked | None
    note: str  # why there is no plan, or what to know about this one
    headroom_wanted_bytes: float = DEFAULT_HEADROOM_BYTES  # free memory asked for
    recompute_s: float = 0.0  # of the iteration: recomputation the plan's memory needs
    refused: str = ""  # the input error (a SpecError's message) that left it without a plan
    objective: str = "throughput"  # what the search ranked plans by (`best_row` too)

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
    def memory_free_bytes(self) -> float | None:
        return None if self.result is None else headroom_bytes(self.result)

    @property
    def tight(self) -> bool:
        """Less memory left free than asked for (`--memory-headroom`)."""
        free = self.memory_free_bytes
        return free is not None and free < self.headroom_wanted_bytes

    @property
    def bottleneck(self) -> str:
        """The largest cost besides useful compute, and its share of the iteration."""
        if self.result is None:
            return "-"
        name, seconds = largest_cost(self.result, self.recompute_s)
        share = seconds / self.result.iteration_time_s
        if share < 0.05:  # nothing but computing to speak of
            return f"computing (next: {name}, {_percent(share)})"
        return f"{name}, {_percent(share)} of the iteration"


def _percent(share: float) -> str:
    return "<1%" if share < 0.005 else f"{share:.0%}"


# What an iteration spends besides useful compute (the simulated breakdown of its
# critical stage), in the report's words
COSTS = [("exposed tensor-parallel communication", "tp_comm_s"),
         ("exposed context-parallel communication", "cp_comm_s"),
         ("exposed expert-parallel all-to-all", "ep_comm_s"),
         ("exposed pipeline communication", "pp_comm_s"),
         ("exposed data-parallel communication", "dp_comm_s"),
         ("pipeline bubble", "bubble_s"), ("waiting for kernel launches", "host_overhead_s"),
         ("optimizer step", "optimizer_s")]


def largest_cost(result: SimResult, recompute_s: float = 0.0) -> tuple[str, float]:
    """The largest part of the iteration that is not useful compute: exposed
    communication of a kind, the pipeline bubble, kernel-launch waits, the optimizer, or
    recomputation the plan needs to fit in memory (`recompute_s`, part of compute)."""
    b = result.breakdown
    parts = {name: getattr(b, field) for name, field in COSTS}
    parts["recomputation (to fit in memory)"] = recompute_s
    return max(parts.items(), key=lambda kv: kv[1])


def recompute_seconds(plan: Plan, profiles: Profiles | None = None) -> float:
    """Seconds per iteration a plan spends recomputing activations: on its slowest stage,
    its backward passes with recomputation less the same without (the cost model's)."""
    if all(s.recompute == Recompute.NONE for p in plan.pipelines for s in p.stages):
        return 0.0
    bare = replace(plan, pipelines=tuple(
        replace(p, stages=tuple(replace(s, recompute=Recompute.NONE) for s in p.stages))
        for p in plan.pipelines))
    with_rc, without = plan_costs(plan, profiles), plan_costs(bare, profiles)
    return max((a.backward_s - b.backward_s) * plan.pipelines[a.pipeline].num_microbatches
               for pa, pb in zip(with_rc.costs, without.costs, strict=True)
               for a, b in zip(pa, pb, strict=True))


def plan_scenarios(base: Setting, scenarios: Sequence[Scenario], *, gbs: int, seq_len: int | None,
                   objective: str, dtype: DType = DType.BF16, dtype_asked: bool = True,
                   max_budget_usd: float | None = None,
                   profiles: Profiles | None = None, framework: str = "trainplan",
                   memory_headroom_bytes: float = DEFAULT_HEADROOM_BYTES) -> list[Row]:
    """The baseline first, then each scenario: its best plan by `objective` (the search
    of `plan search`, within what `framework` runs), or why there is none. `dtype_asked`
    False (no --dtype): a scenario whose GPU types lack `dtype` (the baseline's default)
    trains in its own default, as `plan search` on its cluster would, priced without the
    profiles (which are of `dtype`); its note says so."""
    settings = [base] + [apply(s, base) for s in scenarios]
    kw = dict(gbs=gbs, seq_len=seq_len, objective=objective, dtype=dtype,
              max_budget_usd=max_budget_usd, profiles=profiles, framework=framework,
              memory_headroom_bytes=memory_headroom_bytes)
    own = [kw if dtype_asked else _own_dtype(setting, kw) for setting in settings]
    # every scenario's pure search work at once (shared where scenarios share it)
    prepare([request_for(s, **k) for s, k in zip(settings, own, strict=True)],
            title="searching every scenario")
    bar = ProgressBar(len(settings), title="planning scenarios")
    rows = []
    for i, (setting, k) in enumerate(zip(settings, own, strict=True), 1):
        row = _plan_one(setting, **k)
        if k["dtype"] != dtype:
            unprofiled = "; priced without the profiles, measured in " + str(dtype) \
                if profiles is not None else ""
            try:  # the baseline's dtype runs here too: the scenario's default is another
                check_train_dtype((g.device for g in setting.cluster.node_groups), str(dtype),
                                  where="--dtype")
                why = f"the default on the scenario's GPU types; the baseline's is {dtype}"
            except SpecError:
                why = f"{dtype} is not on every GPU type of the scenario"
            row = replace(row, note="; ".join(n for n in (
                f"trains in {k['dtype']} ({why}{unprofiled})", row.note) if n))
        rows.append(row)
        bar(i, setting.label)
    bar.close()
    return rows


def _own_dtype(setting: Setting, kw: dict) -> dict:
    """`kw` with the scenario's own default dtype (`train_dtype`), and no profiles where
    that is not the one they were measured in."""
    own = search_dtype(kw["framework"], setting.model,
                       (g.device for g in setting.cluster.node_groups), None)
    return kw if own == kw["dtype"] else {**kw, "dtype": own, "profiles": None}


def request_for(setting: Setting, *, gbs: int, seq_len: int | None, objective: str, dtype: DType,
                max_budget_usd: float | None, profiles: Profiles | None,
                framework: str = "trainplan",
                memory_headroom_bytes: float = DEFAULT_HEADROOM_BYTES) -> SearchRequest:
    return SearchRequest(model=setting.model, cluster=setting.cluster, gbs=gbs,
                         seq_len=seq_len or setting.model.seq_len, dtype=dtype,
                         objective=objective, tokens=setting.tokens,
                         max_budget_usd=max_budget_usd, top=1, profiles=profiles,
                         framework=framework, memory_headroom_bytes=memory_headroom_bytes)


def _plan_one(setting: Setting, **kw: object) -> Row:
    req = request_for(setting, **kw)  # type: ignore[arg-type]  # keyword arguments collected in kw
    try:  # the search checks the dtype against the GPU types it plans (`_planned`)
        found = search(req)
    except InfeasiblePlan as err:
        return Row(setting, None, f"no plan: {err}", req.memory_headroom_bytes,
                   objective=req.objective)
    except SpecError as err:  # this scenario's input (another may add what it lacks)
        return Row(setting, None, f"no plan: {err}", req.memory_headroom_bytes,
                   refused=str(err), objective=req.objective)
    best = found.ranked[0]
    notes = list(found.notes)
    unpriced = sorted({g.gpu for g in setting.cluster.node_groups
                       if g.price_per_gpu_hour_usd is None})
    if unpriced:
        notes.append(f"no price per GPU-hour for {', '.join(unpriced)} (add 'price TYPE USD' "
                     "to the scenario)")
    return Row(setting, best, "; ".join(notes), req.memory_headroom_bytes,
               recompute_seconds(best.plan, req.profiles), objective=req.objective)


# --- output -------------------------------------------------------------------------

# (header, how a value is shown in the report's tables); table.csv has the raw numbers
COLUMNS = ["scenario", "model", "GPUs", "used", "idle", "plan", "iteration s", "tokens/s",
           "MFU %", "time to train (days)", "GPU $", "egress $", "total $", "$ per 1M tokens",
           "memory free (GiB)", "bottleneck", "note"]
_SHOWN = {"iteration s": ".3f", "tokens/s": ",.0f", "MFU %": ".1f",
          "time to train (days)": ".4g", "GPU $": ",.0f", "egress $": ",.0f",
          "total $": ",.0f", "$ per 1M tokens": ".3f", "memory free (GiB)": ".1f"}
GIB = 1024**3


def replica_kinds(plan: Plan) -> list[tuple[int, int, str]]:
    """The plan's distinct replicas (pipelines): (index of the first of its kind, how
    many, a description: stages by GPU type, tensor parallelism, micro-batch size)."""
    c = plan.cluster
    short = gpu_short_names(plan)
    kinds: dict[str, list[int]] = {}
    for i, pipe in enumerate(plan.pipelines):
        runs: list[list] = []
        for s in pipe.stages:
            g = short[c.group_of(s.devices[0]).gpu]
            key = f"{g} tp{s.tp}"
            if not runs or runs[-1][0] != key:
                runs.append([key, 0])
            runs[-1][1] += 1
        stages = " + ".join(k if n == 1 else f"{n}x {k}" for k, n in runs)
        kinds.setdefault(f"[{stages}] mbs {pipe.micro_batch_size}", []).append(i)
    return [(ids[0], len(ids), text) for text, ids in kinds.items()]


def values(row: Row) -> dict[str, object]:
    """A row's cells as values: numbers (None where there is no plan or no price) and
    text."""
    res = row.result
    ttt, free = row.time_to_train_s, row.memory_free_bytes
    return {
        "scenario": row.label, "model": row.setting.model.name,
        "GPUs": row.setting.cluster.num_gpus, "used": row.gpus_used, "idle": row.gpus_idle,
        "plan": None if row.ranked is None else plan_words(row.ranked.plan),
        "iteration s": None if res is None else res.iteration_time_s,
        "tokens/s": None if res is None else res.tokens_per_s,
        "MFU %": None if res is None else res.mfu * 100,
        "time to train (days)": None if ttt is None else ttt / 86400,
        "GPU $": row.gpu_cost_usd, "egress $": row.egress_usd, "total $": row.total_usd,
        "$ per 1M tokens": row.usd_per_million_tokens,
        "memory free (GiB)": None if free is None else free / GIB,
        "bottleneck": None if res is None else row.bottleneck, "note": row.note,
    }


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    """The table as the report shows it: numbers rounded and grouped, '-' where there is
    none, '!' after memory left free below the headroom asked for."""
    out = []
    for r in rows:
        cells = []
        for column, value in values(r).items():
            if value is None:
                cells.append("-")
            elif column in _SHOWN:
                tight = " !" if column == "memory free (GiB)" and r.tight else ""
                cells.append(format(value, _SHOWN[column]) + tight)
            else:
                cells.append(str(value))
        out.append(cells)
    return out


def csv_rows(rows: Sequence[Row]) -> list[list[object]]:
    """table.csv: plain numbers (no grouping, no rounding beyond what float holds), an
    empty cell where there is none."""
    return [["" if v is None else round(v, 9) if isinstance(v, float) else v
             for v in values(r).values()] for r in rows]


def write_report(rows: Sequence[Row], out_dir: str, *, title: str, command: str,
                 profiles: Profiles | None = None) -> dict[str, str]:
    """report.html (self-contained), report.md, table.csv, the figures and the best
    plan; returns their paths."""
    from planner.whatif import document, figures

    os.makedirs(out_dir, exist_ok=True)
    paths = {"csv": os.path.join(out_dir, "table.csv")}
    with atomic_path(paths["csv"]) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(csv_rows(rows))
    paths.update(figures.draw_all(rows, out_dir, profiles=profiles))
    paths["clusters"] = _write_clusters(rows, os.path.join(out_dir, "clusters"))
    best = best_row(rows)
    if best is not None:
        paths["plan"] = os.path.join(out_dir, "best-plan.yaml")
        save_plan(best.ranked.plan, paths["plan"])  # type: ignore[union-attr]  # best rows are planned
    blocks = document.report_blocks(rows, paths, title=title, command=command)
    paths["md"] = os.path.join(out_dir, "report.md")
    write_text(paths["md"], document.markdown(blocks))
    paths["html"] = os.path.join(out_dir, "report.html")
    write_text(paths["html"], document.html_page(blocks, title=title))
    return paths


_SCENARIO_HEADER = "# what-if scenario "  # the first line of each cluster file it writes


def _written_by_what_if(path: str) -> bool:
    """Whether `path` is a scenario cluster an earlier report wrote (its first line)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().startswith(_SCENARIO_HEADER)
    except (OSError, UnicodeDecodeError):
        return False


def cluster_file(index: int, row: Row) -> str:
    """The file name of scenario `index`'s cluster (1 is the baseline)."""
    slug = "".join(c if c.isalnum() else "-" for c in row.label.lower()).strip("-")
    return f"{index:02d}-{'-'.join(w for w in slug.split('-') if w)[:40]}.yaml"


def _write_clusters(rows: Sequence[Row], folder: str) -> str:
    """Each scenario's cluster as a ClusterSpec file, so any row can be re-planned with
    `plan search --cluster FILE` (the report's numbers are that command's)."""
    import yaml

    os.makedirs(folder, exist_ok=True)
    written = {cluster_file(i, r) for i, r in enumerate(rows, 1)}
    for name in os.listdir(folder):  # a previous report's scenarios, numbered as these
        path = os.path.join(folder, name)
        if re.fullmatch(r"\d\d+-.*\.yaml", name) and name not in written \
                and _written_by_what_if(path):  # a file of the user's is kept
            os.remove(path)
    for i, r in enumerate(rows, 1):
        text = (f"{_SCENARIO_HEADER}{i}: {r.label} (model {r.setting.model.name}, "
                f"{r.setting.tokens:.3g} tokens)\n"
                + yaml.safe_dump(dump(r.setting.cluster), sort_keys=False, width=100))
        write_text(os.path.join(folder, cluster_file(i, r)), text)
    return folder


def same_job(rows: Sequence[Row]) -> list[Row]:
    """The planned rows that train what the baseline (the first row) trains: its model on
    its token budget. A scenario of another model or budget answers its own question and
    is not a candidate for the fastest or best run (a `tokens 3e5` scenario was the best
    plan, "$0 in 2.1 s"; a smaller model's was best-plan.yaml)."""
    planned = [r for r in rows if r.ranked is not None]
    if not rows:
        return planned
    job = (rows[0].setting.model, rows[0].setting.tokens)
    return [r for r in planned if (r.setting.model, r.setting.tokens) == job]


def fastest_row(rows: Sequence[Row]) -> Row | None:
    """The planned row of the baseline's job (`same_job`) that trains soonest (the first
    of equals)."""
    planned = same_job(rows)
    return min(planned, key=lambda r: r.time_to_train_s or 0.0) if planned else None


def best_row(rows: Sequence[Row]) -> Row | None:
    """The row the what-if's objective picks among those of the baseline's job
    (`same_job`), as its search ranks plans: the cheapest priced run for `cost` (the
    fastest where no row has a price), else the soonest trained. Its plan is
    best-plan.yaml and the report's "best plan"."""
    planned = same_job(rows)
    if not planned:
        return None
    priced = [r for r in planned if r.total_usd is not None]
    if planned[0].objective == "cost" and priced:
        return min(priced, key=lambda r: (r.total_usd, r.time_to_train_s or 0.0))
    return fastest_row(planned)
