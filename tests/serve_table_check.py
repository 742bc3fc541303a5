#!/usr/bin/env python3
"""scripts/serve_table.py (scripts/gpu-bench serve's table) on made-up inputs: llmq's rows joined
with the peer's by dataset and request count (a --no-preemption run in its own column), the ratios
computed from the right cells, a peer stopped by its time budget marked, missing cells a dash,
rows that are not serve runs ignored.

usage: serve_table_check.py SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    script = os.path.join(sys.argv[1], "scripts", "serve_table.py")
    ours = [
        {"kind": "serve", "dataset": "fixed:128/128", "requests": 1024, "precision": "fp8-dynamic",
         "fp8_fast_accumulation": False, "output_tokens_per_s": 24000.0},
        {"kind": "serve", "dataset": "fixed:128/128", "requests": 1024, "precision": "fp8-dynamic",
         "fp8_fast_accumulation": True, "output_tokens_per_s": 26000.0},
        {"kind": "serve", "dataset": "fixed:128/128", "requests": 1024, "precision": "fp8-tensor-static",
         "output_tokens_per_s": 25000.0},
        {"kind": "serve", "dataset": "fixed:128/128", "requests": 1024, "precision": "bf16",
         "output_tokens_per_s": 16000.0},
        {"kind": "serve", "dataset": "fixed:2048/2048", "requests": 256, "precision": "fp8-dynamic",
         "output_tokens_per_s": 8000.0},
        {"kind": "serve", "dataset": "fixed:2048/2048", "requests": 256, "precision": "fp8-dynamic",
         "no_preemption": True, "output_tokens_per_s": 8500.0},
        {"kind": "copy", "dataset": "fixed:128/128", "requests": 1024, "output_tokens_per_s": 1.0},
    ]
    peers = [
        {"peer": "transformers", "dataset": "fixed:128/128", "requests": 1024, "output_tokens_per_s": 1200.0,
         "complete": True},
        {"peer": "transformers", "dataset": "fixed:2048/2048", "requests": 256, "output_tokens_per_s": 200.0,
         "complete": False},
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        ours_path = os.path.join(d, "llmq_serve.jsonl")
        with open(ours_path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in ours))
        peer_paths = []
        for i, p in enumerate(peers):
            peer_paths.append(os.path.join(d, f"peer{i}.json"))
            with open(peer_paths[-1], "w") as f:
                json.dump(p, f)
        out = subprocess.run([sys.executable, script, ours_path] + peer_paths + [os.path.join(d, "absent.json")],
                             capture_output=True, text=True, check=False)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.stdout.splitlines() if line.startswith("| fixed:")}
    want = {
        "fixed:128/128, 1024": ["24,000", "26,000", "-", "25,000", "16,000", "-", "1.50x", "1,200", "20.00x"],
        "fixed:2048/2048, 256": ["8,000", "-", "8,500", "-", "-", "-", "-", "200 (incomplete)", "40.00x"],
    }
    if out.returncode != 0:
        print(f"serve_table.py exited {out.returncode}: {out.stderr}")
        failed += 1
    for key, cells in want.items():
        if rows.get(key) != cells:
            print(f"row {key}: got {rows.get(key)}, want {cells}")
            failed += 1
    if set(rows) != set(want):
        print(f"rows {sorted(rows)}, want {sorted(want)}")
        failed += 1
    print(f"serve_table_check: {len(want) - min(failed, len(want))} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
