#!/usr/bin/env python3
"""Tensor-parallel scaling from `llmq bench e2e --tp ... --json` lines (scripts/gpu-bench tp):
per model, precision and batch, decode TPOT at each TP size, its speedup over TP=1 of the same
run and file, scaling efficiency (speedup / TP) and the all-reduces' share of the step; prefill
TTFT likewise. Rows whose TP=1 did not run (it did not fit) are compared with the smallest TP.

  python3 scripts/tp_table.py bench/results/...-tp-e2e-*.jsonl
"""
import json
import sys


def main(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    decode, prefill = {}, {}
    for r in rows:
        if "skipped" in r or r.get("kind") not in ("decode", "prefill"):
            continue
        tp = r.get("tp", 1)
        precision = r["precision"].split(" tp")[0]
        # TP=1 rows are the baseline of every all-reduce kind and of expert parallelism.
        kinds = ["auto", "nccl", "auto ep", "nccl ep"] if tp == 1 else \
            [r.get("allreduce", "auto") + (" ep" if r.get("expert_parallel") else "")]
        for ar in kinds:
            if r["kind"] == "decode":
                decode.setdefault((r["device"], r["model"], precision, ar, r["batch"], r["context"]), {})[tp] = r
            elif r.get("attention", "bf16") == "bf16":
                prefill.setdefault((r["device"], r["model"], precision, ar, r["tokens"]), {})[tp] = r
    print("| device | model | precision | all-reduce | batch | TP | TPOT ms | speedup | efficiency | all-reduce share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (dev, model, prec, ar, batch, ctx), by_tp in sorted(decode.items()):
        if len(by_tp) < 2 and 1 in by_tp:
            continue  # a baseline with nothing to compare
        base_tp = min(by_tp)
        base = by_tp[base_tp]["tpot_ms_median"] * base_tp
        for tp, r in sorted(by_tp.items()):
            t = r["tpot_ms_median"]
            share = r.get("allreduce_share")
            speed = base / t if base_tp == 1 else None
            print(f"| {dev} | {model.replace('synthetic:', '')} | {prec} | {ar} | {batch} | {tp} | {t:.2f} | "
                  f"{f'{speed:.2f}x' if speed else '-'} | {f'{speed / tp:.0%}' if speed else '-'} | "
                  f"{f'{share:.1%}' if share is not None else '-'} |")
    print()
    print("| device | model | precision | all-reduce | prefill tokens | TP | TTFT ms | speedup | efficiency |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (dev, model, prec, ar, tokens), by_tp in sorted(prefill.items()):
        if len(by_tp) < 2 and 1 in by_tp:
            continue
        base_tp = min(by_tp)
        base = by_tp[base_tp]["ttft_ms_median"]
        for tp, r in sorted(by_tp.items()):
            t = r["ttft_ms_median"]
            speed = base / t if base_tp == 1 else None
            print(f"| {dev} | {model.replace('synthetic:', '')} | {prec} | {ar} | {tokens} | {tp} | {t:.1f} | "
                  f"{f'{speed:.2f}x' if speed else '-'} | {f'{speed / tp:.0%}' if speed else '-'} |")


if __name__ == "__main__":
    main(sys.argv[1:])
