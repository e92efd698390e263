"""`plan profile fit`: calibrate the analytic device model of a GPU type from a profile.

The analytic model (profiler/analytic.py) prices each profiled op from its shape, FLOPs
and bytes; the fit moves the architecture's physical parameters (GEMM efficiency and its
inner-dimension half point, fused-attention efficiency, achievable DRAM fraction, GPU
time per kernel) to minimise the mean |log(predicted / measured)|, each op kind weighted
equally so that dozens of GEMMs do not drown three norms. Same bounded Nelder-Mead as the
published-data calibration (planner/calibration/fit.py). Host launch overhead is not fitted:
an op measured alone does not show it (it is the per-kernel cost of a whole framework's
step; see docs/calibration.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.calibration.fit import Parameter, minimize_bounded, with_values
from planner.costs.compute import ComputeCosts, clear_op_cache
from planner.costs.workload import Op
from planner.outputs import check_distinct, check_output_file, write_text
from planner.profiling.cases import op_dtype
from profiler.devices import device, parameter_overrides
from profiler.progress import ProgressBar
from profiler.schema import dump, fail
from profiler.store import Profile, ProfileRow, load_profile

__all__ = ["FitResult", "fit_profile", "run_fit"]

# (field, low, high): bounds of each fitted parameter of ArchEfficiency.
_FIELDS = (("gemm_efficiency", 0.05, 1.0), ("gemm_k_half", 0.0, 1024.0),
           ("attention_efficiency", 0.02, 1.0), ("memory_efficiency", 0.05, 1.0),
           ("kernel_overhead_us", 0.0, 100.0))
# Which parameters each op kind informs: fit only what the profile measured.
_INFORMS = {"gemm": ("gemm_efficiency", "gemm_k_half"), "attention": ("attention_efficiency",),
            "elementwise": ("memory_efficiency", "kernel_overhead_us"),
            "embedding": ("memory_efficiency",), "optimizer": ("memory_efficiency",)}


@dataclass(frozen=True)
class FitResult:
    arch: str
    params: tuple[Parameter, ...]
    before: tuple[float, ...]
    after: tuple[float, ...]
    error_before: float  # mean |log(predicted / measured)|, kinds weighted equally
    error_after: float
    at_bounds: tuple[str, ...]  # fields that ended at a bound (the model cannot fit better)


def _op(row: ProfileRow) -> Op:
    assert row.kind != "collective" and row.kind != "host", "op rows only"
    return Op(row.name, row.kind, row.flops, row.bytes, row.shape, row.kernels,
              variant=row.variant)


def _error(profile: Profile, rows_by_kind: dict[str, list[ProfileRow]]) -> float:
    m = profile.meta

    def analytic_s(r: ProfileRow) -> float:  # an fp8 profile's ops ran in fp8 or bf16
        return ComputeCosts(device(m.device), op_dtype(m.dtype, r.name)).time_s(_op(r))

    per_kind = [statistics.mean(abs(math.log(analytic_s(r) / r.time_s)) for r in rows)
                for rows in rows_by_kind.values()]
    return statistics.mean(per_kind)


def fit_profile(profile: Profile, *, iterations: int = 400,
                progress: Callable[[], None] | None = None) -> FitResult:
    """Fit the profile's architecture parameters to its op rows (`progress()` after each
    evaluation of the error, at most `iterations` of them)."""
    arch = device(profile.meta.device).arch
    rows_by_kind: dict[str, list[ProfileRow]] = {}
    for r in profile.op_rows:
        rows_by_kind.setdefault(r.kind, []).append(r)
    informed = {f for kind in rows_by_kind for f in _INFORMS.get(kind, ())}
    params = [Parameter(f"arch:{arch}", f, lo, hi) for f, lo, hi in _FIELDS if f in informed]
    if not params:
        fail(profile.path, f"{len(profile.rows)} collective rows",
             "fitting needs op rows (plan profile --model ...)")

    def objective(values: list[float]) -> float:
        arch_over, _ = with_values(params, values)
        with parameter_overrides(arch=arch_over):
            clear_op_cache()
            err = _error(profile, rows_by_kind)
        clear_op_cache()
        if progress is not None:
            progress()
        return err

    before = [p.current() for p in params]
    values, after = minimize_bounded(params, objective, iterations=iterations)
    at_bounds = tuple(p.field for p, v in zip(params, values, strict=True)
                      if min(v - p.low, p.high - v) < 1e-3 * (p.high - p.low))
    return FitResult(arch=arch, params=tuple(params), before=tuple(before), after=tuple(values),
                     error_before=objective(before), error_after=after, at_bounds=at_bounds)


def run_fit(path: str, *, iterations: int, output: str | None = None) -> int:
    """Print the fitted values; with `output`, write the profiled GPU type with them as
    its own analytic-model parameters to a catalog file (`--catalog` reads it)."""
    check_output_file(output, flag="-o", suffixes=(".yaml", ".yml"))  # before the fit
    check_distinct({"FILE": path, "-o": output})
    profile = load_profile(path)
    with ProgressBar(iterations, title="fitting", unit="evaluations") as bar:
        result = fit_profile(profile, iterations=iterations, progress=bar.advance)
    m = profile.meta
    print(f"{path}: {m.device} ({m.device_detail}), {m.dtype}: {len(profile.op_rows)} op rows")
    print(f"mean |log(analytic / measured)|: {result.error_before:.3f} -> "
          f"{result.error_after:.3f} (about {math.expm1(result.error_before):.0%} -> "
          f"{math.expm1(result.error_after):.0%} off per op)")
    for p, old, new in zip(result.params, result.before, result.after, strict=True):
        bound = "  (at its bound)" if p.field in result.at_bounds else ""
        print(f"  {result.arch}.{p.field:22} {old:9.4g} -> {new:9.4g}{bound}")
    if m.dtype in ("tf32", "fp8"):
        print(f"note: fitted to {m.dtype} ops; the analytic model has one GEMM efficiency per "
              "architecture for every dtype (fit a bf16 profile for a catalog entry)")
    if output is None:
        print(f"write them to a catalog file with -o FILE (then --catalog FILE), or copy into "
              f"profiler/data/efficiency.yaml under `{result.arch}` and record the profile in "
              "docs/calibration.md")
        return 0
    import yaml

    dev = device(m.device)
    arch, _ = with_values(list(result.params), list(result.after))
    fitted = replace(dev, efficiency=arch[result.arch],
                     source=f"{dev.source}; analytic model fitted to {path} "
                     f"({m.device_detail}, {m.dtype}, {m.created})")
    entry = {k: v for k, v in dump(fitted).items() if k != "name"}
    write_text(output, "# trainplan catalog file: use with --catalog\n"
               + yaml.safe_dump({dev.name: entry}, sort_keys=False))
    print(f"wrote {output}: {dev.name} with the fitted parameters (use --catalog {output})")
    return 0
