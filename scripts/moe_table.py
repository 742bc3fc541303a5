#!/usr/bin/env python3
"""Joins bench_cuda_moe_sparse's JSON lines with torch_moe_peers.py's (same session, same routing)
into one table per shape: llmq's sparse grouped GEMM (the kernel auto picks), the fraction of copy
bandwidth its active expert weights stream at, and the ratios against torch._scaled_grouped_mm
(FP8), torch._grouped_mm (BF16), the BF16 per-expert loop and llmq's dense path and llmq's own BF16 experts;
last, llmq's wgmma kernel with fast accumulation (wg-fast) against torch's use_fast_accum=True.

usage: moe_table.py LLMQ_JSONL TORCH_JSONL"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def main():
    llmq, torch = load(sys.argv[1]), load(sys.argv[2])
    ours = {}
    for r in llmq:
        if r.get("bench") == "moe_sparse":
            ours.setdefault((r["shape"], r["tokens"]), {})[r["variant"]] = r
    peers = {}
    for r in torch:
        if r.get("bench") == "moe_grouped_peer" and "us" in r and "shape" in r:
            peers.setdefault((r["shape"], r["tokens"]), {})[r["peer"]] = r["us"]
    head = (f"{'shape':>13} {'tok':>5} | {'llmq us':>8} {'kernel':>8} {'%copy':>6} | {'vs torch fp8':>12} "
            f"{'vs torch bf16':>13} {'vs bf16 loop':>12} | {'dense/sparse':>12} {'llmq bf16/fp8':>13} | "
            f"{'fast vs torch fast':>18}")
    print(head)
    for (shape, t), v in sorted(ours.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        auto = next((r for k, r in v.items() if k.startswith("auto")), None)
        if auto is None:
            continue
        p = peers.get((shape, t), {})

        def ratio(peer_us):
            return f"{peer_us / auto['us']:.2f}x" if peer_us else "-"

        dense = v.get("dense", {}).get("us")
        # Both accumulating in the tensor core over all of K: llmq's wg-fast row against torch's.
        fast_us, torch_fast = v.get("wg-fast", {}).get("us"), p.get("torch_scaled_grouped_mm_fp8_fast")
        fast = f"{torch_fast / fast_us:.2f}x" if fast_us and torch_fast else "-"
        print(f"{shape:>13} {t:>5} | {auto['us']:8.1f} {auto['variant'][5:]:>8} {100 * auto['fraction_of_copy']:5.1f}% | "
              f"{ratio(p.get('torch_scaled_grouped_mm_fp8')):>12} {ratio(p.get('torch_grouped_mm_bf16')):>13} "
              f"{ratio(p.get('bf16_per_expert_loop')):>12} | {ratio(dense):>12} {ratio(v.get('bf16', {}).get('us')):>13} | "
              f"{fast:>18}")


if __name__ == "__main__":
    main()
