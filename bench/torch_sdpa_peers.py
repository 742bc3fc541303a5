#!/usr/bin/env python3
"""PyTorch SDPA peers of llmq's prefill attention kernels (bench_cuda_attention.cu shapes: 32 query
heads, 8 KV heads, head_dim 128, one sequence), BF16, each backend forced in turn (flash, cuDNN,
efficient); GQA through enable_gqa. FLOPs as the llmq bench counts them: 4 * pairs * d * heads,
pairs = n^2 (full) or n(n+1)/2 (causal). CUDA events, 3 warm-ups, median of --iters runs. JSON lines
to --json.

usage: torch_sdpa_peers.py [--lengths 2048,4096,8192] [--iters 20] [--json FILE]"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    heads, kv_heads, d = 32, 8, 128
    dev = torch.cuda.get_device_name()
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        q = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, kv_heads, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, kv_heads, n, d, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            pairs = n * (n + 1) / 2 if causal else n * n
            for name, backend in BACKENDS.items():
                row = dict(bench="sdpa_peer", backend=name, n=n, causal=causal, heads=heads, kv_heads=kv_heads,
                           head_dim=d, device=dev)
                try:
                    with sdpa_kernel(backend):
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                        times = []
                        for _ in range(args.iters):
                            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            s.record()
                            fn()
                            e.record()
                            torch.cuda.synchronize()
                            times.append(s.elapsed_time(e))
                    ms = statistics.median(times)
                    row.update(ms=ms, tflops=4 * pairs * d * heads / (ms * 1e-3) / 1e12)
                    print(f"sdpa {name:<9} n={n:<5} {'causal' if causal else 'full':<6} {ms:8.3f} ms {row['tflops']:7.1f} TFLOP/s")
                except Exception as ex:  # a backend that refuses the shape
                    row.update(error=str(ex)[:200])
                    print(f"sdpa {name:<9} n={n:<5} {'causal' if causal else 'full':<6} error: {str(ex)[:80]}")
                rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
