#!/usr/bin/env python3
"""llmq calibrate's KV line and llmq eval --kv-cache on the built-in default model: each candidate runs once per KV cache of the
CPU reference, in the order given, each row saying its cache; the float row is the run without
--kv-cache, number for number; the E4M3 caches change the numbers; and the misuses are refused with
exit status 2 naming the option (an unknown cache, an E4M3 cache on --device cuda, statistics
without the KV cache for e4m3-static).

usage: eval_kv_cache_cli.py LLMQ"""
import json
import os
import struct
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

    # A --quantized checkpoint that declares KV scales runs e4m3-static with its own: the same
    # checkpoint with its k_scale values scaled by 64 evaluates differently.
    with tempfile.TemporaryDirectory() as d:
        stats, q = os.path.join(d, "stats.json"), os.path.join(d, "q")
        cal = run(llmq, "calibrate", "--model", "default", "--samples", "2", "--length", "24", "-o", stats)
        ok = cal.returncode == 0
        if ok:  # calibrate's KV line names the file's largest |K| and |V| and their layers
            kv = json.load(open(stats))["kv_cache"]
            heads = kv["kv_heads"]
            k_max, v_max = max(kv["k_absmax"]), max(kv["v_absmax"])
            want = (f"KV cache: |K| up to {k_max:.4g} (layer {kv['k_absmax'].index(k_max) // heads}), "
                    f"|V| up to {v_max:.4g} (layer {kv['v_absmax'].index(v_max) // heads})")
            check("calibrate prints the KV cache's largest values", want in cal.stdout, f"want '{want}' in {cal.stdout}")
        ok = ok and run(llmq, "quantize", "--model", "default", "--scheme", "fp8-dynamic", "--stats", stats,
                        "--kv-cache-scales", "-o", q).returncode == 0
        check("calibrate and quantize --kv-cache-scales exit 0", ok)
        if ok:
            ev = ["eval", "--model", "default", "--quantized", q, "--stats", stats, "--samples", "2", "--length", "24",
                  "--json", "--kv-cache", "e4m3-static"]
            first = run(llmq, *ev)
            path = os.path.join(q, "model.safetensors")
            with open(path, "rb") as f:
                blob = bytearray(f.read())
            n = struct.unpack("<Q", blob[:8])[0]
            header = json.loads(blob[8:8 + n])
            for name, info in header.items():
                if name.endswith(".k_scale"):
                    at = 8 + n + info["data_offsets"][0]
                    blob[at:at + 4] = struct.pack("<f", struct.unpack("<f", blob[at:at + 4])[0] * 64.0)
            with open(path, "wb") as f:
                f.write(blob)
            second = run(llmq, *ev)
            ok = first.returncode == 0 and second.returncode == 0
            check("eval --quantized with declared scales exits 0", ok, first.stderr + second.stderr)
            if ok:
                a = json.loads(first.stdout)["results"][0]["kl_mean"]
                b = json.loads(second.stdout)["results"][0]["kl_mean"]
                check("the checkpoint's declared scales are the ones run", a != b, f"{a} == {b}")

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
