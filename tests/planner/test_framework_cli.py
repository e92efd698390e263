"""`--framework` on the command line: the issue's check (GPT-3 175B on Selene, searched
for Megatron-LM, exports exactly and simulates as searched) and what-if passing it on."""

import json
import subprocess
import sys

import pytest

from planner.export.frameworks import CAPABILITIES, chunk_layer_counts, unsupported
from planner.specs.plan import load_plan
from tests.planner.cli_helpers import run_cli


def test_search_takes_the_flag_and_refuses_other_names(capsys, tmp_path):
    out = str(tmp_path / "p.yaml")
    code, stdout, err = run_cli(["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8",
                                 "--gbs", "16", "--framework", "deepspeed", "--json", "-o", out],
                                capsys)
    assert code == 0, err
    assert all(not p["sequence_parallel"] and p["recompute"] in ("none", "full")
               for p in json.loads(stdout)["plans"])
    assert unsupported(load_plan(out), CAPABILITIES["deepspeed"]) == []
    code, _, err = run_cli(["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8",
                            "--gbs", "16", "--framework", "nemo"], capsys)
    assert code == 2 and "--framework: invalid choice: 'nemo'" in err


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_gpt3_175b_on_selene_with_megatron_exports_exactly_and_simulates_as_searched(tmp_path):
    """The issue's check: `plan search --framework megatron` then `plan export --format
    megatron` writes every setting the plan uses, with no warning, and `plan simulate
    --plan` gives the time the search reported."""
    plan_file = str(tmp_path / "p.yaml")
    searched = _plan("search", "--model", "gpt3-175b", "--cluster",
                     "cluster_specs/selene-a100.yaml", "--gbs", "1536", "--framework",
                     "megatron", "-o", plan_file, "--json")
    assert searched.returncode == 0, searched.stderr
    reported = json.loads(searched.stdout)["plans"][0]
    exported = _plan("export", plan_file, "--format", "megatron")
    assert exported.returncode == 0 and exported.stderr == "", exported.stderr
    args = exported.stdout
    plan = load_plan(plan_file)
    tr, sh = plan.training, plan.sharding
    stages = plan.pipelines[0].stages
    uses = {"--use-distributed-optimizer": sh.optim > 1,
            "--sequence-parallel": tr.sequence_parallel,
            "--recompute-granularity": stages[0].recompute != "none"}
    for flag, used in uses.items():
        assert (flag in args) == used, flag
    assert sh.optim > 1 and tr.sequence_parallel  # the plan needs them: they must be written
    # interleaving and the layer split: Megatron's even split, or the explicit layout
    chunks = chunk_layer_counts(tuple(s.num_layers for s in stages), tr.virtual_stages)
    if len(set(chunks)) > 1:
        assert "--pipeline-model-parallel-layout 'E" + "|".join(f"t*{n}" for n in chunks) \
            + "L'" in args
    else:
        assert ("--num-layers-per-virtual-pipeline-stage" in args) == (tr.virtual_stages > 1)
    assert f"--pipeline-model-parallel-size {len(stages)}" in args
    assert f"--tensor-model-parallel-size {stages[0].tp}" in args
    simulated = _plan("simulate", "--plan", plan_file, "--json")
    assert simulated.returncode == 0, simulated.stderr
    again = json.loads(simulated.stdout)["iteration_time_s"]
    assert again == pytest.approx(reported["iteration_time_s"], rel=1e-9)


def test_what_if_passes_the_framework_on(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: small-mixed\nnode_groups:\n"
                       "  - {name: a100, gpu: A100-80GB-SXM, num_nodes: 2, island: ib}\n"
                       "  - {name: v100, gpu: V100-32GB-SXM2, num_nodes: 2, island: ib}\n")
    proc = _plan("what-if", "--model", "gpt3-1.3b", "--cluster", str(cluster), "--tokens",
                 "1e10", "--gbs", "64", "--framework", "deepspeed", "-o", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    best = load_plan(str(tmp_path / "r" / "best-plan.yaml"))
    assert unsupported(best, CAPABILITIES["deepspeed"]) == [] and len(best.gpu_types) == 1


@pytest.mark.parametrize(("extra", "message"), [
    (["--model", "llama2-7b", "--dtype", "fp8"],
     "--dtype: 'fp8' is not allowed (trainplan 0.1.0 executor trains in bf16, fp16, fp32, "
     "tf32; --framework megatron plans fp8)"),
    (["--model", "deepseek-v2-lite"],
     "--model: 'deepseek-v2-lite' is not allowed (it uses multi-head latent attention"),
])
def test_what_if_refuses_once_what_the_framework_never_runs(capsys, tmp_path, extra, message):
    """A dtype or a model the framework cannot run on any cluster fails every scenario
    alike: the command says so in one line (exit 2) instead of writing a report of
    scenarios that each say "no plan"."""
    out = tmp_path / "r"
    code, _, err = run_cli(["what-if", *extra, "--gpus", "H100-80GB-SXM:16", "--tokens", "1e9",
                            "--gbs", "64", "-o", str(out)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_framework_that_plans_each_gpu_type_alone_leaves_out_the_types_without_the_dtype(
        capsys):
    """torchtitan plans one GPU type per job, yet the dtype was checked against every type
    of the cluster: on H100 + A100 + V100 the default became fp16 (the V100s have no bf16),
    which torchtitan refused ('--dtype fp16', a flag never given), and --dtype bf16 was
    refused for the V100s. The V100s are left out, with a note, and the rest planned."""
    from planner.specs.cluster import train_dtype
    from profiler.devices import device

    code, stdout, err = run_cli(["search", "--model", "gpt3-1.3b", "--cluster",
                                 "cluster_specs/mixed-a100-v100.yaml", "--gbs", "128",
                                 "--framework", "torchtitan", "--json"], capsys)
    assert code == 0, err
    found = json.loads(stdout)
    assert {p["dtype"] for p in found["plans"]} == {"bf16"}
    assert any(n.startswith("V100-32GB-SXM2 not planned: no bf16 there") for n in
               found["notes"]), found["notes"]
    code, _, err = run_cli(["search", "--model", "gpt3-1.3b", "--cluster",
                            "cluster_specs/mixed-a100-v100.yaml", "--gbs", "128",
                            "--framework", "torchtitan", "--dtype", "bf16", "--json"], capsys)
    assert code == 0, err
    # a framework that mixes types still needs the dtype on every one
    code, _, err = run_cli(["search", "--model", "gpt3-1.3b", "--cluster",
                            "cluster_specs/mixed-a100-v100.yaml", "--gbs", "128",
                            "--dtype", "bf16"], capsys)
    assert code == 2 and "V100-32GB-SXM2 has no bf16" in err
    a100, v100 = device("A100-80GB-SXM"), device("V100-32GB-SXM2")
    assert train_dtype([a100, v100], None, where="d") == "fp16"
    assert train_dtype([a100, v100], None, where="d", each_alone=True,
                       allowed=("bf16", "fp32")) == "bf16"
    assert train_dtype([v100], None, where="d", allowed=("bf16", "fp32")) == "fp32"
