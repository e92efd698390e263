"""Calibrate the analytic device model and the link model against published measurements.

    python -m planner.calibration.fit [--arch ampere] [--rows N] [--iterations N]

Only parameters with a physical meaning are fitted (profiler/data/efficiency.yaml for a
GPU architecture, profiler/data/links.yaml for a link kind): never a factor per row or
per source. The objective is the mean absolute relative error of the simulated iteration
time, each dataset weighted equally. The fitted values are printed in the data files'
format; copy them there and record the data in docs/calibration.md.

Which data constrains what: Ampere (A100) from vTrain's 1,440 single-node runs, the
published A100 rows (Korthikanti et al. 2022; Megatron-LM 2020) and Korthikanti et al.'s
per-layer times (Table 4); NVSwitch from the same;
InfiniBand from the multi-node rows; Volta from the Megatron-LM V100 rows; Hopper from
the Megatron-Core H100 rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.calibration.published import (
    Case,
    LayerCase,
    korthikanti_layer_cases,
    layer_errors,
    predict_s,
    published_cases,
    vtrain_cases,
)
from planner.costs.stages import clear_cost_caches
from planner.predict.estimate import estimate
from planner.simulator import simulate
from profiler.devices import (
    ArchEfficiency,
    LinkKind,
    arch_efficiency,
    link_kind,
    parameter_overrides,
)

__all__ = ["Parameter", "fit", "main", "minimize_bounded", "with_values"]


@dataclass(frozen=True)
class Parameter:
    """One fitted number: `target` is `arch:<name>` or `link:<name>`, `field` its field."""

    target: str
    field: str
    low: float
    high: float

    def current(self) -> float:
        kind, name = self.target.split(":")
        spec = arch_efficiency(name) if kind == "arch" else link_kind(name)
        return float(getattr(spec, self.field))


SPACES: dict[str, list[Parameter]] = {
    "ampere": [
        Parameter("arch:ampere", "gemm_efficiency", 0.5, 0.95),
        Parameter("arch:ampere", "small_tile_penalty", 0.0, 0.5),
        Parameter("arch:ampere", "gemm_k_half", 8, 512),
        Parameter("arch:ampere", "memory_efficiency", 0.5, 0.95),
        Parameter("arch:ampere", "kernel_overhead_us", 0.5, 20),
        Parameter("arch:ampere", "launch_overhead_us", 5, 120),
        Parameter("arch:ampere", "tp_comm_overlap", 0.0, 1.0),
        # NCCL's per-hop latencies are its own constants (profiler/data/nccl.yaml), not fitted
        Parameter("link:nvswitch", "bandwidth_efficiency", 0.4, 0.95),
    ],
    # 4 rows: the GEMM rate only; HBM2 streaming stays at its STREAM-measured ~0.9.
    "volta": [
        Parameter("arch:volta", "gemm_efficiency", 0.5, 0.95),
    ],
    # 3 rows only: two parameters; fused attention stays at its literature value.
    "hopper": [
        Parameter("arch:hopper", "gemm_efficiency", 0.4, 0.95),
        Parameter("arch:hopper", "tp_comm_overlap", 0.0, 1.0),
    ],
}


Dataset = list[Case] | list[LayerCase]


def _dataset(arch: str, rows: int) -> list[Dataset]:
    gpu_prefix = {"ampere": "A100", "volta": "V100", "hopper": "H100"}[arch]
    published = [c for c in published_cases() if c.plans and
                 c.plans[0].cluster.node_groups[0].gpu.startswith(gpu_prefix)]
    sets: list[Dataset] = [published]
    if arch == "ampere":
        vt = vtrain_cases()
        step = max(1, len(vt) // rows) if rows else 1
        sets.append(vt[::step])
        sets.append(korthikanti_layer_cases())
    return sets


def _set_error(cases: Dataset, method: Callable) -> float:
    """Mean |predicted / measured - 1| over a dataset (1.0 for a case that fails)."""
    if cases and isinstance(cases[0], LayerCase):
        layer_cases = [c for c in cases if isinstance(c, LayerCase)]
        return statistics.mean(abs(e) for e in layer_errors(layer_cases).values())
    errs = []
    for case in cases:
        assert isinstance(case, Case)
        predicted = predict_s(case, method)
        errs.append(1.0 if predicted is None else abs(predicted / case.measured_s - 1))
    return statistics.mean(errs)


def with_values(params: list[Parameter], values: list[float]) -> tuple[dict, dict]:
    """Arch and link parameter overrides with `values` put in (for parameter_overrides)."""
    arch: dict[str, ArchEfficiency] = {}
    links: dict[str, LinkKind] = {}
    for p, v in zip(params, values, strict=True):
        kind, name = p.target.split(":")
        change: dict[str, Any] = {p.field: v}  # a float field of the spec
        if kind == "arch":
            arch[name] = dataclasses.replace(arch.get(name) or arch_efficiency(name), **change)
        else:
            links[name] = dataclasses.replace(links.get(name) or link_kind(name), **change)
    return arch, links


def objective(params: list[Parameter], values: list[float], sets: list[Dataset],
              method: Callable = estimate) -> float:
    """Mean over datasets of each one's mean |predicted / measured - 1|."""
    arch, links = with_values(params, values)
    with parameter_overrides(arch=arch, links=links):
        clear_cost_caches()
        per_set = [_set_error(cases, method) for cases in sets]
    clear_cost_caches()
    return statistics.mean(per_set)


def _to_unit(p: Parameter, v: float) -> float:
    x = (min(max(v, p.low), p.high) - p.low) / (p.high - p.low)
    x = min(max(x, 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def _from_unit(p: Parameter, u: float) -> float:
    return p.low + (p.high - p.low) / (1 + math.exp(-u))


def minimize_bounded(params: list[Parameter], f: Callable[[list[float]], float], *,
                     iterations: int, start: list[float] | None = None
                     ) -> tuple[list[float], float]:
    """Nelder-Mead over `params` from `start` (default their current values), each kept
    inside its bounds by a logit transform; the best values and f there."""
    from scipy.optimize import minimize

    start = start if start is not None else [p.current() for p in params]

    def g(units: list[float]) -> float:
        return f([_from_unit(p, u) for p, u in zip(params, units, strict=True)])

    x0 = [_to_unit(p, v) for p, v in zip(params, start, strict=True)]
    simplex = [x0] + [[x + (0.5 if i == j else 0.0) for j, x in enumerate(x0)]
                      for i in range(len(x0))]
    result = minimize(g, x0, method="Nelder-Mead",
                      options={"maxfev": iterations, "xatol": 1e-3, "fatol": 1e-5,
                               "initial_simplex": simplex})
    return [_from_unit(p, u) for p, u in zip(params, result.x, strict=True)], float(result.fun)


def fit(arch: str, *, rows: int = 480, iterations: int = 400) -> tuple[list[Parameter], list[float], float, float]:
    """Fit the parameters of `arch` (Nelder-Mead in a bounded space); returns them with
    the objective before and after."""
    params = SPACES[arch]
    sets = _dataset(arch, rows)
    before = objective(params, [p.current() for p in params], sets)
    values, after = minimize_bounded(params, lambda v: objective(params, v, sets),
                                     iterations=iterations)
    return params, values, before, after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.calibration.fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(SPACES), default="ampere")
    ap.add_argument("--rows", type=int, default=480, help="vTrain rows used while fitting")
    ap.add_argument("--iterations", type=int, default=400)
    args = ap.parse_args(argv)
    params, values, before, after = fit(args.arch, rows=args.rows, iterations=args.iterations)
    print(f"objective (closed-form estimate): {before:.4f} -> {after:.4f}")
    for p, v in zip(params, values, strict=True):
        print(f"  {p.target:16s} {p.field:22s} {p.current():8.4g} -> {v:8.4g}")
    arch, links = with_values(params, values)
    sets = _dataset(args.arch, 0)
    with parameter_overrides(arch=arch, links=links):
        clear_cost_caches()
        print(f"full datasets, event simulation: {objective(params, values, sets, simulate):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
