#!/usr/bin/env python3
"""End-to-end PyTorch peers of llmq's GPU runtime: a model of real shapes (random seeded weights, BF16,
built directly on the GPU with transformers' own model class) of each family llmq runs:
  Llama      llama3-8b, tiny                      LlamaForCausalLM, llama3 rope
  Mixtral    mixtral-8x7b, tiny-moe               MixtralForCausalLM, top-2 of 8, theta 1e6
  Qwen3      qwen3-8b, qwen3-32b, tiny-qwen3       Qwen3ForCausalLM, head_dim 128, q/k norms, theta 1e6
  Qwen3-MoE  qwen3-30b-a3b, tiny-qwen3-moe         Qwen3MoeForCausalLM, top-8 of 128 (renormalised)
  gpt-oss    gpt-oss-20b, gpt-oss-120b, tiny-gpt-oss   GptOssForCausalLM: top-4 of 32 / 128 experts with
             biases, attention sinks and biases, sliding window 128 on alternate layers, YaRN rope
(configs checked after construction, see torch_e2e_model.py), run three ways:

  eager-bf16    transformers' eager forward with a DynamicCache (what model.generate does by default)
  compile-bf16  the gpt-fast recipe: StaticCache, decode step torch.compile'd (fullgraph, dynamic=False)
                and captured by hand in one CUDA graph (the step's token/position updates included)
  compile-fp8   the same, with every nn.Linear of the decoder layers replaced by FP8 (e4m3) weights with
                per-output-channel scales and per-token activation scales, torch._scaled_mm row-wise;
                lm_head and the embeddings stay BF16

Attention: SDPA, except gpt-oss: transformers has no SDPA path that applies its sinks, so eager
(--attn-impl flex_attention to try that); the rows say which. Sliding windows come from transformers' own
caches (StaticSlidingWindowLayer / DynamicSlidingWindowLayer keep 128 tokens; the decode rows list the
cache's layers). Those 5.x layers branch on a Python int counter, so for gpt-oss the decode step is compiled
with dynamic=None (one recompile makes the counter symbolic; "dynamic": "auto") and at least 3 warm-up calls;
a replayed CUDA graph runs no Python, so the sliding layers' mask offset stays where it was at capture
("sliding_mask_offset_frozen": the work per step is the same, up to --steps of the 128 window slots are
masked by the end) and positions are checked on a full-attention layer.

MoE models: eager-bf16 and compile-bf16 run as above, with transformers' own MoE block (router + experts)
and its default experts implementation ("grouped_mm" in transformers 5.x where the experts support it;
--experts-impl overrides it; the rows name the experts class). If torch.compile(fullgraph=True) fails the
step is compiled with fullgraph=False and the rows say "fullgraph": false; if the CUDA graph of the step
cannot be captured the decode rows are reported as skipped with the capture error. compile-fp8 is skipped
for MoE when the experts are fused 3-D parameters (transformers 5.x: gate_up_proj / down_proj per layer,
gpt-oss with their biases), since this peer only replaces nn.Linear; with per-expert nn.Linear experts
(transformers 4.x) they are quantized like the rest, the router stays BF16. Random weights give a
near-uniform routing. A model whose BF16 weights (counted from the config: gpt-oss-120b ~234 GB) do not
fit the free GPU memory is reported as skipped ("does not fit") without allocating anything; the first
info row still carries its parameter counts, checked against a build on the meta device.

Measured (JSON lines to --json, one object per measurement, a table on stdout at the end):
  decode   batch x context: the cache is filled by a (chunked, untimed) prefill of `context` random
           tokens, then --steps greedy steps (argmax fed back on the device) are timed one by one with
           CUDA events: median and p90 ms per step, tokens/s = batch / median.
  prefill  batch 1: time to first token (forward over the prompt, lm_head on the last token only,
           argmax), median of several runs; MFU = 2 * params_without_embeddings * tokens / time / peak
           (plus lm_head for one token), and a second figure that adds causal attention FLOPs
           (4 * q_dim per query-key pair: seq^2 / 2 pairs per full layer, the window's on sliding layers).
           For MoE models the parameter count is the active one per token: non-expert parameters
           (attention incl. biases / sinks / q-k norms, router, norms) + top_k/num_experts of the expert
           parameters incl. their biases (active_params_without_embeddings). Compiled peers prefill
           eagerly unless --compile-prefill.
  memory   torch.cuda.max_memory_allocated over each peer's measurements.
Compile time and CUDA-graph capture are outside the timed region and reported separately. Decode
combinations that do not fit are reported as skipped (out of memory) with the KV-cache bytes.

usage: torch_e2e_peers.py [--model NAME] [--peer P [--peer P ...]] [--quick] [--json FILE] [--time-budget S]
                         [--experts-impl eager|grouped_mm|batched_mm] [--attn-impl eager|sdpa|flex_attention]"""
import argparse
import contextlib
import datetime
import gc
import json
import math
import statistics
import sys
import time

import torch

from torch_e2e_model import (FUSED_EXPERTS_REASON, NO_SINKS_REASON, GiB, SHAPES, T0, Skip, attention_flops,
                             build_model, cache_layout, cfg_is_moe, compile_fn, default_attn, drop_compiled_act_quant,
                             fill, flops_params, fused_expert_params, get_base, is_fatal, is_oom, log, make_config, make_forward,
                             meta_facts, new_dynamic_cache, new_static_cache, param_counts, param_numel, quantize_fp8,
                             reset_static_cache, seq_seen, shape_fields, sliding_layers, tensor_bytes,
                             weights_bytes_bf16)
from torch_e2e_model import kv_cache_bytes as kv_bytes

PEERS = ("eager-bf16", "compile-bf16", "compile-fp8")
NO_FIT = "does not fit (BF16 weights estimated from the config; nothing allocated)"


def decode_len(ctx, args):
    return -(-(ctx + args.warmup + args.steps + 16) // 16) * 16


def timed(step, n):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        s.record()
        step()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def p90(xs):
    return sorted(xs)[max(0, math.ceil(0.9 * len(xs)) - 1)]


# ---------------------------------------------------------------- measurements
def measure_decode(P, B, ctx, args):
    cfg, W = P["cfg"], args.warmup
    if P.get("compile_failed"):
        raise Skip("compile failed earlier", compile_error=P["compile_failed"])
    if P.get("capture_failed"):
        raise Skip("CUDA graph capture failed earlier", capture_error=P["capture_failed"])
    max_len = decode_len(ctx, args)
    need, free = kv_bytes(cfg, B, max_len), torch.cuda.mem_get_info()[0]
    if need + 3 * GiB > free:
        raise Skip("out of memory (estimated)", kv_cache_bytes=need, free_bytes=free)
    torch.manual_seed(args.seed + 1000 * B + ctx)
    ids = torch.randint(0, cfg.vocab_size, (B, ctx), device="cuda")
    cache = new_static_cache(cfg, B, max_len) if P["static"] else new_dynamic_cache(cfg)
    t = time.perf_counter()
    tok = fill(P["fwd"], ids, cache, max(1, min(ctx, args.fill_tokens // B))).clone()
    torch.cuda.synchronize()
    row = dict(kv_cache_bytes=need, cache_len=max_len if P["static"] else None, fill_s=time.perf_counter() - t,
               cuda_graph="none", compile_s=None, capture_s=None, **cache_layout(cache))
    pos = torch.full((B, 1), ctx, dtype=torch.long, device="cuda")
    cpos = torch.full((1,), ctx, dtype=torch.long, device="cuda")
    fn = P["fwd"]
    trees = args.compile_mode == "reduce-overhead"

    def one():
        if trees:
            torch.compiler.cudagraph_mark_step_begin()
        nxt = fn(tok, pos, cpos, cache)
        tok.copy_(nxt)
        pos.add_(1)
        cpos.add_(1)

    graph = None
    if P["compiled"]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with contextlib.nullcontext() if trees else torch.cuda.stream(side):  # capture wants a side-stream warm-up
            err = None
            # sliding layers (5.x): the cache branches on a Python int counter; dynamic=None lets dynamo make it
            # symbolic after one recompile (dynamic=False would recompile on every step)
            dyn = None if P["sliding"] else False
            for fullgraph in (True, False):
                fn = compile_fn(P["fwd"], args.compile_mode, fullgraph, dynamic=dyn)
                try:
                    t = time.perf_counter()
                    one()  # compiles
                    torch.cuda.synchronize()
                    row.update(compile_s=time.perf_counter() - t, fullgraph=fullgraph,
                               dynamic="auto" if dyn is None else dyn)
                    break
                except Exception as e:
                    if is_oom(e) or is_fatal(e):
                        raise
                    err = f"{type(e).__name__}: {str(e)[:600]}"
                    log(f"compile (fullgraph={fullgraph}) failed: {err[:300]}")
                    torch._dynamo.reset()
            else:
                P["compile_failed"] = err
                raise RuntimeError("compile failed: " + err)
            warm = []
            for _ in range(W - 1):  # (sliding layers: the first of these recompiles)
                t = time.perf_counter()
                one()
                torch.cuda.synchronize()
                warm.append(round(time.perf_counter() - t, 3))
            row["warmup_call_s"] = warm
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if trees:
            row["cuda_graph"] = "cudagraph-trees"
        else:
            graph = torch.cuda.CUDAGraph()
            t = time.perf_counter()
            try:
                with torch.cuda.graph(graph):
                    one()  # recorded, not run: one replay = one decode step incl. the tok/pos updates
                torch.cuda.synchronize()
                row.update(cuda_graph="manual", capture_s=time.perf_counter() - t)
                if row.get("sliding_python_counter"):  # replays do not run Python: the sliding mask offset stays
                    row["sliding_mask_offset_frozen"] = True  # at capture (same work per step; see the docstring)
            except Exception as e:  # e.g. a host sync left in the step: time it compiled, without a graph
                if is_oom(e) or is_fatal(e):
                    raise
                graph = None
                row.update(cuda_graph="none (capture failed)", capture_error=f"{type(e).__name__}: {str(e)[:400]}")
                log("CUDA graph capture failed: " + row["capture_error"][:300])
                torch.cuda.synchronize()
                if P.get("moe"):  # MoE: reported as skipped (with why), not timed without a graph
                    P["capture_failed"] = row["capture_error"]
                    raise Skip("CUDA graph capture failed", capture_error=row["capture_error"],
                               compile_s=row["compile_s"], fullgraph=row.get("fullgraph"), kv_cache_bytes=need)
    else:
        for _ in range(W):
            one()
    torch.cuda.synchronize()
    times = timed(graph.replay if graph is not None else one, args.steps)
    med = statistics.median(times)
    final = ctx + W + args.steps
    seen = seq_seen(cache)
    row.update(steps=args.steps, warmup_calls=W, median_ms=med, p90_ms=p90(times), mean_ms=statistics.mean(times),
               min_ms=min(times), tokens_per_s=B / (med / 1e3), final_position=int(pos[0, 0]),
               positions_ok=int(pos[0, 0]) == final and int(seen) == final)
    return row


def measure_prefill(P, L, args):
    cfg = P["cfg"]
    torch.manual_seed(args.seed + L)
    ids = torch.randint(0, cfg.vocab_size, (1, L), device="cuda")
    cpos = torch.arange(L, device="cuda")
    pos = cpos.unsqueeze(0)
    fn, reuse, row = P["fwd"], None, dict(prefill_mode="eager", compile_s=None)
    cache_len = L + args.steps + 16
    if P["compiled"] and args.compile_prefill:
        fn = compile_fn(P["fwd"], "default", fullgraph=False)
        reuse = new_static_cache(cfg, 1, cache_len)  # compiled code guards on the cache's addresses
        row["prefill_mode"] = "compiled (dynamic=False per length)"

    def run():
        if reuse is not None:
            reset_static_cache(reuse)
        cache = reuse if reuse is not None else (
            new_static_cache(cfg, 1, cache_len) if P["static"] else new_dynamic_cache(cfg))
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(ids, pos, cpos, cache)
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e)

    if reuse is not None:
        t = time.perf_counter()
        run()
        row["compile_s"] = time.perf_counter() - t
    for _ in range(args.prefill_warmup):
        run()
    times = [run() for _ in range(args.prefill_runs)]
    med = statistics.median(times)
    flops = 2 * flops_params(P["counts"]) * L + 2 * P["counts"]["lm_head_params"]  # MoE: active parameters
    attn = attention_flops(cfg, L)
    peak = P["peak_flops"]
    row.update(batch=1, runs=len(times), ttft_ms=med, ttft_p90_ms=p90(times), min_ms=min(times),
               tokens_per_s=L / (med / 1e3), flops_linear=flops, flops_attention=attn, peak_flops=peak,
               static_cache_len=cache_len if P["static"] else None,
               mfu=flops / (med / 1e3) / peak if peak else None,
               mfu_with_attention=(flops + attn) / (med / 1e3) / peak if peak else None)
    if P.get("moe"):
        row["flops_params"] = flops_params(P["counts"])
    return row


def peak_flops(device, fp8):
    if "H100" in device or "H200" in device or "GH200" in device:
        if "PCIe" in device:
            return 1513e12 if fp8 else 756e12
        return 1979e12 if fp8 else 989e12  # SXM dense
    return None


# ---------------------------------------------------------------- driver
def run_peer(peer, args, cfg, rope, emit, deadline, share_end, grad_ctx):
    plan = [("prefill", dict(prompt_len=L)) for L in args.prefill] + \
           [("decode", dict(batch=b, context=c)) for b in args.decode_batches for c in args.contexts]
    if time.time() >= deadline:
        for kind, params in plan:
            emit(peer=peer, kind=kind, skipped="time budget", **params)
        return True
    moe = cfg_is_moe(cfg)
    counts = param_counts(cfg)
    need = weights_bytes_bf16(counts)
    free = torch.cuda.mem_get_info()[0]
    if need + 2 * GiB > free:  # BF16 weights alone do not fit: say so, from the config, before allocating
        emit(peer=peer, kind="info", skipped=NO_FIT, weights_bytes=need, free_bytes=free)
        for kind, params in plan:
            emit(peer=peer, kind=kind, skipped=NO_FIT, weights_bytes=need, **params)
        return True
    if moe and peer == "compile-fp8":
        fused = fused_expert_params(cfg)
        if fused:
            emit(peer=peer, kind="info", skipped=FUSED_EXPERTS_REASON, fused_expert_params=fused)
            for kind, params in plan:
                emit(peer=peer, kind=kind, skipped=FUSED_EXPERTS_REASON, **params)
            return True
    log(f"{peer}: building {args.model} (BF16 weights {need / GiB:.1f} GiB, free {free / GiB:.1f} GiB)")
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model = build_model(cfg, args.seed, args.experts_impl, args.attn_impl)
    torch.cuda.synchronize()
    build_s, quant_s, n_fp8 = time.perf_counter() - t, None, 0
    if peer == "compile-fp8":
        t = time.perf_counter()
        n_fp8 = quantize_fp8(model)
        torch.cuda.synchronize()
        quant_s = time.perf_counter() - t
    fwd, pass_cpos = make_forward(model)
    compiled = peer != "eager-bf16"
    peak = (args.peak_fp8 or peak_flops(emit.device, True)) if peer == "compile-fp8" else \
        (args.peak_bf16 or peak_flops(emit.device, False))
    P = dict(cfg=cfg, fwd=fwd, static=compiled, compiled=compiled, counts=counts, peak_flops=peak, moe=moe,
             sliding=bool(sliding_layers(cfg)))
    numel = param_numel(model) if peer != "compile-fp8" else None  # the formula checked against the model built
    moe_info = dict(params_total=numel, params_formula=need // 2,
                    param_count_ok=None if numel is None else numel == need // 2)
    if moe:  # the experts implementation in use
        experts = getattr(getattr(get_base(model).layers[0], "mlp", None), "experts", None)
        moe_info.update(experts_implementation=getattr(model.config, "_experts_implementation", None),
                        experts_class=type(experts).__name__ if experts is not None else None)
    emit(peer=peer, kind="info", build_s=build_s, quantize_s=quant_s, fp8_linears=n_fp8, **moe_info,
         weights_bytes=tensor_bytes(model), attn_implementation=getattr(model.config, "_attn_implementation", None),
         rope=rope, cache="static" if compiled else "dynamic", pass_cache_position=pass_cpos,
         compile_mode=args.compile_mode if compiled else None, grad_mode=args.grad_mode,
         prefill_mode="compiled" if compiled and args.compile_prefill else "eager",
         peak_flops=P["peak_flops"], **{**P["counts"], **shape_fields(cfg, rope, args.model)})
    build_peak, peer_peak, fatal, first = torch.cuda.max_memory_allocated(), 0, False, True
    for kind, params in plan:
        now = time.time()
        if fatal or now >= deadline or (now >= share_end and not first):
            emit(peer=peer, kind=kind, skipped="earlier fatal CUDA error" if fatal else "time budget", **params)
            continue
        first = False
        log(f"{peer}: {kind} " + " ".join(f"{k}={v}" for k, v in params.items()))
        if compiled and kind == "decode":
            torch._dynamo.reset()  # a fresh compile per (batch, context): shapes and cache addresses differ
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            with grad_ctx():
                if kind == "decode":
                    res = measure_decode(P, params["batch"], params["context"], args)
                else:
                    res = measure_prefill(P, params["prompt_len"], args)
            res["peak_bytes"] = torch.cuda.max_memory_allocated()
            emit(peer=peer, kind=kind, **params, **res)
        except Skip as s:
            emit(peer=peer, kind=kind, skipped=s.reason, **params, **s.fields)
        except Exception as e:
            msg = f"{type(e).__name__}: {str(e)[:800]}"
            extra = dict(kv_cache_bytes=kv_bytes(cfg, params["batch"], decode_len(params["context"], args))) \
                if kind == "decode" else {}
            if is_oom(e):
                emit(peer=peer, kind=kind, skipped="out of memory", error=msg, **params, **extra)
            else:
                fatal = is_fatal(e)
                emit(peer=peer, kind=kind, error=msg, **params, **extra)
        peer_peak = max(peer_peak, torch.cuda.max_memory_allocated())
    emit(peer=peer, kind="memory", peak_bytes=peer_peak, build_peak_bytes=build_peak, weights_bytes=tensor_bytes(model))
    del model, fwd, P
    drop_compiled_act_quant()
    cleanup()
    return not fatal


def cleanup():  # between peers: free the model, compiled graphs and cached blocks
    try:
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    except Exception as e:
        log(f"cleanup failed: {type(e).__name__}: {str(e)[:200]}")


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def table(rows):
    print(f"\n{'peer':13} {'kind':8} {'shape':18} {'median ms':>10} {'p90 ms':>8} {'tok/s':>10}  notes", flush=True)
    for r in rows:
        if r["kind"] == "info" and not (r.get("skipped") or r.get("error")):
            continue
        shape = (f"b={r['batch']} ctx={r['context']}" if r["kind"] == "decode" else
                 f"L={r['prompt_len']}" if r["kind"] == "prefill" else "")
        if r.get("skipped") or r.get("error"):
            print(f"{str(r['peer']):13} {r['kind']:8} {shape:18} {(r.get('skipped') or r.get('error'))[:90]}", flush=True)
        elif r["kind"] == "memory":
            print(f"{r['peer']:13} {'memory':8} {'':18} peak {r['peak_bytes'] / GiB:.2f} GiB, "
                  f"weights {r['weights_bytes'] / GiB:.2f} GiB", flush=True)
        elif r["kind"] == "decode":
            note = f"compile {r['compile_s']:.0f}s, graph {r['cuda_graph']}" if r.get("compile_s") else ""
            note += ", fullgraph=False" if r.get("fullgraph") is False else ""
            note += "" if r.get("positions_ok") else " POSITIONS MISMATCH"
            print(f"{r['peer']:13} decode   {shape:18} {r['median_ms']:10.3f} {r['p90_ms']:8.3f} "
                  f"{r['tokens_per_s']:10.1f}  {note}", flush=True)
        else:
            mfu = f"MFU {100 * r['mfu']:.1f}% (+attn {100 * r['mfu_with_attention']:.1f}%)" if r.get("mfu") else ""
            print(f"{r['peer']:13} prefill  {shape:18} {r['ttft_ms']:10.3f} {r['ttft_p90_ms']:8.3f} "
                  f"{r['tokens_per_s']:10.1f}  TTFT, {r['prefill_mode']}, {mfu}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--peer", action="append", choices=("all",) + PEERS, default=None,
                    help="repeatable (--peer eager-bf16 --peer compile-bf16); default all")
    ap.add_argument("--decode-batches", type=ints, default=[1, 8, 64])
    ap.add_argument("--contexts", type=ints, default=[512, 8192])
    ap.add_argument("--prefill", type=ints, default=[512, 2048, 8192])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5, help="decode calls before timing (the compile call included)")
    ap.add_argument("--prefill-runs", type=int, default=5)
    ap.add_argument("--prefill-warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="batch 1, context 512, prefill 2048, 32 steps")
    ap.add_argument("--json", default=None)
    ap.add_argument("--time-budget", type=float, default=480.0)
    ap.add_argument("--compile-mode", default="default",
                    choices=("default", "max-autotune-no-cudagraphs", "reduce-overhead"),
                    help="decode step compile mode; all but reduce-overhead get a hand-captured CUDA graph")
    ap.add_argument("--compile-prefill", action="store_true", help="compile prefill too (one compile per length)")
    ap.add_argument("--grad-mode", choices=("inference", "no_grad"), default="inference")
    ap.add_argument("--fill-tokens", type=int, default=16384, help="tokens per chunk of the untimed cache fill")
    ap.add_argument("--peak-bf16", type=float, default=None)
    ap.add_argument("--peak-fp8", type=float, default=None)
    ap.add_argument("--experts-impl", default=None,
                    help="MoE models: transformers experts implementation (eager, grouped_mm, batched_mm); "
                         "default: transformers' own default (grouped_mm in 5.x)")
    ap.add_argument("--attn-impl", default=None, choices=("eager", "sdpa", "flex_attention"),
                    help="transformers attention implementation; default sdpa, gpt-oss eager (its sinks: no sdpa)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.decode_batches, args.contexts, args.prefill, args.steps = [1], [512], [2048], 32
        args.prefill_runs, args.prefill_warmup, args.warmup = 3, 1, 3
    args.warmup, args.prefill_warmup = max(args.warmup, 2), max(args.prefill_warmup, 1)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    import transformers
    transformers.logging.set_verbosity_error()
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    torch.manual_seed(args.seed)
    device = torch.cuda.get_device_name()
    meta = dict(model=args.model, device=device, torch=torch.__version__, transformers=transformers.__version__)
    out = open(args.json, "w") if args.json else None
    rows = []

    def emit(**r):
        r = dict(r, **meta, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        rows.append(r)
        line = json.dumps(r, default=str)
        if out:
            out.write(line + "\n")
            out.flush()
        else:
            print(line, flush=True)
        if r["kind"] in ("decode", "prefill"):
            brief = r.get("skipped") or r.get("error") or (
                f"{r['median_ms']:.3f} ms/step, {r['tokens_per_s']:.1f} tok/s" if r["kind"] == "decode"
                else f"TTFT {r['ttft_ms']:.2f} ms, {r['tokens_per_s']:.0f} tok/s")
            log(f"  -> {brief[:200]}")
    emit.device = device

    try:
        cfg, rope = make_config(args.model)
    except Exception as e:
        emit(peer=None, kind="info", error=f"config: {type(e).__name__}: {str(e)[:800]}")
        return 1
    if args.attn_impl == "sdpa" and cfg.model_type == "gpt_oss":
        emit(peer=None, kind="info", error=NO_SINKS_REASON)
        return 1
    if sliding_layers(cfg):  # compile call, recompile (the counter made symbolic), then steady calls
        args.warmup = max(args.warmup, 3)
    counts = param_counts(cfg)
    try:  # on the meta device: no memory, so also for a model that does not fit
        facts = meta_facts(cfg)
        facts["param_count_ok"] = facts["params_meta"] == counts["params_without_embeddings"] + \
            counts["embedding_params"] + counts["lm_head_params"]
    except Exception as e:
        facts = dict(meta_error=f"{type(e).__name__}: {str(e)[:400]}")
    emit(peer=None, kind="info", args=vars(args), cuda=torch.version.cuda,
         total_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
         attn_implementation=args.attn_impl or default_attn(cfg), weights_bytes_bf16=weights_bytes_bf16(counts),
         **{**counts, **facts, **shape_fields(cfg, rope, args.model)})
    grad_ctx = torch.inference_mode if args.grad_mode == "inference" else torch.no_grad
    chosen = args.peer or ["all"]
    peers = PEERS if "all" in chosen else tuple(p for p in PEERS if p in chosen)
    deadline = T0 + args.time_budget
    for i, peer in enumerate(peers):
        now = time.time()
        share_end = now + max(0.0, deadline - now) / (len(peers) - i)  # time left split over the peers left
        try:
            ok = run_peer(peer, args, cfg, rope, emit, deadline, share_end, grad_ctx)
        except Exception as e:  # building/quantizing failed: record and go on
            emit(peer=peer, kind="info", error=f"{type(e).__name__}: {str(e)[:800]}")
            ok = not is_fatal(e)
            drop_compiled_act_quant()
            cleanup()
        if not ok:
            for p in peers[i + 1:]:
                emit(peer=p, kind="info", skipped="earlier fatal CUDA error")
            break
    table(rows)
    skipped = [r for r in rows if r.get("skipped")]
    if skipped:
        print(f"skipped {len(skipped)}: " + "; ".join(
            f"{r['peer']} {r['kind']} {r.get('batch', '')}/{r.get('context', r.get('prompt_len', ''))}: {r['skipped']}"
            for r in skipped), flush=True)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
