#!/usr/bin/env python3
"""Joins `llmq bench serve --json` lines with bench/torch_serve_peer.py's JSON objects (one device
session, the same workloads) into issue 25's table: per dataset, llmq's output tok/s at each
precision (FP8 with and without --fp8-fast-accum, per-tensor FP8, BF16, INT8), FP8 / BF16, transformers' continuous
batching (BF16) and llmq FP8 / the peer. A peer that did not finish its run (time budget) is shown
with its partial figure and marked; a missing one is a dash.

usage: serve_table.py LLMQ_JSONL [PEER_JSON...]"""
import json
import sys


def load_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def load_object(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def variant(row):
    precision = row.get("precision", "?")
    return (precision + (" fast-accum" if row.get("fp8_fast_accumulation") else "") +
            (" no-preemption" if row.get("no_preemption") else ""))


def fmt(x):
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "-"


def ratio(a, b):
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else "-"


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ours = {}
    for r in load_lines(sys.argv[1]):
        if r.get("kind") == "serve" and "output_tokens_per_s" in r:
            ours.setdefault((r["dataset"], r["requests"]), {})[variant(r)] = r["output_tokens_per_s"]
    peers = {}
    for path in sys.argv[2:]:
        p = load_object(path)
        if isinstance(p, dict) and "output_tokens_per_s" in p:
            mark = "" if p.get("complete") else " (incomplete)"
            peers[(p.get("dataset"), p.get("requests"))] = (p["output_tokens_per_s"], mark)
    cols = ["fp8-dynamic", "fp8-dynamic fast-accum", "fp8-dynamic no-preemption", "fp8-tensor-static", "bf16", "int8-w8a8"]
    print("| dataset, requests | llmq FP8 | FP8 fast-accum | FP8 no-preemption | FP8 per-tensor | BF16 | INT8 | FP8 / BF16 |"
          " transformers BF16 | llmq FP8 / peer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(set(ours) | set(peers), key=lambda k: (str(k[0]), k[1] or 0)):
        row = ours.get(key, {})
        peer, mark = peers.get(key, (None, ""))
        fp8, bf16 = row.get("fp8-dynamic"), row.get("bf16")
        cells = [fmt(row.get(c)) for c in cols]
        print(f"| {key[0]}, {key[1]} | " + " | ".join(cells) +
              f" | {ratio(fp8, bf16)} | {fmt(peer)}{mark} | {ratio(fp8, peer)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
