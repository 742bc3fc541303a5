#!/usr/bin/env python3
"""Test data for config reading: tiny random models saved by transformers 5 (config.json in the
format it writes: rope_parameters instead of top-level rope_theta / rope_scaling), with
transformers' own float32 logits for fixed token ids. Run where transformers >= 5 is installed:
    python3 tests/data/hf5/make_models.py OUT_DIR
Writes OUT_DIR/<name>/{config.json, model.safetensors, ids.txt, logits.f32} and
OUT_DIR/defaults/<model_type>.json (each family's default config as transformers saves it)."""
import json, os, sys
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

out = sys.argv[1]
os.makedirs(os.path.join(out, "defaults"), exist_ok=True)
for mt in ["llama", "mistral", "qwen2", "mixtral", "qwen3", "phi3", "gemma2", "gpt_oss"]:
    try:
        cfg = AutoConfig.for_model(mt)
        cfg.save_pretrained(os.path.join(out, "defaults", mt))
        os.rename(os.path.join(out, "defaults", mt, "config.json"), os.path.join(out, "defaults", mt + ".json"))
        os.rmdir(os.path.join(out, "defaults", mt))
    except Exception as e:  # noqa
        print("defaults", mt, "failed:", e)

def save(name, mt, ids, **kw):
    torch.manual_seed(1234)
    cfg = AutoConfig.for_model(mt, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                               max_position_embeddings=128, **kw)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # make every weight random and large enough that rope differences show
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.3)
    d = os.path.join(out, name)
    model.save_pretrained(d, safe_serialization=True)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    logits.tofile(os.path.join(d, "logits.f32"))
    with open(os.path.join(d, "ids.txt"), "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    print(name, json.load(open(os.path.join(d, "config.json"))))

ids = [(7 * i + 3) % 64 for i in range(40)]
save("llama3-rope", "llama", ids,
     rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
save("qwen2-theta", "qwen2", ids, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
print("transformers", transformers.__version__, "torch", torch.__version__)
