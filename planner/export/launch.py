"""Launch files for a plan: a Slurm batch script and a Kubernetes JobSet manifest.

Both start one torchrun per node the plan uses, with a static rendezvous on the first
node and node ranks in the plan's node order (so global ranks are the plan's GPUs in
global order, as the executor and Megatron-style rank layouts expect), and run the
framework's command on the exported config. A plan on several node groups (GPU types)
gets one section per group: a Slurm heterogeneous-job component, a JobSet replicated
job. Every node runs the same small launcher (`launch-node.sh`), told the first node
rank of its group; its index inside the group comes from Slurm or the indexed Job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.export.formats import CONFIG_FILES
from planner.specs.plan import Plan, describe_layout

__all__ = ["MASTER_PORT", "NodeSlot", "framework_env", "kubernetes_manifest", "plan_nodes",
           "slurm_script"]

MASTER_PORT = 29500  # torchrun's default
EOF_MARK = "TRAINPLAN_EOF"


@dataclass(frozen=True)
class NodeSlot:
    node: int  # the cluster's node index
    node_rank: int  # torchrun's: the index among the plan's nodes
    num_ranks: int  # processes (GPUs) the plan puts on it
    group: int  # the cluster's node group


def plan_nodes(plan: Plan) -> list[NodeSlot]:
    """The nodes the plan uses, in order, with how many of their GPUs it uses."""
    slots = plan.cluster.slots
    counts: dict[int, int] = {}
    group_of: dict[int, int] = {}
    for d in (d for p in plan.pipelines for s in p.stages for d in s.devices):
        counts[slots[d].node] = counts.get(slots[d].node, 0) + 1
        group_of[slots[d].node] = slots[d].group
    return [NodeSlot(node, rank, counts[node], group_of[node])
            for rank, node in enumerate(sorted(counts))]


def _sections(nodes: list[NodeSlot]) -> list[list[NodeSlot]]:
    """Consecutive nodes of one node group: one job section each."""
    out: list[list[NodeSlot]] = []
    for n in nodes:
        if out and out[-1][0].group == n.group:
            out[-1].append(n)
        else:
            out.append([n])
    return out


def framework_command(framework: str, config_text: str) -> str:
    """What follows torchrun's own arguments, as shell text ($CONFIG_DIR holds the
    config file; user-set variables fill in what a plan does not say)."""
    if framework == "trainplan":
        return ('-m executor.worker --plan "$CONFIG_DIR/plan.yaml" --steps "${STEPS:-10}" '
                '--run-dir "$RUN_DIR"')
    if framework == "megatron":  # data, tokenizer and optimizer arguments are the user's
        return ('"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}/pretrain_gpt.py" '
                "\\\n    " + config_text.rstrip("\n") + " \\\n    ${MEGATRON_EXTRA_ARGS:-}")
    if framework == "deepspeed":
        return ('"${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your DeepSpeed training script}" '
                '--deepspeed --deepspeed_config "$CONFIG_DIR/ds_config.json" ${TRAIN_ARGS:-}')
    if framework == "torchtitan":
        return '-m torchtitan.train --job.config_file "$CONFIG_DIR/config.toml"'
    raise ValueError(f"framework {framework!r}")


def framework_env(plan: Plan, framework: str) -> dict[str, str]:
    """Environment the framework needs for this plan: Megatron-LM asserts
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor or context parallelism (arguments.py
    validate_args: "Using tensor model parallelism or context parallelism require setting
    the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1", before Blackwell; one
    connection keeps each tp collective queued behind the GEMM it follows)."""
    if framework != "megatron":
        return {}
    tp_cp = max(s.tp * s.cp for p in plan.pipelines for s in p.stages)
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if tp_cp > 1 else {}


def launcher(nodes: list[NodeSlot], command: str, env: dict[str, str] | None = None) -> str:
    """One node's torchrun; argument 1 is the first node rank of the node's group; `env`
    exported first (`framework_env`)."""
    nprocs = " ".join(str(n.num_ranks) for n in nodes)
    return "\n".join([
        "#!/bin/bash",
        "# One node's torchrun (written by `plan export`). $1: the first node rank of this",
        "# node's group; the node's index in its group comes from Slurm (SLURM_NODEID of",
        "# the job step) or the indexed Job (JOB_COMPLETION_INDEX).",
        "set -euo pipefail",
        *(f"export {k}={v}" for k, v in (env or {}).items()),
        'index=${SLURM_NODEID:-${JOB_COMPLETION_INDEX:?neither Slurm nor an indexed Job}}',
        "node_rank=$(( $1 + index ))",
        f"nprocs=({nprocs})  # ranks per node, by node rank",
        f'exec torchrun --nnodes={len(nodes)} --node-rank="$node_rank" '
        '--nproc-per-node="${nprocs[$node_rank]}" \\',
        '    --rdzv-backend=static --master-addr="$MASTER_ADDR" '
        '--master-port="$MASTER_PORT" --max-restarts=0 \\',
        f"    {command}",
        "",
    ])


def _heredoc(path: str, text: str) -> list[str]:
    assert EOF_MARK not in text, "the config may not contain the heredoc marker"
    return [f"cat > {path} <<'{EOF_MARK}'", text.rstrip("\n"), EOF_MARK]


def slurm_script(plan: Plan, *, framework: str, config_text: str, version: str) -> str:
    """An sbatch script: one heterogeneous-job component per node group of the plan."""
    nodes = plan_nodes(plan)
    sections = _sections(nodes)
    groups = plan.cluster.node_groups
    lines = ["#!/bin/bash",
             f"# {plan.model.name} on {plan.cluster.name}: {describe_layout(plan)}",
             f"# framework: {version}; written by `plan export --format slurm`",
             f"#SBATCH --job-name={_name(plan)}"]
    for k, sec in enumerate(sections):
        g = groups[sec[0].group]
        if k:
            lines.append("#SBATCH hetjob")
        lines += [f"#SBATCH --nodes={len(sec)}", "#SBATCH --ntasks-per-node=1",
                  *([f"#SBATCH --gpus-per-node={g.gpus_per_node}"]
                    if g.device.vendor != "cpu" else []),
                  "#SBATCH --exclusive",
                  f"##SBATCH --constraint={g.gpu}  # {g.name}: name these nodes as your "
                  "cluster does (partition or feature)"]
    first = "${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}"
    lines += ["set -euo pipefail",
              'RUN_DIR=${RUN_DIR:-$PWD/trainplan-run-$SLURM_JOB_ID}',
              'CONFIG_DIR=$RUN_DIR/config', 'mkdir -p "$CONFIG_DIR"',
              f'MASTER_ADDR=$(scontrol show hostnames "{first}" | head -n 1)',
              f"MASTER_PORT={MASTER_PORT}", "export RUN_DIR CONFIG_DIR MASTER_ADDR MASTER_PORT"]
    if framework != "megatron":  # Megatron's arguments are in the launcher itself
        lines += _heredoc(f'"$CONFIG_DIR/{CONFIG_FILES[framework]}"', config_text)
    lines += _heredoc('"$CONFIG_DIR/launch-node.sh"',
                      launcher(nodes, framework_command(framework, config_text),
                               framework_env(plan, framework)))
    lines.append("pids=()")
    for k, sec in enumerate(sections):
        het = f"--het-group={k} " if len(sections) > 1 else ""
        lines.append(f'srun {het}--nodes={len(sec)} --ntasks-per-node=1 '
                     f'bash "$CONFIG_DIR/launch-node.sh" {sec[0].node_rank} & pids+=($!)')
    # the job fails when a group does (a bare `wait` returns 0), and a failed group stops
    # the others, which would otherwise wait for it at their next collective. `wait -n`
    # answers 127 once bash has no unreported group left, which groups that end together
    # can make happen early; `wait PID` then gives each group's own status
    lines += ["status=0",
              'for _ in "${pids[@]}"; do',
              "    rc=0; wait -n || rc=$?",
              '    [ "$rc" -eq 127 ] && break',
              '    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then',
              '        status=$rc; kill "${pids[@]}" 2>/dev/null || true',
              "    fi",
              "done",
              'for pid in "${pids[@]}"; do',
              '    rc=0; wait "$pid" || rc=$?',
              '    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi',
              "done",
              'exit "$status"', ""]
    return "\n".join(lines)


def _name(plan: Plan) -> str:
    """A DNS-1123 label naming the job."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"trainplan-{plan.model.name}".lower()).strip("-")
    return slug[:40].rstrip("-")


def kubernetes_manifest(plan: Plan, *, framework: str, config_text: str,
                        version: str) -> list[dict]:
    """A ConfigMap (config and launcher) and a JobSet with one replicated job per node
    group of the plan: indexed Jobs, one pod per node, static rendezvous on the first."""
    nodes = plan_nodes(plan)
    name = _name(plan)
    data = {"launch-node.sh": launcher(nodes, framework_command(framework, config_text),
                                       framework_env(plan, framework))}
    if framework != "megatron":
        data[CONFIG_FILES[framework]] = config_text
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"{name}-config",
                               "annotations": {"trainplan/plan": describe_layout(plan),
                                               "trainplan/framework": version}},
                  "data": data}
    jobs = [_replicated_job(plan, sec, k, name=name)
            for k, sec in enumerate(_sections(nodes))]
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": name},
              "spec": {"network": {"enableDNSHostnames": True},
                       "failurePolicy": {"maxRestarts": 0},
                       "replicatedJobs": jobs}}
    return [config_map, jobset]


def _replicated_job(plan: Plan, sec: list[NodeSlot], k: int, *, name: str) -> dict:
    g = plan.cluster.node_groups[sec[0].group]
    env = {"MASTER_ADDR": f"{name}-group-0-0-0.{name}",  # JobSet's pod host name
           "MASTER_PORT": str(MASTER_PORT), "CONFIG_DIR": "/config", "RUN_DIR": "/run"}
    container: dict[str, object] = {
        "name": "trainer",
        "image": "REPLACE-WITH-YOUR-TRAINING-IMAGE",
        "command": ["bash", "/config/launch-node.sh", str(sec[0].node_rank)],
        "env": [{"name": k_, "value": v} for k_, v in env.items()],
        "volumeMounts": [{"name": "config", "mountPath": "/config"},
                         {"name": "run", "mountPath": "/run"},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if g.device.vendor != "cpu":
        container["resources"] = {"limits": {"nvidia.com/gpu": g.gpus_per_node}}
    pod = {"restartPolicy": "Never",
           # label the nodes of this group so (or use your cluster's GPU product label)
           "nodeSelector": {"trainplan/gpu-type": g.gpu},
           "containers": [container],
           "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}},
                       {"name": "run", "emptyDir": {}},
                       {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    return {"name": f"group-{k}", "replicas": 1,
            "template": {"metadata": {"annotations": {"trainplan/node-group": g.name}},
                         "spec": {"parallelism": len(sec), "completions": len(sec),
                                  "completionMode": "Indexed", "backoffLimit": 0,
                                  "template": {"spec": pod}}}}
