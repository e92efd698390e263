"""The analytic GEMM model against measured kernel throughput on Hopper and Blackwell
(held out).

planner/data/reference/xla_matmul_sm90.csv and xla_matmul_sm100.csv are OpenXLA's default
matmul performance tables (`kDefaultMatmulPTable`, matmul_interpolator_data.h; collected by
xla/tools/matmul_perf_table_gen: every b in {1, 2, 4} and m, n, k in {256, ..., 4096}, each
dot compiled by XLA with its autotuned backend and timed on the GPU): 375 shapes each, in
bf16 and in f32 (whose throughput, up to 401 TFLOP/s on sm_90, six times the 67 TFLOP/s of
the CUDA cores, says XLA ran them on the tensor cores in TF32), and on sm_100 in FP8 (e4m3
x e4m3 -> bf16). Each shape's measured time is set beside `profiler.analytic.gemm_time_s`
on the catalog's H100-80GB-SXM (sm_90: the measured bf16 rate, up to 793 TFLOP/s, is above
the 756 of the PCIe part) and B200-180GB (sm_100). Nothing was fitted to the tables
(docs/calibration.md, "GEMM kernels on Hopper"; sources in planner/data/reference/README.md).

    python -m planner.calibration.gemm_kernels [--arch sm_90|sm_100] [--device NAME] [-v]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from dataclasses import dataclass

from profiler.analytic import gemm_time_s
from profiler.devices import DeviceSpec, device

__all__ = ["BANDS_US", "TABLES", "KernelCase", "bands", "kernel_cases", "main", "rank_correlation"]

_REFERENCE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "reference")
# each table and the catalog GPU it is priced on
TABLES = {"sm_90": (os.path.join(_REFERENCE, "xla_matmul_sm90.csv"), "H100-80GB-SXM"),
          "sm_100": (os.path.join(_REFERENCE, "xla_matmul_sm100.csv"), "B200-180GB")}
TABLE = TABLES["sm_90"][0]
# the table's dtype -> the precision its kernels ran in (f32 dots: TF32 tensor cores)
MATH = {"bf16": "bf16", "f32": "tf32", "fp8": "fp8"}
ELEM_BYTES = {"bf16": 2, "f32": 4, "fp8": 1}
# bands of measured kernel time, microseconds (upper bounds)
BANDS_US = (10.0, 30.0, 100.0, 300.0, float("inf"))


@dataclass(frozen=True)
class KernelCase:
    b: int
    m: int
    n: int
    k: int
    dtype: str  # the table's: bf16, f32 or fp8
    measured_s: float
    predicted_s: float
    peak_flops: float  # the catalog's peak of the precision it ran in

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.n * self.k

    @property
    def measured_fraction(self) -> float:
        """The measured FLOP/s as a fraction of the datasheet peak."""
        return self.flops / self.measured_s / self.peak_flops

    @property
    def predicted_fraction(self) -> float:
        return self.flops / self.predicted_s / self.peak_flops

    @property
    def ratio(self) -> float:
        """Predicted over measured time (below 1: the model is too fast)."""
        return self.predicted_s / self.measured_s


def kernel_cases(dev: DeviceSpec | None = None, path: str = TABLE) -> list[KernelCase]:
    """Every row of the table, measured and as the analytic model prices it on `dev`
    (default: the sm_90 table's GPU, `TABLES`)."""
    dev = dev or device(TABLES["sm_90"][1])
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            b, m, n, k = (int(r[x]) for x in "bmnk")
            math_dtype = MATH[r["dtype"]]
            predicted = gemm_time_s(b, m, n, k, device=dev, dtype=math_dtype,
                                    elem_bytes=ELEM_BYTES[r["dtype"]])
            out.append(KernelCase(b, m, n, k, r["dtype"],
                                  measured_s=2.0 * b * m * n * k / float(r["flops_per_s"]),
                                  predicted_s=predicted,
                                  peak_flops=dev.peak_flops(math_dtype)))
    return out


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2.0
        i = j + 1
    return ranks


def rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (Pearson's on the ranks, ties at their mean rank)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy)


def bands(cases: list[KernelCase]) -> list[tuple[str, list[KernelCase]]]:
    """The cases by band of measured kernel time."""
    out, low = [], 0.0
    for high in BANDS_US:
        inside = [c for c in cases if low <= c.measured_s * 1e6 < high]
        name = f"{low:.0f}-{high:.0f} us" if high != float("inf") else f">= {low:.0f} us"
        out.append((name, inside))
        low = high
    return out


def _report(cases: list[KernelCase], verbose: bool) -> None:
    for dtype in sorted({c.dtype for c in cases}):
        of = [c for c in cases if c.dtype == dtype]
        rho = rank_correlation([c.measured_fraction for c in of],
                               [c.predicted_fraction for c in of])
        print(f"{dtype} ({MATH[dtype]}): {len(of)} shapes; rank correlation of the fraction "
              f"of peak, model against measured: {rho:.2f}")
        print("  measured time   shapes  measured fraction  model fraction  model / measured "
              "time (median, range)")
        for name, inside in bands(of):
            if not inside:
                continue
            ratios = [c.ratio for c in inside]
            print(f"  {name:>13}  {len(inside):>6}  "
                  f"{statistics.median(c.measured_fraction for c in inside):>17.3f}  "
                  f"{statistics.median(c.predicted_fraction for c in inside):>14.3f}  "
                  f"{statistics.median(ratios):>6.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")
        if verbose:
            for c in sorted(of, key=lambda c: c.flops):
                print(f"    b{c.b} m{c.m} n{c.n} k{c.k}: measured {c.measured_s * 1e6:8.1f} us "
                      f"({c.measured_fraction:.3f}), model {c.predicted_s * 1e6:8.1f} us "
                      f"({c.predicted_fraction:.3f})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=tuple(TABLES), default="sm_90",
                    help="the table: sm_90 (Hopper) or sm_100 (Blackwell)")
    ap.add_argument("--device", help="the catalog GPU to price the shapes on (default: "
                    + ", ".join(f"{a}: {dev}" for a, (_, dev) in TABLES.items()) + ")")
    ap.add_argument("-v", "--verbose", action="store_true", help="every shape")
    args = ap.parse_args(argv)
    path, default = TABLES[args.arch]
    _report(kernel_cases(device(args.device or default), path), args.verbose)


if __name__ == "__main__":
    main()
