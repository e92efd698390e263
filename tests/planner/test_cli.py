"""`plan` as users meet it: errors are one line, exit 2, no traceback."""

import json
import re
import subprocess
import sys

import pytest

from tests.planner.cli_helpers import run_cli as _run

GOOD = ["simulate", "--model", "gpt3-175b", "--gpus", "A100-80GB-SXM:64", "--tp", "8", "--pp",
        "8", "--dp", "1", "--vp", "3", "--mbs", "1", "--gbs", "64", "--recompute", "full"]


def _swap(flag, value):
    argv = list(GOOD)
    argv[argv.index(flag) + 1] = value
    return argv


def _model_file(tmp_path, text):
    f = tmp_path / "model.yaml"
    f.write_text(text)
    return ["simulate", "--model-file", str(f), "--gpus", "A100-80GB-SXM:8", "--tp", "8",
            "--pp", "1", "--dp", "1", "--mbs", "1", "--gbs", "8"]


MODEL = ("name: m\nnum_layers: 4\nhidden_size: 256\nffn_hidden_size: 1024\nnum_heads: 8\n"
         "vocab_size: 1000\nseq_len: 128\n")


@pytest.mark.parametrize("argv, needle", [
    (_swap("--gpus", "Z100-80GB:64"), "--gpus: 'Z100-80GB' is not a known GPU type"),
    (_swap("--tp", "5"), "--tp: 5 is not allowed (must divide num_heads 96)"),
    (_swap("--dp", "2"), "tp*pp*dp*cp = 8*8*2*1 = 128 must equal the cluster's 64 GPUs"),
    (_swap("--mbs", "0"), "argument --mbs: 0 is not allowed (must be ≥ 1)"),
    (_swap("--gbs", "-4"), "argument --gbs: -4 is not allowed (must be ≥ 1)"),
    (_swap("--tp", "eight"), "argument --tp: 'eight' is not an integer"),
    (_swap("--model", "gpt3-17b"), "--model: 'gpt3-17b' is not a known preset"),
    (GOOD[:-4], "--gbs: required (or --plan FILE); a configuration needs --gpus or --cluster, "
     "--tp, --pp, --dp, --mbs, --gbs"),
    (GOOD[:3] + GOOD[5:], "--gpus: required (or --plan FILE)"),
    (["simulate", "--plan", "p.yaml", "--tp", "2"], "--tp: 2 is not allowed (not with --plan "
     "(the plan has its own))"),
    (["simulate", "--plan", "p.yaml", "--model", "gpt3-175b"], "argument --model: not allowed "
     "with argument --plan"),
    (_swap("--recompute", "some"), "argument --recompute: invalid choice: 'some'"),
    (GOOD + ["--shard-params", "3"], "--shard-params: 3 is not allowed (must divide dp = 1)"),
    (GOOD + ["--moe-dispatcher", "deepep"], "--moe-dispatcher: 'deepep' is not allowed (only "
     "for mixture-of-experts models (gpt3-175b has no experts))"),
    # named by the flags the user has, and what a left-out one defaults to
    (GOOD + ["--shard-params", "8", "--shard-optim", "2"], "--shard-optim: 2 is not allowed "
     "(must be a multiple of the gradient sharding (8: --shard-grads, which defaults to "
     "--shard-params))"),
    (GOOD + ["--shard-params", "2", "--shard-grads", "3"], "--shard-grads: 3 is not allowed "
     "(must be a multiple of --shard-params (2))"),
    (_swap("--gpus", "V100-32GB-SXM3:64") + ["--dtype", "bf16"], "V100-32GB-SXM3 has no bf16"),
    (GOOD + ["--schedule", "zb-h2"], "argument --schedule: invalid choice: 'zb-h2' (choose from "
     "'1f1b', 'gpipe', 'zb-h1')"),
    (GOOD + ["--schedule", "zb-h1"], "--schedule: 'zb-h1' is not allowed (zb-h1 needs pp > 1 "
     "and vp = 1 (here pp 8, vp 3); allowed here: 1f1b)"),
    (["simulate", "--model", "gpt3-175b", "--gpus", "A100-80GB-SXM:64", "--tp", "8", "--pp", "1",
      "--dp", "8", "--mbs", "1", "--gbs", "64", "--schedule", "zb-h1"],
     "--schedule: 'zb-h1' is not allowed (zb-h1 needs pp > 1 and vp = 1 (here pp 1, vp 1); "
     "allowed here: 1f1b, gpipe)"),
    # the note on --sequence-parallel at tp 1 comes once the flags are checked: an error
    # stays one line (the property test found the note before an error, 2026-12-04)
    (["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--tp", "1", "--pp", "1",
      "--dp", "8", "--mbs", "1", "--gbs", "12", "--sequence-parallel"],
     "--gbs: 12 is not allowed"),
    # two counts of one type; two types on different networks
    (["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8:8", "--tp", "1", "--pp",
      "1", "--dp", "8", "--mbs", "1", "--gbs", "8"],
     "--gpus: 'A100-80GB-SXM:8:8' is not allowed (TYPE:COUNT, one count a type"),
    (["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8,RTX4090-24GB:8", "--tp",
      "1", "--pp", "1", "--dp", "16", "--mbs", "1", "--gbs", "16"],
     "(one network for all types, but their standard nodes have different NICs "
     "(A100-80GB-SXM's infiniband, RTX4090-24GB's ethernet): describe the islands"),
])
def test_bad_flags(argv, needle, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_gbs_not_divisible(capsys):
    argv = _swap("--gbs", "63")
    argv[argv.index("--dp") + 1] = "2"
    argv[argv.index("--pp") + 1] = "4"
    code, _, err = _run(argv, capsys)
    assert code == 2 and "--gbs: 63 is not allowed (must be a multiple of mbs*dp = 2)" in err


@pytest.mark.parametrize("text, needle", [
    (MODEL.replace("num_layers: 4\n", ""), "model.yaml:num_layers: missing (required field of ModelSpec)"),
    (MODEL + "colour: red\n", "model.yaml:colour: 'red' is not allowed (unknown field; known: name,"),
    (MODEL.replace("num_layers: 4", "num_layers: -1"), "model.yaml:num_layers: -1 is not allowed (must be ≥ 1)"),
    (MODEL.replace("hidden_size: 256", "hidden_size: 0"), "hidden_size: 0 is not allowed (must be ≥ 1)"),
    (MODEL + "activation: relu\n", "activation: 'relu' is not allowed (allowed: gelu, swiglu, geglu)"),
    ("name: m\nnum_layers: [4\n", "model.yaml: line 3: malformed YAML"),
])
def test_bad_model_files(tmp_path, text, needle, capsys):
    code, out, err = _run(_model_file(tmp_path, text), capsys)
    assert code == 2 and needle in err, err
    assert err.count("\n") == 1


@pytest.mark.parametrize("text, needle", [
    ("name: c\nnode_groups:\n  - {name: a, gpu: Q100, num_nodes: 1}\n",
     "cluster.yaml:node_groups[0].gpu: 'Q100' is not a known GPU type"),
    ("name: c\nnode_groups:\n  - {name: a, gpu: A100-80GB-SXM, num_nodes: 0}\n",
     "node_groups[0].num_nodes: 0 is not allowed (must be ≥ 1)"),
    ("name: c\nnode_groups:\n  - {name: a, gpu: A100-80GB-SXM, num_nodes: 1, nic: carrier-pigeon}\n",
     "nic: 'carrier-pigeon' is not allowed (allowed: infiniband, roce, ethernet)"),
    ("name: c\nnode_groups: {name: a\n", "malformed YAML"),
])
def test_bad_cluster_files(tmp_path, text, needle, capsys):
    f = tmp_path / "cluster.yaml"
    f.write_text(text)
    argv = ["simulate", "--model", "gpt3-125m", "--cluster", str(f), "--tp", "1", "--pp", "1",
            "--dp", "8", "--mbs", "1", "--gbs", "8"]
    code, _, err = _run(argv, capsys)
    assert code == 2 and needle in err, err
    assert err.count("\n") == 1


def test_missing_file(capsys):
    code, _, err = _run(["simulate", "--model-file", "/nonexistent.yaml", *GOOD[3:]], capsys)
    assert code == 2 and "/nonexistent.yaml: cannot read (No such file or directory)" in err


def test_json_contract(capsys):
    code, out, _ = _run(GOOD + ["--json"], capsys)
    assert code == 0
    result = json.loads(out)
    for key in ("iteration_time_s", "tokens_per_s", "tflops_per_gpu_model", "mfu",
                "peak_memory_bytes", "fits", "breakdown", "sources"):
        assert key in result
    assert set(result["sources"]) >= {"compute", "communication", "memory"}
    assert result["fits"] is True and result["iteration_time_s"] > 0


def test_zero_bubble_schedule(tmp_path, capsys):
    """`--schedule zb-h1` (Qi et al. 2024): shorter than 1F1B, the plan records it."""
    argv = _swap("--vp", "1") + ["--json"]
    times = {}
    for schedule in ("1f1b", "zb-h1"):
        code, out, _ = _run(argv + ["--schedule", schedule, "-o", str(tmp_path / "p.yaml")],
                            capsys)
        assert code == 0
        times[schedule] = json.loads(out)["iteration_time_s"]
    assert times["zb-h1"] < times["1f1b"]
    from planner.specs.plan import load_plan

    assert load_plan(str(tmp_path / "p.yaml")).training.schedule == "zb-h1"


def test_not_fitting_reports_the_shortfall(capsys):
    argv = ["simulate", "--model", "gpt3-175b", "--gpus", "A100-80GB-SXM:8", "--tp", "8",
            "--pp", "1", "--dp", "1", "--mbs", "1", "--gbs", "8"]
    code, out, _ = _run(argv + ["--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["fits"] is False and result["iteration_time_s"] > 0
    assert all(s["memory"]["shortfall_bytes"] > 0 for s in result["stages"])
    code, out, _ = _run(argv, capsys)
    assert "DOES NOT FIT: short by" in out


def test_readable_summary_and_plan_output(tmp_path, capsys):
    code, out, _ = _run(GOOD + ["-o", str(tmp_path / "p.yaml")], capsys)
    assert code == 0
    for word in ("iteration", "throughput", "MFU", "breakdown", "memory", "sources"):
        assert word in out
    from planner.specs.plan import load_plan

    plan = load_plan(str(tmp_path / "p.yaml"))
    assert plan.predicted is not None and plan.predicted.fits
    assert plan.provenance is not None and plan.provenance.command.startswith("plan simulate")


@pytest.mark.parametrize("verb", ["models", "gpus"])
def test_listings_one_per_line(verb, capsys):
    code, out, _ = _run([verb], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) > 20
    code, out, _ = _run([verb, "--json"], capsys)
    assert code == 0 and len(json.loads(out)) == len(lines) - 1


def test_gpus_says_what_a_full_mesh_gives_each_peer(capsys):
    """A quad GH200 node's 450 GB/s is a GPU's links to its 3 peers together."""
    code, out, _ = _run(["gpus"], capsys)
    gh = next(line for line in out.splitlines() if line.startswith("GH200-96GB "))
    assert code == 0 and "nvlink-mesh (450 GB/s, 150 to each of 3 peers)" in gh
    h100 = next(line for line in out.splitlines() if line.startswith("H100-80GB-SXM "))
    assert "nvswitch (450 GB/s)" in h100


def test_models_lists_small_counts_in_millions(capsys):
    """The debug models read 0.00B parameters."""
    code, out, _ = _run(["models"], capsys)
    tiny = next(line for line in out.splitlines() if line.startswith("debug-tiny "))
    assert code == 0 and "0.12M" in tiny and "0.00B" not in out
    assert "174.59B" in next(line for line in out.splitlines() if line.startswith("gpt3-175b"))


def test_planner_never_imports_torch():
    code = ("import sys, planner.cli, planner.commands.simulate, planner.predict.estimate;"
            "bad = [m for m in ('torch', 'pandas', 'matplotlib', 'scipy', 'pyarrow')"
            " if m in sys.modules];"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_search_table_json_and_plan(tmp_path, capsys):
    argv = ["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--gbs", "16"]
    code, out, _ = _run(argv + ["--top", "3"], capsys)
    assert code == 0 and "MFU" in out and "searched" in out and "sources:" in out
    # searched for Megatron-LM, so that its export is exact (trainplan's best here is
    # ZeRO-3, which Megatron-LM does not run)
    code, out, _ = _run(argv + ["--json", "--framework", "megatron",
                                "-o", str(tmp_path / "best.yaml")], capsys)
    result = json.loads(out)
    assert code == 0 and result["plans"][0]["iteration_time_s"] > 0
    from planner.specs.plan import load_plan

    plan = load_plan(str(tmp_path / "best.yaml"))
    assert plan.predicted.iteration_time_s == result["plans"][0]["iteration_time_s"]
    code, out, err = _run(["export", str(tmp_path / "best.yaml"), "--format", "megatron"], capsys)
    assert code == 0 and "--tensor-model-parallel-size" in out


@pytest.mark.parametrize("extra, needle", [
    (["--objective", "cost"], "--objective: 'cost' is not allowed (needs prices"),
    (["--max-budget", "100"], "--max-budget: 100.0 is not allowed (needs --tokens"),
    (["--objective", "time-to-train"], "needs --tokens"),
    (["--tokens", "-5"], "--tokens: -5.0 is not allowed (must be > 0)"),
    # a negative number in e-notation is a value, not a flag
    (["--tokens", "-1e9"], "--tokens: -1000000000.0 is not allowed (must be > 0)"),
    # the budget is what cannot be judged without prices: it is the value named
    (["--tokens", "1e9", "--max-budget", "100"], "--max-budget: 100.0 is not allowed (needs prices"),
])
def test_search_bad_input(extra, needle, capsys):
    argv = ["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--gbs", "16", *extra]
    code, _, err = _run(argv, capsys)
    assert code == 2 and needle in err and err.count("\n") == 1


def test_search_infeasible_exits_1_with_reason(capsys):
    argv = ["search", "--model", "gpt3-175b", "--gpus", "A100-80GB-SXM:8", "--gbs", "8"]
    code, out, err = _run(argv, capsys)
    assert code == 1 and "nothing fits in memory" in err and "Traceback" not in err


CPU_SIM = ["simulate", "--model", "debug-small", "--gpus", "CPU:1", "--tp", "1", "--pp", "1",
           "--dp", "1", "--mbs", "8", "--gbs", "8", "--dtype", "fp32"]


def _cpu_profile(tmp_path):
    from planner.costs.memory import rank_param_count
    from planner.costs.workload import optimizer_work
    from planner.specs.model import preset
    from tests.planner.profile_helpers import op_row, write_profile

    params = rank_param_count(preset("debug-small"), num_layers=4, first=True, last=True,
                              tp=1, pp=1)
    rows = [op_row(optimizer_work(params, dtype="fp32", implementation=k), t)
            for k, t in (("fused", 3e-3), ("foreach", 1e-3))]
    return write_profile(tmp_path / "cpu.csv", rows)


def test_simulate_with_a_profile(tmp_path, capsys):
    path = _cpu_profile(tmp_path)
    code, out, err = _run(CPU_SIM + ["--profile", path, "--json", "-o",
                                     str(tmp_path / "p.yaml")], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["sources"]["compute"].startswith(f"measured profile {path} (optimizer)")
    assert result["kernels"]["optimizer"] == "foreach"
    from planner.specs.plan import load_plan

    plan = load_plan(str(tmp_path / "p.yaml"))
    assert plan.kernels.optimizer == "foreach" and plan.provenance.profile == path
    # a folder of profiles is matched by device name
    code, out, _ = _run(CPU_SIM + ["--profile", str(tmp_path), "--json"], capsys)
    assert code == 0 and json.loads(out)["kernels"]["optimizer"] == "foreach"


def test_simulate_says_when_its_profile_was_interrupted(tmp_path, capsys):
    """An interrupted profile priced plans with no word outside `plan profile show`."""
    from dataclasses import replace

    from profiler.store import INTERRUPTED_NOTE, load_profile, save_profile

    whole = load_profile(_cpu_profile(tmp_path))
    path = str(tmp_path / "cut.csv")
    save_profile(path, replace(whole.meta, command=f"plan profile{INTERRUPTED_NOTE}2 rows"),
                 whole.rows)
    code, _, err = _run(CPU_SIM + ["--profile", path], capsys)
    assert code == 0, err
    assert f"plan simulate: note: {path} is an interrupted profile: it holds the 2 rows" in err


@pytest.mark.parametrize("extra, needle", [
    (["--gpus", "A100-80GB-SXM:1"], "device: 'CPU' is not allowed (the plan's GPUs are "
                                    "A100-80GB-SXM)"),
    (["--dtype", "bf16"], "dtype: 'fp32' is not allowed (the plan trains in bf16"),
])
def test_a_profile_that_does_not_fit_the_plan(tmp_path, extra, needle, capsys):
    argv = CPU_SIM + ["--profile", _cpu_profile(tmp_path)]
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        argv[argv.index(flag) + 1] = value
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == "" and needle in err, err
    assert err.count("\n") == 1


def test_simulate_a_plan_file_as_written(tmp_path, capsys):
    """`plan simulate --plan` predicts a Plan file as it is (here a mixed-type plan the
    search wrote): the same numbers as the search."""
    out_plan = tmp_path / "mixed.yaml"
    code, _, _ = _run(["search", "--model", "llama3-70b", "--cluster",
                       "cluster_specs/two-datacenter.yaml", "--gbs", "512", "--seq", "4096",
                       "--top", "1", "-o", str(out_plan)], capsys)
    assert code == 0
    from planner.specs.plan import load_plan

    written = load_plan(str(out_plan))
    code, out, _ = _run(["simulate", "--plan", str(out_plan), "--json"], capsys)
    assert code == 0
    shown = json.loads(out)
    assert shown["iteration_time_s"] == pytest.approx(written.predicted.iteration_time_s,
                                                      rel=1e-12)
    code, out, _ = _run(["simulate", "--plan", str(out_plan)], capsys)
    from planner.specs.plan import describe_layout

    assert code == 0 and f"  {describe_layout(written)}\n" in out


def test_search_table_on_several_gpu_types_names_the_type_and_which_way_a_baseline_is(
        capsys):
    """Cost on a cluster of H100s and A100s: one-GPU plans of either type differ only by
    the type, so the GPUs column names it; under --objective cost a baseline is compared
    by what a token costs (the iteration times of a 1-GPU plan and a 512-GPU baseline said
    the cheapest plan was '96% slower', which is not what it was chosen for); GPUs a
    cheaper plan leaves idle cost more, not 'do not divide evenly'."""
    import pathlib

    two_dc = pathlib.Path(__file__).resolve().parents[2] / "cluster_specs" / "two-datacenter.yaml"
    code, out, err = _run(["search", "--model", "gpt3-125m", "--cluster", str(two_dc),
                           "--gbs", "256", "--objective", "cost", "--tokens", "1e9"], capsys)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert {r[2] for r in rows} >= {"H100", "A100"}
    uniform = out.split("baseline uniform")[1].splitlines()[0]
    assert "% faster" not in uniform and "the best plan's tokens cost" in uniform
    assert re.search(r"the best plan's tokens cost \d+\.\d% (less|more)", out)
    assert "do not divide evenly" not in out and "a plan on more of them costs more" in out


def test_simulate_on_mixed_types_writes_what_each_stage_runs(tmp_path, capsys):
    """A100s with V100s in fp16: the plan names flash (the first type's default) and its
    V100 stages say they run memory-efficient attention, in the file and the output."""
    from planner.specs.plan import load_plan

    cluster = tmp_path / "av.yaml"
    cluster.write_text("name: av\nnode_groups:\n  - {name: a, gpu: A100-80GB-SXM, num_nodes: 1}\n"
                       "  - {name: v, gpu: V100-32GB-SXM2, num_nodes: 1}\n")
    out = tmp_path / "p.yaml"
    code, text, err = _run(["simulate", "--model", "gpt3-125m", "--cluster", str(cluster),
                            "--tp", "1", "--pp", "1", "--dp", "16", "--mbs", "1", "--gbs", "16",
                            "--seq", "1024", "-o", str(out)], capsys)
    assert code == 0, err
    assert "flash attention (memory_efficient on some stages)" in text
    plan = load_plan(str(out))
    runs = {(plan.group_of(s).gpu, plan.attention_of(s))
            for p in plan.pipelines for s in p.stages}
    assert runs == {("A100-80GB-SXM", "flash"), ("V100-32GB-SXM2", "memory_efficient")}


def test_a_gpus_list_is_the_cluster_file_it_stands_for(tmp_path, capsys):
    """--gpus A100-80GB-SXM:8,V100-32GB-SXM2:8 is the two types' standard nodes on one
    fabric: the same prediction as the cluster file that says so."""
    cluster = tmp_path / "av.yaml"
    cluster.write_text("name: av\nnode_groups:\n  - {name: a, gpu: A100-80GB-SXM, num_nodes: 1}\n"
                       "  - {name: v, gpu: V100-32GB-SXM2, num_nodes: 1}\n")
    layout = ["--tp", "1", "--pp", "2", "--dp", "8", "--mbs", "1", "--gbs", "32", "--seq",
              "1024", "--json"]
    results = []
    for where in (["--cluster", str(cluster)], ["--gpus", "A100-80GB-SXM:8,V100-32GB-SXM2:8"]):
        code, out, err = _run(["simulate", "--model", "gpt3-125m", *where, *layout], capsys)
        assert code == 0, err
        results.append(json.loads(out))
    assert results[0]["iteration_time_s"] == results[1]["iteration_time_s"] > 0
    assert results[0]["peak_memory_bytes"] == results[1]["peak_memory_bytes"]


@pytest.mark.parametrize("args, budget", [
    # the V100s idle; the throughput-proportional baseline (4.5% faster, $14,985) is over
    (["--model", "llama2-7b", "--cluster", "cluster_specs/mixed-a100-v100.yaml", "--gbs",
      "256", "--dtype", "fp16", "--tokens", "1e11"], 14_000),
    # as reported (45 s: `make test-slow`)
    pytest.param(["--model", "llama3-70b", "--cluster", "cluster_specs/two-datacenter.yaml",
                  "--gbs", "1024", "--tokens", "1e12"], 1_200_000, marks=pytest.mark.slow),
], ids=["mixed-a100-v100", "two-datacenter"])
def test_a_budget_says_which_baselines_it_rules_out_and_why_gpus_idle(args, budget, capsys):
    """--max-budget left the A100s of two datacenters idle 'because every plan that uses
    them is slower', three lines below a baseline that used them and ran faster, over the
    budget; the baseline and the note now say the budget is why."""
    code, out, err = _run(["search", *args, "--objective", "time-to-train", "--max-budget",
                           str(budget), "--json"], capsys)
    assert code == 0, err
    found = json.loads(out)
    best = found["plans"][0]
    assert best["run_cost_usd"] <= budget
    over = [b for b in found["baselines"] if "over the --max-budget" in b["note"]]
    assert over and all(b["best_is_faster_by"] is not None for b in over)
    faster = [b for b in found["baselines"] if (b["best_is_faster_by"] or 0) < 0]
    assert faster and all(b in over for b in faster)  # a faster baseline: over the budget
    idle = [n for n in found["notes"] if " GPUs idle: every plan that uses them is slower" in n]
    assert idle and all(f"(of the plans within the --max-budget of ${budget:,})" in n
                        for n in idle)


def test_an_unknown_progress_mode_is_refused(capsys, monkeypatch):
    """TRAINPLAN_PROGRESS=bogus was taken as "auto" without a word (CLI sweep)."""
    monkeypatch.setenv("TRAINPLAN_PROGRESS", "bogus")
    code, out, err = _run(["search", "--model", "debug-small", "--gpus", "CPU:2", "--gbs", "8",
                           "--seq", "64", "--dtype", "fp32"], capsys)
    assert code == 2 and out == ""
    assert "TRAINPLAN_PROGRESS: 'bogus' is not allowed (one of auto, always, never)" in err, err


def test_a_budget_under_a_hundred_dollars_is_printed_with_its_cents(capsys):
    """A budget of $0.01 was reported as "exceeds the budget of $0" (CLI sweep)."""
    code, _, err = _run(["search", "--model", "gpt3-1.3b", "--cluster",
                         "cluster_specs/dgx-h100.yaml", "--gbs", "64", "--objective", "cost",
                         "--tokens", "1e9", "--max-budget", "0.01"], capsys)
    assert code == 1 and "exceeds the budget of $0.01 for 1e+09 tokens" in err, err


def test_sequence_parallelism_at_tp_1_is_left_off_with_a_note(capsys):
    """It was dropped without a word (CLI sweep); Megatron-LM turns it off at tp 1 with a
    warning (arguments.py), and the published rows' commands pass it so: a note, not an
    error."""
    code, out, err = _run(["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8",
                           "--tp", "1", "--pp", "1", "--dp", "8", "--mbs", "8", "--gbs", "64",
                           "--sequence-parallel"], capsys)
    assert code == 0 and "iteration" in out
    assert "plan simulate: note: --sequence-parallel does nothing at --tp 1" in err


_LLAMA_LAYOUT = ["--model", "llama2-7b", "--tp", "2", "--pp", "2", "--dp", "2", "--mbs", "1",
                 "--gbs", "64"]


@pytest.mark.parametrize("argv, first", [
    (["--gpus", "H100-80GB-SXM:8", *_LLAMA_LAYOUT], "llama2-7b on 8x H100-80GB-SXM\n"),
    (["--cluster", "cluster_specs/dgx-h100.yaml", *_LLAMA_LAYOUT],
     "llama2-7b on dgx-h100 (first 8 GPUs)\n"),
    (["--model", "debug-tiny", "--cluster", "cluster_specs/local-cpu.yaml", "--tp", "1",
      "--pp", "1", "--dp", "2", "--mbs", "1", "--gbs", "4", "--seq", "32"],
     "debug-tiny on local-cpu (2 CPU ranks)\n"),
])
def test_simulate_names_the_gpus_it_runs_on_once(argv, first, capsys):
    """The header said '(first 8 GPUs) (8 GPUs)' and '1x CPU (1 GPUs)'."""
    code, out, err = _run(["simulate", *argv], capsys)
    assert code == 0, err
    assert out.startswith(first)


def test_simulate_says_which_gpus_of_a_larger_cluster_it_takes(capsys):
    """On three-types.yaml a 32-GPU layout silently ran on the H100 group alone, in bf16
    where the whole cluster's default is fp16 (CLI audit, 2026-12-06)."""
    code, out, err = _run(["simulate", "--model", "llama2-13b", "--cluster",
                           "cluster_specs/three-types.yaml", "--tp", "2", "--pp", "2", "--dp",
                           "8", "--mbs", "1", "--gbs", "160"], capsys)
    assert code == 0, err
    assert err == ("plan simulate: note: the layout's 32 GPUs are the first of --cluster's 160 "
                   "(32 H100-80GB-SXM of group 'h100'; the rest idle: plan search uses them "
                   "all); training in bf16\n")
    code, out, err = _run(["simulate", "--model", "llama2-13b", "--cluster",
                           "cluster_specs/dgx-h100.yaml", "--tp", "8", "--pp", "4", "--dp",
                           "32", "--mbs", "1", "--gbs", "256"], capsys)
    assert code == 0 and err == ""  # the whole cluster: nothing to say


def test_every_option_of_every_command_has_help():
    """`search --attention`, `simulate --sequence-parallel`, `models --json`, the profile
    commands' FILE had none (CLI audit, 2026-12-06)."""
    import argparse

    from planner.cli import build_parser

    def bare(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from bare(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                yield f"{path} {'/'.join(action.option_strings) or action.dest}"

    assert list(bare(build_parser(), "plan")) == []


def test_a_layout_that_is_not_whole_nodes_of_a_cluster_names_the_layout(capsys):
    """It blamed --cluster ("'dgx-h100' is not allowed (12 GPUs do not fill whole
    nodes ...)") where the layout's flags are what to change (CLI audit, 2026-12-06)."""
    code, _, err = _run(["simulate", "--model", "llama2-7b", "--cluster",
                         "cluster_specs/dgx-h100.yaml", "--tp", "2", "--pp", "2", "--dp", "3",
                         "--mbs", "1", "--gbs", "60"], capsys)
    assert code == 2 and err == (
        "plan simulate: error: --dp: 3 is not allowed (tp*pp*dp*cp = 2*2*3*1: 12 GPUs do not "
        "fill whole nodes of 8 GPUs in group 'dgx-h100' of --cluster 'dgx-h100')\n")


def test_search_says_why_its_default_dtype_is_fp16_for_a_plan_of_bf16_gpus(tmp_path, capsys):
    """On an H100 + V100 cluster the default dtype is fp16 (V100s have no bf16); the best
    plan, on the H100s alone, was listed in fp16 without a word (CLI audit, 2026-12-06)."""
    cluster = tmp_path / "hv.yaml"
    cluster.write_text("name: hv\nnode_groups:\n  - {name: h, gpu: H100-80GB-SXM, num_nodes: 1}"
                       "\n  - {name: v, gpu: V100-32GB-SXM2, num_nodes: 1}\n")
    argv = ["search", "--model", "gpt3-1.3b", "--cluster", str(cluster), "--gbs", "32", "--json"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["plans"][0]["gpu_types"] == {"H100-80GB-SXM": 8}
    assert ("fp16 because V100-32GB-SXM2 has no bf16 (the default is a dtype every GPU type "
            "runs); the best plan uses only H100-80GB-SXM, which run bf16: --dtype bf16 plans "
            "them in it") in result["notes"]
    code, out, err = _run(argv + ["--dtype", "fp16"], capsys)  # asked for: nothing to say
    assert code == 0 and not any(n.startswith("fp16 because") for n in json.loads(out)["notes"])
