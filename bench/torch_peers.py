#!/usr/bin/env python3
"""The peers llmq's kernels are compared with, timed on the same device in the same session:
a device-to-device copy (the bandwidth ceiling), torch.matmul in BF16 (cuBLAS), torch._scaled_mm
FP8 with tensor-wise and row-wise scales, torch._int_mm INT8, and a torch.compile'd per-token FP8
quantize. Method (METHOD.md): warm-up, CUDA events, rotating operand sets larger than 2x L2,
median of many runs. Writes JSON lines to --json.

usage: torch_peers.py [--json FILE] [--quick]"""
import argparse
import json
import statistics
import sys

import torch

L2_BYTES = 60 << 20


def median_ms(fn, sets, warmup=5, iters=30):
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = sets[i % len(sets)]
        s.record()
        fn(*args)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def n_sets(bytes_per_set):
    return max(2, min(16, (2 * L2_BYTES) // max(bytes_per_set, 1) + 1))


def gemm_sets(m, n, k, make):
    per = (m * k + n * k) * 2
    return [make(m, n, k) for _ in range(n_sets(per))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    rows = []

    def emit(**r):
        r["device"] = dev
        rows.append(r)
        print(json.dumps(r), flush=True)

    # Bandwidth ceiling: copy of 1 GiB (bytes read + bytes written).
    nbytes = 1 << 30
    bufs = [(torch.empty(nbytes, dtype=torch.uint8, device="cuda"), torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
            for _ in range(2)]
    ms = median_ms(lambda a, b: b.copy_(a), bufs)
    emit(op="copy", bytes=2 * nbytes, us=ms * 1e3, gbps=2 * nbytes / ms / 1e6)
    del bufs

    shapes = [(8192, 8192, 8192)]
    llama = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (8192, 8192)]
    ms_list = [1, 16, 128, 2048, 8192] if not args.quick else [1, 2048]
    for m in ms_list:
        for k, n in llama:
            shapes.append((m, n, k))
    fp8 = torch.float8_e4m3fn
    for (m, n, k) in shapes:
        flops = 2 * m * n * k
        def bf16(m, n, k):
            return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
        sets = gemm_sets(m, n, k, bf16)
        t = median_ms(lambda a, b: torch.matmul(a, b.t()), sets)
        emit(op="bf16_matmul", m=m, n=n, k=k, us=t * 1e3, tflops=flops / t / 1e9)
        del sets

        def f8(m, n, k):
            a = (torch.randn(m, k, device="cuda") * 4).to(fp8)
            b = (torch.randn(n, k, device="cuda") * 4).to(fp8)
            return a, b
        sets = gemm_sets(m, n, k, f8)
        one = torch.ones((), device="cuda")
        try:
            t = median_ms(lambda a, b: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), sets)
            emit(op="scaled_mm_tensor", m=m, n=n, k=k, us=t * 1e3, tflops=flops / t / 1e9)
        except Exception as e:
            emit(op="scaled_mm_tensor", m=m, n=n, k=k, error=str(e)[:200])
        sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
        try:
            t = median_ms(lambda a, b: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), sets)
            emit(op="scaled_mm_rowwise", m=m, n=n, k=k, us=t * 1e3, tflops=flops / t / 1e9)
        except Exception as e:
            emit(op="scaled_mm_rowwise", m=m, n=n, k=k, error=str(e)[:200])
        del sets

        if m >= 17:  # _int_mm needs M > 16
            def i8(m, n, k):
                return (torch.randint(-128, 127, (m, k), device="cuda", dtype=torch.int8),
                        torch.randint(-128, 127, (n, k), device="cuda", dtype=torch.int8))
            sets = gemm_sets(m, n, k, i8)
            try:
                t = median_ms(lambda a, b: torch._int_mm(a, b.t()), sets)
                emit(op="int_mm", m=m, n=n, k=k, us=t * 1e3, tops=flops / t / 1e9)
            except Exception as e:
                emit(op="int_mm", m=m, n=n, k=k, error=str(e)[:200])
            del sets

    # Per-token FP8 quantize, compiled by torch.compile (what a PyTorch user would write).
    def per_token_quant(x):
        s = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1.0 / (448.0 * 512.0)) / 448.0
        q = (x.float() / s).clamp(-448.0, 448.0).to(fp8)
        return q, s
    compiled = torch.compile(per_token_quant)
    for (r, c) in [(16384, 8192), (1, 4096), (16, 4096), (8192, 4096)]:
        sets = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(n_sets(r * c * 2))]
        t = median_ms(lambda x: compiled(x), sets, warmup=10)
        moved = r * c * 2 + r * c + r * 4
        emit(op="torch_compile_per_token_quant", rows=r, cols=c, us=t * 1e3, gbps=moved / t / 1e6)

    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
