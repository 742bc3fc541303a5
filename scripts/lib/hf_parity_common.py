"""Helpers shared by scripts/gpu-hf-parity and its MXFP4 part (hf_parity_mxfp4.py): logging, config
files, transformers' reference models and logits."""
import json
import os


def log(msg):
    print(msg, flush=True)


def bitwise_equal(torch, a, b):
    if tuple(a.shape) != tuple(b.shape):
        return False
    a, b = a.float().contiguous(), b.float().contiguous()
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def load_reference(torch, transformers, path, notes, **extra):
    kw = dict(dtype=torch.float32, attn_implementation="eager", **extra)
    try:
        m = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    except Exception as e:  # older / newer transformers without experts_implementation
        notes.append(f"experts_implementation=eager not taken ({type(e).__name__}); default experts")
        m = transformers.AutoModelForCausalLM.from_pretrained(path, **kw)
    return m.float().eval()


def hf_logits(torch, model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def read_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def write_config(path, cfg):
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
