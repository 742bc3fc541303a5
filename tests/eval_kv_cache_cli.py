#!/usr/bin/env python3
"""llmq eval --kv-cache on the built-in default model: each candidate runs once per KV cache of the
CPU reference, in the order given, each row saying its cache; the float row is the run without
--kv-cache, number for number; the E4M3 caches change the numbers; and the misuses are refused with
exit status 2 naming the option (an unknown cache, an E4M3 cache on --device cuda, statistics
without the KV cache for e4m3-static).

usage: eval_kv_cache_cli.py LLMQ"""
import json
import os
import subprocess
import sys
import tempfile


def run(llmq, *args):
    return subprocess.run([llmq, *args], capture_output=True, text=True, check=False)


def main():
    llmq = sys.argv[1]
    failed = 0

    def check(name, ok, detail=""):
        nonlocal failed
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
        failed += 0 if ok else 1

    common = ["eval", "--model", "default", "--scheme", "fp8-dynamic", "--samples", "2", "--length", "24", "--json"]
    plain = run(llmq, *common)
    kv = run(llmq, *common, "--kv-cache", "float,e4m3,e4m3-static")
    check("eval exits 0", plain.returncode == 0 and kv.returncode == 0, plain.stderr + kv.stderr)
    if plain.returncode == 0 and kv.returncode == 0:
        base = json.loads(plain.stdout)["results"]
        rows = json.loads(kv.stdout)["results"]
        check("one row per cache, in order", [r["kv_cache"] for r in rows] == ["float", "e4m3", "e4m3-static"],
              str([r.get("kv_cache") for r in rows]))
        check("labels name the cache", all(r["scheme"].endswith(" + " + r["kv_cache"] + " KV") for r in rows),
              str([r["scheme"] for r in rows]))
        check("the float row is the run without --kv-cache", rows[0]["kl_mean"] == base[0]["kl_mean"] and
              rows[0]["top1"] == base[0]["top1"], f"{rows[0]['kl_mean']} vs {base[0]['kl_mean']}")
        check("the E4M3 caches change the model", all(r["kl_mean"] != rows[0]["kl_mean"] for r in rows[1:]),
              str([r["kl_mean"] for r in rows]))

    def refused(name, pattern, *args):
        r = run(llmq, *args)
        check(f"{name} (exit {r.returncode})", r.returncode == 2 and pattern in r.stderr, r.stderr[-300:])

    refused("an unknown cache", "--kv-cache: 'e5m2'", *common, "--kv-cache", "e5m2")
    refused("an E4M3 cache on the GPU", "--kv-cache e4m3: the CPU reference's cache", *common, "--device", "cuda",
            "--kv-cache", "e4m3")
    with tempfile.TemporaryDirectory() as d:
        stats = os.path.join(d, "old.json")
        with open(stats, "w") as f:
            json.dump({"format": "llmq-calibration-v1", "linears": {}}, f)
        refused("statistics without the KV cache", "holds no KV cache statistics", *common, "--stats", stats,
                "--kv-cache", "e4m3-static")
    print(f"eval_kv_cache_cli: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
