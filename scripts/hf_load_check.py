#!/usr/bin/env python3
"""Load checkpoints llmq wrote with Hugging Face transformers and compare their logits with
llmq's own logits for the same token ids (written by `llmq logits`).

usage: hf_load_check.py IDS_FILE  DIR:LLMQ_LOGITS[:dtype[:LLMQ_DEQUANTIZED_LOGITS]] ...
Prints one row per checkpoint: did it load, and how far transformers' logits are from llmq's
(relative Frobenius error, mean KL, top-1 agreement). A checkpoint transformers refuses for want of
the compressed-tensors package gets a second row: the checkpoint read the way that package
decompresses it, into the unquantized model. Writes the rows as JSON to $OUT if set."""
import json
import os
import sys
import traceback

import torch
import torch.nn.functional as F


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()


def compare(row, out, logits_file, ids):
    ref = torch.frombuffer(bytearray(open(logits_file, "rb").read()), dtype=torch.float32)
    ref = ref.reshape(len(ids), -1)[:, : out.shape[1]]
    row["rel_err"] = float((out - ref).norm() / ref.norm())
    row["kl_mean"] = float(F.kl_div(F.log_softmax(out, -1), F.log_softmax(ref, -1), log_target=True,
                                    reduction="batchmean"))
    row["top1_agree"] = float((out.argmax(-1) == ref.argmax(-1)).float().mean())


def transformers_logits(path, dtype, ids, row):
    """transformers' own loader. Returns logits and whether they are of dequantized weights."""
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map="cuda")
        row["quantization"] = type(getattr(model.config, "quantization_config", None)).__name__
        return logits_of(model, ids), False
    except ImportError as e:
        # transformers' FP8 kernels need the `kernels` package (missing on some images; the error
        # comes at load or at the first forward); its dequantize path does not, and still checks
        # that the tensor names, shapes and weight_scale_inv mean what llmq wrote.
        if "fp8" not in str(e).lower() or "compressed" in str(e).lower():
            raise
        row["kernels_error"] = str(e)[:200]
        from transformers import FineGrainedFP8Config
        cfg = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
        block = cfg.get("weight_block_size", [128, 128])
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, device_map="cuda",
            quantization_config=FineGrainedFP8Config(weight_block_size=tuple(block), dequantize=True))
        row["quantization"] = "FineGrainedFP8Config"
        row["note"] = "dequantized on load (FP8 kernels unavailable); vs llmq dequantized"
        return logits_of(model, ids), True


def emulated_compressed_tensors(path, dtype):
    """The checkpoint as compressed-tensors' decompression reads it: every F8/I8 `X.weight` times its
    `X.weight_scale` (shape [N, 1] per channel, [1] per tensor), loaded into the model without its
    quantization_config. input_scale is an activation parameter: the dequantized model has none."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(path)
    group = next(iter(config.quantization_config["config_groups"].values()))
    strategy = group["weights"]["strategy"]
    if strategy not in ("tensor", "channel"):
        raise ValueError(f"emulation covers tensor and channel weights, not {strategy}")
    del config.quantization_config
    state = {}
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    for f in files:
        state.update(load_file(os.path.join(path, f)))
    out = {}
    for name, t in state.items():
        if name.endswith(".weight_scale") or name.endswith(".input_scale"):
            continue
        if t.dtype in (torch.float8_e4m3fn, torch.int8) and name.endswith(".weight"):
            scale = state[name[: -len("weight")] + "weight_scale"].float()
            n = t.shape[0]
            want = (n, 1) if strategy == "channel" else (1,)
            if tuple(scale.shape) != want:
                raise ValueError(f"{name}_scale has shape {tuple(scale.shape)}; {strategy} expects {want}")
            t = t.float() * scale
        out[name] = t.to(dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(out, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.to("cuda")


def main():
    ids = [int(t) for t in open(sys.argv[1]).read().split()]
    rows = []
    for spec in sys.argv[2:]:
        parts = spec.split(":")
        path, logits_file = parts[0], parts[1]
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[parts[2] if len(parts) > 2 else "bf16"]
        # Optional 4th part: llmq's logits of the same checkpoint with weights dequantized and
        # activations in float, what a dequantizing loader computes.
        dequant_logits = parts[3] if len(parts) > 3 else None
        row = {"checkpoint": path, "loaded": False}
        try:
            out, dequantized = transformers_logits(path, dtype, ids, row)
            row["loaded"] = True
            compare(row, out, dequant_logits if dequantized and dequant_logits else logits_file, ids)
        except Exception as e:  # report, keep going: one failing format must not hide the others
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc(limit=2)
            if dequant_logits and "compressed" in str(e).lower():
                rows.append(row)
                row = {"checkpoint": path + " [compressed-tensors rules, emulated]", "loaded": False}
                try:
                    compare(row, logits_of(emulated_compressed_tensors(path, dtype), ids), dequant_logits, ids)
                    row["loaded"] = True
                    row["note"] = "weight * weight_scale; vs llmq dequantized"
                except Exception as e2:
                    row["error"] = f"{type(e2).__name__}: {e2}"[:300]
                    traceback.print_exc(limit=2)
        rows.append(row)
    print(f"{'checkpoint':56} {'loaded':6} {'rel err':>9} {'KL(llmq||hf)':>12} {'top1':>6}  note")
    for r in rows:
        print(f"{r['checkpoint'][-56:]:56} {str(r['loaded']):6} {r.get('rel_err', float('nan')):9.2e} "
              f"{r.get('kl_mean', float('nan')):12.2e} {r.get('top1_agree', float('nan')):6.3f}  "
              f"{r.get('quantization', '')} {r.get('note', '')} {r.get('error', '')[:160]}")
    if os.environ.get("OUT"):
        tag = os.environ.get("LLMQ_HF_TAG", "")
        json.dump(rows, open(os.path.join(os.environ["OUT"], f"hf_load_check{tag}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
