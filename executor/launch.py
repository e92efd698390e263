"""Starting a plan's ranks with torchrun: here for a one-node plan, as printed command
lines for every node of a multi-node one.

torchrun numbers ranks node by node; the executor's ranks are the plan's GPUs in global
order (executor/topology.py), which is the same order, so node i of the plan runs
torchrun with `--node-rank i` and as many processes as the plan puts on it. Failure
handling: `--max-restarts 0`, torchrun stops the other local ranks when one dies, the
ranks' watchdogs (executor/watchdog.py) say which one it was and stop the ranks on other
nodes. Imports no torch: the launcher only builds and runs command lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass

from planner.export.launch import MASTER_PORT, plan_nodes
from planner.specs.plan import Plan

__all__ = ["MASTER_PORT", "NodeLaunch", "die_with_parent", "first_failure", "node_launches",
           "run_local",
           "stop_torchrun"]

WORKER = ["-m", "executor.worker"]


@dataclass(frozen=True)
class NodeLaunch:
    node: int  # the cluster's node index
    node_rank: int  # torchrun's: the index among the plan's nodes
    num_ranks: int
    argv: tuple[str, ...]  # after `torchrun`

    def command_line(self) -> str:
        """The command for a shell on that node ($MASTER_ADDR and $RUN_DIR left to the
        shell)."""
        return shlex.join(["torchrun", *self.argv]).replace(
            "'--master-addr=$MASTER_ADDR'", '--master-addr="$MASTER_ADDR"').replace(
            "'$RUN_DIR'", '"$RUN_DIR"')


def node_launches(plan: Plan, worker_argv: list[str]) -> list[NodeLaunch]:
    """One torchrun command per node the plan uses (all on one node: standalone); the
    nodes and their ranks as the launch files (planner/export/launch.py) number them."""
    nodes = plan_nodes(plan)
    out = []
    for n in nodes:
        if len(nodes) == 1:
            rdzv = ["--standalone", "--nnodes=1"]
        else:
            rdzv = [f"--nnodes={len(nodes)}", f"--node-rank={n.node_rank}",
                    "--rdzv-backend=static", "--master-addr=$MASTER_ADDR",
                    f"--master-port={MASTER_PORT}"]
        argv = (*rdzv, f"--nproc-per-node={n.num_ranks}", "--max-restarts=0", *WORKER,
                *worker_argv)
        out.append(NodeLaunch(n.node, n.node_rank, n.num_ranks, tuple(argv)))
    return out


STOP_GRACE_S = 45.0  # torchrun gives its ranks 30 s after SIGTERM before it kills them
# in the run folder when `plan run` itself stops the ranks (Ctrl-C, SIGTERM): their
# watchdogs then end without a line each (`plan run` says the one line)
STOP_REQUESTED = "stop-requested"


def run_local(launch: NodeLaunch, *, cpu: bool, run_dir: str | None = None) -> int:
    """Run one node's torchrun here (the same torch as this Python); its exit code.
    `run_dir`: the ranks' folder, where a stop this process asks for is marked."""
    env = dict(os.environ)
    if cpu:
        env["OMP_NUM_THREADS"] = "1"  # one core per rank (the workers pin torch too)
    env.setdefault("LOGLEVEL", "ERROR")  # torchrun's warnings (e.g. stopping on SIGTERM)
    cmd = [sys.executable, "-m", "executor.torchrun", *launch.argv]
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
    try:
        return proc.wait()
    except BaseException:  # Ctrl-C or SIGTERM (planner/cli.py): no rank may outlive us
        if run_dir is not None:
            with contextlib.suppress(OSError):
                open(os.path.join(run_dir, STOP_REQUESTED), "w").close()
        stop_torchrun(proc)
        raise


def die_with_parent() -> None:
    """In a child before it runs: SIGTERM when its parent dies (Linux PR_SET_PDEATHSIG),
    so that torchrun stops its ranks even when `plan run` is killed (SIGKILL leaves it no
    chance to: torchrun and the ranks trained on, orphaned)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_torchrun(proc: subprocess.Popen, *, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to torchrun, which stops its ranks (each in a session of its own, so only
    torchrun can reach them) and exits; SIGKILL if it has not within `grace_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def first_failure(run_dir: str) -> str | None:
    """What went wrong, from the ranks' stop notes (executor/watchdog.py): the first
    note's cause, and how many ranks stopped."""
    notes = []
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        if name.startswith("stop-rank") and name.endswith(".json"):
            with open(os.path.join(run_dir, name), encoding="utf-8") as fh:
                try:
                    notes.append(json.load(fh))
                except json.JSONDecodeError:
                    continue  # cut short: its writer was killed while writing
    if not notes:
        return None
    first = min(notes, key=lambda n: n["time"])
    return f"{first['cause']} ({len(notes)} rank(s) reported it)"
