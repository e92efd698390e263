"""The what-if report as a document: built once as blocks (headings, paragraphs of plain
text, bold and code, a table, figures, lists), then written as Markdown and as a
self-contained HTML page, so both say the same and neither shows the other's markup.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence

from planner.describe import GLOSSARY, duration_words
from planner.whatif.figures import costs_plotted
from planner.whatif.report import (
    COLUMNS,
    Row,
    best_row,
    fastest_row,
    largest_cost,
    same_job,
    table_rows,
)

__all__ = ["FIGURES", "html_page", "markdown", "report_blocks"]

# a paragraph is a list of segments: text, or ("b", text) / ("code", text)
Segment = str | tuple[str, str]
Block = tuple

UNPRICED_CAPTION = ("Time to train of each scenario, numbered as the table's rows (the key "
                    "beside it names them); no cost axis: some scenario has no price.")
FIGURES = [("cost_vs_time", "Cost against time to train: each point is a scenario, numbered "
            "as the table's rows (the key beside it names them); red: no other scenario is "
            "both faster and cheaper (joined by a dashed line where there are several)."),
           ("breakdown", "Where each scenario's iteration goes (event simulation of its best "
            "plan, on its slowest pipeline stage): computing, recomputing activations, and "
            "the communication and waiting that computing does not hide."),
           ("memory", "Memory per GPU at the peak of the overall best plan, by stage and by "
            "what it holds, against each GPU's capacity and the headroom asked to stay free."),
           ("gantt", "One iteration of the overall best plan's first pipeline: forward passes "
            "in blue, backward in green, weight gradients (zero-bubble) in purple, data-"
            "parallel communication in orange; gaps are the pipeline bubble.")]

# words of the report's table and figures that the search table does not use
REPORT_WORDS = {
    "replica": "one copy of the model that trains on its share of each batch; the plan "
               "column counts them, and says how each is split into pipeline stages",
    "used, idle": "GPUs of the cluster the best plan runs on, and those it leaves out "
                  "(the note says why)",
    "egress": "traffic that crosses a priced link between islands (groups of nodes on one "
              "network, e.g. two datacenters), billed per GB",
    "kernel-launch waits": "time a GPU waits for the host to issue its next kernel",
}

WORDY = ("plan", "note")  # columns of sentences: the second table's


def _columns(headers: Sequence[str], rows: Sequence[Sequence[str]], keep: Sequence[str]
             ) -> list[list[str]]:
    """The cells of columns `keep` (by header), in that order."""
    at = [list(headers).index(h) for h in keep]
    return [[r[i] for i in at] for r in rows]


def _days(seconds: float) -> str:
    return duration_words(seconds)


def _summary(rows: Sequence[Row]) -> list[list[Segment]]:
    base = rows[0]
    out: list[list[Segment]] = []
    best, fastest = best_row(rows), fastest_row(rows)
    if (fastest is not None and fastest is not base and fastest.time_to_train_s is not None
            and base.time_to_train_s is not None):
        out.append(["Fastest: ", ("b", fastest.label), f", {_days(fastest.time_to_train_s)} "
                    f"against {_days(base.time_to_train_s)} for the baseline."])
    if best is not None and best.time_to_train_s is not None:
        name, seconds = largest_cost(best.result, best.recompute_s)  # type: ignore[arg-type]  # the best row is planned
        share = seconds / best.result.iteration_time_s  # type: ignore[union-attr]  # the best row is planned
        by = "cheapest run" if best.objective == "cost" and best.total_usd is not None \
            else "fastest run"
        out.append(["In the best plan (", ("b", best.label), f", the {by}; best-plan.yaml), "
                    f"the largest cost besides computing is {name}: {share:.0%} of each "
                    "iteration."])
    job = same_job(rows)
    priced = [r for r in job if r.total_usd is not None]
    if priced:
        cheap = min(priced, key=lambda r: r.total_usd)  # type: ignore[arg-type, return-value]  # rows with a total only
        unpriced = any(r.total_usd is None for r in job)
        out.append(["Cheapest" + (" of the rows with a price" if unpriced else "") + ": ",
                    ("b", cheap.label), f", ${cheap.total_usd:,.0f} in "
                    f"{_days(cheap.time_to_train_s)}."])  # type: ignore[arg-type]  # priced rows are planned
    other = [r for r in rows if r.ranked is not None and all(r is not j for j in job)]
    if other:
        out.append(["Of another model or token budget, so not compared with the baseline "
                    "for fastest, best or cheapest: "] + _joined([("b", r.label) for r in other])
                   + ["."])
    tight = [r for r in rows if r.tight]
    if tight:
        wanted = tight[0].headroom_wanted_bytes / 1024**3
        out.append([f"Less than the {wanted:g} GiB of GPU memory asked to stay free "
                    "(--memory-headroom), so at risk of running out of memory: "]
                   + _joined([("b", r.label) for r in tight])
                   + [" (memory free: " + ", ".join(
                       f"{r.memory_free_bytes / 1024**3:.1f} GiB" for r in tight) + ")."])  # type: ignore[operator]  # tight rows are planned
    for r in rows:
        if r.ranked is None:
            out.append([("b", r.label), f": {r.note}"])
    return out


def _joined(items: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for i, item in enumerate(items):
        if i:
            out.append(", ")
        out.append(item)
    return out


def _sources(rows: Sequence[Row]) -> list[list[Segment]]:
    """Every planned row's source lines (a line that differs between scenarios is given
    once per answer, with the scenarios it holds for), then the report's own."""
    answers: dict[str, dict[str, list[str]]] = {}  # what -> answer -> scenarios
    planned = [r for r in rows if r.result is not None]
    for r in planned:
        for k, v in r.result.sources.items():  # type: ignore[union-attr]  # planned rows have a result
            answers.setdefault(k, {}).setdefault(v, []).append(r.label)
    items: list[list[Segment]] = []
    for k, by_answer in answers.items():
        for v, labels in by_answer.items():
            which = "" if len(labels) == len(planned) else f" ({', '.join(labels)})"
            items.append([("b", k), f": {v}{which}"])
    return items + [[("b", "cost"), ": GPU-hours at the node groups' prices for the token "
                     "budget; egress: bytes crossing priced island links at their price (an "
                     "estimate, ", ("code", "planner/costs/egress.py"), ")"],
                    [("b", "bottleneck"), ": the largest part of the simulated iteration "
                     "that is not useful computing; recomputation is counted there when the "
                     "plan recomputes activations to fit in memory"]]


def report_blocks(rows: Sequence[Row], paths: dict[str, str], *, title: str, command: str
                  ) -> list[Block]:
    blocks: list[Block] = [("h1", title), ("p", ["Made by:"]), ("code", command)]
    blocks += [("p", p) for p in _summary(rows)]
    # the numbers in one table, each plan's words (long) in a second, both numbered as
    # the figures number the scenarios
    cells = [[str(i), *r] for i, r in enumerate(table_rows(rows), 1)]
    headers = ["#", *COLUMNS]
    numbers = [h for h in headers if h not in WORDY]
    blocks.append(("table", numbers, _columns(headers, cells, numbers)))
    if any(r.tight for r in rows):
        blocks.append(("p", [("b", "!"), ": less GPU memory free than the headroom asked for."]))
    blocks.append(("h2", "Each scenario's plan"))
    words = ["#", "scenario", *WORDY]
    blocks.append(("table", words, _columns(headers, cells, words)))
    blocks.append(("p", [
        "Each scenario's cluster is in ", ("code", "clusters/"), " (numbered as the rows): ",
        ("code", f"plan search --cluster clusters/NN-....yaml --objective {rows[0].objective}"),
        " with the row's model and tokens and the batch and other flags of the command above "
        "gives that row's plan and numbers."]))
    blocks.append(("h2", "Figures"))
    for name, caption in FIGURES:
        if name == "cost_vs_time" and not costs_plotted(rows):
            caption = UNPRICED_CAPTION  # drawn as bars of time alone
        if name in paths:
            blocks.append(("figure", paths[name], caption))
    if "gantt" not in paths and best_row(rows) is not None:
        blocks.append(("p", ["No pipeline timeline: the best plan runs each replica on one "
                             "stage, so there is no pipeline to draw."]))
    blocks.append(("h2", "Where the numbers come from"))
    blocks.append(("ul", _sources(rows)))
    blocks.append(("h2", "Words used"))
    blocks.append(("dl", list(GLOSSARY.items()) + list(REPORT_WORDS.items())))
    return blocks


# --- Markdown ---------------------------------------------------------------------------

def _md_text(segments: Sequence[Segment]) -> str:
    out = []
    for seg in segments:
        if isinstance(seg, str):
            out.append(seg)
        elif seg[0] == "b":
            out.append(f"**{seg[1]}**")
        else:
            out.append(f"`{seg[1]}`")
    return "".join(out)


def markdown(blocks: Sequence[Block]) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind == "h1":
            out.append(f"# {block[1]}")
        elif kind == "h2":
            out.append(f"## {block[1]}")
        elif kind == "p":
            out.append(_md_text(block[1]))
        elif kind == "code":
            out.append(f"```\n{block[1]}\n```")
        elif kind == "table":
            def cells(row: Sequence[str]) -> str:
                return "| " + " | ".join(c.replace("|", "/") for c in row) + " |"
            out.append("\n".join([cells(block[1]), "|" + "---|" * len(block[1])]
                                 + [cells(r) for r in block[2]]))
        elif kind == "figure":
            name = os.path.basename(block[1])
            out.append(f"![{os.path.splitext(name)[0]}]({name})\n\n{block[2]}")
        elif kind == "ul":
            out.append("\n".join(f"- {_md_text(item)}" for item in block[1]))
        elif kind == "dl":
            out.append("\n".join(f"- **{term}**: {text}" for term, text in block[1]))
    return "\n\n".join(out) + "\n"


# --- HTML --------------------------------------------------------------------------------

def _html_text(segments: Sequence[Segment]) -> str:
    out = []
    for seg in segments:
        if isinstance(seg, str):
            out.append(html.escape(seg))
        else:
            tag = "b" if seg[0] == "b" else "code"
            out.append(f"<{tag}>{html.escape(seg[1])}</{tag}>")
    return "".join(out)


def _image(path: str) -> str:
    with open(path, "rb") as fh:
        data = base64.b64encode(fh.read()).decode("ascii")
    name = os.path.splitext(os.path.basename(path))[0]
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(name)}">'


_STYLE = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1300px;"
          "padding:0 1em;line-height:1.45;color:#222}"
          "table{border-collapse:collapse;font-size:12px;margin:1em 0}"
          "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}"
          "td.n{text-align:right;white-space:nowrap}td.w{min-width:14em}td.p{min-width:28em}"
          "th{background:#f0f0f0}"
          "tr:nth-child(2) td{background:#fbfbe8}.wrap{overflow-x:auto}"
          "img{max-width:100%;border:1px solid #eee}figure{margin:1.5em 0}"
          "figcaption{color:#555;max-width:60em}"
          "code,pre{background:#f4f4f4;padding:2px 4px;font-size:90%}"
          "pre{padding:.6em;white-space:pre-wrap;word-break:break-word}"
          "dt{font-weight:bold;margin-top:.4em}dd{margin-left:1.5em}")


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Numbers right-aligned on one line; text columns wide enough to read."""
    text = {"scenario", "model", "plan", "bottleneck", "note"}
    numeric = {h for h in headers if h in ("#", "GPUs", "used", "idle")
               or h.endswith(("s", "%", "$", "tokens", ")"))} - text

    def cls(h: str) -> str:
        return (" class=n" if h in numeric else " class=w" if h == "bottleneck" else
                " class=p" if h == "plan" else "")

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f"<td{cls(h)}>{html.escape(c)}</td>"
        for h, c in zip(headers, r, strict=True)) + "</tr>" for r in rows)
    return f"<div class=wrap><table><tr>{head}</tr>{body}</table></div>"


def html_page(blocks: Sequence[Block], *, title: str) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{html.escape(block[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_html_text(block[1])}</p>")
        elif kind == "code":
            out.append(f"<pre><code>{html.escape(block[1])}</code></pre>")
        elif kind == "table":
            out.append(_html_table(block[1], block[2]))
        elif kind == "figure":
            out.append(f"<figure>{_image(block[1])}<figcaption>{html.escape(block[2])}"
                       "</figcaption></figure>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_text(i)}</li>" for i in block[1])
                       + "</ul>")
        elif kind == "dl":
            out.append("<dl>" + "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>"
                                        for t, d in block[1]) + "</dl>")
    return (f"<!doctype html><html lang=en><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(out) + "</body></html>\n")
