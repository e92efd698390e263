"""Per-device analytic-model parameters fitted to Zorse's per-layer times, and how well
every GPU type fits (docs/calibration.md, "Zorse").

    python -m planner.calibration.zorse_fit [--gpu a10g ...] [--iterations 400]
    python -m planner.calibration.zorse_fit --simt    # the CUDA-core GEMM fit (fp32)

prints, per GPU type, the error before (its architecture's parameters) and after (the
catalog's, with any `efficiency:` of the device), on the training cases and the held-out
ones, the fitted values in devices.yaml's format, and each GPU's predicted / measured
speed relative to the A100.

Split: the fit sees the Llama layers (HF Llama and the v2 block) of every model except
the 7B ones (`HELD_OUT_MODELS`), in the dtype a plan trains in on that GPU (fp16; fp32
on Pascal, which has no tensor cores); the held-out cases are the 7B models (a whole
model per GPU never seen by the fit) and, separately, the other families (BERT, GPT,
Mistral: other code, other shapes) in the same dtype. Only devices the published data
do not cover get parameters of their own (`FITTED`); the A100, V100 and H100 SXM
architectures stay as the published rows and vTrain calibrated them, and their Zorse
error is reported against those.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from planner.calibration.fit import Parameter, minimize_bounded
from planner.calibration.zorse import GPU_MAP, ZorseCase, measured_device, predict_s, zorse_cases
from planner.costs.stages import clear_cost_caches
from profiler.devices import ArchEfficiency, DeviceSpec, arch_efficiency, device_efficiency

__all__ = ["FITTED", "HELD_OUT_MODELS", "REFERENCE_GPU", "SIMT_FITTED", "DeviceFit", "SimtFit",
           "Split", "arch_device", "case_error", "fit_device", "fit_dtype", "fit_simt", "main",
           "mean_error", "relative_speed", "set_aside", "simt_split", "split", "without_simt"]

HELD_OUT_MODELS = frozenset({"deepspeedllama_7b", "deepspeedllamav2_7b"})
FIT_FAMILIES = frozenset({"llama", "llama_v2"})
REFERENCE_GPU = "a100x40"

# Bounds of the fitted fields of ArchEfficiency (each a physical quantity).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.2, 1.0),
    "memory_efficiency": (0.3, 0.95),
    "attention_efficiency": (0.05, 0.9),
    "small_tile_penalty": (0.0, 0.6),
    "gemm_k_half": (8.0, 512.0),
    "kernel_overhead_us": (0.2, 10.0),
}
# What is fitted per Zorse GPU: devices no published row covers, whose held-out error the
# fit lowers. Two numbers each: the fraction of the datasheet tensor (Pascal: fp32) peak
# its GEMMs sustain (clocks under the card's power cap included) and the fraction of
# its DRAM bandwidth streaming kernels reach. Fitting attention_efficiency,
# small_tile_penalty or gemm_k_half as well lowered no held-out error by more than 1.4
# points, most of them ending at their bounds; P40's fit lowered none, so it keeps Pascal's.
_TWO = ("gemm_efficiency", "memory_efficiency")
FITTED: dict[str, tuple[str, ...]] = {
    "a10g": _TWO, "a6000": _TWO, "h100-nvl": _TWO, "l4": _TWO, "p100": _TWO, "t4": _TWO,
}


# The SIMT (CUDA-core) GEMM efficiency, fitted on the fp32 layers (no TF32) per
# architecture over its full-power cards, each GPU type weighing alike. Ampere fits two
# numbers: GA100 (A100, single issue) fixes the efficiency, GA102 (A10G, A6000) the share
# of its second, INT32-shared FP32 datapath a GEMM gets; Ada keeps that share (the same
# SM partition) and fits its efficiency on the L40S. The power-capped cards (T4 70 W,
# L4 72 W), whose clocks fall under load, fit their own, as their tensor-core fits do.
# Pascal keeps its values: one number for GP100 and GP102 made both worse (P40 7.7 ->
# 12.7%); P100 keeps its device fit (fp32 GEMMs, which were SIMT all along). Turing
# has no full-power card in the data: Volta's value (the same 64 FP32 lanes per SM).
SIMT = "simt_gemm_efficiency"
GAIN = "dual_issue_fp32_gain"
SIMT_FITTED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ampere": (("a100x40", "a10g", "a6000"), (SIMT, GAIN)), "ada": (("l40s",), (SIMT,)),
    "hopper": (("h100-nvl",), (SIMT,)),
    "volta": (("v100x16", "v100x32", "v100-pciex16"), (SIMT,)),
    "t4": (("t4",), (SIMT,)), "l4": (("l4",), (SIMT,)),
}
SIMT_BOUNDS = {SIMT: (0.2, 1.0), GAIN: (0.0, 1.0)}  # no kernel beats its peak


def fit_dtype(gpu: str) -> str:
    """The dtype a plan trains in on `gpu`: fp16 (autocast) where it has tensor cores."""
    return "fp32" if measured_device(gpu).arch == "pascal" else "fp16"


def set_aside(case: ZorseCase) -> str | None:
    """Why a case cannot judge the catalog device (it is reported, never fitted), or None."""
    if case.gpu == "l4" and case.family == "llama_v2":
        return ("1.5-2x slower than the HF Llama layer of the same shapes on L4, non-monotonic "
                "in micro-batch: another (throttled) card or run")
    return None


@dataclass(frozen=True)
class Split:
    train: tuple[ZorseCase, ...]
    held_out: tuple[ZorseCase, ...]  # the fitted families' held-out models
    other_families: tuple[ZorseCase, ...]  # BERT, GPT, Mistral in the fitted dtype


def split(gpu: str) -> Split:
    cases = [c for c in zorse_cases()
             if c.gpu == gpu and c.dtype == fit_dtype(gpu) and set_aside(c) is None]
    fit_family = [c for c in cases if c.family in FIT_FAMILIES]
    return Split(train=tuple(c for c in fit_family if c.model not in HELD_OUT_MODELS),
                 held_out=tuple(c for c in fit_family if c.model in HELD_OUT_MODELS),
                 other_families=tuple(c for c in cases if c.family not in FIT_FAMILIES))


def simt_split(gpu: str) -> Split:
    """The fp32 cases of `gpu` (GEMMs on the CUDA cores), split as `split` does."""
    cases = [c for c in zorse_cases() if c.gpu == gpu and c.dtype == "fp32"
             and set_aside(c) is None]
    fit_family = [c for c in cases if c.family in FIT_FAMILIES]
    return Split(train=tuple(c for c in fit_family if c.model not in HELD_OUT_MODELS),
                 held_out=tuple(c for c in fit_family if c.model in HELD_OUT_MODELS),
                 other_families=tuple(c for c in cases if c.family not in FIT_FAMILIES))


def case_error(case: ZorseCase, dev: DeviceSpec | None = None) -> float:
    """Mean of the forward and backward |predicted / measured - 1|."""
    fwd, bwd = predict_s(case, dev)
    return (abs(fwd / case.forward_s - 1) + abs(bwd / case.backward_s - 1)) / 2


def mean_error(cases: Iterable[ZorseCase], dev: DeviceSpec | None = None) -> float:
    errors = [case_error(c, dev) for c in cases]
    return statistics.mean(errors) if errors else float("nan")


def arch_device(gpu: str) -> DeviceSpec:
    """The measured card with its architecture's parameters (what it had before a fit)."""
    return replace(measured_device(gpu), efficiency=None)


def _with_values(base: DeviceSpec, names: Sequence[str], values: Sequence[float]) -> DeviceSpec:
    change: dict[str, Any] = dict(zip(names, values, strict=True))  # float fields
    eff = replace(device_efficiency(base), **change)
    return replace(base, efficiency=eff)


@dataclass(frozen=True)
class DeviceFit:
    gpu: str
    efficiency: ArchEfficiency
    train_before: float
    train_after: float
    held_out_before: float
    held_out_after: float


def fit_device(gpu: str, *, iterations: int = 400) -> DeviceFit:
    """Nelder-Mead (bounded, planner/calibration/fit.py) over FITTED[gpu], from the
    architecture's values, on the training split; errors before and after."""
    names = FITTED[gpu]
    base = arch_device(gpu)
    data = split(gpu)
    params = [Parameter(f"device:{gpu}", n, *BOUNDS[n]) for n in names]
    start = [float(getattr(arch_efficiency(base.arch), n)) for n in names]

    def objective(values: list[float]) -> float:
        clear_cost_caches()
        return mean_error(data.train, _with_values(base, names, values))

    values, after = minimize_bounded(params, objective, iterations=iterations, start=start)
    fitted = _with_values(base, names, values)
    clear_cost_caches()
    return DeviceFit(gpu, device_efficiency(fitted), mean_error(data.train, base), after,
                     mean_error(data.held_out, base), mean_error(data.held_out, fitted))


@dataclass(frozen=True)
class SimtFit:
    group: str  # an architecture, or a power-capped device
    values: dict[str, float]  # simt_gemm_efficiency (and dual_issue_fp32_gain)
    before: dict[str, tuple[float, float, float]]  # gpu -> train, held-out, other families
    after: dict[str, tuple[float, float, float]]


def _with_simt(gpu: str, values: dict[str, float]) -> DeviceSpec:
    dev = measured_device(gpu)
    change: dict[str, Any] = dict(values)  # float fields
    return replace(dev, efficiency=replace(device_efficiency(dev), **change))


def without_simt(gpu: str) -> DeviceSpec:
    """The card as the model priced it before the SIMT efficiency: its fp32 GEMMs at the
    tensor-core fraction of the datasheet fp32 peak."""
    dev = replace(measured_device(gpu), fp32_dual_issue=False)
    eff = device_efficiency(dev)
    return replace(dev, efficiency=replace(eff, simt_gemm_efficiency=eff.gemm_efficiency))


def _simt_errors(gpu: str, dev: DeviceSpec) -> tuple[float, float, float]:
    data = simt_split(gpu)
    clear_cost_caches()
    return (mean_error(data.train, dev), mean_error(data.held_out, dev),
            mean_error(data.other_families, dev))


def fit_simt(group: str, *, iterations: int = 200) -> SimtFit:
    """The fields SIMT_FITTED[group] names, from the catalog's values: the mean over its
    GPU types of each one's training error (fp32 Llama layers, 7B held out)."""
    gpus, names = SIMT_FITTED[group]
    trained = [g for g in gpus if simt_split(g).train]
    params = [Parameter(f"simt:{group}", n, *SIMT_BOUNDS[n]) for n in names]
    now = device_efficiency(measured_device(gpus[0]))
    start = [float(getattr(now, n) or (0.5 if n == GAIN else now.gemm_efficiency))
             for n in names]

    def objective(values: list[float]) -> float:
        clear_cost_caches()
        change = dict(zip(names, values, strict=True))
        return statistics.mean(mean_error(simt_split(g).train, _with_simt(g, change))
                               for g in trained)

    values, _ = minimize_bounded(params, objective, iterations=iterations, start=start)
    fitted = dict(zip(names, values, strict=True))
    before = {g: _simt_errors(g, without_simt(g)) for g in gpus}
    after = {g: _simt_errors(g, _with_simt(g, fitted)) for g in gpus}
    clear_cost_caches()
    return SimtFit(group, fitted, before, after)


def relative_speed(gpu: str, dev: DeviceSpec | None = None, *, reference: str = REFERENCE_GPU,
                   dtype: str | None = None) -> list[tuple[ZorseCase, float, float]]:
    """For each case of `gpu` measured alike (model, sequence, dtype, micro-batch) on the
    reference GPU: (case, measured time ratio gpu / reference, predicted ratio), forward
    plus backward. A heterogeneous plan splits work by exactly this ratio."""
    dtype = dtype or fit_dtype(gpu)
    ref = {(c.model, c.seq_len, c.dtype, c.micro_batch_size): c for c in zorse_cases()
           if c.gpu == reference and c.dtype == dtype}
    out = []
    for c in zorse_cases():
        r = ref.get((c.model, c.seq_len, c.dtype, c.micro_batch_size))
        if c.gpu != gpu or r is None or set_aside(c) is not None:
            continue
        measured = (c.forward_s + c.backward_s) / (r.forward_s + r.backward_s)
        predicted = sum(predict_s(c, dev)) / sum(predict_s(r))
        out.append((c, measured, predicted))
    return out


def _efficiency_yaml(eff: ArchEfficiency) -> str:
    parts = []
    for f in fields(ArchEfficiency):
        v = getattr(eff, f.name)
        if v is None:  # left to the architecture
            continue
        parts.append(f"{f.name}: {v:.3g}" if isinstance(v, float) else f"{f.name}: {v}")
    return "{" + ", ".join(parts) + "}"


def _pct(before: float, after: float) -> str:
    if before != before:  # nan: no cases
        return f"{'-':>15s}"
    return f"{before:6.1%} ->{after:6.1%}"


def _report_gpu(gpu: str) -> str:
    """One line: cases and error (arch parameters -> catalog now) on the training and
    held-out splits, the other families, the other dtype; speed relative to the A100."""
    data, base, now = split(gpu), arch_device(gpu), measured_device(gpu)
    other_dtype = [c for c in zorse_cases() if c.gpu == gpu and c.dtype != fit_dtype(gpu)
                   and set_aside(c) is None]
    speed = [p / m for _, m, p in relative_speed(gpu, now)]
    speed_text = (f"{statistics.mean(speed):5.2f} [{min(speed):4.2f}, {max(speed):4.2f}]"
                  if speed else f"{'-':>18s}")
    parts = [(len(s), mean_error(s, base), mean_error(s, now))
             for s in (data.train, data.held_out, data.other_families, other_dtype)]
    cells = "  ".join(f"{n:4d} {_pct(b, a)}" for n, b, a in parts)
    return f"{gpu:13s} {GPU_MAP[gpu]:15s} {fit_dtype(gpu)}  {cells}  {speed_text}"


def report() -> str:
    head = (f"{'gpu':13s} {'catalog':15s} {'dtype':5s} {'train':>20s}  {'held-out 7B':>20s}  "
            f"{'other families':>20s}  {'other dtype':>20s}  speed vs A100 pred/meas")
    lines = [head] + [_report_gpu(g) for g in sorted(GPU_MAP)
                      if any(c.gpu == g for c in zorse_cases())]
    return "\n".join(lines + ["error: mean over cases of (|fwd err| + |bwd err|) / 2, "
                               "architecture's parameters -> the catalog's now"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.calibration.zorse_fit",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", nargs="*", choices=sorted(FITTED), help="fit these (default all)")
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--report", action="store_true", help="only the table, no fitting")
    ap.add_argument("--simt", action="store_true",
                    help="fit simt_gemm_efficiency on the fp32 layers (SIMT_FITTED)")
    args = ap.parse_args(argv)
    if args.simt:
        for group in SIMT_FITTED:
            simt = fit_simt(group)
            print(f"{group}: " + ", ".join(f"{k} {v:.3f}" for k, v in simt.values.items()))
            for g in simt.before:
                (bt, bh, bo), (at_, ah, ao) = simt.before[g], simt.after[g]
                print(f"  {g:13s} train {_pct(bt, at_)}  held-out 7B {_pct(bh, ah)}  "
                      f"other families {_pct(bo, ao)}")
    elif not args.report:
        for gpu in args.gpu or sorted(FITTED):
            r = fit_device(gpu, iterations=args.iterations)
            print(f"{gpu} ({GPU_MAP[gpu]}): train {r.train_before:.1%} -> {r.train_after:.1%}, "
                  f"held-out {r.held_out_before:.1%} -> {r.held_out_after:.1%}")
            print(f"  efficiency: {_efficiency_yaml(r.efficiency)}")
    print(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
