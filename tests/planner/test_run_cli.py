"""`plan run` as users meet it: bad plans and flags refused in one line (exit 2) before any
process starts; multi-node plans printed as torchrun lines; the automatic mode end to end."""

import json
import subprocess
import sys

import pytest
import yaml

from planner.specs.cluster import ClusterSpec, NodeGroup, parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import Kernels, plan_to_dict, save_plan
from tests.planner.cli_helpers import run_cli as _run

TINY = preset("debug-tiny")
CPU_KERNELS = Kernels(attention="math", optimizer="foreach")


def _cpu(num_nodes, per_node):
    return ClusterSpec(name="cpu", node_groups=(NodeGroup(
        name="host", gpu="CPU", num_nodes=num_nodes, gpus_per_node=per_node,
        intra_node_link="loopback"),)).resolved()


def _plan_file(tmp_path, plan=None, edit=None):
    plan = plan or homogeneous_plan(TINY, _cpu(1, 2), ParallelConfig(
        pp=2, mbs=1, gbs=4, seq_len=32, dtype="fp32"), kernels=CPU_KERNELS)
    data = plan_to_dict(plan)
    if edit:
        edit(data)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if anything would start a process."""
    pytest.importorskip("torch")
    import executor.launch

    def refuse(*_a, **_k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(executor.launch, "run_local", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)



def _stages_edit(data):
    data["pipelines"][0]["stages"][1]["layers"] = [1, 0]


def _replicas_edit(data):  # two replicas, split at different boundaries
    p = data["pipelines"][0]
    data["pipelines"] = [
        {**p, "stages": [{**p["stages"][0], "layers": [0, 1]},
                         {**p["stages"][1], "layers": [1, 2]}]},
        {**p, "stages": [{**p["stages"][0], "layers": [0, 2], "devices": [2]}]}]
    data["training"]["global_batch_size"] = 8
    data["cluster"]["node_groups"][0]["gpus_per_node"] = 3
    data["cluster"]["node_groups"][0]["nvlink_domain_gpus"] = 3  # a node, as the plan's 2 was


def _cp_edit(data):
    data["pipelines"] = [{**data["pipelines"][0], "stages": [
        {"layers": [0, 2], "devices": [0, 1], "tp": 1, "cp": 2, "recompute": "none"}]}]


@pytest.mark.parametrize(("edit", "needle"), [
    (_stages_edit, "pipelines[0].stages[1].layers: [1, 0] is not allowed"),
    (_replicas_edit, "the executor needs every replica to split the layers at the same"),
    (_cp_edit, "context parallelism is not implemented by the executor"),
    (lambda d: d["cluster"]["node_groups"][0].update(gpus_per_node=3),  # domain left at 2
     "nvlink_domain_gpus: 2 is not allowed (a multiple of gpus_per_node (3)"),
    (lambda d: d["kernels"].update(attention="memory_efficient"),
     "kernels.attention: 'memory_efficient' is not allowed (CPU runs flash, math in fp32)"),
])
def test_bad_plans_are_refused_before_any_process_starts(tmp_path, capsys, no_launch, edit,
                                                          needle):
    code, out, err = _run(["run", "--plan", _plan_file(tmp_path, edit=edit)], capsys)
    assert code == 2 and out == "" and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_fp8_is_refused_and_fp16_runs(tmp_path, capsys, no_launch):
    """The executor trains fp16 (dynamic loss scaling) and tf32, but has no FP8 GEMMs
    (`--dry-run`: the plan alone is checked, on any host)."""
    from dataclasses import replace

    h100 = homogeneous_plan(TINY, parse_gpus_arg("H100-80GB-SXM:2"),
                            ParallelConfig(dp=2, mbs=1, gbs=4, seq_len=32, dtype="fp8"))
    code, out, err = _run(["run", "--plan", _plan_file(tmp_path, h100), "--dry-run"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "training.dtype: 'fp8' is not allowed (the executor has no FP8 GEMMs" in err
    for dtype in ("fp16", "tf32"):
        plan = replace(h100, training=replace(h100.training, dtype=dtype),
                       kernels=replace(h100.kernels, attention="math"))
        code, out, err = _run(["run", "--plan", _plan_file(tmp_path, plan), "--dry-run"],
                              capsys)
        assert code == 0 and "torchrun" in out and err == "", err


def test_a_gpu_plan_is_refused_on_a_host_without_one(tmp_path, capsys, no_launch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    plan = homogeneous_plan(TINY, parse_gpus_arg("A100-80GB-SXM:2"),
                            ParallelConfig(dp=2, mbs=1, gbs=4, seq_len=32))
    code, _, err = _run(["run", "--plan", _plan_file(tmp_path, plan)], capsys)
    assert code == 2 and "this host has no CUDA device" in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "needle"), [
    (["--model", "debug-tiny", "--gpus", "CPU:2"], "--gbs: --model needs the global batch size"),
    (["--model", "debug-tiny", "--gbs", "8"], "--model needs --gpus"),
    (["--plan", "p.yaml", "--gbs", "8"], "only with --model"),
    (["--plan", "p.yaml", "--resume"], "--resume and --checkpoint-every need it"),
    # a typo'd folder trained from step 1 with exit 0
    (["--plan", "p.yaml", "--resume", "--checkpoint-dir", "no-such-folder"],
     "--checkpoint-dir: 'no-such-folder' is not allowed (an existing folder of checkpoints"),
    (["--plan", "p.yaml", "--steps", "2", "--warmup", "2"], "0 ≤ warmup < --steps 2"),
    (["--plan", "missing.yaml"], "missing.yaml: cannot read"),
    (["--plan", "p.yaml", "--no-profile"], "--no-profile: true is not allowed (only with"),
    (["--model", "debug-tiny", "--gpus", "CPU:2", "--gbs", "8", "--no-profile", "--profile",
      "p"], "not allowed with argument --no-profile"),
    # the flag named, not the cluster field it fills; CPU ranks do not join GPU types
    (["--model", "debug-tiny", "--gpus", "XPU:2", "--gbs", "8"],
     "--gpus: 'XPU' is not a known GPU type"),
    (["--model", "debug-tiny", "--gpus", "CPU:2,A100-80GB-SXM:8", "--gbs", "8"],
     "--gpus: 'CPU:2,A100-80GB-SXM:8' is not allowed (CPU ranks are a cluster of their own"),
    # --name was ignored without a word (CLI sweep 2026-12-04)
    (["--plan", "p.yaml", "--report", "out", "--name", "foo"],
     "--name: 'foo' is not allowed (not with --report"),
])
def test_bad_flags(argv, needle, capsys, no_launch):
    code, out, err = _run(["run", *argv], capsys)
    assert code == 2 and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_multi_node_plans_print_a_torchrun_line_per_node(tmp_path, capsys, no_launch):
    plan = homogeneous_plan(TINY, _cpu(2, 2), ParallelConfig(
        dp=2, pp=2, mbs=1, gbs=4, seq_len=32, dtype="fp32"), kernels=CPU_KERNELS)
    code, out, _ = _run(["run", "--plan", _plan_file(tmp_path, plan), "--steps", "3"], capsys)
    lines = [ln for ln in out.splitlines() if ln.startswith("torchrun")]
    assert code == 0 and "the plan spans 2 nodes" in out and len(lines) == 2
    for rank, line in enumerate(lines):
        assert f"--nnodes=2 --node-rank={rank} --rdzv-backend=static" in line
        assert "--nproc-per-node=2" in line and "-m executor.worker --plan" in line
        # not this command's temporary folder, gone before the lines are run
        assert '--run-dir "$RUN_DIR"' in line
    assert "RUN_DIR: a folder for the ranks' metrics" in out
    report = tmp_path / "rep"
    code, out, _ = _run(["run", "--plan", _plan_file(tmp_path, plan), "--steps", "3",
                         "--report", str(report)], capsys)
    assert code == 0 and f"--run-dir {report}" in out and "RUN_DIR" not in out


def test_a_multi_node_gpu_plan_prints_its_lines_on_a_host_without_gpus(tmp_path, capsys,
                                                                      no_launch):
    """Nothing of a plan over several nodes runs here, so the host's devices do not matter:
    a 2-node A100 plan was refused for this host's lack of CUDA unless --dry-run (audit of
    2026-12-06), though the README promises its torchrun lines."""
    plan = homogeneous_plan(TINY, parse_gpus_arg("A100-80GB-SXM:16"), ParallelConfig(
        dp=16, mbs=1, gbs=16, seq_len=32))
    code, out, err = _run(["run", "--plan", _plan_file(tmp_path, plan), "--steps", "3"], capsys)
    assert code == 0, err
    assert "the plan spans 2 nodes" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("torchrun")]) == 2


def test_planner_never_imports_the_executor():
    code = ("import sys, planner.cli, planner.commands.run;"
            "print([m for m in ('torch', 'executor') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def _automatic_run(tmp_path, capsys, *extra):
    """`plan run --model debug-tiny --gpus CPU:2` end to end: the search's plan run for 4
    steps and reported; the JSON it printed and the report folder."""
    pytest.importorskip("torch")
    report = tmp_path / "report"
    code, out, err = _run(["run", "--model", "debug-tiny", "--gpus", "CPU:2", "--gbs", "8",
                           "--seq", "32", "--steps", "4", "--warmup", "1", "--report",
                           str(report), "--json", *extra], capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["model"] == "debug-tiny" and len(shown["losses"]) == 4
    assert shown["predicted_iteration_s"] > 0 and shown["measured_iteration_s"] > 0
    assert len(shown["ranks"]) == 2 and all(r["peak_bytes"] > 0 for r in shown["ranks"])
    assert (report / "report.md").read_text().startswith("# ")
    assert json.loads((report / "report.json").read_text())["layout"] == shown["layout"]
    from planner.specs.plan import load_plan

    plan = load_plan(str(report / "plan.yaml"))
    assert plan.predicted is not None and plan.provenance.command.startswith("plan run")
    save_plan(plan, str(tmp_path / "again.json"))  # the written plan is a valid Plan
    return shown, err, report


@pytest.mark.multiprocess
def test_automatic_mode_searches_runs_and_reports(tmp_path, capsys):
    """Without the host's profile (--no-profile: 15 s where measuring it first takes two
    minutes more, `test_automatic_mode_profiles_this_host_first`): priced by the analytic
    model, and it says so."""
    shown, err, report = _automatic_run(tmp_path, capsys, "--no-profile")
    assert not (report / "profiles").exists() and "measuring a profile" not in err
    assert shown["prediction_source"].startswith("event simulation of the searched plan")
    assert "compute: analytic device model" in shown["prediction_source"]


@pytest.mark.slow  # 2.5 minutes: the host's op and collective profile is measured first
@pytest.mark.multiprocess
def test_automatic_mode_profiles_this_host_first(tmp_path, capsys):
    shown, err, report = _automatic_run(tmp_path, capsys)
    # without --profile, this host was profiled first and that profile priced the plan
    assert sorted(p.name for p in (report / "profiles").iterdir()) == [
        "cpu-collectives.csv", "cpu-ops.csv"]
    assert "measured profile" in shown["prediction_source"]
    assert "plan run: measuring a profile of this host first" in err
    # DTensor's rows on the tiny preset's block and on the model's own at the largest
    # micro-batch the search asks for (8 x 32 tokens x 64 wide, fp32; smaller ones read
    # between the two)
    from profiler.store import load_profile

    collectives = load_profile(str(report / "profiles" / "cpu-collectives.csv"))
    assert "--host-model debug-tiny --mbs 8 --seq 32" in collectives.meta.command
    assert sorted(r.bytes for r in collectives.host_rows
                  if r.name == "dtensor_layer_total_forward" and r.variant == "gloo") == [
        4 * 16 * 64, 4 * 8 * 32 * 64]


def test_what_plan_run_measures_before_a_cpu_run_and_measures_once(tmp_path, capsys,
                                                                   monkeypatch):
    """`_profile_here` without the measurement (it is run in
    `test_automatic_mode_profiles_this_host_first`): the model's ops at the micro-batches
    the search asks for (1, 4 and the batch, at most 16), at every tp the model splits
    into among the ranks, with host costs; the collectives among the cluster's ranks with
    DTensor's rows on the model's blocks at the largest micro-batch. A second run with the
    same command line uses the profiles already there; another --seq measures again."""
    import argparse
    from dataclasses import replace

    import planner.commands.profile as profile_command
    from planner.commands.run import _profile_here
    from profiler.store import save_profile
    from tests.planner.profile_helpers import collective_row, meta

    asked = []

    def measure(req):
        asked.append(req)
        save_profile(req.output, replace(meta(), command=req.command),
                     [collective_row("all_reduce", 1024, 1e-4)])
        return 0

    monkeypatch.setattr(profile_command, "measure", measure)
    args = argparse.Namespace(report=str(tmp_path / "report"), name=None, plan=None, gbs=8,
                              seq=32, model_file=None)
    folder = _profile_here(args, TINY, parse_gpus_arg("CPU:4"), "fp32")
    assert folder == str(tmp_path / "report" / "profiles")
    ops, coll = asked
    assert (ops.model, ops.tp, ops.mbs, ops.seq, ops.host_costs) == (TINY, (1, 2, 4),
                                                                     (1, 4, 8), (32,), True)
    assert ops.output == f"{folder}/cpu-ops.csv"
    assert (coll.model, coll.collectives, coll.nprocs, coll.host_model, coll.mbs) == (
        None, True, 4, TINY, (8,))
    assert coll.command.startswith("plan profile measure --device cpu --collectives "
                                   "--nprocs 4 ")
    assert "--host-costs --host-model debug-tiny --mbs 8 --seq 32" in coll.command
    err = capsys.readouterr().err
    assert err.count("plan run: measuring a profile of this host first") == 2
    _profile_here(args, TINY, parse_gpus_arg("CPU:4"), "fp32")
    assert len(asked) == 2
    assert capsys.readouterr().err.count("plan run: using the profile measured before") == 2
    args.seq = 64
    _profile_here(args, TINY, parse_gpus_arg("CPU:4"), "fp32")
    assert len(asked) == 4


def test_a_plan_priced_with_overlapped_gradient_reduction_is_predicted_as_the_executor_runs(
        capsys):
    """`plan simulate -o` writes Megatron-LM's communication (gradients reduced while the
    backward runs); the executor reduces after the last backward
    (executor/data_parallel.py reduce_grads), so `plan run` set its measurement beside a
    prediction of something it did not run."""
    from dataclasses import replace

    from planner.commands.run import _predict
    from planner.simulator import simulate
    from planner.specs.plan import Communication

    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(dp=8, mbs=4, gbs=32, seq_len=2048, dtype="bf16"))
    assert plan.training.comm.overlap_grad_reduce  # Megatron-LM's default
    result, source = _predict(plan, None)
    runs = replace(plan, training=replace(plan.training, comm=Communication.preset(
        "trainplan", dtype="bf16")))
    assert result.iteration_time_s == pytest.approx(simulate(runs).iteration_time_s)
    assert result.iteration_time_s > simulate(plan).iteration_time_s
    assert "executor's communication" in source
    err = capsys.readouterr().err
    assert "training.comm.overlap_grad_reduce true)" in err
    assert "gradients reduced after the last backward" in err
    # a plan already priced as the executor runs it: no note
    again, source = _predict(runs, None)
    assert again.iteration_time_s == result.iteration_time_s and source == "event simulation"
    assert capsys.readouterr().err == ""


def test_a_long_model_name_makes_a_folder_name_the_system_allows(tmp_path, capsys,
                                                                 monkeypatch):
    """The report folder is named after the model: a 240-character model name made a
    folder name past 255 bytes and an OSError traceback, even with --dry-run."""
    monkeypatch.chdir(tmp_path)
    spec = {"name": "y" * 240, "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256,
            "num_heads": 4, "vocab_size": 256, "seq_len": 64}
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(spec))
    code, out, err = _run(["run", "--model-file", "long.yaml", "--gpus", "CPU:2", "--gbs",
                           "16", "--no-profile", "--dry-run"], capsys)
    assert code == 0 and "torchrun" in out, err
    (folder,) = (tmp_path / "reports").iterdir()
    assert folder.name == "y" * 80 + "-2-cpu-ranks-gbs16"
