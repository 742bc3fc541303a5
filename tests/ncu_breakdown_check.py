#!/usr/bin/env python3
"""scripts/ncu_breakdown.py (scripts/gpu-bench breakdown) on a made-up ncu CSV: launches before the
first embedding kernel left out, one pass per embedding kernel, kernels put in the right categories
with the right sums, other metrics ignored, the JSON written.

usage: ncu_breakdown_check.py SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, name, grid, ns, metric="gpu__time_duration.sum"):
    return (f'"{i}","1","llmq","host","{name}","1","7","(128, 1, 1)","{grid}","0","9.0",'
            f'"Command line profiler metrics","{metric}","ns","{ns:,}"')


def main():
    script = os.path.join(sys.argv[1], "scripts", "ncu_breakdown.py")
    kernels = [
        ("void quant_kernels::quantize_tiles_kernel<1>(TileArgs)", "(64, 1, 1)", 900_000),  # before: left out
        ("runtime::<unnamed>::embedding_kernel(const int *)", "(512, 1, 1)", 10_000),
        ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "(1, 132, 1)", 60_000),
        ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "(1, 132, 1)", 40_000),
        ("void attention::<unnamed>::decode_attention_warp_kernel<1>(DecodeAttentionArgs)", "(1, 2, 512)", 30_000),
        ("void runtime::<unnamed>::row_op_kernel<1, 1, 8>(RowKernelArgs)", "(512, 1, 1)", 20_000),
        ("nvjet_sm90_tss_320x128_64x3_1x2_h_bz_coopB_TNT", "(2, 66, 1)", 8_000),
        ("runtime::<unnamed>::argmax_slices_kernel(const float *)", "(32, 512, 1)", 2_000),
        ("runtime::<unnamed>::embedding_kernel(const int *)", "(8192, 1, 1)", 50_000),
        ("void attention::<unnamed>::prefill_attention_mma_kernel<128, 0, 0>(Args)", "(128, 32, 1)", 70_000),
    ]
    lines = ["==PROF== Connected to process 1", "llmq bench e2e: ...", HEADER]
    for i, (name, grid, ns) in enumerate(kernels):
        lines.append(row(i, name, grid, ns))
    lines.append(row(99, kernels[2][0], "(1, 132, 1)", 5_000_000, metric="sm__inst_executed.sum"))  # not a duration
    failed = 0

    def check(what, ok):
        nonlocal failed
        if not ok:
            print("FAILED:", what)
            failed += 1

    with tempfile.TemporaryDirectory() as d:
        csv_path, json_path = os.path.join(d, "ncu.csv"), os.path.join(d, "breakdown.json")
        with open(csv_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        out = subprocess.run([sys.executable, script, csv_path, "--json", json_path], capture_output=True, text=True,
                             check=False)
        check(f"exit status 0 (got {out.returncode}: {out.stderr.strip()})", out.returncode == 0)
        passes = json.load(open(json_path)) if os.path.exists(json_path) else []
    check(f"two passes (got {len(passes)})", len(passes) == 2)
    if len(passes) == 2:
        first = {c["category"]: c["us"] for c in passes[0]["categories"]}
        want = {"fp8 gemm": 100.0, "attention": 30.0, "row kernels": 30.0, "bf16 gemm": 8.0, "sampling": 2.0}
        check(f"first pass by category {first}, want {want}", first == want)
        check(f"first pass total {passes[0]['total_us']}, want 170", passes[0]["total_us"] == 170.0)
        check(f"first pass rows {passes[0]['embedding_grid']}", passes[0]["embedding_grid"] == "(512, 1, 1)")
        fp8 = passes[0]["categories"][0]
        check(f"largest category first, its kernel once with 2 calls: {fp8}",
              fp8["category"] == "fp8 gemm" and len(fp8["kernels"]) == 1 and fp8["kernels"][0]["calls"] == 2)
        second = {c["category"]: c["us"] for c in passes[1]["categories"]}
        check(f"second pass {second}", second == {"attention": 70.0, "row kernels": 50.0})
    print(f"ncu_breakdown_check: {'0 failed' if failed == 0 else str(failed) + ' failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
