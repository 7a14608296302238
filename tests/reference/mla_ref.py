#!/usr/bin/python3
"""Independent reference forward pass for multi-head latent attention models (DeepSeek-V2/V3
attention, dense FFN; numpy, float64). Reads a Hugging Face directory (DeepseekV2ForCausalLM /
DeepseekV3ForCausalLM config.json + safetensors) through llama_ref.py's reader and shares no
code with kvlab or the fixture generator.

    /usr/bin/python3 tests/reference/mla_ref.py --model DIR --tokens 1,2,3 --out logits.f32
        [--mode decompressed|absorbed]

writes raw little-endian float32 logits [n_tokens, vocab] (row i: the logits after token i).

Model (the math of HF modeling_deepseek.py's DeepseekV2Attention, no KV cache, positions 0..n-1;
H heads, nope = qk_nope_head_dim, rope = qk_rope_head_dim, v = v_head_dim, r = kv_lora_rank):
    h = rmsnorm(x) * input_layernorm
    q = rmsnorm(h Wqa^T) * q_a_layernorm  Wqb^T      (q_lora_rank null: q = h Wq^T)  [n, H, nope + rope]
    [c_raw ; k_pe] = h Wkva^T                        [n, r + rope]
    c = rmsnorm(c_raw) * kv_a_layernorm              the latent the MLA cache holds, with k_pe
    q_pe, k_pe rotated by RoPE over their rope dims, pairs (2i, 2i+1) (HF reorders each rope part
        to rotate-half order first: the same rotation), inv_freq theta^(-2i/rope)
    scale = 1/sqrt(nope + rope)
    rope_scaling yarn (DeepseekV2YarnRotaryEmbedding): inv_freq = inter * (1 - mask) + extra * mask,
        extra = theta^(-2i/rope), inter = extra / factor, mask = 1 - linear_ramp(low, high) over
        the pairs, low / high = floor / ceil of rope ln(orig / (2 pi beta)) / (2 ln theta) for
        beta_fast / beta_slow clamped to [0, rope - 1]; cos, sin times
        m(factor, mscale) / m(factor, mscale_all_dim), m(s, x) = 0.1 x ln s + 1 (1 for s <= 1);
        scale times m(factor, mscale_all_dim)^2 (when mscale_all_dim is set)
  decompressed (what HF computes):
    [k_nope ; v] = c Wkvb^T per head  [n, H, nope + v];  k = [k_nope ; k_pe], q = [q_nope ; q_pe]
    a_h = softmax(q_h k_h^T * scale + causal) v_h
  absorbed (the latent-cache form; W_UK_h, W_UV_h = head h's nope / v rows of Wkvb):
    q_abs_h = W_UK_h^T q_nope_h  [r];  s = (q_abs_h . c_j + q_pe_h . k_pe_j) * scale
    a_h = W_UV_h (softmax(s + causal) c)
    x = x + a Wo^T; h = rmsnorm(x) * post_attention_layernorm; x = x + (silu(h Wg^T) * h Wu^T) Wd^T
    logits = (rmsnorm(x) * norm) W_lm^T  (W_lm = embed_tokens when tied)
The two modes are equal in exact arithmetic (q_nope . (W_UK c) = (W_UK^T q_nope) . c, and
P (c W_UV^T) = (P c) W_UV^T); mla_ref_test.py checks that, and more.
MoE layers (n_routed_experts set and a layer past first_k_dense_replace) are refused.
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import lm_logits, reference_cli, rmsnorm, swiglu_block, write_logits  # noqa: E402


def yarn_m(scale, x):
    return 1.0 if scale <= 1 else 0.1 * x * math.log(scale) + 1.0


def inv_frequencies(cfg, d):
    theta = cfg.get("rope_theta", 10000.0)
    extra = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = cfg.get("rope_scaling")
    if not rs:
        return extra, 1.0
    if rs.get("type", rs.get("rope_type")) != "yarn":
        raise ValueError(f"mla_ref.py: rope_scaling {rs} is not modelled")
    factor, orig = rs["factor"], rs["original_max_position_embeddings"]

    def corr(n_rot):
        return d * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(corr(rs.get("beta_slow", 1))), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    inv = extra / factor * (1 - mask) + extra * mask
    return inv, yarn_m(factor, rs.get("mscale", 1)) / yarn_m(factor, rs.get("mscale_all_dim", 0))


def rope_interleaved(x, pos, inv, mag=1.0):
    """x [n, heads, d]: pairs (2i, 2i+1) rotated by pos * inv[i], cos and sin times mag."""
    ang = np.outer(pos, inv)[:, None, :]
    c, s = np.cos(ang) * mag, np.sin(ang) * mag
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x1 * c + x0 * s
    return out


def softmax_causal(s):
    n = s.shape[0]
    s = s + np.triu(np.full((n, s.shape[1]), -np.inf), k=1)
    s = np.exp(s - s.max(axis=1, keepdims=True))
    return s / s.sum(axis=1, keepdims=True)


def forward(cfg, w, tokens, mode="decompressed"):
    if cfg.get("n_routed_experts") and cfg.get("first_k_dense_replace", 0) < cfg["num_hidden_layers"]:
        raise ValueError("mla_ref.py: mixture-of-experts layers are not modelled")
    H, eps = cfg["num_attention_heads"], cfg.get("rms_norm_eps", 1e-6)
    nope, rope, vh = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    r = cfg["kv_lora_rank"]
    inv, mag = inv_frequencies(cfg, rope)
    scale = 1.0 / math.sqrt(nope + rope)
    rs = cfg.get("rope_scaling") or {}
    if rs.get("mscale_all_dim"):
        scale *= yarn_m(rs["factor"], rs["mscale_all_dim"]) ** 2
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        h = rmsnorm(x, w[f"model.layers.{i}.input_layernorm.weight"], eps)
        if cfg.get("q_lora_rank"):
            q = rmsnorm(h @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], eps) @ w[p + "q_b_proj.weight"].T
        else:
            q = h @ w[p + "q_proj.weight"].T
        q = q.reshape(n, H, nope + rope)
        q_nope, q_pe = q[..., :nope], rope_interleaved(q[..., nope:], pos, inv, mag)
        kva = h @ w[p + "kv_a_proj_with_mqa.weight"].T
        c = rmsnorm(kva[:, :r], w[p + "kv_a_layernorm.weight"], eps)            # [n, r]
        k_pe = rope_interleaved(kva[:, None, r:], pos, inv, mag)[:, 0, :]      # [n, rope]
        wkvb = w[p + "kv_b_proj.weight"].reshape(H, nope + vh, r)
        out = np.empty((n, H, vh))
        if mode == "decompressed":
            kv = (c @ w[p + "kv_b_proj.weight"].T).reshape(n, H, nope + vh)
            k_nope, v = kv[..., :nope], kv[..., nope:]
            for head in range(H):
                k = np.concatenate([k_nope[:, head, :], k_pe], axis=1)
                qh = np.concatenate([q_nope[:, head, :], q_pe[:, head, :]], axis=1)
                out[:, head, :] = softmax_causal(qh @ k.T * scale) @ v[:, head, :]
        elif mode == "absorbed":
            for head in range(H):
                w_uk, w_uv = wkvb[head, :nope, :], wkvb[head, nope:, :]         # [nope, r], [v, r]
                q_abs = q_nope[:, head, :] @ w_uk                               # [n, r]
                s = (q_abs @ c.T + q_pe[:, head, :] @ k_pe.T) * scale
                out[:, head, :] = (softmax_causal(s) @ c) @ w_uv.T
        else:
            raise ValueError(f"unknown mode {mode}")
        x = x + out.reshape(n, H * vh) @ w[p + "o_proj.weight"].T
        x = swiglu_block(x, w, f"model.layers.{i}.", eps)
    return lm_logits(cfg, w, x, eps)


def main():
    args, cfg, w, tokens = reference_cli(
        "numpy float64 MLA reference forward pass (HF directory)", "mla_ref.py",
        lambda ap: ap.add_argument("--mode", default="decompressed", choices=["decompressed", "absorbed"]))
    write_logits(forward(cfg, w, tokens, args.mode), args.out)


if __name__ == "__main__":
    main()
