"""What-if reports: each row is `plan search`'s answer for that scenario's cluster, a
scenario that does not fit is reported (not fatal), and every promised file is written."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from planner.search import SearchRequest, search
from planner.specs.cluster import load_cluster
from planner.specs.model import preset
from planner.whatif.report import table_rows

CLUSTER = """\
name: small-mixed
node_groups:
  - {name: a100, gpu: A100-80GB-SXM, num_nodes: 2, island: ib, price_per_gpu_hour_usd: 1.8}
  - {name: v100, gpu: V100-32GB-SXM2, num_nodes: 2, island: ib, price_per_gpu_hour_usd: 0.8}
"""
MODEL, GBS, TOKENS = "gpt3-1.3b", 64, 1e10
DTYPE = "fp16"  # the V100s have no bf16
SCENARIOS = ["retire: remove V100-32GB-SXM2 16", "too big: model gpt3-175b",
             "fast nic: scale-nic v100 4; price A100-80GB-SXM 2.2"]


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    root = tmp_path_factory.mktemp("whatif")
    cluster = root / "cluster.yaml"
    cluster.write_text(CLUSTER)
    out = root / "report"
    args = ["what-if", "--model", MODEL, "--cluster", str(cluster), "--tokens", str(TOKENS),
            "--gbs", str(GBS), "--dtype", DTYPE, "-o", str(out)]
    for s in SCENARIOS:
        args += ["--scenario", s]
    proc = _plan(*args)
    assert proc.returncode == 0, proc.stderr
    with open(out / "table.csv", encoding="utf-8") as fh:
        return str(out), list(csv.DictReader(fh))


def test_every_file_is_written_and_the_html_is_self_contained(report: tuple) -> None:
    out, rows = report
    for name in ("report.html", "report.md", "table.csv", "best-plan.yaml", "cost_vs_time.png",
                 "breakdown.png", "memory.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    from planner.specs.plan import load_plan

    # a timeline only where the best plan has a pipeline to draw
    stages = len(load_plan(os.path.join(out, "best-plan.yaml")).pipelines[0].stages)
    assert os.path.exists(os.path.join(out, "gantt.png")) == (stages > 1)
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    pngs = [f for f in os.listdir(out) if f.endswith(".png")]
    assert page.count("data:image/png;base64,") == len(pngs)
    assert 'src="http' not in page and "src='http" not in page
    assert [r["scenario"] for r in rows] == ["baseline", "retire", "too big", "fast nic"]
    assert len(os.listdir(os.path.join(out, "clusters"))) == len(rows)


def test_a_scenario_that_does_not_fit_is_a_row_not_a_failure(report: tuple) -> None:
    _, rows = report
    big = rows[2]
    assert big["model"] == "gpt3-175b" and big["plan"] == "" and big["used"] == "0"
    assert "nothing fits in memory" in big["note"]
    assert all(r["plan"] for r in rows if r is not big)


@pytest.mark.parametrize("index", [0, 1, 3])
def test_rows_equal_plan_search_on_the_scenarios_cluster(report: tuple, index: int) -> None:
    """The scenario's cluster, written by the report, searched directly: the same best
    plan and the same numbers, to the digits the table shows."""
    out, rows = report
    path = os.path.join(out, "clusters", sorted(os.listdir(os.path.join(out, "clusters")))[index])
    found = search(SearchRequest(model=preset(MODEL), cluster=load_cluster(path), gbs=GBS,
                                 seq_len=preset(MODEL).seq_len, tokens=TOKENS, dtype=DTYPE,
                                 objective="time-to-train", top=1))
    best = found.ranked[0]
    row = rows[index]
    assert float(row["iteration s"]) == pytest.approx(best.result.iteration_time_s, abs=5e-4)
    assert float(row["MFU %"]) == pytest.approx(best.result.mfu * 100, abs=0.05)
    assert float(row["tokens/s"]) == pytest.approx(best.result.tokens_per_s, rel=1e-9)
    assert float(row["time to train (days)"]) == pytest.approx(
        best.time_to_train_s(TOKENS) / 86400, abs=0.005)
    assert float(row["GPU $"]) == pytest.approx(best.run_cost_usd(TOKENS), rel=1e-9)
    assert int(row["used"]) == best.result.num_gpus


def test_the_cli_search_agrees_with_the_baseline_row(report: tuple) -> None:
    out, rows = report
    cluster = os.path.join(out, "clusters", "01-baseline.yaml")
    proc = _plan("search", "--model", MODEL, "--cluster", cluster, "--gbs", str(GBS),
                 "--tokens", str(TOKENS), "--objective", "time-to-train", "--dtype", DTYPE,
                 "--json")
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)["plans"][0]
    assert float(rows[0]["iteration s"]) == pytest.approx(best["iteration_time_s"], abs=5e-4)
    assert float(rows[0]["GPU $"]) == pytest.approx(best["run_cost_usd"], rel=1e-9)


def test_table_rows_have_a_cell_per_column() -> None:
    from planner.whatif.report import COLUMNS, plan_scenarios
    from planner.whatif.scenarios import Setting

    base = Setting("baseline", preset("gpt3-125m"), load_cluster("cluster_specs/local-cpu.yaml"),
                   1e9)
    rows = plan_scenarios(base, [], gbs=8, seq_len=512, objective="throughput")
    assert all(len(r) == len(COLUMNS) for r in table_rows(rows))


def test_free_gpus_make_a_report(tmp_path) -> None:
    """A cluster priced at $0 per GPU-hour divided by zero while choosing the cost axis
    (found by the property tests)."""
    cluster = tmp_path / "free.yaml"
    cluster.write_text("name: free\nnode_groups:\n  - {name: a, gpu: A100-40GB-PCIe, "
                       "num_nodes: 1, price_per_gpu_hour_usd: 0.0}\n")
    proc = _plan("what-if", "--model", "debug-tiny", "--cluster", str(cluster), "--tokens", "1e9",
                 "--gbs", "1", "-o", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r" / "cost_vs_time.png").stat().st_size > 0
def test_the_csv_holds_plain_numbers(report: tuple) -> None:
    out, rows = report
    text = open(os.path.join(out, "table.csv"), encoding="utf-8").read()
    numeric = ["GPUs", "used", "idle", "iteration s", "tokens/s", "MFU %",
               "time to train (days)", "GPU $", "egress $", "total $", "$ per 1M tokens",
               "memory free (GiB)"]
    for r in rows:
        for column in numeric:
            if r["plan"] or column in ("GPUs", "used", "idle"):
                float(r[column])  # a number, no thousands separators
            else:
                assert r[column] == ""  # no plan: empty, not "-"
    for line in text.splitlines()[1:]:
        # every quoted field is text (the plan, bottleneck, note), never a number
        for field in next(csv.reader([line])):
            if f'"{field}"' in line:
                with pytest.raises(ValueError):
                    float(field)


def test_the_report_speaks_plainly_and_the_html_has_no_markdown(report: tuple) -> None:
    out, rows = report
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    md = open(os.path.join(out, "report.md"), encoding="utf-8").read()
    for text in (page, md):
        assert "P/G/OS" not in text and "none recompute" not in text
        assert "Words used" in text and "pipeline bubble" in text
    assert "`" not in page and "**" not in page
    # every source line, the cost one too
    assert "<b>cost</b>" in page and "<b>compute</b>" in page and "<b>memory</b>" in page
    planned = [r for r in rows if r["plan"]]
    assert all(r["bottleneck"] and "compute" != r["bottleneck"] for r in planned)


def test_the_bottleneck_is_the_largest_cost_besides_computing() -> None:
    from planner.predict.results import Breakdown, SimResult
    from planner.whatif.report import largest_cost

    def result(**parts: float) -> SimResult:
        b = Breakdown(**{f: parts.get(f, 0.0) for f in (
            "compute_s", "host_overhead_s", "tp_comm_s", "cp_comm_s", "pp_comm_s",
            "dp_comm_s", "bubble_s", "optimizer_s")})
        return SimResult("test", b.total_s, 1.0, 1.0, 1.0, 1.0, 0.5, 8, b, (), {})

    assert largest_cost(result(compute_s=10, bubble_s=2, dp_comm_s=1))[0] == "pipeline bubble"
    assert largest_cost(result(compute_s=10, dp_comm_s=3, bubble_s=2))[0] == (
        "exposed data-parallel communication")
    # recomputation for memory's sake counts when it is the largest
    assert largest_cost(result(compute_s=10, tp_comm_s=1), recompute_s=2.5)[0].startswith(
        "recomputation")


def test_every_source_line_of_every_scenario_is_listed() -> None:
    """A homogeneous scenario's plan is chosen by another search than a mixed one's: the
    report lists both answers, each with the scenarios it holds for (it listed the first
    row's only)."""
    from types import SimpleNamespace

    from planner.whatif.document import _md_text, _sources

    def row(label: str, choice: str) -> SimpleNamespace:
        return SimpleNamespace(label=label, result=SimpleNamespace(
            sources={"compute": "analytic", "choice": choice}))

    lines = [_md_text(i) for i in _sources([row("baseline", "mixed search"),
                                             row("A100s only", "solver"),
                                             SimpleNamespace(label="too big", result=None)])]
    assert "**compute**: analytic" in lines  # the same for every scenario: said once
    assert "**choice**: mixed search (baseline)" in lines
    assert "**choice**: solver (A100s only)" in lines
    assert any(s.startswith("**cost**") for s in lines)


def test_the_table_is_numbered_as_the_figures_and_plans_are_a_table_of_their_own(
        report: tuple) -> None:
    out, rows = report
    md = open(os.path.join(out, "report.md"), encoding="utf-8").read()
    tables = [block for block in md.split("\n\n") if block.startswith("| #")]
    assert len(tables) == 2
    numbers, plans = (t.splitlines() for t in tables)
    assert "plan" not in numbers[0].split(" | ") and "bottleneck" in numbers[0]
    assert plans[0] == "| # | scenario | plan | note |"
    for i, r in enumerate(rows, 1):
        assert numbers[i + 1].startswith(f"| {i} | {r['scenario']} |")
        assert plans[i + 1].startswith(f"| {i} | {r['scenario']} |")


def test_the_best_row_follows_the_objective_and_fastest_names_the_fastest() -> None:
    """The report's best plan (best-plan.yaml) preferred any priced row over an unpriced
    one, so "Fastest" named a run 2.2x slower than the baseline (an unpriced H100
    baseline beside a priced A100 swap), and under --objective cost it named the fastest
    run, not the cheaper one the search was asked for."""
    from types import SimpleNamespace

    from planner.whatif.report import best_row, fastest_row

    def row(days: float, usd: float | None, objective: str = "throughput", *,
            model: str = "llama2-7b", tokens: float = 1e11) -> SimpleNamespace:
        return SimpleNamespace(ranked=object(), time_to_train_s=days * 86400,
                               total_usd=usd, objective=objective,
                               setting=SimpleNamespace(model=model, tokens=tokens))

    base, a100 = row(2.17, None), row(4.76, 9_000.0)
    assert best_row([base, a100]) is base and fastest_row([base, a100]) is base
    fast, cheap = row(1.0, 44_785.0, "cost"), row(3.0, 17_770.0, "cost")
    assert best_row([fast, cheap]) is cheap and fastest_row([fast, cheap]) is fast
    # cost with no price anywhere: the fastest; no plan anywhere: none
    assert best_row([row(2.0, None, "cost"), row(1.0, None, "cost")]).time_to_train_s == 86400
    assert best_row([SimpleNamespace(ranked=None, setting=base.setting)]) is None
    # a scenario of another model or token budget is no candidate: a smaller model's plan
    # was best-plan.yaml, a 3e5-token scenario the best run ("$0 in 2.1 s")
    small, short = row(0.5, 10.0, model="gpt3-1.3b"), row(0.001, 0.1, tokens=3e5)
    for rows in ([base, small, short], [cheap, small, short]):
        assert best_row(rows) is rows[0] and fastest_row(rows) is rows[0]


def test_without_dtype_each_scenario_trains_in_its_own_default() -> None:
    """No --dtype: the baseline's default (bf16 on A100s) was forced on a scenario that
    swaps in V100s ("no plan: --dtype 'bf16' is not allowed", a flag never given), while
    `plan search` on the scenario's cluster plans it in fp16, as the report says it would.
    Asked for, the dtype holds everywhere."""
    from planner.specs.choices import DType
    from planner.specs.cluster import parse_gpus_arg
    from planner.whatif.report import plan_scenarios
    from planner.whatif.scenarios import Setting, parse_scenario

    base = Setting(label="baseline", model=preset(MODEL), cluster=parse_gpus_arg(
        "A100-80GB-SXM:16"), tokens=TOKENS)
    swap = [parse_scenario("v100: swap A100-80GB-SXM V100-32GB-SXM2")]
    rows = plan_scenarios(base, swap, gbs=GBS, seq_len=None, objective="throughput",
                          dtype=DType.BF16, dtype_asked=False)
    assert rows[0].ranked.plan.training.dtype == "bf16"
    assert rows[1].ranked is not None and rows[1].ranked.plan.training.dtype == "fp16"
    assert rows[1].note.startswith("trains in fp16 (bf16 is not on every GPU type")
    assert [g.name for g in rows[1].setting.cluster.node_groups] == ["v100-32gb-sxm2"]
    asked = plan_scenarios(base, swap, gbs=GBS, seq_len=None, objective="throughput",
                           dtype=DType.BF16, dtype_asked=True)
    assert asked[1].ranked is None and "bf16" in asked[1].note
    # the other way (V100s swapped out of an fp16 baseline): fp16 runs on the A100s too;
    # the note said it was "not on every GPU type of the scenario"
    v100 = Setting(label="baseline", model=preset(MODEL), cluster=parse_gpus_arg(
        "V100-32GB-SXM2:16"), tokens=TOKENS)
    back = plan_scenarios(v100, [parse_scenario("a100: swap V100-32GB-SXM2 A100-80GB-SXM")],
                          gbs=GBS, seq_len=None, objective="throughput", dtype=DType.FP16,
                          dtype_asked=False)
    assert back[1].note.startswith("trains in bf16 (the default on the scenario's GPU types; "
                                   "the baseline's is fp16")


def test_other_budgets_are_set_apart_and_a_rerun_leaves_no_stale_cluster(tmp_path) -> None:
    """A `tokens` scenario trains another budget: 'Cheapest' named it ($ of 1e8 tokens
    against the baseline's 1e10) while the best plan was another row. Rerunning into the
    folder left the first run's clusters/ files beside the new ones (two files numbered
    02). The report's search command names the objective the rows were searched for (a
    search without it planned another row); a run without prices has no cost axis."""
    cluster = tmp_path / "a100.yaml"
    cluster.write_text("name: a100\nnode_groups:\n  - {name: a, gpu: A100-80GB-SXM, "
                       "num_nodes: 1, price_per_gpu_hour_usd: 2.0}\n")
    out = tmp_path / "r"
    base = ["what-if", "--model", MODEL, "--gbs", "16", "--tokens", "1e10", "-o", str(out)]
    proc = _plan(*base, "--cluster", str(cluster), "--scenario", "short: tokens 1e8",
                 "--scenario", "cheaper: price A100-80GB-SXM 1.5", "--scenario",
                 "third: price A100-80GB-SXM 1.9")
    assert proc.returncode == 0, proc.stderr
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Cheapest: **cheaper**" in md
    assert "fastest, best or cheapest: **short**." in md
    assert "--objective time-to-train" in md
    assert len(os.listdir(out / "clusters")) == 4
    # a cluster file of the user's, numbered like the report's, was deleted too (CLI sweep)
    (out / "clusters" / "99-mine.yaml").write_text("name: mine\nnode_groups: []\n")
    proc = _plan(*base, "--gpus", "A100-80GB-SXM:8", "--scenario",
                 "more: add A100-80GB-SXM 8")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out / "clusters")) == ["01-baseline.yaml", "02-more.yaml",
                                                    "99-mine.yaml"]
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "no cost axis: some scenario has no price" in md and "Cheapest" not in md
