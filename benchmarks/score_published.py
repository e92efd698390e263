#!/usr/bin/env python3
"""Score the project's simulator against published measurements.

Each CSV row is one published training configuration and its measured result.
The row is turned into a model YAML and a `plan simulate ... --json` call; the
predicted iteration time is compared with the measured one (derived from the
row's metric with the source's own FLOP formula).

usage: score.py CSV [CSV...] [--plan CMD] [--max-rows N] [--out FILE.csv]
prints one line per row and a summary; last line: "MAPE x% (n rows)".
"""
import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def measured_iter_s(r):
    B, s, l, h, V = (int(r["gbs"]), int(r["seq"]), int(r["layers"]), int(r["hidden"]), int(r["vocab"]))
    gpus, v, m = int(r["gpus"]), float(r["value"]), r["metric"]
    if m == "iter_s":
        return v
    if m == "tokens_per_s_per_gpu":
        return B * s / (gpus * v)
    if m == "tflops_per_gpu_hw":
        f = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        return f / (gpus * v * 1e12)
    if m == "tflops_per_gpu_model":
        if r.get("kv_heads") or int(r["ffn"]) != 4 * h:  # GQA / SwiGLU: 6N + attention
            ffn, kv, heads = int(r["ffn"]), int(r["kv_heads"] or r["heads"]), int(r["heads"])
            hd = h // heads
            per_layer = h * h * 2 + 2 * h * kv * hd + 3 * h * ffn
            n = l * per_layer + 2 * V * h
            f = 6 * n * B * s + 12 * l * h * s * B * s
            return f / (gpus * v * 1e12)
        f = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
        return f / (gpus * v * 1e12)
    raise ValueError(m)


def model_yaml(r, path):
    act = "swiglu" if (int(r["ffn"]) != 4 * int(r["hidden"])) else "gelu"
    lines = [f"name: {r['model']}", f"num_layers: {r['layers']}", f"hidden_size: {r['hidden']}",
             f"ffn_hidden_size: {r['ffn']}", f"num_heads: {r['heads']}",
             f"num_kv_heads: {r['kv_heads'] or r['heads']}", f"vocab_size: {r['vocab']}",
             f"seq_len: {r['seq']}", f"activation: {act}",
             f"norm: {'rmsnorm' if act == 'swiglu' else 'layernorm'}"]
    open(path, "w").write("\n".join(lines) + "\n")


def simulate(plan_cmd, r, mbs, tmp):
    mf = os.path.join(tmp, r["id"] + ".yaml")
    model_yaml(r, mf)
    args = plan_cmd + ["simulate", "--model-file", mf, "--gpus", f"{r['gpu']}:{r['gpus']}",
            "--tp", r["tp"], "--pp", r["pp"], "--dp", r["dp"], "--mbs", str(mbs), "--gbs", r["gbs"],
            "--seq", r["seq"], "--recompute", r["recompute"], "--dtype", r["dtype"],
            "--sharding", r["sharding"] or "none", "--json"]
    if r.get("cp") and r["cp"] not in ("", "1"):
        args += ["--cp", r["cp"]]
    if r.get("vp") and r["vp"] not in ("", "1"):
        args += ["--vp", r["vp"]]
    if r.get("seq_par") == "1":
        args += ["--sequence-parallel"]
    if r.get("attention"):  # this project's annotation of the runs' kernel (README)
        args += ["--attention", r["attention"]]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError:
        return None, "output is not JSON"
    if out.get("fits") is False:
        return None, "reported as not fitting in memory"
    return float(out["iteration_time_s"]), ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--plan", default="plan")
    ap.add_argument("--max-rows", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    plan_cmd = shlex.split(a.plan)
    rows = []
    for f in a.csv:
        with open(f) as fh:
            rows += list(csv.DictReader(fh))
    if a.max_rows:
        rows = rows[: a.max_rows]
    errs, results, failed = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            meas = measured_iter_s(r)
            cands = [int(r["mbs"])] if r["mbs"] else [1, 2, 4, 8]
            best, why = None, ""
            for mbs in cands:
                if int(r["gbs"]) % (mbs * int(r["dp"])):
                    continue
                t, w = simulate(plan_cmd, r, mbs, tmp)
                if t is not None and (best is None or t < best):
                    best = t
                why = why or w
            if best is None:
                failed += 1
                print(f"{r['id']:45s} measured {meas:9.3f}s  predicted  FAILED  {why[:90]}")
                results.append((r["id"], meas, "", ""))
                continue
            e = best / meas - 1
            errs.append(abs(e))
            results.append((r["id"], meas, best, e))
            print(f"{r['id']:45s} measured {meas:9.3f}s  predicted {best:9.3f}s  err {e*100:+6.1f}%")
    if a.out:
        with open(a.out, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "measured_s", "predicted_s", "rel_err"])
            w.writerows(results)
    if not errs:
        print(f"MAPE n/a (0 of {len(rows)} rows simulated)")
        return 1
    mape = statistics.mean(errs) * 100
    print(f"max |err| {max(errs)*100:.1f}%  median {statistics.median(errs)*100:.1f}%  failed {failed}")
    print(f"MAPE {mape:.1f}% ({len(errs)} of {len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
