"""The model side of bench/torch_e2e_peers.py: the Llama / Mixtral configs and shapes, the model built on the
GPU with seeded random BF16 weights, its FP8 form (FP8Linear: e4m3 weights with per-output-channel scales,
per-token activation scales, torch._scaled_mm row-wise), the KV caches across transformers versions and the
forward step (base model, lm_head on the last position, greedy argmax), plus the error helpers the driver
shares (Skip, is_oom, is_fatal, log). See torch_e2e_peers.py for what is measured and how."""
import copy
import gc
import inspect
import sys
import time

import torch
import torch.nn as nn

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


def drop_compiled_act_quant():  # between peers: the next FP8 peer compiles its own
    _ACT_QUANT["compiled"] = None


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
