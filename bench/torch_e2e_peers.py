#!/usr/bin/env python3
"""End-to-end PyTorch peers of llmq's GPU runtime: a Llama-family model (real shapes, random seeded
weights, BF16, built directly on the GPU with transformers' LlamaForCausalLM and SDPA attention)
or a Mixtral-family MoE model (--model mixtral-8x7b / tiny-moe: transformers' MixtralForCausalLM, same
recipe, top-2 of 8 experts, rope theta 1e6, no llama3 rope scaling) run three ways:

  eager-bf16    transformers' eager forward with a DynamicCache (what model.generate does by default)
  compile-bf16  the gpt-fast recipe: StaticCache, decode step torch.compile'd (fullgraph, dynamic=False)
                and captured by hand in one CUDA graph (the step's token/position updates included)
  compile-fp8   the same, with every nn.Linear of the decoder layers replaced by FP8 (e4m3) weights with
                per-output-channel scales and per-token activation scales, torch._scaled_mm row-wise;
                lm_head and the embeddings stay BF16

MoE models (mixtral-8x7b, tiny-moe): eager-bf16 and compile-bf16 run as above, with transformers' own MoE
block (router + experts) and its default experts implementation ("grouped_mm" in transformers 5.x;
--experts-impl overrides it). If torch.compile(fullgraph=True) fails on the MoE block the step is compiled
with fullgraph=False and the rows say "fullgraph": false; if the CUDA graph of the step cannot be captured
the decode rows are reported as skipped with the capture error (not timed without a graph as for Llama).
compile-fp8 is skipped for MoE when the experts are fused 3-D parameters (transformers 5.x: one
gate_up_proj [E, 2I, H] and one down_proj [E, H, I] per layer), since this peer only replaces nn.Linear;
with per-expert nn.Linear experts (transformers 4.x) they are quantized like the rest, the router stays BF16.
Random weights give a near-uniform routing. Mixtral-8x7B in BF16 is ~93.4 GB (87 GiB) of weights: it is
built directly on the GPU in BF16 (no FP32 copy) and needs an H200-class GPU; each peer builds it anew.

Measured (JSON lines to --json, one object per measurement, a table on stdout at the end):
  decode   batch x context: the cache is filled by a (chunked, untimed) prefill of `context` random
           tokens, then --steps greedy steps (argmax fed back on the device) are timed one by one with
           CUDA events: median and p90 ms per step, tokens/s = batch / median.
  prefill  batch 1: time to first token (forward over the prompt, lm_head on the last token only,
           argmax), median of several runs; MFU = 2 * params_without_embeddings * tokens / time / peak
           (plus lm_head for one token), and a second figure that adds causal attention FLOPs
           (4 * layers * seq^2 * hidden / 2). For MoE models the parameter count is the active one per
           token: non-expert parameters (attention, router, norms) + top_k/num_experts of the expert
           parameters (active_params_without_embeddings). Compiled peers prefill eagerly unless
           --compile-prefill.
  memory   torch.cuda.max_memory_allocated over each peer's measurements.
Compile time and CUDA-graph capture are outside the timed region and reported separately. Decode
combinations that do not fit are reported as skipped (out of memory) with the KV-cache bytes.

usage: torch_e2e_peers.py [--model llama3-8b|tiny|mixtral-8x7b|tiny-moe] [--peer P [--peer P ...]] [--quick]
                         [--json FILE] [--time-budget S] [--experts-impl eager|grouped_mm|batched_mm]"""
import argparse
import contextlib
import copy
import datetime
import gc
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn

PEERS = ("eager-bf16", "compile-bf16", "compile-fp8")
SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=512),
    # MoE (MixtralForCausalLM): default rope with theta 1e6, no llama3 scaling, no sliding window
    "mixtral-8x7b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
                         rope_theta=1e6, max_position_embeddings=32768),
    "tiny-moe": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                     num_key_value_heads=4, vocab_size=512, num_local_experts=8, num_experts_per_tok=2,
                     rope_theta=1e6, max_position_embeddings=32768),
}
ROPE_THETA = 500000.0
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
FP8, FP8_MAX = torch.float8_e4m3fn, 448.0
GiB = 1 << 30
T0 = time.time()
FUSED_EXPERTS_REASON = "fused expert parameters: no FP8 replacement in this peer"


def is_moe(name):
    return "num_local_experts" in SHAPES[name]


def cfg_is_moe(cfg):
    return bool(getattr(cfg, "num_local_experts", None))


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


class Skip(Exception):
    def __init__(self, reason, **fields):
        super().__init__(reason)
        self.reason, self.fields = reason, fields


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


FATAL = ("device-side assert", "illegal memory access", "misaligned address", "unspecified launch failure",
         "illegal instruction", "CUDA error: an illegal")


def is_fatal(e):  # sticky CUDA errors: the context is gone, nothing after this can run
    return any(f in str(e) for f in FATAL)


# ---------------------------------------------------------------- model
def rope_of(cfg):  # 5.x converts either form into `rope_parameters`; 4.x keeps rope_theta + rope_scaling
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return dict(rp)
    return dict(getattr(cfg, "rope_scaling", None) or {}, rope_theta=getattr(cfg, "rope_theta", None))


def make_config(name):
    """LlamaConfig across versions: transformers 5 takes `rope_parameters` (theta inside), 4.x takes
    `rope_theta` + `rope_scaling`. The form taken is checked, not assumed."""
    if is_moe(name):
        return make_moe_config(name)
    import transformers
    from transformers import LlamaConfig
    base = dict(SHAPES[name], max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                attention_bias=False, mlp_bias=False, hidden_act="silu", use_cache=True)
    new_api = "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters or \
        int(transformers.__version__.split(".")[0]) >= 5  # (4.x would keep an unknown kwarg as a plain attribute)
    forms = [dict(rope_parameters=dict(LLAMA3_ROPE, rope_theta=ROPE_THETA))] if new_api else []
    forms.append(dict(rope_theta=ROPE_THETA, rope_scaling=dict(LLAMA3_ROPE)))
    errors = []
    for extra in forms:
        try:
            cfg = LlamaConfig(**base, **extra)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            continue
        r = rope_of(cfg)
        if r.get("rope_theta") == ROPE_THETA and (r.get("rope_type") or r.get("type")) == "llama3":
            try:
                cfg._attn_implementation = "sdpa"
            except Exception:
                pass
            return cfg, r
        errors.append(f"rope not taken: {r}")
    raise RuntimeError("LlamaConfig: " + "; ".join(errors))


def make_moe_config(name):
    """MixtralConfig across versions, as make_config: 5.x takes rope_parameters=dict(rope_type="default",
    rope_theta=...), 4.x takes rope_theta. Checked: theta, default rope (no scaling), the shape fields
    (experts, top-k included) and no sliding window."""
    import transformers
    from transformers import MixtralConfig
    shape = dict(SHAPES[name])
    theta = shape.pop("rope_theta")
    base = dict(shape, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", use_cache=True,
                sliding_window=None, router_jitter_noise=0.0, output_router_logits=False)
    new_api = "rope_parameters" in inspect.signature(MixtralConfig.__init__).parameters or \
        int(transformers.__version__.split(".")[0]) >= 5
    forms = [dict(rope_parameters=dict(rope_type="default", rope_theta=theta))] if new_api else []
    forms.append(dict(rope_theta=theta))
    errors = []
    for extra in forms:
        try:
            cfg = MixtralConfig(**base, **extra)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            continue
        r = rope_of(cfg)
        wrong = {k: getattr(cfg, k, None) for k, v in shape.items() if getattr(cfg, k, None) != v}
        if getattr(cfg, "sliding_window", None) is not None:
            wrong["sliding_window"] = cfg.sliding_window
        if r.get("rope_theta") == theta and (r.get("rope_type") or r.get("type") or "default") == "default" \
                and not wrong:
            try:
                cfg._attn_implementation = "sdpa"
            except Exception:
                pass
            return cfg, r
        errors.append(f"not taken: rope {r}, fields {wrong}")
    raise RuntimeError("MixtralConfig: " + "; ".join(errors))


def shape_fields(cfg, rope, name):  # the SHAPES entry as the config holds it (theta lives in the rope dict)
    return {k: (rope.get("rope_theta") if k == "rope_theta" else getattr(cfg, k, None)) for k in SHAPES[name]}


def model_class(cfg):
    if cfg_is_moe(cfg):
        from transformers import MixtralForCausalLM
        return MixtralForCausalLM
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM


def get_base(model):
    base = getattr(model, "model", None)
    if isinstance(base, nn.Module) and hasattr(base, "layers"):
        return base
    return model.get_decoder() if hasattr(model, "get_decoder") else model.base_model


def build_model(cfg, seed, experts_impl=None):
    """Parameters created on the GPU in BF16 (no CPU init, no FP32 copy), then re-initialised in place with
    a seed: normal(0, 0.02) for matrices (MoE: the router weight [E, H] and the fused 3-D expert tensors
    too), 1 for the RMSNorm weights."""
    cls = model_class(cfg)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"), torch.no_grad():
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("sdpa")
        except Exception:
            pass
    if experts_impl is not None and cfg_is_moe(cfg):
        if not hasattr(model, "set_experts_implementation"):
            raise RuntimeError(f"--experts-impl {experts_impl}: this transformers has no set_experts_implementation")
        model.set_experts_implementation(experts_impl)
        got = getattr(model.config, "_experts_implementation", None)
        if got != experts_impl:
            raise RuntimeError(f"--experts-impl {experts_impl} not taken (model uses {got})")
    model.eval().requires_grad_(False)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model


def param_counts(cfg):
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * hd
    if not cfg_is_moe(cfg):
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
        return dict(params_without_embeddings=cfg.num_hidden_layers * per_layer + h,
                    embedding_params=cfg.vocab_size * h, lm_head_params=cfg.vocab_size * h)
    # MoE (Mixtral): per layer, every token goes through attention (q, o: h*h each; k, v: h*kv each), the
    # router (E*h) and the two RMSNorms (2h); of the E experts (3*h*i each: gate, up, down) only the top_k
    # selected ones. Active parameters per token = non-expert + top_k/E of the expert parameters; that
    # count (not the total) is what the prefill FLOPs and the MFU figures use: 2 * active * tokens.
    E, k, L = cfg.num_local_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers
    dense = 2 * h * h + 2 * h * kv + E * h + 2 * h
    expert = 3 * h * i
    return dict(params_without_embeddings=L * (dense + E * expert) + h,
                active_params_without_embeddings=L * (dense + k * expert) + h,
                expert_params=L * E * expert, active_expert_params=L * k * expert,
                num_experts=E, experts_per_token=k,
                embedding_params=cfg.vocab_size * h, lm_head_params=cfg.vocab_size * h)


def flops_params(counts):  # parameters one token goes through (MoE: the active ones)
    return counts.get("active_params_without_embeddings", counts["params_without_embeddings"])


def param_numel(model):
    return sum(p.numel() for p in model.parameters())


def fused_expert_params(cfg):
    """Names of the 3-D (all experts in one tensor) parameters of a decoder layer, found on a copy of the
    model built on the meta device (no memory). transformers 5.x Mixtral: mlp.experts.gate_up_proj and
    mlp.experts.down_proj; 4.x: none (one nn.Linear w1/w2/w3 per expert)."""
    try:
        with torch.device("meta"), torch.no_grad():
            m = model_class(cfg)(copy.deepcopy(cfg))
        names = [n for n, p in get_base(m).layers[0].named_parameters() if p.dim() >= 3]
        del m
        return names
    except Exception as e:
        log(f"meta build to inspect the experts failed ({type(e).__name__}: {str(e)[:200]}); by module contents")
        import transformers.models.mixtral.modeling_mixtral as mm
        return ["mlp.experts (MixtralExperts)"] if hasattr(mm, "MixtralExperts") else []


def tensor_bytes(model):
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


# ---------------------------------------------------------------- FP8
def _act_quant(x):  # per token (row): scale = amax / 448
    s = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


_ACT_QUANT = {"compiled": None}  # torch.compile'd version for eager (prefill) calls


def act_quant(x):
    if torch.compiler.is_compiling() or _ACT_QUANT["compiled"] is None:
        return _act_quant(x)  # inside the compiled decode step inductor fuses it anyway
    try:
        return _ACT_QUANT["compiled"](x)
    except Exception as e:
        if is_oom(e) or is_fatal(e):
            raise
        log(f"compiled activation quantization failed, eager from now on: {type(e).__name__}: {str(e)[:200]}")
        _ACT_QUANT["compiled"] = None
        return _act_quant(x)


class FP8Linear(nn.Module):
    """Weight [N, K] e4m3 row-major (so .t() is the column-major operand _scaled_mm wants), scale per
    output channel [1, N]; activation scale per token [M, 1]; row-wise _scaled_mm to BF16."""

    def __init__(self, lin):
        super().__init__()
        w = lin.weight.detach()
        scale = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
        self.register_buffer("qweight", (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous())
        self.register_buffer("wscale", scale.reshape(1, -1).contiguous())
        self.bias = None if lin.bias is None else nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = lin.in_features, lin.out_features

    def forward(self, x):
        shape = x.shape
        xq, xs = act_quant(x.reshape(-1, shape[-1]))
        y = torch._scaled_mm(xq, self.qweight.t(), scale_a=xs, scale_b=self.wscale, out_dtype=torch.bfloat16)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def _quantize_layer(layer):  # a function, so no loop variable outlives it holding a BF16 weight
    n = 0
    for parent in list(layer.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.in_features % 16 == 0 and child.out_features % 16 == 0:
                setattr(parent, name, FP8Linear(child))  # (_scaled_mm needs multiples of 16: a router stays BF16)
                n += 1
    return n


def quantize_fp8(model):
    with torch.no_grad():
        n = sum(_quantize_layer(layer) for layer in get_base(model).layers)
    gc.collect()
    torch.cuda.empty_cache()
    _ACT_QUANT["compiled"] = torch.compile(_act_quant, dynamic=True)
    return n


# ---------------------------------------------------------------- caches and the step
def new_static_cache(cfg, batch, max_len):
    from transformers import StaticCache
    if "max_batch_size" in inspect.signature(StaticCache.__init__).parameters:  # transformers 4.4x
        return StaticCache(config=cfg, max_batch_size=batch, max_cache_len=max_len, device="cuda",
                           dtype=torch.bfloat16)
    cache = StaticCache(config=cfg, max_cache_len=max_len)  # 4.56+/5.x: lazily allocated
    try:  # allocate now (outside any timed region); else the first eager prefill does it
        cache.early_initialization(batch_size=batch, num_heads=cfg.num_key_value_heads,
                                   head_dim=cfg.hidden_size // cfg.num_attention_heads,
                                   dtype=torch.bfloat16, device=torch.device("cuda"))
    except Exception:
        pass
    return cache


def new_dynamic_cache(cfg):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=cfg)
    except TypeError:
        return DynamicCache()


def cache_counters(cache):
    """transformers 5.x StaticLayer keeps its write offset in a device tensor and ignores the
    cache_position it is handed; 4.x writes at cache_position. Both are kept in step here."""
    return [c for c in (getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", None) or [])
            if isinstance(c, torch.Tensor)]


def reset_static_cache(cache):
    counters = cache_counters(cache)
    if counters:
        for c in counters:
            c.zero_()
    else:
        cache.reset()
    n = int(cache.get_seq_length())
    if n != 0:
        raise RuntimeError(f"static cache reset left {n} tokens")


def make_forward(model):
    """ids [B, T] -> next token [B, 1]: the base model, lm_head on the last position only (no [B, T, vocab]
    logits), greedy argmax."""
    base, head = get_base(model), model.lm_head
    pass_cpos = "cache_position" in inspect.signature(base.forward).parameters

    def fwd(ids, pos, cpos, cache):
        kw = dict(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        if pass_cpos:
            kw["cache_position"] = cpos
        out = base(**kw)
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return torch.argmax(head(h[:, -1, :]), dim=-1, keepdim=True)
    return fwd, pass_cpos


def compile_fn(fn, mode, fullgraph):
    kw = dict(fullgraph=fullgraph, dynamic=False)
    if mode != "default":
        kw["mode"] = mode
    return torch.compile(fn, **kw)


def fill(fwd, ids, cache, chunk):
    B, L = ids.shape
    tok = None
    for s in range(0, L, chunk):
        e = min(L, s + chunk)
        cpos = torch.arange(s, e, device="cuda")
        tok = fwd(ids[:, s:e], cpos.unsqueeze(0).expand(B, -1).contiguous(), cpos, cache)
    return tok


def kv_bytes(cfg, batch, length):
    hd = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * length * cfg.num_key_value_heads * hd * 2


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
               cuda_graph="none", compile_s=None, capture_s=None)
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
            for fullgraph in (True, False):
                fn = compile_fn(P["fwd"], args.compile_mode, fullgraph)
                try:
                    t = time.perf_counter()
                    one()  # compiles
                    torch.cuda.synchronize()
                    row.update(compile_s=time.perf_counter() - t, fullgraph=fullgraph)
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
            for _ in range(W - 1):
                one()
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
    seen = cache.get_seq_length()
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
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    flops = 2 * flops_params(P["counts"]) * L + 2 * P["counts"]["lm_head_params"]  # MoE: active parameters
    attn = 4 * layers * L * L * h // 2
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
    if moe and peer == "compile-fp8":
        fused = fused_expert_params(cfg)
        if fused:
            emit(peer=peer, kind="info", skipped=FUSED_EXPERTS_REASON, fused_expert_params=fused)
            for kind, params in plan:
                emit(peer=peer, kind=kind, skipped=FUSED_EXPERTS_REASON, **params)
            return True
    counts = param_counts(cfg)
    need = 2 * (counts["params_without_embeddings"] + counts["embedding_params"] + counts["lm_head_params"])
    free = torch.cuda.mem_get_info()[0]
    if need + 2 * GiB > free:  # BF16 weights alone do not fit: say so rather than fail half-way
        emit(peer=peer, kind="info", skipped="out of memory (weights, estimated)", weights_bytes=need, free_bytes=free)
        for kind, params in plan:
            emit(peer=peer, kind=kind, skipped="out of memory (weights, estimated)", **params)
        return True
    log(f"{peer}: building {args.model} (BF16 weights {need / GiB:.1f} GiB, free {free / GiB:.1f} GiB)")
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model = build_model(cfg, args.seed, args.experts_impl)
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
    P = dict(cfg=cfg, fwd=fwd, static=compiled, compiled=compiled, counts=counts, peak_flops=peak, moe=moe)
    moe_info = {}
    if moe:  # the experts implementation in use, and the parameter count checked against the model built
        numel = param_numel(model) if peer != "compile-fp8" else None
        moe_info = dict(experts_implementation=getattr(model.config, "_experts_implementation", None),
                        params_total=numel, params_formula=need // 2,
                        param_count_ok=None if numel is None else numel == need // 2)
    emit(peer=peer, kind="info", build_s=build_s, quantize_s=quant_s, fp8_linears=n_fp8, **moe_info,
         weights_bytes=tensor_bytes(model), attn_implementation=getattr(model.config, "_attn_implementation", None),
         rope=rope, cache="static" if compiled else "dynamic", pass_cache_position=pass_cpos,
         compile_mode=args.compile_mode if compiled else None, grad_mode=args.grad_mode,
         prefill_mode="compiled" if compiled and args.compile_prefill else "eager",
         peak_flops=P["peak_flops"], **P["counts"], **shape_fields(cfg, rope, args.model))
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
    _ACT_QUANT["compiled"] = None
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
    emit(peer=None, kind="info", args=vars(args), cuda=torch.version.cuda,
         total_memory_bytes=torch.cuda.get_device_properties(0).total_memory)
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
            _ACT_QUANT["compiled"] = None
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
