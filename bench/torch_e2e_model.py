"""The model side of bench/torch_e2e_peers.py: the configs and shapes of every family (Llama, Mixtral,
Qwen3, Qwen3-MoE, gpt-oss) as transformers computes them, the model built on the GPU with seeded random
BF16 weights, the parameter / KV-cache / attention-FLOP arithmetic, its FP8 form (FP8Linear: e4m3 weights
with per-output-channel scales, per-token activation scales, torch._scaled_mm row-wise), the KV caches
across transformers versions and the forward step (base model, lm_head on the last position, greedy
argmax), plus the error helpers the driver shares (Skip, is_oom, is_fatal, log). See torch_e2e_peers.py
for what is measured and how."""
import copy
import gc
import inspect
import sys
import time
from collections import Counter

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
    # Qwen3ForCausalLM: head_dim 128 whatever the hidden size, q/k RMSNorm per head (built in), theta 1e6
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "tiny-qwen3": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=64, vocab_size=512),
    # Qwen3MoeForCausalLM: every layer sparse (decoder_sparse_step 1, no mlp_only_layers), so intermediate_size
    # (the real config's dense width) is unused; experts of moe_intermediate_size, top-k renormalised
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                          num_experts=128, num_experts_per_tok=8, norm_topk_prob=True),
    "tiny-qwen3-moe": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=512,
                           num_experts=16, num_experts_per_tok=4, norm_topk_prob=True),
    # GptOssForCausalLM: attention sinks, q/k/v/o biases, sliding window 128 on the even layers (transformers'
    # default layer_types), YaRN rope, fused experts with biases (clamped SwiGLU), router with a bias
    "gpt-oss-20b": dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=64, vocab_size=201088, num_local_experts=32,
                        num_experts_per_tok=4, sliding_window=128),
    "gpt-oss-120b": dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=36, num_attention_heads=64,
                         num_key_value_heads=8, head_dim=64, vocab_size=201088, num_local_experts=128,
                         num_experts_per_tok=4, sliding_window=128),
    "tiny-gpt-oss": dict(hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=64, vocab_size=512, num_local_experts=8,
                         num_experts_per_tok=4, sliding_window=128),
}
FAMILY = {"mixtral-8x7b": "mixtral", "tiny-moe": "mixtral", "qwen3-8b": "qwen3", "qwen3-32b": "qwen3",
          "tiny-qwen3": "qwen3", "qwen3-30b-a3b": "qwen3_moe", "tiny-qwen3-moe": "qwen3_moe",
          "gpt-oss-20b": "gpt_oss", "gpt-oss-120b": "gpt_oss", "tiny-gpt-oss": "gpt_oss"}  # others: llama
_QWEN3_BASE = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
                   max_position_embeddings=40960, hidden_act="silu", use_cache=True)
YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
            original_max_position_embeddings=4096)
FAMILIES = {  # config class, the fixed fields of the real checkpoints, rope (theta inside)
    "qwen3": dict(cls="Qwen3Config", base=_QWEN3_BASE, rope=dict(rope_type="default", rope_theta=1e6)),
    "qwen3_moe": dict(cls="Qwen3MoeConfig", base=dict(_QWEN3_BASE, decoder_sparse_step=1, mlp_only_layers=[],
                                                       output_router_logits=False),
                      rope=dict(rope_type="default", rope_theta=1e6)),
    "gpt_oss": dict(cls="GptOssConfig", base=dict(rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
                                                   max_position_embeddings=131072, use_cache=True,
                                                   output_router_logits=False),
                    rope=dict(YARN, rope_theta=150000.0)),
}
CHECKED = ("attention_bias", "tie_word_embeddings", "norm_topk_prob", "rms_norm_eps", "decoder_sparse_step")
MODEL_CLASSES = {"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM"}
ROPE_THETA = 500000.0
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
FP8, FP8_MAX = torch.float8_e4m3fn, 448.0
GiB = 1 << 30
T0 = time.time()
FUSED_EXPERTS_REASON = "fused expert parameters: no FP8 replacement in this peer"
NO_SINKS_REASON = "sdpa drops gpt-oss's attention sinks (s_aux): use eager or flex_attention"


def is_moe(name):
    return any(k in SHAPES[name] for k in ("num_local_experts", "num_experts"))


def family(name):
    return FAMILY.get(name, "llama")


def n_experts(cfg):  # Mixtral / gpt-oss: num_local_experts; Qwen3-MoE: num_experts (aliased in newer 5.x)
    return getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or 0


def cfg_is_moe(cfg):
    return bool(n_experts(cfg))


def head_dim(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def sliding_layers(cfg):
    """{layer index: window} of the sliding-window attention layers (gpt-oss: the even ones, 128)."""
    window, types = getattr(cfg, "sliding_window", None), getattr(cfg, "layer_types", None)
    if not window or not types:
        return {}
    return {i: window for i, t in enumerate(types) if t == "sliding_attention"}


def default_attn(cfg):  # gpt-oss: no sdpa in transformers (its sdpa path ignores the sinks)
    return "eager" if cfg.model_type == "gpt_oss" else "sdpa"


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


def _set_attn(cfg, impl):
    try:
        cfg._attn_implementation = impl
    except Exception:
        pass


def make_config(name):
    """LlamaConfig across versions: transformers 5 takes `rope_parameters` (theta inside), 4.x takes
    `rope_theta` + `rope_scaling`. The form taken is checked, not assumed."""
    if family(name) == "mixtral":
        return make_moe_config(name)
    if family(name) != "llama":
        return make_family_config(name)
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
            _set_attn(cfg, "sdpa")
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
            _set_attn(cfg, "sdpa")
            return cfg, r
        errors.append(f"not taken: rope {r}, fields {wrong}")
    raise RuntimeError("MixtralConfig: " + "; ".join(errors))


def _rope_ok(r, want):
    kind = r.get("rope_type") or r.get("type") or "default"
    if r.get("rope_theta") != want["rope_theta"] or kind != want["rope_type"]:
        return False
    return all(r.get(k) == v for k, v in want.items() if k in ("factor", "beta_fast", "beta_slow",
                                                               "original_max_position_embeddings"))


def make_family_config(name):
    """Qwen3 / Qwen3-MoE / gpt-oss configs. gpt-oss first takes transformers' own defaults for the rope
    (YaRN) and layer_types, then the explicit 5.x and 4.x forms; the others 5.x rope_parameters then 4.x
    rope_theta. Checked: the shape fields, rope (type, theta, YaRN factors), attention bias, norm_topk_prob,
    and the sliding layers (gpt-oss: window 128 on the even layers; Qwen3: none)."""
    import transformers
    fam = FAMILIES[family(name)]
    cls = getattr(transformers, fam["cls"])
    shape, want = dict(SHAPES[name]), fam["rope"]
    base = dict(fam["base"], **shape)
    scaling = {k: v for k, v in want.items() if k != "rope_theta"}
    forms = [dict()] if family(name) == "gpt_oss" else []
    forms += [dict(rope_parameters=dict(want)),
              dict(rope_theta=want["rope_theta"], **({} if want["rope_type"] == "default" else
                                                     dict(rope_scaling=scaling)))]
    errors = []
    for extra in forms:
        try:
            cfg = cls(**base, **extra)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {str(e)[:300]}")
            continue
        r = rope_of(cfg)
        wrong = {k: getattr(cfg, k, None) for k, v in base.items()
                 if (k in shape or k in CHECKED) and getattr(cfg, k, None) != v}
        L, sl = cfg.num_hidden_layers, sliding_layers(cfg)
        if family(name) == "gpt_oss":
            if sl != {i: shape["sliding_window"] for i in range(0, L, 2)}:
                wrong["layer_types"] = getattr(cfg, "layer_types", None)
        elif sl:
            wrong["sliding_layers"] = sl
        if _rope_ok(r, want) and not wrong:
            _set_attn(cfg, default_attn(cfg))
            return cfg, r
        errors.append(f"not taken ({sorted(extra) or 'defaults'}): rope {r}, fields {wrong}")
    raise RuntimeError(f"{fam['cls']}: " + "; ".join(errors))


def shape_fields(cfg, rope, name):  # the SHAPES entry as the config holds it (theta lives in the rope dict)
    out = {k: (rope.get("rope_theta") if k == "rope_theta" else getattr(cfg, k, None)) for k in SHAPES[name]}
    sl = sliding_layers(cfg)
    return dict(out, model_type=cfg.model_type, head_dim=head_dim(cfg), sliding_layers=len(sl),
                sliding_window=max(sl.values()) if sl else None)


def model_class(cfg):
    import transformers
    return getattr(transformers, MODEL_CLASSES[cfg.model_type])


def get_base(model):
    base = getattr(model, "model", None)
    if isinstance(base, nn.Module) and hasattr(base, "layers"):
        return base
    return model.get_decoder() if hasattr(model, "get_decoder") else model.base_model


def build_model(cfg, seed, experts_impl=None, attn_impl=None):
    """Parameters created on the GPU in BF16 (no CPU init, no FP32 copy), then re-initialised in place with
    a seed: normal(0, 0.02) for matrices (MoE: the router weight [E, H] and the fused 3-D expert tensors
    too) and for the 1-D non-norm parameters (biases, gpt-oss's sinks), 1 for the RMSNorm weights."""
    attn_impl = attn_impl or default_attn(cfg)
    if cfg.model_type == "gpt_oss" and attn_impl == "sdpa":
        raise RuntimeError(NO_SINKS_REASON)
    _set_attn(cfg, attn_impl)  # 5.x checks it at construction (gpt-oss refuses sdpa there)
    cls = model_class(cfg)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"), torch.no_grad():
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    if hasattr(model, "set_attn_implementation") and getattr(model.config, "_attn_implementation", None) != attn_impl:
        try:
            model.set_attn_implementation(attn_impl)
        except Exception as e:
            log(f"set_attn_implementation({attn_impl}) failed: {type(e).__name__}: {str(e)[:200]}")
    got = getattr(model.config, "_attn_implementation", None)
    if got != attn_impl:
        raise RuntimeError(f"attention implementation {attn_impl} not taken (model uses {got})")
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
        for name, p in model.named_parameters():
            if p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
            if p.dim() == 1 and "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model


def _sparse_layers(cfg):  # Qwen3-MoE may keep dense MLP layers (mlp_only_layers, decoder_sparse_step)
    L = cfg.num_hidden_layers
    if not cfg_is_moe(cfg):
        return []
    if cfg.model_type != "qwen3_moe":
        return list(range(L))
    only, step = set(getattr(cfg, "mlp_only_layers", None) or []), getattr(cfg, "decoder_sparse_step", 1) or 1
    return [i for i in range(L) if i not in only and (i + 1) % step == 0]


def param_counts(cfg):
    """Per layer, every token goes through attention (q, o: h*nh*hd each; k, v: h*kv*hd each; + biases when
    attention_bias; Qwen3: q/k norms 2*hd; gpt-oss: one sink per head) and the two RMSNorms (2h); dense
    layers through the MLP (3*h*i). MoE layers: the router (E*h, gpt-oss + E bias) and, of the E experts
    (3*h*i_e each; gpt-oss + the 2*i_e + h expert biases; Qwen3-MoE i_e = moe_intermediate_size), only the
    top_k selected ones. Active parameters per token = non-expert + top_k/E of the expert parameters; that
    count (not the total) is what the prefill FLOPs and the MFU figures use: 2 * active * tokens."""
    h, L, hd, mt = cfg.hidden_size, cfg.num_hidden_layers, head_dim(cfg), cfg.model_type
    qd, kvd = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    attn = 2 * h * qd + 2 * h * kvd
    if getattr(cfg, "attention_bias", False):
        attn += qd + 2 * kvd + h
    if mt in ("qwen3", "qwen3_moe"):
        attn += 2 * hd
    if mt == "gpt_oss":
        attn += cfg.num_attention_heads
    dense_mlp = 3 * h * cfg.intermediate_size + (2 * cfg.intermediate_size + h if getattr(cfg, "mlp_bias", False) else 0)
    sparse = _sparse_layers(cfg)
    n_sparse, n_dense = len(sparse), L - len(sparse)
    common = dict(embedding_params=cfg.vocab_size * h, lm_head_params=cfg.vocab_size * h)
    non_expert = L * (attn + 2 * h) + n_dense * dense_mlp + h
    if not n_sparse:
        return dict(params_without_embeddings=non_expert, **common)
    E, k = n_experts(cfg), cfg.num_experts_per_tok
    ei = cfg.moe_intermediate_size if mt == "qwen3_moe" else cfg.intermediate_size
    expert = 3 * h * ei + (2 * ei + h if mt == "gpt_oss" else 0)
    router = E * h + (E if mt == "gpt_oss" else 0)
    non_expert += n_sparse * router
    return dict(params_without_embeddings=non_expert + n_sparse * E * expert,
                active_params_without_embeddings=non_expert + n_sparse * k * expert,
                expert_params=n_sparse * E * expert, active_expert_params=n_sparse * k * expert,
                num_experts=E, experts_per_token=k, sparse_layers=n_sparse, **common)


def flops_params(counts):  # parameters one token goes through (MoE: the active ones)
    return counts.get("active_params_without_embeddings", counts["params_without_embeddings"])


def weights_bytes_bf16(counts):
    return 2 * (counts["params_without_embeddings"] + counts["embedding_params"] + counts["lm_head_params"])


def attention_flops(cfg, L):
    """Prefill attention FLOPs (QK^T and PV, 4 * q_dim per query-key pair): causal L*L/2 pairs on full layers,
    on sliding layers only the keys inside the window (sum over queries of min(i + 1, window))."""
    qd, sl = cfg.num_attention_heads * head_dim(cfg), sliding_layers(cfg)
    total = 0
    for i in range(cfg.num_hidden_layers):
        W = sl.get(i)
        if W is None:
            total += 4 * L * L * qd // 2
        else:
            pairs = L * (L + 1) // 2 if L <= W else W * (W + 1) // 2 + (L - W) * W
            total += 4 * qd * pairs
    return total


def kv_cache_bytes(cfg, batch, length):  # BF16 K and V; a sliding layer holds at most its window
    sl, per_tok = sliding_layers(cfg), 2 * batch * cfg.num_key_value_heads * head_dim(cfg) * 2
    return sum(per_tok * min(length, sl.get(i, length)) for i in range(cfg.num_hidden_layers))


def param_numel(model):
    return sum(p.numel() for p in model.parameters())


def meta_facts(cfg):
    """Built on the meta device (no memory, so also for models that do not fit): the parameter count and
    the names of the 3-D (all experts in one tensor) parameters of the first MoE decoder layer
    (transformers 5.x Mixtral / Qwen3-MoE: mlp.experts.gate_up_proj and down_proj; gpt-oss the same plus
    2-D biases; 4.x Mixtral: none, one nn.Linear per expert), and the experts class."""
    with torch.device("meta"), torch.no_grad():
        m = model_class(cfg)(copy.deepcopy(cfg))
    layers = get_base(m).layers
    sparse = _sparse_layers(cfg)
    layer = layers[sparse[0]] if sparse else layers[0]
    out = dict(params_meta=param_numel(m), fused_expert_params=[n for n, p in layer.named_parameters() if p.dim() >= 3])
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    if isinstance(experts, nn.Module):
        fwd = type(experts).forward
        out.update(experts_class=type(experts).__name__,
                   experts_forward=f"{getattr(fwd, '__module__', '?')}.{getattr(fwd, '__qualname__', '?')}")
    del m
    return out


def fused_expert_params(cfg):
    try:
        return meta_facts(cfg)["fused_expert_params"]
    except Exception as e:
        log(f"meta build to inspect the experts failed ({type(e).__name__}: {str(e)[:200]}); by module contents")
        import transformers.models.mixtral.modeling_mixtral as mm
        if cfg.model_type != "mixtral":
            return [f"{cfg.model_type} experts (meta build failed: assumed fused)"]
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
                                   head_dim=head_dim(cfg),
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


def seq_seen(cache):
    """Tokens the cache has seen, read from its first full-attention layer: 5.x's StaticSlidingWindowLayer
    counts in a Python int (cumulative_length_int), which a replayed CUDA graph does not advance."""
    layers = getattr(cache, "layers", None) or []
    idx = next((i for i, layer in enumerate(layers) if not getattr(layer, "is_sliding", False)), 0)
    try:
        return int(cache.get_seq_length(idx))
    except TypeError:
        return int(cache.get_seq_length())


def cache_layout(cache):
    """The cache's layer classes and the length a sliding layer keeps: shows that the sliding windows are
    honoured (gpt-oss: StaticSlidingWindowLayer / DynamicSlidingWindowLayer of 128 on half the layers)."""
    layers = getattr(cache, "layers", None) or []
    kinds = Counter(type(layer).__name__ for layer in layers)
    sliding = [layer for layer in layers if getattr(layer, "is_sliding", False)]
    keep = [getattr(layer, "max_cache_len", None) or getattr(layer, "sliding_window", None) for layer in sliding]
    return dict(cache_layers=", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())),
                sliding_cache_len=max((k for k in keep if k), default=None),
                sliding_python_counter=any(isinstance(getattr(layer, "cumulative_length_int", None), int)
                                           for layer in sliding))


def reset_static_cache(cache):
    counters = cache_counters(cache)
    if counters:
        for c in counters:
            c.zero_()
        for layer in getattr(cache, "layers", None) or []:
            if isinstance(getattr(layer, "cumulative_length_int", None), int):
                layer.cumulative_length_int = 0
    else:
        cache.reset()
    n = seq_seen(cache)
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


def compile_fn(fn, mode, fullgraph, dynamic=False):
    kw = dict(fullgraph=fullgraph, dynamic=dynamic)
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
