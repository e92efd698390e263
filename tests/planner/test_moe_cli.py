"""Issue 18's checks, end to end through `plan`: MoE plans with expert parallelism on the
command line, in the search (per framework) and in the exports."""

import dataclasses
import json

from planner.export.formats import export_plan, megatron_args
from planner.export.frameworks import CAPABILITIES
from planner.search.space import default_space, for_framework, layouts
from planner.specs.cluster import homogeneous_cluster
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Sharding
from tests.planner.cli_helpers import run_cli

MIXTRAL_64 = ["--model", "mixtral-8x7b", "--gpus", "H100-80GB-SXM:64"]


def test_simulate_shows_the_all_to_all(capsys):
    code, out, _ = run_cli(["simulate", *MIXTRAL_64, "--tp", "1", "--pp", "4", "--dp", "16",
                            "--ep", "8", "--mbs", "1", "--gbs", "256", "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["breakdown"]["ep_comm_s"] > 0
    code, out, _ = run_cli(["simulate", *MIXTRAL_64, "--tp", "1", "--pp", "4", "--dp", "16",
                            "--ep", "8", "--mbs", "1", "--gbs", "256"], capsys)
    assert code == 0 and "ep 8" in out and "ep all-to-all" in out


def test_simulate_refuses_an_ep_that_does_not_divide_the_experts(capsys):
    code, _, err = run_cli(["simulate", *MIXTRAL_64, "--tp", "1", "--pp", "4", "--dp", "16",
                            "--ep", "16", "--mbs", "1", "--gbs", "256"], capsys)
    assert code != 0 and "--ep: 16" in err and "num_experts 8" in err


def test_megatron_and_trainplan_search_spaces_have_ep():
    """Both run expert parallelism (trainplan's executor within its limits, which
    tests/planner/search/test_search_frameworks.py checks); a dense model has none."""
    model = preset("mixtral-8x7b")
    space = default_space(model, num_gpus=(64,), nvlink_domain_gpus=8, seq_len=4096)
    assert space.ep == (1, 2, 4, 8)
    mega = for_framework(space, CAPABILITIES["megatron"])
    ours = for_framework(space, CAPABILITIES["trainplan"])
    assert mega.ep == (1, 2, 4, 8) and ours.ep == (1, 2, 4, 8)
    for framework in (mega, ours):
        eps = {lo.ep for lo in layouts(framework, model, gbs=256, seq_len=4096)}
        assert eps == {1, 2, 4, 8}
    dense = default_space(preset("llama3-8b"), num_gpus=(64,), nvlink_domain_gpus=8, seq_len=4096)
    assert dense.ep == (1,)


def test_search_mixtral_on_64_h100_with_megatron_picks_ep(capsys):
    code, out, _ = run_cli(["search", *MIXTRAL_64, "--gbs", "256", "--framework", "megatron",
                            "--top", "3", "--json"], capsys)
    result = json.loads(out)
    assert code == 0
    assert result["plans"][0]["ep"] > 1, result["plans"][0]


def test_megatron_export_carries_the_moe_flags():
    model = preset("deepseek-v3")
    cluster = homogeneous_cluster("H800-80GB-SXM", 1024)
    cfg = ParallelConfig(tp=1, pp=16, dp=64, mbs=1, gbs=1024, seq_len=4096, ep=64)
    args = megatron_args(homogeneous_plan(model, cluster, cfg))
    for flag in ("--num-experts 256", "--moe-router-topk 8", "--moe-ffn-hidden-size 2048",
                 "--expert-model-parallel-size 64", "--moe-shared-expert-intermediate-size 2048",
                 "--moe-layer-freq ([0]*3+[1]*58)", "--moe-router-score-function sigmoid",
                 "--moe-token-dispatcher-type alltoall"):
        assert flag in args, flag
    titan = export_plan(homogeneous_plan(model, cluster, cfg), "torchtitan")
    assert "expert_parallel_degree = 64" in titan.text


def test_torchtitan_export_writes_the_expert_tp_the_plan_priced():
    """A plan with tp 2 and no etp runs its experts at tp 2 (Megatron's default, as the
    simulator prices it); torchtitan's own default is 1, and the TOML left the field out."""
    model = preset("qwen3-30b-a3b")
    cluster = homogeneous_cluster("H100-80GB-SXM", 64)
    cfg = ParallelConfig(tp=2, pp=1, dp=32, mbs=4, gbs=256, seq_len=4096, ep=4,
                         sequence_parallel=True, sharding=Sharding(params=32, grads=32, optim=32))
    text = export_plan(homogeneous_plan(model, cluster, cfg), "torchtitan").text
    assert "tensor_parallel_degree = 2" in text
    assert "expert_tensor_parallel_degree = 2" in text


def test_deepep_dispatch_is_cheaper_across_nodes(capsys):
    argv = ["simulate", "--model", "qwen3-30b-a3b", "--gpus", "H100-80GB-SXM:16", "--tp", "1",
            "--pp", "1", "--dp", "16", "--ep", "16", "--mbs", "1", "--gbs", "16",
            "--method", "estimate", "--json"]
    code, out, _ = run_cli(argv, capsys)
    nccl = json.loads(out)["breakdown"]["ep_comm_s"]
    code2, out, _ = run_cli([*argv, "--moe-dispatcher", "deepep"], capsys)
    deepep = json.loads(out)["breakdown"]["ep_comm_s"]
    assert code == code2 == 0 and 0 < deepep < nccl


def test_plan_words_say_how_the_experts_are_split():
    from planner.describe import plan_words

    model = preset("qwen3-235b-a22b")
    cluster = homogeneous_cluster("H100-80GB-SXM", 256)
    cfg = ParallelConfig(tp=2, pp=8, dp=16, mbs=1, gbs=2048, seq_len=4096,
                         sequence_parallel=True, ep=32, etp=1)
    words = plan_words(homogeneous_plan(model, cluster, cfg))
    assert "experts split over 32 ranks (expert parallel, expert tp 1)" in words
    cfg = dataclasses.replace(cfg, ep=8, sequence_parallel=False, ep_layout="data_parallel")
    words = plan_words(homogeneous_plan(model, cluster, cfg))
    assert ("experts split over 8 ranks (expert parallel, expert tp 1, one tp rank in each "
            "of 8 replicas)") in words


def test_simulate_prices_the_ep_groups_the_flag_names(capsys):
    """`--ep-layout data_parallel` (trainplan's executor: one tp rank of ep replicas) puts
    Mixtral's ep 4 at tp 4 on GPUs 0, 4, 8, 12 over two nodes, where Megatron's folding
    keeps it on a replica's 4 tp ranks in one node: a slower all-to-all."""
    argv = ["simulate", "--model", "mixtral-8x7b", "--gpus", "H100-80GB-SXM:16", "--tp", "4",
            "--etp", "1", "--pp", "1", "--dp", "4", "--ep", "4", "--mbs", "1", "--gbs", "16",
            "--sequence-parallel", "--method", "estimate", "--json"]
    code, out, _ = run_cli(argv, capsys)
    folded = json.loads(out)["breakdown"]["ep_comm_s"]
    code2, out, _ = run_cli([*argv, "--ep-layout", "data_parallel"], capsys)
    replicas = json.loads(out)["breakdown"]["ep_comm_s"]
    assert code == code2 == 0 and 0 < folded < replicas


def test_simulate_summary_names_the_ep_layout_and_dispatcher_it_priced(capsys):
    """The summary's layout line says which ep groups (`--ep-layout`) and which dispatcher
    (`--moe-dispatcher`) the numbers are for: without them two runs of different price
    printed the same line."""
    argv = ["simulate", "--model", "mixtral-8x7b", "--gpus", "H100-80GB-SXM:16", "--tp", "4",
            "--etp", "1", "--pp", "1", "--dp", "4", "--ep", "4", "--mbs", "1", "--gbs", "16",
            "--sequence-parallel", "--method", "estimate"]
    code, folded, _ = run_cli(argv, capsys)
    code2, replicas, _ = run_cli([*argv, "--ep-layout", "data_parallel",
                                  "--moe-dispatcher", "deepep"], capsys)
    assert code == code2 == 0
    assert "ep 4 (ep_layout folded), etp 1, 1f1b" in folded.splitlines()[1]
    assert ("ep 4 (ep_layout data_parallel), etp 1, deepep dispatch, 1f1b"
            in replicas.splitlines()[1])


def test_search_refuses_latent_attention_where_the_framework_lacks_it(capsys):
    """trainplan's executor runs ordinary attention only (executor/preflight.check_model):
    a search for an MLA model under it is refused in one line that names the frameworks
    that run it, as an fp8 search is; under Megatron it plans."""
    argv = ["search", "--model", "deepseek-v2-lite", "--gpus", "H100-80GB-SXM:16",
            "--gbs", "64", "--top", "1", "--json"]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    line = err.strip().splitlines()[-1]
    assert "--model: 'deepseek-v2-lite' is not allowed" in line
    assert "multi-head latent attention" in line and "--framework megatron" in line
    code, out, _ = run_cli([*argv, "--framework", "megatron"], capsys)
    assert code == 0 and json.loads(out)["plans"]


def test_search_refuses_geglu_where_the_framework_lacks_it(capsys):
    """Megatron-LM's arguments cannot gate with GELU (planner/export/frameworks.py): a
    search for grok-1 (GeGLU) under Megatron is refused in one line naming the frameworks
    that plan it; trainplan's executor runs it."""
    argv = ["search", "--model", "grok-1", "--gpus", "H100-80GB-SXM:64", "--gbs", "64",
            "--top", "1", "--json", "--framework", "megatron"]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    line = err.strip().splitlines()[-1]
    assert "--model: 'grok-1' is not allowed" in line
    assert ("its activation geglu is not among megatron-core 0.16.1 (Megatron-LM "
            "core_r0.16.0)'s (gelu, swiglu); --framework deepspeed or torchtitan or "
            "trainplan plans it") in line
