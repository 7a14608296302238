#!/usr/bin/python3
"""Checks tests/reference/llama_ref.py's gemma_forward (numpy, float64) against Hugging Face's own
modelling code (transformers' Gemma2ForCausalLM / Gemma3ForCausalLM, eager attention) on every
Gemma tiny fixture, in float64. HF computes three things in float32 even in a float64 model (its
RMSNorm casts x.float(); the rotary embedding forces float32 angles; eager attention's softmax
takes dtype=float32); those are run in float64 here (the patches below), so both sides are float64
throughout and must agree to 1e-9 (observed ~1e-13: the same math summed in other orders).

    KVLAB_VENV/bin/python tests/reference/gemma_ref_hf_test.py FIXTURES_DIR

Exits 77 (skip) when transformers / torch are not importable (KVLAB_VENV unset or without them).
"""

import json
import os
import sys

try:
    import numpy as np
    import torch
    import transformers
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.gemma3 import modeling_gemma3
except ImportError as e:
    print(f"gemma_ref_hf_test: skipped: needs transformers and torch ({e}); set KVLAB_VENV")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402


def norm64(self, x):  # HF: self._norm(x.float()) * (1.0 + self.weight.float())
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.to(x.dtype))


def inv_freq64(cfg, layer_type):
    hd = cfg.head_dim
    rp = cfg.rope_parameters[layer_type] if layer_type else cfg.rope_parameters
    inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if rp.get("rope_type") == "linear":
        inv = inv / rp["factor"]
    elif rp.get("rope_type") not in (None, "default"):
        raise ValueError(f"unexpected rope type {rp.get('rope_type')}")
    return inv


def rotary64(inv, x, position_ids):
    freqs = position_ids[0].double()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), -1)[None]
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def main():
    fixtures = sys.argv[1]
    modeling_gemma2.Gemma2RMSNorm.forward = norm64
    modeling_gemma3.Gemma3RMSNorm.forward = norm64
    modeling_gemma2.Gemma2RotaryEmbedding.forward = lambda self, x, p: rotary64(inv_freq64(self.config, None), x, p)
    modeling_gemma3.Gemma3RotaryEmbedding.forward = (
        lambda self, x, p, layer_type=None: rotary64(inv_freq64(self.config, layer_type), x, p))
    softmax = torch.nn.functional.softmax
    torch.nn.functional.softmax = lambda x, dim=None, dtype=None, **kw: softmax(
        x, dim=dim, dtype=x.dtype if x.dtype == torch.float64 else dtype, **kw)
    transformers.logging.set_verbosity_error()
    names = json.load(open(os.path.join(fixtures, "fixtures.json")))["fixtures"]
    failures = checked = 0
    for name in names:
        folder = os.path.join(fixtures, name, "hf")
        cfg, w = llama_ref.load_hf(folder)
        if not cfg["architectures"][0].startswith("Gemma"):
            continue
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                                  attn_implementation="eager").eval()
        for tokens in json.load(open(os.path.join(fixtures, name, "tokens.json")))["sequences"]:
            with torch.no_grad():
                hf = model(torch.tensor([tokens])).logits[0].numpy()
            err = np.abs(hf - llama_ref.gemma_forward(cfg, w, tokens)).max()
            ok = err <= 1e-9
            failures += not ok
            checked += 1
            print(f"{'ok  ' if ok else 'FAIL'} {name} {len(tokens)} tokens: max |diff| = {err:.2e}")
    if checked == 0:
        sys.exit("gemma_ref_hf_test: no Gemma fixture found in " + fixtures)
    if failures:
        sys.exit(f"{failures} checks failed")


if __name__ == "__main__":
    main()
