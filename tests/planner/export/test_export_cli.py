"""`plan export` from the command line: exact or refused, --approximate, launch files, and
`plan run --dry-run` of a GPU plan on this CPU host."""

import os
import shutil
import stat
import subprocess
import time

import pytest
import yaml

from planner.export.frameworks import CAPABILITIES, unsupported
from planner.export.launch import plan_nodes
from planner.specs.cluster import load_cluster
from planner.specs.model import preset
from planner.specs.plan import (
    Communication,
    Kernels,
    Pipeline,
    Plan,
    Sharding,
    Stage,
    Training,
    plan_from_dict,
    save_plan,
)
from profiler.schema import SpecError
from tests.planner.cli_helpers import run_cli
from tests.planner.export.framework_helpers import SELENE, gpt3_on_selene

MIXED = os.path.join(os.path.dirname(SELENE), "mixed-a100-v100.yaml")


@pytest.fixture
def selene_plan(tmp_path):
    path = str(tmp_path / "p.yaml")
    save_plan(gpt3_on_selene(), path)
    return path


def test_megatron_export_of_the_selene_plan_is_exact_and_complete(selene_plan, capsys):
    code, out, err = run_cli(["export", selene_plan, "--format", "megatron"], capsys)
    assert (code, err) == (0, "")
    for setting in ("--use-distributed-optimizer", "--sequence-parallel",
                    "--num-layers-per-virtual-pipeline-stage 2",
                    "--recompute-granularity selective", "--micro-batch-size 1",
                    "--global-batch-size 1536", "--tensor-model-parallel-size 8",
                    "--pipeline-model-parallel-size 16", "--bf16", "--attention-backend flash"):
        assert setting in out, setting


def _amsp(tmp_path):
    """AMSP P/G/OS 1/4/64 on Selene (tp 8, pp 2, dp 64)."""
    path = str(tmp_path / "amsp.yaml")
    save_plan(gpt3_on_selene(pp=2, vp=1, dp=64, gbs=1536, sharding=Sharding(grads=4, optim=64)),
              path)
    return path


def test_amsp_plan_is_refused_by_megatron_naming_the_sharding(tmp_path, capsys):
    code, out, err = run_cli(["export", _amsp(tmp_path), "--format", "megatron",
                              "-o", str(tmp_path / "args.sh")], capsys)
    assert code == 2 and out == ""
    assert "sharding P/G/OS 1/4/64 over dp 64" in err
    assert err.endswith("plan export: nothing written; --approximate writes the nearest plan "
                        "it expresses\n")
    assert not (tmp_path / "args.sh").exists()


def test_approximate_writes_the_nearest_and_both_times(tmp_path, capsys):
    code, out, err = run_cli(["export", _amsp(tmp_path), "--format", "megatron",
                              "--approximate"], capsys)
    assert code == 0
    assert "approximated: sharding P/G/OS 1/4/64 -> P/G/OS 1/1/64" in err
    assert "simulated iteration time: plan " in err and " s, exported " in err
    assert "--use-distributed-optimizer" in out
    assert "--num-distributed-optimizer-instances" not in out


def test_an_approximation_that_runs_out_of_memory_is_refused(tmp_path, capsys):
    """torchtitan's FSDP (P/G/OS 64/64/64) has no Megatron sharding as deep: the nearest,
    1/1/64, needs 107 GiB of an H100's 80 and was written anyway, with "it does not fit in
    memory" on stderr and exit 0 (audit of 2026-12-06). A plan that fits is not
    approximated by one that does not; one that does not fit already keeps that note."""
    def plan(mbs: int) -> str:
        path = str(tmp_path / f"z{mbs}.yaml")
        code, _, _ = run_cli(["simulate", "--model", "llama2-7b", "--gpus", "H100-80GB-SXM:64",
                              "--tp", "1", "--pp", "1", "--dp", "64", "--mbs", str(mbs),
                              "--gbs", "512", "--sharding", "zero3", "--framework",
                              "torchtitan", "-o", path], capsys)
        assert code == 0
        return path

    out = tmp_path / "args.sh"
    code, _, err = run_cli(["export", plan(4), "--format", "megatron", "--approximate",
                            "-o", str(out)], capsys)
    assert code == 2 and not out.exists()
    assert "megatron cannot express the nearest plan either: it runs out of memory" in err
    assert "plan search --framework megatron" in err
    code, _, err = run_cli(["export", plan(2), "--format", "megatron", "--approximate",
                            "-o", str(out)], capsys)
    assert code == 0 and out.exists() and "fit" not in err
    code, _, err = run_cli(["export", plan(8), "--format", "megatron", "--approximate",
                            "-o", str(out)], capsys)
    assert code == 0 and "it does not fit in memory, nor does the plan" in err


def mixed_plan() -> Plan:
    """Two replicas of unlike GPU types on mixed-a100-v100: one A100 node, two V100 nodes,
    priced as trainplan's executor communicates (gradients reduced after the backward)."""
    cluster = load_cluster(MIXED)
    model = preset("llama2-13b")
    a100 = Pipeline(micro_batch_size=1, num_microbatches=12, stages=(
        Stage(layers=(0, 40), devices=tuple(range(8)), tp=8, recompute="full"),))
    first_v100 = 16 * 8
    v100 = Pipeline(micro_batch_size=1, num_microbatches=4, stages=(
        Stage(layers=(0, 22), devices=tuple(range(first_v100, first_v100 + 8)), tp=8,
              recompute="full"),
        Stage(layers=(22, 40), devices=tuple(range(first_v100 + 8, first_v100 + 12)), tp=4,
              recompute="full")))
    plan = Plan(model=model, cluster=cluster, pipelines=(a100, v100),
                training=Training(global_batch_size=16, seq_len=4096, dtype="fp32",
                                  comm=Communication.preset("trainplan", dtype="fp32")),
                kernels=Kernels(attention="math"))
    plan.check("plan")
    return plan


def test_mixed_plan_is_refused_by_the_frameworks_and_not_approximated(tmp_path, capsys):
    path = str(tmp_path / "mixed.yaml")
    save_plan(mixed_plan(), path)
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        code, out, err = run_cli(["export", path, "--format", fmt, "--approximate"], capsys)
        assert code == 2 and out == "", fmt
        assert "mixed GPU types A100-80GB-SXM, V100-32GB-SXM2" in err
        assert "unequal micro-batches per replica" in err
        # without --approximate it was suggested, to be refused in turn (CLI audit)
        code, out, err = run_cli(["export", path, "--format", fmt], capsys)
        assert code == 2 and err.endswith(
            f"plan export: nothing written; --approximate cannot help (no plan near it is one "
            f"{fmt} expresses): plan search --framework {fmt} finds one\n"), err
    assert unsupported(mixed_plan(), CAPABILITIES["trainplan"]) == []


def _fake_torchrun(tmp_path):
    """A torchrun that prints its arguments, for running the generated launcher."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


def _launcher_args(script: str, tmp_path, offset: int, index: int, env: dict) -> list[str]:
    path = tmp_path / "launch-node.sh"
    path.write_text(script)
    run_env = {**os.environ, "PATH": f"{_fake_torchrun(tmp_path)}:{os.environ['PATH']}",
               "SLURM_NODEID": str(index), "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
               "CONFIG_DIR": str(tmp_path), "RUN_DIR": str(tmp_path),
               **env}
    done = subprocess.run(["bash", str(path), str(offset)], env=run_env, check=True,
                          capture_output=True, text=True)
    return done.stdout.splitlines()


def _heredoc(script: str, name: str) -> str:
    start = script.index(f'"$CONFIG_DIR/{name}" <<\'TRAINPLAN_EOF\'\n') + len(name) + 33
    return script[start:script.index("\nTRAINPLAN_EOF", start)] + "\n"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_script_for_a_mixed_plan(tmp_path, capsys):
    plan = mixed_plan()
    path = str(tmp_path / "mixed.yaml")
    save_plan(plan, path)
    code, script, err = run_cli(["export", path, "--format", "slurm"], capsys)
    assert code == 0, err
    (tmp_path / "job.sbatch").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], check=True)
    assert script.count("#SBATCH hetjob") == 1  # an A100 component and a V100 component
    assert "#SBATCH --nodes=1\n" in script and "#SBATCH --nodes=2\n" in script
    assert 'srun --het-group=1 --nodes=2 --ntasks-per-node=1 bash "$CONFIG_DIR/launch-node.sh" 1' in script
    assert plan_from_dict(yaml.safe_load(_heredoc(script, "plan.yaml"))) == plan
    launcher = _heredoc(script, "launch-node.sh")
    # the second V100 node: node rank 1 + 1 = 2, the 4 GPUs the plan uses there
    args = _launcher_args(launcher, tmp_path, offset=1, index=1, env={})
    assert args[:3] == ["--nnodes=3", "--node-rank=2", "--nproc-per-node=4"]
    assert "executor.worker" in args and "--master-addr=node0" in args
    assert [n.num_ranks for n in plan_nodes(plan)] == [8, 8, 4]


def _slurm_job(tmp_path, capsys, srun_body: str):
    """The mixed plan's Slurm script with fake `scontrol` and `srun` (`srun_body`, a bash
    script) on the PATH: a function that runs it with `FAIL` set and returns the
    completed process."""
    path = str(tmp_path / "mixed.yaml")
    save_plan(mixed_plan(), path)
    code, script, err = run_cli(["export", path, "--format", "slurm"], capsys)
    assert code == 0, err
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node0\n")
    (bin_dir / "srun").write_text("#!/bin/bash\n" + srun_body)
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)

    def run(failing: str | None) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
               "SLURM_JOB_NODELIST": "node0", "RUN_DIR": str(tmp_path / "run"),
               "FAIL": failing or ""}
        return subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    return run


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("failing, expected", [(None, 0), ("1", 3), ("0", 3)])
def test_slurm_script_fails_when_a_group_fails(tmp_path, capsys, failing, expected):
    """A bare `wait` returned 0 whatever the groups did: a failed run read as completed, and
    the other group kept waiting for it."""
    # group FAIL exits 3 at once; the others run 0.5 s, or 30 s while a group fails
    run = _slurm_job(tmp_path, capsys, 'if [ "$1" = "--het-group=$FAIL" ]; then exit 3; fi\n'
                                       'if [ -n "$FAIL" ]; then exec sleep 30; fi\n'
                                       "sleep 0.5\n")
    start = time.monotonic()
    done = run(failing)
    assert done.returncode == expected, done.stderr
    assert time.monotonic() - start < 20  # the other group was stopped, not waited for


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_script_succeeds_when_its_groups_end_together(tmp_path, capsys):
    """Groups that end at the same moment: bash's `wait -n` may answer 127 (no child left
    to report) for the second once both are reaped, which the script read as a failed
    group (CI, 2026-12-05: exit 127 with every group at 0); each group's own status
    decides. A failing group that ends with another still fails the job."""
    run = _slurm_job(tmp_path, capsys, 'if [ "$1" = "--het-group=$FAIL" ]; then exit 3; fi\n')
    assert [run(None).returncode for _ in range(10)] == [0] * 10
    assert [run("1").returncode for _ in range(5)] == [3] * 5


def test_slurm_script_for_megatron_carries_the_arguments(selene_plan, tmp_path, capsys):
    code, script, err = run_cli(["export", selene_plan, "--format", "slurm", "--framework",
                                 "megatron"], capsys)
    assert code == 0, err
    (tmp_path / "job.sbatch").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], check=True)
    assert "#SBATCH --nodes=128" in script and "#SBATCH --gpus-per-node=8" in script
    assert "hetjob" not in script
    args = _launcher_args(_heredoc(script, "launch-node.sh"), tmp_path, offset=0, index=5,
                          env={"MEGATRON_LM": "/opt/megatron"})
    assert args[:3] == ["--nnodes=128", "--node-rank=5", "--nproc-per-node=8"]
    assert args[args.index("/opt/megatron/pretrain_gpt.py") + 1:][:2] == ["--num-layers", "96"]
    assert "--use-distributed-optimizer" in args
    # Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1 (arguments.py
    # validate_args); the launcher did not set it (export sweep, 2026-12-04)
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in _heredoc(script, "launch-node.sh")


def test_kubernetes_jobset(tmp_path, capsys):
    plan = mixed_plan()
    path = str(tmp_path / "mixed.yaml")
    save_plan(plan, path)
    code, out, err = run_cli(["export", path, "--format", "kubernetes"], capsys)
    assert code == 0, err
    config_map, jobset = yaml.safe_load_all(out)
    assert plan_from_dict(yaml.safe_load(config_map["data"]["plan.yaml"])) == plan
    jobs = jobset["spec"]["replicatedJobs"]
    assert [j["template"]["spec"]["parallelism"] for j in jobs] == [1, 2]
    pods = [j["template"]["spec"]["template"]["spec"] for j in jobs]
    assert [p["nodeSelector"]["trainplan/gpu-type"] for p in pods] == ["A100-80GB-SXM",
                                                                       "V100-32GB-SXM2"]
    assert [p["containers"][0]["command"][-1] for p in pods] == ["0", "1"]
    env = {e["name"]: e["value"] for e in pods[1]["containers"][0]["env"]}
    args = _launcher_args(config_map["data"]["launch-node.sh"], tmp_path, offset=1, index=0,
                          env={**env, "SLURM_NODEID": "", "JOB_COMPLETION_INDEX": "0"})
    assert args[:3] == ["--nnodes=3", "--node-rank=1", "--nproc-per-node=8"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in config_map["data"]["launch-node.sh"]  # trainplan


def test_kubernetes_for_deepspeed_refuses_what_deepspeed_cannot_run(selene_plan, capsys):
    code, out, err = run_cli(["export", selene_plan, "--format", "kubernetes",
                              "--framework", "deepspeed"], capsys)
    assert code == 2 and out == "" and "interleaved" in err


def test_dry_run_of_a_gpu_plan_on_this_cpu_host(selene_plan, capsys):
    code, out, err = run_cli(["run", "--plan", selene_plan, "--dry-run"], capsys)
    assert code == 0, err
    lines = [x for x in out.splitlines() if x.startswith("torchrun ")]
    assert len(lines) == 128
    assert lines[3].startswith("torchrun --nnodes=128 --node-rank=3 --rdzv-backend=static "
                               '--master-addr="$MASTER_ADDR" --master-port=29500 '
                               "--nproc-per-node=8")


def test_dry_run_keeps_the_plan_checks(tmp_path, capsys):
    path = str(tmp_path / "cp.yaml")
    save_plan(gpt3_on_selene(cp=2, dp=4, gbs=1536, sharding=Sharding(optim=4)), path)
    code, _, err = run_cli(["run", "--plan", path, "--dry-run"], capsys)
    assert code == 2 and "context parallelism is not implemented" in err


def test_several_pipeline_schedules_per_step_are_not_exported_as_priced():
    """NeMo AutoModel's schedule per local batch (`training.pipeline_flushes`): the
    exporters run one schedule per step, so they list it, and --approximate runs one."""
    from dataclasses import replace

    from planner.export.approximate import nearest
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:4"),
                            ParallelConfig(pp=2, dp=2, mbs=1, gbs=16, seq_len=2048))
    flushed = replace(plan, training=replace(plan.training, pipeline_flushes=2))
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        assert not any("pipeline schedules" in line
                       for line in unsupported(plan, CAPABILITIES[fmt])), fmt
        assert any("2 pipeline schedules per step" in line
                   for line in unsupported(flushed, CAPABILITIES[fmt])), fmt
        near, changes = nearest(flushed, CAPABILITIES[fmt])
        assert near.training.pipeline_flushes == 1
        assert "2 pipeline schedules per step -> 1" in changes


def test_states_without_master_weights_are_not_exported_as_priced():
    """16-bit weights, gradients and Adam moments with no fp32 master copy (`training.
    master_weights` false): Megatron-Core, DeepSpeed, torchtitan and the executor keep an
    fp32 copy, so every exporter lists it and --approximate restores the master weights
    (more memory: the change is named)."""
    from dataclasses import replace

    from planner.export.approximate import nearest
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:4"),
                            ParallelConfig(dp=4, mbs=1, gbs=16, seq_len=2048, dtype="bf16"))
    pure = replace(plan, training=replace(plan.training, master_weights=False))
    for fmt in CAPABILITIES:
        assert not any("master" in line for line in unsupported(plan, CAPABILITIES[fmt])), fmt
        assert any("no fp32 master weights" in line
                   for line in unsupported(pure, CAPABILITIES[fmt])), fmt
        near, changes = nearest(pure, CAPABILITIES[fmt])
        assert near.training.master_weights
        assert any("fp32 master weights" in c for c in changes), changes


def test_ep_groups_are_exported_as_priced():
    """Which ranks an ep group is (`training.ep_layout`): Megatron-Core, DeepSpeed and
    torchtitan fold ep over tp / etp x cp x dp, trainplan's executor forms it of one tp rank
    in ep data-parallel replicas (executor/topology.py `ep_group`). Where the two differ
    (tp 2, etp 1) each lists the other's layout and --approximate switches to its own;
    at tp 1 they are the same groups and nobody lists either. A framework without expert
    parallelism (DeepSpeed's exporter) says that, once, and not how it would group it."""
    from dataclasses import replace

    from planner.export.approximate import nearest
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    model = preset("mixtral-8x7b")
    plans = {}
    for tp in (1, 2):
        plans[tp] = homogeneous_plan(model, parse_gpus_arg("H100-80GB-SXM:8"), ParallelConfig(
            tp=tp, dp=8 // tp, mbs=1, gbs=16, seq_len=2048, ep=2, etp=1 if tp > 1 else None))
    for fmt, caps in CAPABILITIES.items():
        own = "data_parallel" if fmt == "trainplan" else "folded"
        other = "folded" if own == "data_parallel" else "data_parallel"
        for tp, plan in plans.items():
            for layout in (own, other):
                p = replace(plan, training=replace(plan.training, ep_layout=layout))
                lines = unsupported(p, caps)
                listed = [line for line in lines if "ep groups" in line]
                if "ep" not in caps.parallelisms:
                    # DeepSpeed has expert parallelism, in model code: not "no ep"
                    assert not listed and [line.split(" (")[0] for line in lines
                                           if line.startswith("ep 2:")] == [
                        f"ep 2: {caps.version} has no expert parallelism in its config"], lines
                    continue
                assert bool(listed) == (tp > 1 and layout == other), (fmt, tp, layout, listed)
        p = replace(plans[2], training=replace(plans[2].training, ep_layout=other))
        near, changes = nearest(p, caps)
        assert near.training.ep_layout == own
        assert f"ep groups {other} -> {own}" in changes


def test_model_states_of_another_rule_are_not_exported_as_priced(tmp_path, capsys):
    """What a rank keeps of its model states (`training.model_states`): DeepSpeed 0.19.6
    keeps gradients in the training dtype (16 bytes per parameter unsharded), Megatron-Core,
    torchtitan's FSDP2 and the executor in fp32 (18). A plan priced with one rule is listed
    by the frameworks of the other (the layout is valid, the memory would not be what the
    plan priced: 2 bytes per parameter of each gradient), as the master-weights setting is,
    and --approximate switches to the framework's rule, naming the change. In fp32 (or
    without master weights) both rules keep the same bytes and nobody lists it."""
    from dataclasses import replace

    from planner.export.approximate import nearest
    from planner.specs.choices import ModelStates
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    def plan_in(dtype, rule, comm="megatron"):
        return homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:4"),
                                ParallelConfig(dp=4, mbs=1, gbs=16, seq_len=2048, dtype=dtype,
                                               sharding=Sharding(optim=4), model_states=rule,
                                               comm=Communication.preset(comm, dtype=dtype)))

    for fmt, caps in CAPABILITIES.items():
        for rule in ModelStates:
            for dtype in ("bf16", "fp32"):
                plan = plan_in(dtype, rule)
                listed = [line for line in unsupported(plan, caps) if "model states" in line]
                assert bool(listed) == (rule != caps.model_states and dtype == "bf16"), (
                    fmt, rule, dtype, listed)
            plan = plan_in("bf16", rule)
            pure = replace(plan, training=replace(plan.training, master_weights=False))
            assert not any("model states" in line for line in unsupported(pure, caps))
            near, changes = nearest(plan, caps)
            assert near.training.model_states == caps.model_states
            assert [c for c in changes if c.startswith("model states")] == (
                [] if rule == caps.model_states else [f"model states {rule} -> "
                                                      f"{caps.model_states} (gradients in "
                                                      f"{'fp32' if fmt != 'deepspeed' else 'the training dtype'})"])
    path = str(tmp_path / "ds.yaml")  # a DeepSpeed plan: its model states, its communication
    save_plan(plan_in("bf16", "deepspeed", comm="deepspeed"), path)
    code, out, err = run_cli(["export", path, "--format", "megatron"], capsys)
    assert code == 2 and out == ""
    assert ("model states kept with gradients in the training dtype (training.model_states "
            "deepspeed): megatron-core 0.16.1 (Megatron-LM core_r0.16.0) keeps fp32 gradients, "
            "more memory than the plan priced") in err
    code, out, err = run_cli(["export", path, "--format", "megatron", "--approximate"], capsys)
    assert code == 0 and "--use-distributed-optimizer" in out
    assert "approximated: model states deepspeed -> fp32_grads (gradients in fp32)" in err
    code, out, err = run_cli(["export", path, "--format", "deepspeed"], capsys)
    assert (code, err) == (0, "")


def test_a_geglu_model_is_refused_by_megatron_in_one_line(tmp_path, capsys):
    """grok-1 (GeGLU): Megatron-LM's arguments cannot gate with GELU, so `plan export` for
    Megatron (its arguments, or a Slurm script carrying them) exits 2 with one line naming
    the field, the value and what Megatron-LM has; --approximate cannot change the model.
    DeepSpeed, torchtitan and the executor take it (whatever else of this plan they lack:
    DeepSpeed has no ep)."""
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    path = str(tmp_path / "grok.yaml")
    save_plan(homogeneous_plan(preset("grok-1"), parse_gpus_arg("H100-80GB-SXM:16"),
                               ParallelConfig(dp=16, ep=8, mbs=1, gbs=64, seq_len=4096,
                                              sharding=Sharding(params=16, grads=16,
                                                                optim=16))), path)
    for argv in (["--format", "megatron"], ["--format", "slurm", "--framework", "megatron"],
                 ["--format", "megatron", "--approximate"]):
        code, out, err = run_cli(["export", path, *argv, "-o", str(tmp_path / "out")], capsys)
        assert code == 2 and out == "", argv
        lines = [x for x in err.splitlines() if "activation" in x]
        assert len(lines) == 1 and ("activation geglu: megatron-core 0.16.1 (Megatron-LM "
                                    "core_r0.16.0) has gelu, swiglu (") in lines[0], err
        assert not (tmp_path / "out").exists()
    # the executor's run of it: a plan priced with the executor's communication (it reduces
    # gradients after the backward), so that nothing but the activation is in question
    own = str(tmp_path / "grok-trainplan.yaml")
    save_plan(homogeneous_plan(preset("grok-1"), parse_gpus_arg("H100-80GB-SXM:16"),
                               ParallelConfig(dp=16, ep=8, mbs=1, gbs=64, seq_len=4096,
                                              sharding=Sharding(params=16, grads=16,
                                                                optim=16),
                                              comm=Communication.preset("trainplan",
                                                                        dtype="bf16"))), own)
    for plan_path, argv, want in ((path, ["--format", "deepspeed"], 2),
                                  (path, ["--format", "torchtitan"], 0),
                                  (own, ["--format", "slurm", "--framework", "trainplan"], 0)):
        code, _, err = run_cli(["export", plan_path, *argv], capsys)
        assert "activation" not in err and code == want, (argv, err)


def test_communication_of_another_framework_is_not_exported_as_priced(tmp_path, capsys):
    """How a plan was priced to communicate (`training.comm`) against how the framework
    does (`FrameworkCapabilities.comm`, `Communication.preset`). GPT-3 1.3B in bf16 on 8
    A100s, pp 2 x dp 4 with the optimizer sharded: a plan priced as one framework
    communicates exports as another only where the other's config can say so (Megatron-LM:
    --overlap-grad-reduce, --ddp-bucket-size; DeepSpeed: communication_data_type);
    otherwise `unsupported` lists the setting and --approximate takes the framework's. A
    plan on one GPU prices no communication, and nobody lists it."""
    from dataclasses import replace

    from planner.export.approximate import nearest
    from planner.export.frameworks import comm_differences
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.layout import ParallelConfig, homogeneous_plan

    def plan_in(comm, *, gpus=8, pp=2):
        return homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg(f"A100-80GB-SXM:{gpus}"),
                                ParallelConfig(pp=pp, dp=gpus // pp, mbs=1, gbs=16,
                                               seq_len=2048, sharding=Sharding(optim=gpus // pp),
                                               comm=Communication.preset(comm, dtype="bf16")))

    def listed(plan, caps):
        return sorted(key for key, _, _ in comm_differences(plan, caps))

    megatron, deepspeed = CAPABILITIES["megatron"], CAPABILITIES["deepspeed"]
    # batched vs blocking sends; overlapped vs after the backward; Megatron's 4e7-parameter
    # buckets vs 5e8; the reduction's dtype DeepSpeed's config writes
    assert listed(plan_in("megatron"), deepspeed) == [
        "grad_bucket_params", "overlap_grad_reduce", "pipeline_p2p"]
    # Megatron-LM writes the overlap and the buckets, not blocking sends or a bf16 reduction
    assert listed(plan_in("deepspeed"), megatron) == ["grad_reduce_dtype", "pipeline_p2p"]
    # the executor reduces after the backward; torchtitan's FSDP2 / DDP during it
    assert listed(plan_in("trainplan"), CAPABILITIES["torchtitan"]) == ["overlap_grad_reduce"]
    assert listed(plan_in("megatron"), CAPABILITIES["trainplan"]) == ["overlap_grad_reduce"]
    for fmt, caps in CAPABILITIES.items():
        assert listed(plan_in(caps.comm), caps) == [], fmt
        for comm in ("megatron", "deepspeed", "fsdp2", "trainplan"):
            assert listed(plan_in(comm, gpus=1, pp=1), caps) == [], (fmt, comm)
            near, changes = nearest(plan_in(comm), caps)
            assert listed(near, caps) == [] and not any(
                "training.comm." in line for line in unsupported(near, caps)), (fmt, comm)
            assert len([c for c in changes if c.startswith("comm.")]) == len(
                listed(plan_in(comm), caps))
    path = str(tmp_path / "megatron-comm.yaml")  # DeepSpeed's model states: comm alone differs
    save_plan(replace(plan_in("megatron"), training=replace(
        plan_in("megatron").training, model_states="deepspeed")), path)
    code, out, err = run_cli(["export", path, "--format", "deepspeed"], capsys)
    assert code == 2 and out == ""
    assert ("pipeline sends beside the compute (batched isend / irecv) (training.comm."
            "pipeline_p2p batched): deepspeed 0.19.6 runs blocking pipeline sends holding both "
            "stages' compute, which the plan was not priced with") in err
    code, out, err = run_cli(["export", path, "--format", "deepspeed", "--approximate"], capsys)
    assert code == 0
    for change in ("comm.pipeline_p2p batched -> blocking",
                   "comm.overlap_grad_reduce true -> false",
                   "comm.grad_bucket_params 4e+07 -> 5e+08"):
        assert f"plan export: approximated: {change}" in err
    # fp32 reduction, as priced: DeepSpeed's config says so
    assert '"communication_data_type": "fp32"' in out
    path = str(tmp_path / "megatron.yaml")
    save_plan(plan_in("megatron"), path)
    code, out, err = run_cli(["export", path, "--format", "megatron"], capsys)
    assert (code, err) == (0, "") and "--overlap-grad-reduce" in out


def test_no_plan_splits_a_sequence_unevenly_over_tp():
    """Megatron-Core scatters the sequence over the tp ranks under sequence parallelism
    and asserts an even split (tensor_parallel/mappings.py `_split_along_first_dim`), as
    torchtitan and the executor do: once a Megatron-only export refusal, now a rule of
    every plan (`rules.sp_problem`), so no exporter meets one."""
    from tests.planner.export.framework_helpers import plan_on

    with pytest.raises(SpecError, match=r"tp 8 must divide the tokens each context-parallel "
                                        r"rank holds, 2044"):
        plan_on("A100-80GB-SXM:8", tp=8, dp=1, gbs=8, seq_len=2044, sequence_parallel=True)
    even = plan_on("A100-80GB-SXM:8", tp=8, dp=1, gbs=8, seq_len=2048,
                   sequence_parallel=True)
    assert unsupported(even, CAPABILITIES["megatron"]) == []


def test_megatron_splits_the_key_value_heads_over_tp():
    """Megatron-Core divides the query groups by the tp size and asserts an even split
    (transformer/attention.py `num_query_groups_per_partition = divide(...)`): tp 4 over
    debug-tiny-llama's 2 KV heads is refused, and a search for Megatron-LM never picks it."""
    from planner.search import SearchRequest, search
    from planner.specs.cluster import parse_gpus_arg
    from planner.specs.plan import DType
    from tests.planner.export.framework_helpers import plan_on

    replicated = plan_on("A100-80GB-SXM:8", model="debug-tiny-llama", tp=4, dp=2, gbs=8,
                         seq_len=128)
    split = plan_on("A100-80GB-SXM:8", model="debug-tiny-llama", tp=2, dp=4, gbs=8,
                    seq_len=128)
    assert any("tp 4 over 2 key/value heads" in u
               for u in unsupported(replicated, CAPABILITIES["megatron"]))
    assert not any("key/value heads" in u for u in unsupported(split, CAPABILITIES["megatron"]))
    # nor does the executor copy K/V heads (executor/preflight.py: tp must divide them)
    assert any("tp 4 over 2 key/value heads" in u
               for u in unsupported(replicated, CAPABILITIES["trainplan"]))
    found = search(SearchRequest(model=preset("debug-tiny-llama"),
                                 cluster=parse_gpus_arg("A100-80GB-SXM:8"), gbs=8, seq_len=128,
                                 dtype=DType.BF16, framework="megatron", top=50))
    assert found.ranked and all(s.tp <= 2 for r in found.ranked
                                for p in r.plan.pipelines for s in p.stages)
