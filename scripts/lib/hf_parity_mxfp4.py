"""The MXFP4 case of scripts/gpu-hf-parity: gpt-oss experts packed as MXFP4 blocks + E8M0 scales, the
reference dequantized by transformers' own convert_moe_packed_tensors, and transformers' loader of the
checkpoint checked against it."""
import os
import re
import shutil
import inspect

from hf_parity_common import bitwise_equal, hf_logits, load_reference, log, read_config, write_config

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantize(torch, w):
    """w [E, R, K] (K, the input dimension, a multiple of 32) -> blocks uint8 [E, R, K/32, 16]
    (low nibble element 2i, high nibble 2i+1), scales uint8 [E, R, K/32] (E8M0, bias 127).
    Scale 2^floor(log2(absmax / 6)), codes the nearest FP4 value (clamped to +-6)."""
    E, R, K = w.shape
    b = w.float().reshape(E, R, K // 32, 32)
    amax = b.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0)).clamp(-127, 127)
    q = b / torch.exp2(e).unsqueeze(-1)
    grid = torch.tensor(FP4_VALUES[:8])
    idx = (q.abs().clamp(max=6.0).unsqueeze(-1) - grid).abs().argmin(-1)
    code = idx + 8 * ((q < 0) & (idx > 0)).long()
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous()


def mxfp4_dequantize(torch, blocks, scales):
    """blocks [E, R, G, 16], scales [E, R, G] -> float32 [E, R, G*32] (the spec, by hand)."""
    lut = torch.tensor(FP4_VALUES)
    lo = (blocks & 0x0F).long()
    hi = (blocks >> 4).long()
    vals = torch.stack([lut[lo], lut[hi]], -1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.exp2(scales.float() - 127.0).unsqueeze(-1)
    return vals.reshape(*blocks.shape[:-2], -1)


def transformers_dequantize(torch, blocks, scales, info):
    """transformers.integrations.mxfp4.convert_moe_packed_tensors, in float32 where it takes a dtype."""
    import inspect
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    params = inspect.signature(convert_moe_packed_tensors).parameters
    if "dtype" in params:
        out = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        info["convert_dtype"] = "float32"
    else:
        out = convert_moe_packed_tensors(blocks, scales)
        info["convert_dtype"] = "default (" + str(out.dtype) + ")"
    info["convert_signature"] = str(inspect.signature(convert_moe_packed_tensors))
    return out.detach().float().cpu()


def make_mxfp4(torch, transformers, src_dir, dst_dir, info, notes):
    """Writes dst_dir: src_dir's checkpoint with every layer's experts.gate_up_proj / down_proj as
    MXFP4 blocks + scales. Returns the reference model: src_dir's model with those experts
    dequantized by transformers (by hand where transformers' layout differs, said in info)."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src_dir, dst_dir)
    model = load_reference(torch, transformers, src_dir, notes)
    state = {}
    files = sorted(f for f in os.listdir(dst_dir) if f.endswith(".safetensors"))
    for f in files:
        state.update(load_file(os.path.join(dst_dir, f)))
        os.remove(os.path.join(dst_dir, f))
    if os.path.exists(os.path.join(dst_dir, "model.safetensors.index.json")):
        os.remove(os.path.join(dst_dir, "model.safetensors.index.json"))
    pat = re.compile(r"^(.*layers\.(\d+)\.mlp\.experts\.)(gate_up_proj|down_proj)$")
    layers = model.model.layers
    info["tensors"] = []
    info["convert_matches_spec"] = True
    info["dequantized"] = {}
    hand_fallback = False
    for key in sorted(state):
        m = pat.match(key)
        if not m:
            continue
        layer, proj = int(m.group(2)), m.group(3)
        experts = layers[layer].mlp.experts
        param = getattr(experts, proj)          # [E, in, out] (x @ W) in transformers' GptOssExperts
        E = param.shape[0]
        hidden, inter = model.config.hidden_size, model.config.intermediate_size
        want = (E, hidden, 2 * inter) if proj == "gate_up_proj" else (E, inter, hidden)
        if tuple(param.shape) != want:
            raise RuntimeError(f"{key}: transformers' parameter is {tuple(param.shape)}, expected {want} (x@W)")
        disk = state.pop(key)
        original = param.detach().float().clone()
        w_out_in = original.transpose(1, 2).contiguous()   # [E, out, in]
        blocks, scales = mxfp4_quantize(torch, w_out_in)
        mine = mxfp4_dequantize(torch, blocks, scales).transpose(1, 2).contiguous()   # [E, in, out]
        theirs = transformers_dequantize(torch, blocks, scales, info)
        same = bitwise_equal(torch, theirs, mine)
        if not same:
            info["convert_matches_spec"] = False
            hand_fallback = True
            info.setdefault("convert_mismatch", []).append(
                f"{key}: convert_moe_packed_tensors gave {tuple(theirs.shape)}, spec {tuple(mine.shape)}")
        with torch.no_grad():
            param.copy_(theirs if same else mine)
        info["dequantized"][key] = mine
        state[key + "_blocks"] = blocks
        state[key + "_scales"] = scales
        info["tensors"].append(f"{key}: disk {tuple(disk.shape)} -> blocks {tuple(blocks.shape)} "
                               f"scales {tuple(scales.shape)}; quantization max rel err "
                               f"{float((mine - original).abs().max() / original.abs().max()):.3g}")
    if not info["tensors"]:
        raise RuntimeError("no layers.N.mlp.experts.gate_up_proj / down_proj in the saved gpt_oss checkpoint")
    if hand_fallback:
        notes.append("transformers' convert_moe_packed_tensors disagrees with the spec; reference uses the spec")
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(dst_dir, "model.safetensors"),
              metadata={"format": "pt"})
    cfg = read_config(dst_dir)
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                   "lm_head"],
    }
    write_config(dst_dir, cfg)
    return model


def check_mxfp4_loader(torch, transformers, mx_dir, info, ids, ref_logits):
    """Does transformers' own MXFP4 loader (dequantize=True) read the checkpoint, to the same weights?"""
    row = {}
    try:
        from transformers import Mxfp4Config
        m = transformers.AutoModelForCausalLM.from_pretrained(
            mx_dir, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32,
            attn_implementation="eager")
        m = m.eval()
        row["loaded"] = True
        equal, worst = True, 0.0
        pat = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
        for key, mine in info["dequantized"].items():
            mm = pat.search(key)
            t = getattr(m.model.layers[int(mm.group(1))].mlp.experts, mm.group(2))
            t = t.detach().float().cpu()
            if tuple(t.shape) != tuple(mine.shape):
                equal = False
                row.setdefault("shape_mismatch", []).append(f"{key}: loaded {tuple(t.shape)}, mine {tuple(mine.shape)}")
                continue
            if not bitwise_equal(torch, t, mine):
                equal = False
                worst = max(worst, float((t - mine).abs().max()))
        row["weights_equal_bitwise"] = equal
        row["max_abs_diff"] = worst
        try:
            lg = hf_logits(torch, m.float().cpu(), ids)
            row["logits_max_rel_err_vs_reference"] = float((lg - ref_logits).abs().max() / ref_logits.abs().max())
        except Exception as e:
            row["logits_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    except Exception as e:
        row["loaded"] = False
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return row


# ---- llmq ----------------------------------------------------------------------------------------
