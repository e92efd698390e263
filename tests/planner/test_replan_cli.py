"""`plan replan --without N:TYPE`: the cluster of a plan less lost nodes, searched again for
the plan's own model, batch, sequence, dtype, framework and attention (where every GPU
left runs it); bad input is one line, exit 2;
no plan on what is left exits 1, as `plan search` does."""

import dataclasses
import json

import pytest

from planner.commands.replan import without_nodes
from planner.specs.cluster import ClusterSpec, IslandLink, NodeGroup, parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Kernels, load_plan, save_plan
from tests.planner.cli_helpers import run_cli


def _cpu_nodes(num_nodes):
    return ClusterSpec(name="cpu-nodes", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=num_nodes, gpus_per_node=2,
        intra_node_link="loopback", island="local"),)).resolved()


@pytest.fixture
def plan_a(tmp_path):
    """dp 2 x pp 2 of debug-tiny on 2 nodes of 2 CPU ranks, as a file."""
    plan = homogeneous_plan(preset("debug-tiny"), _cpu_nodes(2), ParallelConfig(
        dp=2, pp=2, mbs=1, gbs=8, seq_len=32, dtype="fp32"),
        kernels=Kernels(attention="math", optimizer="foreach"))
    path = tmp_path / "a.yaml"
    save_plan(plan, str(path))
    return path


def test_replan_writes_the_best_plan_for_what_is_left(plan_a, tmp_path, capsys):
    out = tmp_path / "b.yaml"
    code, stdout, err = run_cli(["replan", "--plan", str(plan_a), "--without", "1:CPU",
                                 "-o", str(out)], capsys)
    assert code == 0, err
    old, new = load_plan(str(plan_a)), load_plan(str(out))
    assert new.num_gpus_used == 2 and new.cluster.num_nodes == 1
    assert new.model == old.model and new.kernels.attention == "math"
    tr, was = new.training, old.training
    assert (tr.global_batch_size, tr.seq_len, tr.dtype) == (was.global_batch_size,
                                                            was.seq_len, was.dtype)
    assert new.predicted is not None and new.provenance is not None
    assert "replan" in new.provenance.command
    assert stdout.startswith("debug-tiny: 4 -> 2 GPUs (cpu-nodes without 1 CPU node(s))")
    assert f"plan run --plan {out} --checkpoint-dir DIR --resume" in stdout


def test_replan_keeps_the_plan_it_replaces(plan_a, capsys):
    """-o naming the input overwrote it with exit 0 (export refuses the same)."""
    before = plan_a.read_text()
    code, out, err = run_cli(["replan", "--plan", str(plan_a), "--without", "1:CPU",
                              "-o", str(plan_a)], capsys)
    assert code == 2 and out == "" and "--output" in err and "the same file as --plan" in err
    assert plan_a.read_text() == before


def test_replan_json(plan_a, tmp_path, capsys):
    out = tmp_path / "b.json"
    code, stdout, _ = run_cli(["replan", "--plan", str(plan_a), "--without", "1:CPU",
                               "-o", str(out), "--json"], capsys)
    data = json.loads(stdout)
    assert code == 0 and data["gpus_before"] == 4 and data["gpus"] == 2
    assert data["plan"] == str(out) and load_plan(str(out)).num_gpus_used == 2


def test_nodes_go_from_the_last_group_of_their_type_first():
    a100 = NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=2, island="x")
    v100 = NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=2, island="y")
    a100_late = NodeGroup(name="a2", gpu="A100-80GB-SXM", num_nodes=1, island="x")
    link = IslandLink(islands=("x", "y"), bandwidth_gbit_per_s=100)
    cluster = ClusterSpec(name="c", node_groups=(a100, v100, a100_late),
                          island_links=(link,)).resolved()
    left = without_nodes(cluster, 2, "A100-80GB-SXM")
    assert [(g.name, g.num_nodes) for g in left.node_groups] == [("a", 1), ("v", 2)]
    assert left.island_links == (link,)
    no_v100 = without_nodes(cluster, 2, "V100-32GB-SXM2")  # island y empties: its link goes
    assert [g.name for g in no_v100.node_groups] == ["a", "a2"] and no_v100.island_links == ()


@pytest.mark.parametrize(("without", "output", "needle"), [
    ("1:Z100", "b.yaml", "--without: 'Z100' is not a known GPU type"),
    ("1:A100-80GB-SXM", "b.yaml", "--without: '1:A100-80GB-SXM' is not allowed (a GPU type "
     "of the plan's cluster: CPU)"),
    ("3:CPU", "b.yaml", "--without: '3:CPU' is not allowed (the plan's cluster has 2 CPU "
     "node(s))"),
    ("2:CPU", "b.yaml", "--without: '2:CPU' is not allowed (would leave no GPUs)"),
    ("0:CPU", "b.yaml", "--without: '0:CPU' is not allowed (N:TYPE, N ≥ 1"),
    ("-1:CPU", "b.yaml", "--without: '-1:CPU' is not allowed (N:TYPE, N ≥ 1"),
    ("CPU", "b.yaml", "--without: 'CPU' is not allowed (N:TYPE"),
    ("1:CPU", "b.txt", "is not allowed (a plan file: .yaml, .yml, .json)"),
    ("1:CPU", "missing/b.yaml", "does not exist"),
])
def test_bad_input_is_one_line_exit_2(plan_a, tmp_path, capsys, without, output, needle):
    out = tmp_path / output
    code, _, err = run_cli(["replan", "--plan", str(plan_a), "--without", without,
                            "-o", str(out)], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not out.exists()


def test_nothing_fits_on_what_is_left_exits_1(tmp_path, capsys):
    """GPT-3 175B on 8 nodes of 8 A100s; with 7 nodes lost it fits nowhere."""
    plan = homogeneous_plan(preset("gpt3-175b"), parse_gpus_arg("A100-80GB-SXM:64"),
                            ParallelConfig(tp=8, pp=8, mbs=1, gbs=8, seq_len=2048))
    save_plan(plan, str(tmp_path / "a.yaml"))
    out = tmp_path / "b.yaml"
    code, _, err = run_cli(["replan", "--plan", str(tmp_path / "a.yaml"), "--without",
                            "7:A100-80GB-SXM", "-o", str(out)], capsys)
    assert code == 1 and err.startswith("plan replan: no plan on ") and "Traceback" not in err
    assert "nothing fits in memory" in err and not out.exists()
    # --json still prints its one object (as `plan search --json` does)
    code, out_text, _ = run_cli(["replan", "--plan", str(tmp_path / "a.yaml"), "--without",
                                 "7:A100-80GB-SXM", "-o", str(out), "--json"], capsys)
    report = json.loads(out_text)
    assert code == 1 and report["plan"] is None and "nothing fits" in report["no_plan"]


def test_gpus_left_that_no_layout_divides_the_batch_over_plan_on_fewer(tmp_path, capsys):
    """125 of 128 DGX H100 nodes left (1,000 GPUs) and gbs 1,024: no tp x pp x dp of 1,000
    has a dp dividing 1,024, and replan (a throughput search, all GPUs) found no plan at
    all. Whole nodes fewer are tried until a layout divides (960 for GPT-3 1.3B: 24
    layers, 32 heads)."""
    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("H100-80GB-SXM:1024"),
                            ParallelConfig(dp=1024, mbs=1, gbs=1024, seq_len=2048))
    save_plan(plan, str(tmp_path / "a.yaml"))
    out = tmp_path / "b.yaml"
    code, text, err = run_cli(["replan", "--plan", str(tmp_path / "a.yaml"), "--without",
                               "3:H100-80GB-SXM", "-o", str(out), "--json"], capsys)
    assert code == 0, err
    report = json.loads(text)
    assert report["gpus"] == 960 and out.exists()
    assert load_plan(str(out)).training.global_batch_size == 1024


def _mixed_plan(tmp_path, *, a100_nodes, v100_nodes, **cfg):
    """A plan on A100 nodes (flash attention), saved with a cluster that has V100 nodes too
    (or not); the V100s run no flash attention in fp16."""
    groups = [NodeGroup(name="a", gpu="A100-80GB-SXM", num_nodes=a100_nodes)]
    if v100_nodes:
        groups.append(NodeGroup(name="v", gpu="V100-32GB-SXM2", num_nodes=v100_nodes))
    cluster = ClusterSpec(name="mixed", node_groups=tuple(groups)).resolved()
    a100 = ClusterSpec(name="a", node_groups=(groups[0],)).resolved()
    plan = homogeneous_plan(preset("gpt3-125m"), a100, ParallelConfig(
        dp=8 * a100_nodes, mbs=1, gbs=16 * a100_nodes, seq_len=1024, dtype="fp16", **cfg),
        kernels=Kernels(attention="flash"))
    path = tmp_path / "mixed.yaml"
    save_plan(plan, str(path))
    return path, cluster


def test_an_attention_kernel_a_gpu_left_cannot_run_is_not_asked_for(tmp_path, capsys):
    """The old plan's flash attention is kept only where every GPU left runs it: with V100s
    in the cluster each GPU type takes its own, as a search without --attention does."""
    plan, cluster = _mixed_plan(tmp_path, a100_nodes=2, v100_nodes=1)
    whole = tmp_path / "whole.yaml"
    whole.write_text("name: mixed\nnode_groups:\n"
                     "  - {name: a, gpu: A100-80GB-SXM, num_nodes: 2}\n"
                     "  - {name: v, gpu: V100-32GB-SXM2, num_nodes: 1}\n")
    out = tmp_path / "b.yaml"
    code, _, err = run_cli(["replan", "--plan", str(plan), "--cluster", str(whole),
                            "--without", "1:A100-80GB-SXM", "-o", str(out)], capsys)
    assert code == 0, err  # asked for flash, the search refused the V100s (exit 2)
    from planner.commands.replan import kept_attention

    assert kept_attention(load_plan(str(plan)), cluster) is None
    assert kept_attention(load_plan(str(plan)), load_plan(str(plan)).cluster) == "flash"


def test_the_whole_cluster_is_where_lost_nodes_are_taken_from(tmp_path, capsys):
    """A searched plan's cluster holds only the GPUs it used: losing them all leaves
    nothing there, and the message says --cluster gives the whole cluster."""
    plan, cluster = _mixed_plan(tmp_path, a100_nodes=1, v100_nodes=0)
    code, _, err = run_cli(["replan", "--plan", str(plan), "--without", "1:A100-80GB-SXM",
                            "-o", str(tmp_path / "b.yaml")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "would leave no GPUs" in err and "--cluster FILE gives the whole cluster" in err


def test_the_framework_is_the_one_whose_communication_the_plan_carries():
    from planner.commands.replan import framework_of
    from planner.export.frameworks import CAPABILITIES

    plan = homogeneous_plan(preset("gpt3-125m"), parse_gpus_arg("H100-80GB-SXM:8"),
                            ParallelConfig(dp=8, mbs=1, gbs=8, seq_len=1024, dtype="bf16"))
    assert framework_of(plan) == "megatron"  # Communication's defaults are Megatron-LM's
    for name, caps in CAPABILITIES.items():
        comm = caps.communication("bf16")
        if all(CAPABILITIES[o].communication("bf16") != comm for o in CAPABILITIES if o != name):
            moved = dataclasses.replace(plan, training=dataclasses.replace(plan.training,
                                                                           comm=comm))
            assert framework_of(moved) == name


def test_a_gpu_type_the_plans_cluster_defines_can_be_lost(tmp_path, capsys):
    """--without 1:MYGPU said "'MYGPU' is not a known GPU type" for a type the plan's
    own cluster defines; names match in any case."""
    from profiler.devices import device

    mine = dataclasses.replace(device("A100-80GB-SXM"), name="MYGPU", source="user-defined")
    cluster = ClusterSpec(name="mine", devices=(mine,), node_groups=(
        NodeGroup(name="m", gpu="MYGPU", num_nodes=2),)).resolved()
    plan = homogeneous_plan(preset("gpt3-125m"), cluster, ParallelConfig(
        dp=16, mbs=1, gbs=32, seq_len=1024, dtype="bf16"))
    path, out = tmp_path / "a.yaml", tmp_path / "b.yaml"
    save_plan(plan, str(path))
    code, _, err = run_cli(["replan", "--plan", str(path), "--without", "1:mygpu",
                            "-o", str(out)], capsys)
    assert code == 0, err
    assert load_plan(str(out)).num_gpus_used <= 8


def test_the_cluster_file_must_hold_the_gpus_the_plan_ran_on(plan_a, tmp_path, capsys):
    """A --cluster of other GPUs was taken as the plan's whole cluster."""
    other = tmp_path / "h.yaml"
    other.write_text("name: h\nnode_groups: [{name: h, gpu: H100-80GB-SXM, num_nodes: 4}]\n")
    code, _, err = run_cli(["replan", "--plan", str(plan_a), "--cluster", str(other),
                            "--without", "1:H100-80GB-SXM", "-o", str(tmp_path / "b.yaml")],
                           capsys)
    assert code == 2 and err.count("\n") == 1
    assert "(the cluster the plan ran on: the plan uses 4 CPU GPUs, the file holds 0)" in err


def test_the_way_on_is_plan_run_only_where_the_executor_runs_the_new_plan():
    """A Megatron-searched MoE plan at tp 2 (experts at tp 2) was written with 'resume the
    run with: plan run --plan ...', which then refused it (the executor keeps experts
    whole); replan said nothing of the framework it searched for. A Megatron-searched
    plan the executor runs was told only 'plan run ... --resume', which reads the
    executor's checkpoints, not those of the Megatron run it most likely was."""
    from planner.commands.replan import resume_command

    moe = homogeneous_plan(preset("mixtral-8x7b"), parse_gpus_arg("H100-80GB-SXM:16"),
                           ParallelConfig(tp=2, pp=1, dp=8, mbs=1, gbs=64, seq_len=4096, ep=4,
                                          sequence_parallel=True))
    assert resume_command(moe, "megatron", "b.yaml").startswith(
        "plan export b.yaml --format megatron, from the run's checkpoints")
    dense = homogeneous_plan(preset("debug-tiny"), parse_gpus_arg("H100-80GB-SXM:8"),
                             ParallelConfig(dp=8, mbs=1, gbs=8, seq_len=32))
    # a Megatron run wrote Megatron's checkpoints: its own files first, then the executor
    assert resume_command(dense, "megatron", "b.yaml") == (
        "plan export b.yaml --format megatron, from the run's checkpoints as megatron "
        "resumes; a run of this project's executor: plan run --plan b.yaml "
        "--checkpoint-dir DIR --resume")
    assert resume_command(dense, "trainplan", "b.yaml") == (
        "plan run --plan b.yaml --checkpoint-dir DIR --resume")
    cpu = homogeneous_plan(preset("debug-tiny"), _cpu_nodes(1), ParallelConfig(
        dp=2, mbs=1, gbs=8, seq_len=32, dtype="fp32"))  # only the executor runs CPU ranks
    assert resume_command(cpu, "megatron", "b.yaml") == (
        "plan run --plan b.yaml --checkpoint-dir DIR --resume")


def test_replan_says_which_framework_it_searched_for(plan_a, tmp_path, capsys):
    out = tmp_path / "b.yaml"
    code, stdout, err = run_cli(["replan", "--plan", str(plan_a), "--without", "1:CPU",
                                 "-o", str(out), "--json"], capsys)
    assert code == 0, err
    data = json.loads(stdout)
    assert data["framework"] == "megatron"  # the plan carries Megatron-LM's communication
    assert data["resume"].startswith("plan run --plan ")
