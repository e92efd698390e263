"""Interactive speed: wall time of three commands a user waits for, on this tree and on a
checkout of earlier code, run alternately in one session so both see the same load.

    git worktree add --detach /tmp/before main      # the code to compare against
    python benchmarks/interactive_speed.py --before /tmp/before [--rounds 3]

Cases (issue 19): the example what-if report (8 scenarios, `make report`) within 15 s;
Llama-3-405B on 16,384 H100 within 5 s; llama2-70b on a 1,024-GPU cluster of three types
(H100 and A100 on InfiniBand islands, L40S on RoCE, benchmarks/hetero_speed.py) within
5 s. Each run is a fresh `plan` process (imports included). Prints one line per run and a
table of medians (before, after, before / after); exits 1 when a median is over budget.
Both trees run with Python's bytecode cache on, as an installed package does (an untimed
warm-up run per tree compiles them).
Without --before it times this tree alone.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

THREE_TYPES = """name: mixed-1024
node_groups:
  - {name: h100, gpu: H100-80GB-SXM, num_nodes: 32, island: ib-h100, price_per_gpu_hour_usd: 3.0}
  - {name: a100, gpu: A100-80GB-SXM, num_nodes: 64, island: ib-a100, price_per_gpu_hour_usd: 1.8}
  - {name: l40s, gpu: L40S-48GB, num_nodes: 32, nic: roce, island: roce-l40s,
     price_per_gpu_hour_usd: 1.0}
island_links:
  - {islands: [ib-h100, ib-a100], bandwidth_gbit_per_s: 400}
  - {islands: [ib-h100, roce-l40s], bandwidth_gbit_per_s: 400}
  - {islands: [ib-a100, roce-l40s], bandwidth_gbit_per_s: 400}
"""

SCENARIOS = [
    "add 8 H100 nodes: add H100-80GB-SXM 64; price H100-80GB-SXM 3.0",
    "retire the V100s: remove V100-32GB-SXM2 128",
    "V100s swapped for A100s: swap V100-32GB-SXM2 A100-80GB-SXM",
    "V100 nodes at 2x NIC bandwidth: scale-nic V100-32GB-SXM2 2",
    "V100 price halved: price V100-32GB-SXM2 0.4",
    "Llama 2 70B instead: model llama2-70b",
    "Llama 3 405B on the V100s alone: model llama3-405b; remove A100-80GB-SXM 128",
]


def cases(scratch: str) -> list[tuple[str, list[str], float]]:
    """(name, `plan` arguments, budget in seconds)."""
    three = os.path.join(scratch, "three-types-1024.yaml")
    with open(three, "w", encoding="utf-8") as fh:
        fh.write(THREE_TYPES)
    whatif = ["what-if", "--model", "llama2-13b", "--cluster",
              os.path.join(HERE, "cluster_specs/mixed-a100-v100.yaml"), "--tokens", "1e12",
              "--gbs", "256", "--seq", "4096", "--dtype", "fp16"]
    for text in SCENARIOS:
        whatif += ["--scenario", text]
    return [
        ("what-if report, 8 scenarios", [*whatif, "-o", os.path.join(scratch, "report")], 15.0),
        ("llama3-405b on 16,384 H100", ["search", "--model", "llama3-405b", "--gpus",
                                        "H100-80GB-SXM:16384", "--gbs", "2048", "--seq",
                                        "8192", "--json"], 5.0),
        ("llama2-70b on 1,024 GPUs of 3 types", ["search", "--model", "llama2-70b",
                                                 "--cluster", three, "--gbs", "512",
                                                 "--seq", "4096", "--top", "3", "--json"], 5.0),
    ]


def run_once(tree: str, args: list[str]) -> float:
    """Wall seconds of `plan ARGS` with the code of `tree`."""
    # as an installed package runs: Python keeps its compiled modules (a sandbox's
    # PYTHONDONTWRITEBYTECODE would have every run compile the planner again, ~0.2 s)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=tree, TRAINPLAN_PROGRESS="never")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=tree, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"plan {' '.join(args[:3])} ... failed in {tree}:\n{done.stderr}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", metavar="DIR", help="a checkout of the code to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--case", type=int, action="append", help="only these cases (0, 1, 2)")
    args = ap.parse_args()
    trees = {"after": HERE} if not args.before else {"before": os.path.abspath(args.before),
                                                     "after": HERE}
    over = False
    with tempfile.TemporaryDirectory() as scratch:
        chosen = [c for i, c in enumerate(cases(scratch)) if not args.case or i in args.case]
        times: dict[tuple[str, str], list[float]] = {}
        for tree in trees.values():  # compile each tree's modules once, untimed
            subprocess.run([sys.executable, "-c", "import planner.cli, planner.whatif.report"],
                           cwd=tree, check=True, env={
                               k: v for k, v in os.environ.items()
                               if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": tree})
        for r in range(args.rounds):
            for name, plan_args, _ in chosen:
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for label in order:  # alternate which goes first
                    t = run_once(trees[label], plan_args)
                    times.setdefault((name, label), []).append(t)
                    print(f"round {r + 1}: {name}: {label} {t:.1f} s", flush=True)
        print(f"\n{'case':38} {'before s':>9} {'after s':>8} {'ratio':>6} {'budget s':>9}")
        for name, _, budget in chosen:
            after = statistics.median(times[(name, "after")])
            before = (statistics.median(times[(name, "before")])
                      if (name, "before") in times else None)
            ratio = f"{before / after:5.1f}x" if before else "-"
            print(f"{name:38} {'-' if before is None else f'{before:.1f}':>9} {after:8.1f} "
                  f"{ratio:>6} {budget:9.0f}")
            over = over or after > budget
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
