#!/usr/bin/python3
"""Independent reference forward pass for Llama-family models (numpy, float64), used by the tests
to check kvlab's logits. Reads a Hugging Face directory by itself (config.json + safetensors,
sharded or not, F32/F16/BF16) and shares no code with kvlab or the fixture generator.

    /usr/bin/python3 tests/reference/llama_ref.py --model DIR --tokens 1,2,3 --out logits.f32

writes raw little-endian float32 logits [n_tokens, vocab] (row i: the logits after token i).

Model (HF LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM, no KV
cache, full causal attention over the given tokens at positions 0..n-1):
    x = E[tokens]
    per layer:  h = rmsnorm(x) * w_in;  q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv
                (Qwen3: q, k = rmsnorm(q_head) * w_qnorm, rmsnorm(k_head) * w_knorm per head)
                q, k = rope_rotate_half(q), rope_rotate_half(k)       (pairs (i, i + d/2))
                a = softmax(q k^T / sqrt(d) + causal mask) v            (kv head = head // group)
                x = x + a Wo^T;  h = rmsnorm(x) * w_post
                x = x + (silu(h Wg^T) * (h Wu^T)) Wd^T
    logits = (rmsnorm(x) * w_final) W_lm^T                              (W_lm = E when tied)
rmsnorm(x) = x / sqrt(mean(x^2) + eps). RoPE inverse frequencies theta^(-2i/d), with "linear"
(divided by factor) and "llama3" scaling (HF's _compute_llama3_parameters).

Gemma2ForCausalLM / Gemma3ForCausalLM (gemma_forward; the math of HF modeling_gemma2.py /
modeling_gemma3.py, every norm normG(x, w) = rmsnorm(x) * (1 + w)):
    x = E[tokens] * sqrt(hidden_size)
    per layer:  h = normG(x, input_layernorm);  q, k, v = h Wq^T, h Wk^T, h Wv^T
                (Gemma 3: q, k = normG per head with q_norm, k_norm)
                q, k = rope_rotate_half at the layer kind's base (Gemma 3: sliding layers
                rope_local_base_freq, unscaled; full layers rope_theta with rope_scaling)
                s = q k^T * query_pre_attn_scalar^-1/2;  (Gemma 2) s = cap tanh(s / cap)
                mask: causal, and on sliding layers key j visible from query i iff i - j < window
                x = x + normG(softmax(s) v Wo^T, post_attention_layernorm)
                h = normG(x, pre_feedforward_layernorm)
                x = x + normG((gelu_tanh(h Wg^T) * (h Wu^T)) Wd^T, post_feedforward_layernorm)
    logits = normG(x, model.norm) E^T;  (final_logit_softcapping) cap tanh(logits / cap)
Layer kinds: layer_types, else sliding_window_pattern (Gemma 3: 6, layer i full iff
(i + 1) % 6 == 0; Gemma 2: even layers sliding).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[base + b: base + end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"{path}: unsupported dtype {e['dtype']} for {name}")
        out[name] = a.reshape(e["shape"])
    return out


def load_hf(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    single = os.path.join(model_dir, "model.safetensors")
    weights = {}
    if os.path.exists(single):
        weights = read_safetensors(single)
    else:
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for s in shards:
            weights.update(read_safetensors(os.path.join(model_dir, s)))
    return cfg, weights


def inv_frequencies(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        factor, low, high = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = rs.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(medium, smoothed, scaled)
    elif kind not in ("default", None):
        raise ValueError(f"unsupported rope scaling {kind}")
    return inv


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_rotate_half(x, cos, sin):
    """x [n, heads, d]; cos/sin [n, d/2]. Rotates pairs (i, i + d/2) by angle pos * inv_freq[i]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def attention_shape(cfg):
    """(hidden size, query heads, KV heads, head dim, RMS eps, group size) of an HF config."""
    d = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    hd = cfg.get("head_dim") or d // n_heads
    return d, n_heads, n_kv, hd, cfg.get("rms_norm_eps", 1e-6), n_heads // n_kv


def forward(cfg, w, tokens):
    d, n_heads, n_kv, hd, eps, group = attention_shape(cfg)
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    ang = np.outer(pos, inv_frequencies(cfg, hd))
    cos, sin = np.cos(ang), np.sin(ang)
    mask = np.triu(np.full((n, n), -np.inf), k=1)

    def bias(name, size):
        return w.get(name, np.zeros(size))

    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T + bias(p + "self_attn.q_proj.bias", n_heads * hd)
        k = h @ w[p + "self_attn.k_proj.weight"].T + bias(p + "self_attn.k_proj.bias", n_kv * hd)
        v = h @ w[p + "self_attn.v_proj.weight"].T + bias(p + "self_attn.v_proj.bias", n_kv * hd)
        q, k = q.reshape(n, n_heads, hd), k.reshape(n, n_kv, hd)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3 (HF modeling_qwen3.py: before RoPE)
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = rope_rotate_half(q, cos, sin)
        k = rope_rotate_half(k, cos, sin)
        v = v.reshape(n, n_kv, hd)
        out = np.empty((n, n_heads, hd))
        for head in range(n_heads):
            kv = head // group
            s = q[:, head, :] @ k[:, kv, :].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, head, :] = s @ v[:, kv, :]
        x = x + out.reshape(n, n_heads * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = swiglu_block(x, w, p, eps)
    return lm_logits(cfg, w, x, eps)


def swiglu_block(x, w, p, eps):
    """x plus layer p's SwiGLU feed-forward of rmsnorm(x) * post_attention_layernorm."""
    h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
    g = h @ w[p + "mlp.gate_proj.weight"].T
    u = h @ w[p + "mlp.up_proj.weight"].T
    return x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T


def lm_logits(cfg, w, x, eps):
    """Logits of the final rmsnorm(x): lm_head, or the embeddings when tied (or absent)."""
    x = rmsnorm(x, w["model.norm.weight"], eps)
    lm = w.get("lm_head.weight")
    if lm is None or cfg.get("tie_word_embeddings", False):
        lm = w["model.embed_tokens.weight"]
    return x @ lm.T


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gemma_forward(cfg, w, tokens):
    gemma3 = cfg["architectures"][0] == "Gemma3ForCausalLM"
    d, n_heads, n_kv, hd, eps, group = attention_shape(cfg)
    n_layers = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window", 4096)
    kinds = cfg.get("layer_types")
    if kinds is None:
        pattern = cfg.get("sliding_window_pattern", 6 if gemma3 else 2)
        kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    attn_cap = cfg.get("attn_logit_softcapping", None if gemma3 else 50.0)
    final_cap = cfg.get("final_logit_softcapping", None if gemma3 else 30.0)
    scale = cfg.get("query_pre_attn_scalar", 256) ** -0.5
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    global_cfg = dict(cfg, rope_theta=cfg.get("rope_theta", 1e6 if gemma3 else 10000.0))
    local_cfg = dict(cfg, rope_theta=cfg.get("rope_local_base_freq", 10000.0), rope_scaling=None) if gemma3 else global_cfg
    rot = {}
    for kind, c in (("full_attention", global_cfg), ("sliding_attention", local_cfg)):
        ang = np.outer(pos, inv_frequencies(c, hd))
        rot[kind] = (np.cos(ang), np.sin(ang))
    i_idx, j_idx = np.arange(n)[:, None], np.arange(n)[None, :]
    masks = {"full_attention": np.where(j_idx <= i_idx, 0.0, -np.inf),
             "sliding_attention": np.where((j_idx <= i_idx) & (i_idx - j_idx < window), 0.0, -np.inf)}

    def norm(x, name):
        return rmsnorm(x, 1.0 + w[name], eps)

    x = w["model.embed_tokens.weight"][np.asarray(tokens)] * math.sqrt(d)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        cos, sin = rot[kinds[i]]
        h = norm(x, p + "input_layernorm.weight")
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, n_heads, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, n_kv, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, n_kv, hd)
        if gemma3:
            q = norm(q, p + "self_attn.q_norm.weight")
            k = norm(k, p + "self_attn.k_norm.weight")
        q = rope_rotate_half(q, cos, sin)
        k = rope_rotate_half(k, cos, sin)
        out = np.empty((n, n_heads, hd))
        for head in range(n_heads):
            kv = head // group
            s = q[:, head, :] @ k[:, kv, :].T * scale
            if attn_cap:
                s = attn_cap * np.tanh(s / attn_cap)
            s = s + masks[kinds[i]]
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, head, :] = s @ v[:, kv, :]
        a = out.reshape(n, n_heads * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = x + norm(a, p + "post_attention_layernorm.weight")
        h = norm(x, p + "pre_feedforward_layernorm.weight")
        f = (gelu_tanh(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        x = x + norm(f, p + "post_feedforward_layernorm.weight")
    x = norm(x, "model.norm.weight")
    lm = w.get("lm_head.weight")
    if lm is None or cfg.get("tie_word_embeddings", True):
        lm = w["model.embed_tokens.weight"]
    logits = x @ lm.T
    if final_cap:
        logits = final_cap * np.tanh(logits / final_cap)
    return logits


def reference_cli(description, script, add_args=None):
    """The reference scripts' command line: --model DIR --tokens a,b,... --out FILE (and what
    add_args(parser) adds). Returns (args, config, weights, token ids), the ids checked against
    the vocabulary; the caller writes its logits with write_logits."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids, e.g. 1,2,3")
    ap.add_argument("--out", required=True, help="output: raw float32 [n_tokens, vocab]")
    if add_args:
        add_args(ap)
    args = ap.parse_args()
    cfg, w = load_hf(args.model)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    vocab = cfg["vocab_size"]
    if not tokens or min(tokens) < 0 or max(tokens) >= vocab:
        sys.exit(f"{script}: token ids must be in [0, {vocab})")
    return args, cfg, w, tokens


def write_logits(logits, path):
    """Raw little-endian float32 [n_tokens, vocab]."""
    logits.astype("<f4").tofile(path)


def main():
    args, cfg, w, tokens = reference_cli("numpy float64 reference forward pass (HF directory)", "llama_ref.py")
    gemma = cfg["architectures"][0] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    write_logits((gemma_forward if gemma else forward)(cfg, w, tokens), args.out)


if __name__ == "__main__":
    main()
