#!/usr/bin/env python3
"""PyTorch peers for llmq's MoE grouped-GEMM benchmark: one grouped GEMM, the expert up-projection
of an MoE layer, y[rows of expert e] = x_perm[rows of e] @ W[e]^T, timed on the same device as
llmq's kernels. Peers: torch._scaled_grouped_mm (FP8 e4m3, row-wise activation scales x
per-(expert, channel) weight scales, BF16 out; promoting to FP32 as by default, and with
use_fast_accum=True), torch._grouped_mm (BF16), a per-expert loop of
torch.mm (BF16, host-known group sizes), and a 1 GiB device-to-device copy (bandwidth ceiling).

Routing is deterministic round-robin, identical to the C++ bench: token t goes to experts
(t*top_k + s) % E for s in 0..top_k-1; rows are grouped expert-major, offs = int32 cumulative group
ends (length E), P = T*top_k rows. Shapes: mixtral-8x7b (E 8, top_k 2, K 4096, N 14336) and
gpt-oss-20b (E 32, top_k 4, K 2880, N 2880) and qwen3-30b-a3b (E 128, top_k 8, K 2048, N 1536).

Method: random normal data, 1% of K columns of x scaled by 20 (outliers), no zeros;
FP8 operands quantized with absmax/448 scales; warm-up 5, then 30 timed runs (10 with --quick),
CUDA events, median; the weights rotate through 2..4 distinct sets so that the active experts'
bytes over all sets exceed 2x L2. --check compares _scaled_grouped_mm (and _grouped_mm) against a
float reference for the smallest token counts (relative Frobenius error). JSON lines to --json.

usage: torch_moe_peers.py [--shape all|mixtral-8x7b|gpt-oss-20b|qwen3-30b-a3b] [--tokens 1,4,16,64,512,4096]
                          [--json FILE] [--quick] [--check]"""
import argparse
import json
import sys

import torch

from torch_peers import median_ms  # same method as the dense peers

L2_BYTES = 50 << 20
MAX_SETS = 4
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
SHAPES = {"mixtral-8x7b": dict(experts=8, top_k=2, k=4096, n=14336),
          "gpt-oss-20b": dict(experts=32, top_k=4, k=2880, n=2880),
          "qwen3-30b-a3b": dict(experts=128, top_k=8, k=2048, n=1536)}
PEERS = ["torch_scaled_grouped_mm_fp8", "torch_scaled_grouped_mm_fp8_fast", "torch_grouped_mm_bf16",
         "bf16_per_expert_loop"]


def group_sizes(tokens, experts, top_k):
    """Rows per expert under round-robin routing: (t*top_k + s) % E for s < top_k."""
    counts = [0] * experts
    for t in range(tokens):
        for s in range(top_k):
            counts[(t * top_k + s) % experts] += 1
    return counts


def sets_needed(active_bytes):
    return max(2, min(MAX_SETS, (2 * L2_BYTES) // max(active_bytes, 1) + 1))


def make_weights(e_, n, k, nsets):
    """nsets of (bf16 [E,N,K], fp8 [E,N,K], fp32 scales [E,N]); FP8 = per-(expert, channel) absmax/448."""
    out = []
    for _ in range(nsets):
        w16 = torch.empty(e_, n, k, device="cuda", dtype=BF16)
        w8 = torch.empty(e_, n, k, device="cuda", dtype=FP8)
        sb = torch.empty(e_, n, device="cuda", dtype=torch.float32)
        for e in range(e_):
            w = torch.randn(n, k, device="cuda")
            w = torch.where(w == 0, torch.full_like(w, 1e-3), w)
            w16[e].copy_(w)
            s = w.abs().amax(dim=1).clamp(min=1e-12) / 448.0
            w8[e].copy_((w / s[:, None]).clamp(-448.0, 448.0).to(FP8))
            sb[e].copy_(s)
            del w
        out.append((w16, w8, sb))
    return out


def make_acts(p, k):
    """x [P,K] bf16 with 1% outlier columns (x20), and its FP8 form with per-row absmax/448 scales."""
    x = torch.randn(p, k, device="cuda")
    x = torch.where(x == 0, torch.full_like(x, 1e-3), x)
    g = torch.Generator(device="cpu").manual_seed(7)
    cols = torch.randperm(k, generator=g)[:max(1, k // 100)].cuda()
    x[:, cols] *= 20.0
    x16 = x.to(BF16)
    sa = x16.float().abs().amax(dim=1).clamp(min=1e-12) / 448.0
    a8 = (x16.float() / sa[:, None]).clamp(-448.0, 448.0).to(FP8)
    return x16, a8, sa.contiguous()


# Call forms of torch._scaled_grouped_mm, tried in order; the first that works is kept and reused.
SGM_FORMS = [
    ("keywords", lambda a, b, sa, sb, offs: torch._scaled_grouped_mm(a, b, scale_a=sa, scale_b=sb, offs=offs,
                                                                     out_dtype=BF16)),
    ("positional_scales", lambda a, b, sa, sb, offs: torch._scaled_grouped_mm(a, b, sa, sb, offs=offs,
                                                                              out_dtype=BF16)),
    ("positional_all", lambda a, b, sa, sb, offs: torch._scaled_grouped_mm(a, b, sa, sb, offs, None, None, BF16)),
]
SGM_VARIANT = {}  # "name", "fn" of the form that worked


def scaled_grouped_mm(a, b, sa, sb, offs):
    fn = SGM_VARIANT.get("fn")
    if fn is not None:
        return fn(a, b, sa, sb, offs)
    errors = []
    for name, f in SGM_FORMS:
        try:
            y = f(a, b, sa, sb, offs)
            torch.cuda.synchronize()
            SGM_VARIANT.update(name=name, fn=f)
            return y
        except (TypeError, ValueError, RuntimeError) as e:
            errors.append(f"{name}: {str(e)[:160]}")
    raise RuntimeError(" | ".join(errors))


def scaled_grouped_mm_fast(a, b, sa, sb, offs):
    """The same GEMM accumulated in the tensor core over all of K (CUTLASS's FP8FastAccum schedules):
    the peer of llmq's MoeGroupedGemm::fast_accumulation."""
    return torch._scaled_grouped_mm(a, b, scale_a=sa, scale_b=sb, offs=offs, out_dtype=BF16, use_fast_accum=True)


def rel_fro(y, ref):
    return ((y.float() - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def check_rows(emit, shape, T, counts, a8, sa, x16, w16, w8, sb, b8, b16, offs):
    """Float references per expert from the dequantized FP8 (resp. BF16) operands."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ref8 = torch.zeros(a8.shape[0], w8.shape[1], device="cuda")
    ref16 = torch.zeros_like(ref8)
    r0 = 0
    for e, c in enumerate(counts):
        if c:
            ref8[r0:r0 + c] = (a8[r0:r0 + c].float() * sa[r0:r0 + c, None]) @ (w8[e].float() * sb[e][:, None]).t()
            ref16[r0:r0 + c] = x16[r0:r0 + c].float() @ w16[e].float().t()
            r0 += c
    for peer, fn, ref in [("torch_scaled_grouped_mm_fp8", lambda: scaled_grouped_mm(a8, b8, sa, sb, offs), ref8),
                          ("torch_grouped_mm_bf16", lambda: torch._grouped_mm(x16, b16, offs=offs), ref16)]:
        try:
            emit(bench="moe_grouped_check", peer=peer, shape=shape, tokens=T, rel_fro_err=rel_fro(fn(), ref))
        except Exception as ex:
            emit(bench="moe_grouped_check", peer=peer, shape=shape, tokens=T, error=str(ex)[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="all", choices=["all"] + list(SHAPES))
    ap.add_argument("--tokens", default="1,4,16,64,512,4096")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    iters = 10 if args.quick else 30
    dev = torch.cuda.get_device_name()
    torch.manual_seed(0)
    rows, table = [], {}
    copy_line = "copy: error"

    def emit(**r):
        r["device"] = dev
        rows.append(r)
        print(json.dumps(r), flush=True)

    # Bandwidth ceiling: copy of 1 GiB (bytes read + bytes written).
    try:
        nbytes = 1 << 30
        bufs = [(torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
                 torch.empty(nbytes, dtype=torch.uint8, device="cuda")) for _ in range(2)]
        ms = median_ms(lambda a, b: b.copy_(a), bufs, iters=iters)
        emit(bench="moe_grouped_peer", peer="copy", bytes=2 * nbytes, us=ms * 1e3, gbps=2 * nbytes / ms / 1e6)
        copy_line = f"copy 1 GiB: {2 * nbytes / ms / 1e6:.0f} GB/s (read + write)"
        del bufs
    except Exception as ex:
        emit(bench="moe_grouped_peer", peer="copy", error=str(ex)[:300])

    names = list(SHAPES) if args.shape == "all" else [args.shape]
    for shape in names:
        E, top_k, K, N = (SHAPES[shape][f] for f in ("experts", "top_k", "k", "n"))
        plans = {T: group_sizes(T, E, top_k) for T in tokens}
        min_active = min(sum(1 for c in cs if c) for cs in plans.values())
        nsets = sets_needed(min_active * N * K)  # FP8 bytes of the fewest active experts: the worst case
        torch.manual_seed(1)
        wsets = make_weights(E, N, K, nsets)
        b16_sets = [w16.transpose(1, 2) for (w16, _, _) in wsets]  # [E,K,N], column-major per expert
        b8_sets = [(w8.transpose(1, 2), sb) for (_, w8, sb) in wsets]
        for T in tokens:
            counts = plans[T]
            P = T * top_k
            active = sum(1 for c in counts if c)
            ends, acc = [], 0
            for c in counts:
                acc += c
                ends.append(acc)
            offs = torch.tensor(ends, device="cuda", dtype=torch.int32)
            x16, a8, sa = make_acts(P, K)
            y = torch.empty(P, N, device="cuda", dtype=BF16)
            flops = 2 * P * N * K
            common = dict(bench="moe_grouped_peer", shape=shape, experts=E, top_k=top_k, k=K, n=N, tokens=T,
                          rows=P, active_experts=active)
            if args.check and T in sorted(tokens)[:2]:
                w16, w8, sb = wsets[0]
                check_rows(emit, shape, T, counts, a8, sa, x16, w16, w8, sb, b8_sets[0][0], b16_sets[0], offs)

            def loop(b16):
                r0 = 0
                for e, c in enumerate(counts):
                    if c:
                        torch.mm(x16[r0:r0 + c], b16[e], out=y[r0:r0 + c])
                        r0 += c

            peers = [
                ("torch_scaled_grouped_mm_fp8", 1, lambda b, sb: scaled_grouped_mm(a8, b, sa, sb, offs),
                 b8_sets[:sets_needed(active * N * K)]),
                ("torch_scaled_grouped_mm_fp8_fast", 1, lambda b, sb: scaled_grouped_mm_fast(a8, b, sa, sb, offs),
                 b8_sets[:sets_needed(active * N * K)]),
                ("torch_grouped_mm_bf16", 2, lambda b: torch._grouped_mm(x16, b, offs=offs),
                 [(b,) for b in b16_sets[:sets_needed(active * N * K * 2)]]),
                ("bf16_per_expert_loop", 2, loop, [(b,) for b in b16_sets[:sets_needed(active * N * K * 2)]]),
            ]
            for peer, wbytes, fn, sets in peers:
                try:
                    ms = median_ms(fn, sets, iters=iters)
                    wb = active * N * K * wbytes
                    extra = {"call": SGM_VARIANT.get("name")} if peer == "torch_scaled_grouped_mm_fp8" else {}
                    emit(peer=peer, **common, us=ms * 1e3, weight_bytes_active=wb, gbps_weights=wb / ms / 1e6,
                         tflops=flops / ms / 1e9, weight_sets=len(sets), **extra)
                    table.setdefault((shape, T), {})[peer] = f"{ms * 1e3:.1f}"
                except Exception as ex:
                    emit(peer=peer, **common, error=str(ex)[:300])
                    table.setdefault((shape, T), {})[peer] = "error"
        del wsets, b16_sets, b8_sets
        torch.cuda.empty_cache()

    print(f"\n{dev}: MoE up-projection grouped GEMM, median us; {copy_line}")
    print(f"{'shape':>13} | {'tokens':>6} | " + " | ".join(f"{p:>27}" for p in PEERS))
    for (shape, T), r in table.items():
        print(f"{shape:>13} | {T:>6} | " + " | ".join(f"{r.get(p, '-'):>27}" for p in PEERS))
    if SGM_VARIANT:
        print(f"torch._scaled_grouped_mm call form: {SGM_VARIANT['name']}")

    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
