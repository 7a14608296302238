#!/usr/bin/python3
"""Checks tests/reference/llama_ref.py (numpy, HF layout, rotate-half RoPE) against a second,
differently written forward pass: PyTorch, Meta's formulation (Q/K rows, and Qwen3's per-head
q/k norm weights, in interleaved order,
RoPE as a complex multiplication of pairs (2i, 2i+1), Llama-3 scaling as llama.cpp's per-pair
frequency divisors). For configs with a llama2.c file it reads that file (Meta's layout, written
already interleaved); otherwise it permutes the HF Q/K rows itself. Both in float64: they must
agree to 1e-9. Also checks the CLI output format.

    /usr/bin/python3 tests/reference/llama_ref_test.py FIXTURES_DIR
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402


def interleave_rows(w, n_heads):
    """rotate-half row order -> interleaved: new row 2i + j of a head = old row j * d/2 + i."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).permute(0, 2, 1, 3).reshape(rows, cols)


def read_llama2c(path):
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", data[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // n_heads
    a = torch.from_numpy(np.frombuffer(data[28:], dtype="<f4").astype(np.float64))
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        t = a[off:off + n].reshape(*shape)
        off += n
        return t

    w = {"emb": take(vocab, dim), "rms_att": take(n_layers, dim), "wq": take(n_layers, n_heads * hd, dim),
         "wk": take(n_layers, n_kv * hd, dim), "wv": take(n_layers, n_kv * hd, dim),
         "wo": take(n_layers, dim, n_heads * hd), "rms_ffn": take(n_layers, dim),
         "w1": take(n_layers, hidden, dim), "w2": take(n_layers, dim, hidden), "w3": take(n_layers, hidden, dim),
         "rms_final": take(dim)}
    take(seq_len, hd)  # freq_cis_real, freq_cis_imag
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    assert off == a.numel()
    layers = [dict(attn_norm=w["rms_att"][i], wq=w["wq"][i], wk=w["wk"][i], wv=w["wv"][i], wo=w["wo"][i],
                   ffn_norm=w["rms_ffn"][i], w1=w["w1"][i], w2=w["w2"][i], w3=w["w3"][i]) for i in range(n_layers)]
    return dict(emb=w["emb"], layers=layers, norm=w["rms_final"], out=w["wcls"])


def meta_weights_from_hf(cfg, hf):
    t = {k: torch.from_numpy(v) for k, v in hf.items()}
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layer = dict(attn_norm=t[p + "input_layernorm.weight"],
                     wq=interleave_rows(t[p + "self_attn.q_proj.weight"], n_heads),
                     wk=interleave_rows(t[p + "self_attn.k_proj.weight"], n_kv),
                     wv=t[p + "self_attn.v_proj.weight"], wo=t[p + "self_attn.o_proj.weight"],
                     ffn_norm=t[p + "post_attention_layernorm.weight"], w1=t[p + "mlp.gate_proj.weight"],
                     w2=t[p + "mlp.down_proj.weight"], w3=t[p + "mlp.up_proj.weight"])
        if p + "self_attn.q_proj.bias" in t:
            layer["bq"] = interleave_rows(t[p + "self_attn.q_proj.bias"][:, None], n_heads)[:, 0]
            layer["bk"] = interleave_rows(t[p + "self_attn.k_proj.bias"][:, None], n_kv)[:, 0]
            layer["bv"] = t[p + "self_attn.v_proj.bias"]
        if p + "self_attn.q_norm.weight" in t:  # Qwen3: the per-head norm weights, interleaved too
            layer["q_norm"] = interleave_rows(t[p + "self_attn.q_norm.weight"][:, None], 1)[:, 0]
            layer["k_norm"] = interleave_rows(t[p + "self_attn.k_norm.weight"][:, None], 1)[:, 0]
        layers.append(layer)
    out = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return dict(emb=t["model.embed_tokens.weight"], layers=layers, norm=t["model.norm.weight"], out=out)


def freq_divisors(cfg, hd):
    """llama.cpp's rope_freqs for Llama-3 scaling; ones otherwise (linear: the factor)."""
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    theta = cfg.get("rope_theta", 10000.0)
    if kind == "linear":
        return torch.full((hd // 2,), float(rs["factor"]), dtype=torch.float64)
    if kind != "llama3":
        return torch.ones(hd // 2, dtype=torch.float64)
    out = []
    for i in range(0, hd, 2):
        wavelen = 2 * math.pi * theta ** (i / hd)
        old = rs["original_max_position_embeddings"]
        if wavelen < old / rs["high_freq_factor"]:
            out.append(1.0)
        elif wavelen > old / rs["low_freq_factor"]:
            out.append(rs["factor"])
        else:
            s = (old / wavelen - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
            out.append(1 / ((1 - s) / rs["factor"] + s))
    return torch.tensor(out, dtype=torch.float64)


def meta_forward(cfg, w, tokens):
    d = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    hd = cfg.get("head_dim") or d // n_heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    n = len(tokens)
    freqs = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = freqs / freq_divisors(cfg, hd)
    cis = torch.polar(torch.ones(n, hd // 2, dtype=torch.float64),
                      torch.outer(torch.arange(n, dtype=torch.float64), freqs))

    def rope(x):  # x [n, heads, hd], pairs (2i, 2i+1) as complex numbers
        xc = torch.view_as_complex(x.reshape(n, x.shape[1], hd // 2, 2).contiguous())
        return torch.view_as_real(xc * cis[:, None, :]).reshape(x.shape)

    def norm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    x = w["emb"][torch.tensor(tokens)]
    causal = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    for L in w["layers"]:
        h = norm(x, L["attn_norm"])
        q = h @ L["wq"].T + L.get("bq", 0)
        k = h @ L["wk"].T + L.get("bk", 0)
        v = h @ L["wv"].T + L.get("bv", 0)
        q, k = q.view(n, n_heads, hd), k.view(n, n_kv, hd)
        if "q_norm" in L:  # Qwen3: each head normalised over head_dim before RoPE
            q, k = norm(q, L["q_norm"]), norm(k, L["k_norm"])
        q = rope(q).transpose(0, 1)
        k = rope(k).repeat_interleave(n_heads // n_kv, dim=1).transpose(0, 1)
        v = v.view(n, n_kv, hd).repeat_interleave(n_heads // n_kv, dim=1).transpose(0, 1)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + causal, dim=-1)
        x = x + (att @ v).transpose(0, 1).reshape(n, n_heads * hd) @ L["wo"].T
        h = norm(x, L["ffn_norm"])
        x = x + (torch.nn.functional.silu(h @ L["w1"].T) * (h @ L["w3"].T)) @ L["w2"].T
    return norm(x, w["norm"]) @ w["out"].T


def check_variants(name, folder, cfg, hf, tokens, forward, variants):
    """The fixture's other copies (sharded, bf16, f16) against its f32 HF files: failures."""
    failures = 0
    for variant, tol in variants:
        if os.path.isdir(os.path.join(folder, variant)):
            vcfg, vw = llama_ref.load_hf(os.path.join(folder, variant))
            err = np.abs(forward(vcfg, vw, tokens) - forward(cfg, hf, tokens)).max()
            ok = err <= tol
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name} [{variant}]: max |diff| = {err:.2e} (tolerance {tol})")
    return failures


def main():
    fixtures = sys.argv[1]
    names = json.load(open(os.path.join(fixtures, "fixtures.json")))["fixtures"]
    failures = 0
    for name in names:
        folder = os.path.join(fixtures, name)
        cfg, hf = llama_ref.load_hf(os.path.join(folder, "hf"))
        seqs = json.load(open(os.path.join(folder, "tokens.json")))["sequences"]
        if cfg["architectures"][0].startswith("Gemma"):
            # gemma_forward is checked against HF's own modelling code by gemma_ref_hf_test.py
            failures += check_variants(name, folder, cfg, hf, seqs[1], llama_ref.gemma_forward,
                                       (("hf-bf16", 0.5), ("hf-f16", 0.05)))
            continue
        sources = [("hf permuted", meta_weights_from_hf(cfg, hf))]
        if os.path.exists(os.path.join(folder, "model.bin")):
            sources.append(("llama2.c", read_llama2c(os.path.join(folder, "model.bin"))))
        for tokens in seqs:
            ref = llama_ref.forward(cfg, hf, tokens)
            for label, w in sources:
                other = meta_forward(cfg, w, tokens).numpy()
                err = np.abs(ref - other).max()
                ok = err <= 1e-9
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name} [{label}] {len(tokens)} tokens: max |diff| = {err:.2e}")
        # the sharded and bf16 copies give the same (bf16: close) logits
        failures += check_variants(name, folder, cfg, hf, seqs[1], llama_ref.forward,
                                   (("hf-sharded", 0.0), ("hf-bf16", 0.5), ("hf-f16", 0.05)))
    # CLI: raw float32 [n_tokens, vocab]
    folder = os.path.join(fixtures, names[0])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), "--model", os.path.join(folder, "hf"),
                        "--tokens", "1,2,3", "--out", out], check=True)
        cfg, hf = llama_ref.load_hf(os.path.join(folder, "hf"))
        got = np.fromfile(out, dtype="<f4")
        ok = got.size == 3 * cfg["vocab_size"] and np.allclose(
            got.reshape(3, -1), llama_ref.forward(cfg, hf, [1, 2, 3]).astype(np.float32), rtol=0, atol=0)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} CLI writes float32 [3, {cfg['vocab_size']}]")
    if failures:
        sys.exit(f"{failures} checks failed")


if __name__ == "__main__":
    main()
