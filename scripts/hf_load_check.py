#!/usr/bin/env python3
"""Load checkpoints llmq wrote with Hugging Face transformers and compare their logits with
llmq's own logits for the same token ids (written by `llmq logits`).

usage: hf_load_check.py IDS_FILE  DIR:LLMQ_LOGITS[:dtype[:LLMQ_DEQUANTIZED_LOGITS]] ...
Prints one row per checkpoint: did it load, and how far transformers' logits are from llmq's
(relative Frobenius error, mean KL, top-1 agreement). Writes the rows as JSON to $OUT if set."""
import json
import os
import sys
import traceback

import torch
import torch.nn.functional as F


def main():
    ids = [int(t) for t in open(sys.argv[1]).read().split()]
    rows = []
    for spec in sys.argv[2:]:
        parts = spec.split(":")
        path, logits_file = parts[0], parts[1]
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[parts[2] if len(parts) > 2 else "bf16"]
        # Optional 4th part: llmq's logits of the same checkpoint with weights dequantized and
        # activations in float, what transformers' dequantize path computes.
        dequant_logits = parts[3] if len(parts) > 3 else None
        row = {"checkpoint": path, "loaded": False}
        try:
            from transformers import AutoModelForCausalLM

            def logits_of(model):
                with torch.no_grad():
                    return model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
            try:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map="cuda")
                row["quantization"] = type(getattr(model.config, "quantization_config", None)).__name__
                out = logits_of(model)
            except ImportError as e:
                # transformers' FP8 kernels need the `kernels` package (missing on some images); its
                # dequantize path does not, and still checks that the tensor names, shapes and
                # weight_scale_inv mean what llmq wrote.
                if "fp8" not in str(e).lower():
                    raise
                from transformers import FineGrainedFP8Config
                cfg = json.load(open(os.path.join(path, "config.json")))["quantization_config"]
                block = cfg.get("weight_block_size", [128, 128])
                model = AutoModelForCausalLM.from_pretrained(
                    path, dtype=dtype, device_map="cuda",
                    quantization_config=FineGrainedFP8Config(weight_block_size=tuple(block), dequantize=True))
                row["quantization"] = "FineGrainedFP8Config"
                row["note"] = "dequantized on load (no FP8 kernels package); vs llmq dequantized"
                out = logits_of(model)
                if dequant_logits:
                    logits_file = dequant_logits
            row["loaded"] = True
            ref = torch.frombuffer(bytearray(open(logits_file, "rb").read()), dtype=torch.float32)
            ref = ref.reshape(len(ids), -1)[:, : out.shape[1]]
            row["rel_err"] = float((out - ref).norm() / ref.norm())
            row["kl_mean"] = float(F.kl_div(F.log_softmax(out, -1), F.log_softmax(ref, -1), log_target=True,
                                            reduction="batchmean"))
            row["top1_agree"] = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        except Exception as e:  # report, keep going: one failing format must not hide the others
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc(limit=2)
        rows.append(row)
    print(f"{'checkpoint':44} {'loaded':6} {'rel err':>9} {'KL(llmq||hf)':>12} {'top1':>6}  note")
    for r in rows:
        print(f"{r['checkpoint'][-44:]:44} {str(r['loaded']):6} {r.get('rel_err', float('nan')):9.2e} "
              f"{r.get('kl_mean', float('nan')):12.2e} {r.get('top1_agree', float('nan')):6.3f}  "
              f"{r.get('quantization', '')} {r.get('note', '')} {r.get('error', '')}")
    if os.environ.get("OUT"):
        json.dump(rows, open(os.path.join(os.environ["OUT"], "hf_load_check.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
