"""Every scored group's error under the catalog's parameters and under proposed ones.

    python -m planner.calibration.held_out --set hopper.gemm_efficiency=0.594 [...]

prints, per group, the rows, the mean signed and the mean absolute error before (the
catalog) and after (with the `--set` values): the published rows, the DGX Cloud recipes
by GPU, dtype and NeMo generation, Megatron-Bridge's B200 / GB200 rows by GPU,
vTrain's multi-node runs, LLM Foundry's FSDP runs by GPU
and dtype, the MoE rows by GPU and dtype, and Sailor's rows by cluster. A calibration proposal is judged on the groups it was not fitted to
(docs/calibration.md, "Hopper (H100)": the split).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

from planner.calibration import moe, sailor
from planner.calibration.fit import Parameter, with_values
from planner.calibration.published import (
    dgxc_framework,
    dgxc_rows,
    dgxc_summary,
    foundry_rows,
    foundry_summary,
    held_out_summary,
    mbridge_cases,
    mbridge_rows,
    published_cases,
    summarize,
    vtrain_multi_cases,
)
from planner.costs.stages import clear_cost_caches
from planner.predict.estimate import estimate
from planner.simulator import simulate
from profiler.devices import parameter_overrides

__all__ = ["group_errors", "main", "parse_setting"]

Errors = dict[str, dict[str, float]]  # group name -> case id -> signed relative error


def group_errors() -> Errors:
    """Each scorer's signed errors by group, under the parameters in force (every scorer's
    own method: the event simulation, the closed-form estimate for the MoE rows)."""
    groups: Errors = {"published rows": summarize(published_cases(), simulate).errors}

    def by_row(errors: dict[str, float], rows: list[dict[str, str]],
               key: Callable[[dict[str, str]], str]) -> None:
        for r in rows:
            groups.setdefault(key(r), {})[r["id"]] = errors[r["id"]]

    by_row(dgxc_summary(simulate)[0].errors, dgxc_rows(),
           lambda r: f"DGX Cloud {r['gpu']} {r['dtype']} {dgxc_framework(r)}")
    by_row(held_out_summary(mbridge_cases(), simulate)[0].errors, mbridge_rows(),
           lambda r: f"Megatron-Bridge {r['gpu']} {r['dtype']}")
    groups["vTrain multi-node A100"] = summarize(vtrain_multi_cases(), simulate,
                                                 require_fit=False).errors
    by_row(foundry_summary(simulate)[0].errors, foundry_rows(),
           lambda r: f"LLM Foundry {r['gpu']} {r['dtype']}")
    moe_errors = moe.score(estimate).errors
    for r in moe.scored_rows():
        if r["id"] in moe_errors:
            groups.setdefault(f"MoE {r['gpu']} {r['dtype']}", {})[r["id"]] = moe_errors[r["id"]]
    cases = sailor.sailor_cases()
    scored = sailor.score(cases, simulate).errors
    for c in cases:
        if c.id in scored:
            groups.setdefault(f"Sailor {c.group}", {})[c.id] = scored[c.id]
    return groups


def parse_setting(text: str) -> tuple[Parameter, float]:
    """`arch.field=value` (e.g. hopper.gemm_efficiency=0.594) as a parameter and its value."""
    name, _, value = text.partition("=")
    arch, _, field = name.partition(".")
    if not (arch and field and value):
        raise ValueError(f"--set {text!r}: expected ARCH.FIELD=VALUE")
    return Parameter(f"arch:{arch}", field, 0.0, 1.0), float(value)


def _line(name: str, before: dict[str, float], after: dict[str, float]) -> str:
    def mean(e: dict[str, float], f: Callable[[float], float]) -> float:
        return 100 * statistics.mean(f(v) for v in e.values())

    return (f"  {name:44s} {len(before):4d}  signed {mean(before, float):+6.1f} -> "
            f"{mean(after, float):+6.1f}%  |error| {mean(before, abs):5.1f} -> "
            f"{mean(after, abs):5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.calibration.held_out",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], metavar="ARCH.FIELD=VALUE")
    args = ap.parse_args(argv)
    settings = [parse_setting(s) for s in args.set]
    before = group_errors()
    arch, links = with_values([p for p, _ in settings], [v for _, v in settings])
    with parameter_overrides(arch=arch, links=links):
        clear_cost_caches()
        after = group_errors()
    clear_cost_caches()
    print("group: rows, mean signed error, mean |error|, the catalog -> with "
          + (", ".join(args.set) or "no change"))
    for name in sorted(before):
        print(_line(name, before[name], after[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
