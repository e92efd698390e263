"""Start-up time of the `plan` command line: `plan --help` and a small `plan simulate
--json` each in under a second (best of three runs). Imports stay light (no torch, no
pandas) so the command starts fast.

    python benchmarks/startup_speed.py

Exits 1 over budget (the test suite holds no wall-clock bounds: a busy machine must not
fail a test).
"""

import subprocess
import sys
import time

BUDGET_S = 1.0
SIMULATE = ["simulate", "--model", "gpt3-175b", "--gpus", "A100-80GB-SXM:64", "--tp", "8",
            "--pp", "8", "--dp", "1", "--vp", "3", "--mbs", "1", "--gbs", "64", "--recompute",
            "full", "--json"]


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    plan = [sys.executable, "-m", "planner.cli"]
    ok = True
    for argv in (["--help"], SIMULATE):
        best = min(_timed(plan + argv) for _ in range(3))
        print(f"plan {' '.join(argv)}: best {best:.2f} s (budget {BUDGET_S:.1f} s)")
        ok &= best < BUDGET_S
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
