#!/usr/bin/env python3
"""Where a forward pass's time goes, from Nsight Compute's per-kernel durations: `ncu --csv
--print-units base --metrics gpu__time_duration.sum` over `llmq bench e2e ... --no-graphs`
(scripts/gpu-bench breakdown runs both). Kernels are serialized under ncu, so the sum of a pass is
close to the pass's time without overlap; launches before the first embedding kernel (weight
generation, quantization at load) are left out, and each embedding kernel starts a pass.

Per pass: its rows (the embedding kernel's grid), its total, and the time by category (FP8 GEMM,
BF16 GEMM, attention, row kernels, sampling, other) with the largest kernels in each. --json FILE
writes the same as one object per pass.

usage: ncu_breakdown.py NCU_CSV [--json FILE] [--top N]"""
import argparse
import csv
import io
import json
import re
import sys

# First match wins. cuBLASLt's kernels are nvjet_*: qq* take 8-bit operands, the others BF16.
CATEGORIES = [
    ("fp8 gemm", re.compile(r"^nvjet_\w*_qq|cutlass.*e4m3|int8_gemm|sm90_gemm|moe_grouped|decode_gemm")),
    ("bf16 gemm", re.compile(r"^nvjet_|^sm90_xmma|cutlass|gemm", re.I)),
    ("attention", re.compile(r"attention")),
    ("row kernels", re.compile(r"row_op|rope_kv|embedding|broadcast_scale|quantize")),
    ("sampling", re.compile(r"argmax|flag_unusable|sample|logprob|advance")),
]


def category(name):
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


def short(name):
    """The kernel's name without its namespace and arguments (templates kept)."""
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    return re.sub(r"^[\w:<>]*::(?=[\w]+(<|$))", "", name.replace("(anonymous namespace)", "").replace("<unnamed>", ""))


def load(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV header (\"ID\", ...) found")
    rows = []
    for r in csv.DictReader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append(dict(name=r["Kernel Name"], grid=r.get("Grid Size", ""),
                         us=float(r["Metric Value"].replace(",", "")) / 1000.0))
    return rows


def passes(rows):
    out, cur = [], None
    for r in rows:
        if "embedding" in r["name"]:
            cur = dict(rows=r["grid"], kernels=[])
            out.append(cur)
        if cur is not None:
            cur["kernels"].append(r)
    return out


def summarize(p, top):
    total = sum(k["us"] for k in p["kernels"])
    cats = {}
    for k in p["kernels"]:
        c = cats.setdefault(category(k["name"]), dict(us=0.0, kernels={}))
        c["us"] += k["us"]
        e = c["kernels"].setdefault((short(k["name"]), k["grid"]), dict(calls=0, us=0.0))
        e["calls"] += 1
        e["us"] += k["us"]
    result = dict(embedding_grid=p["rows"], total_us=total, kernels=len(p["kernels"]), categories=[])
    for label, c in sorted(cats.items(), key=lambda x: -x[1]["us"]):
        biggest = sorted(c["kernels"].items(), key=lambda x: -x[1]["us"])[:top]
        result["categories"].append(dict(category=label, us=c["us"], share=c["us"] / total if total else 0.0,
                                         kernels=[dict(name=n, grid=g, calls=v["calls"], us=v["us"])
                                                  for (n, g), v in biggest]))
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--json", default=None)
    ap.add_argument("--top", type=int, default=3)
    a = ap.parse_args()
    results = [summarize(p, a.top) for p in passes(load(a.csv))]
    if not results:
        print(f"{a.csv}: no pass (no embedding kernel among the profiled launches)")
        return 1
    for i, r in enumerate(results):
        print(f"pass {i}: rows {r['embedding_grid']}, {r['kernels']} kernels, {r['total_us']:.0f} us")
        for c in r["categories"]:
            print(f"  {c['category']:<12} {c['us']:10.0f} us {100 * c['share']:5.1f}%")
            for k in c["kernels"]:
                print(f"      {k['us']:10.0f} us  {k['calls']:4d} x {k['grid']:<14} {k['name'][:90]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
