#!/usr/bin/python3
"""Checks tests/reference/mla_ref.py on its own, on every MLA fixture
(scripts/fixtures/make_mla_fixtures.py):
  1. its decompressed (HF's per-head K, V) and absorbed (latent-cache) modes agree;
  2. both agree with a second, differently written forward pass: PyTorch, token by token with an
     explicit latent cache (the cache holds c and the rotated k_pe per token, as MLA's does), RoPE
     as a complex multiplication of the pairs (2i, 2i+1), the weights read from the GGUF file
     (through gguf-py-free parsing here) rather than from the HF directory;
  3. the CLI writes [n_tokens, vocab] float32.
All in float64: the passes differ by reordered sums only, |diff| <= 1e-9 x the logit scale
(values O(10), 2^-53 relative rounding per operation over < 10^4-term paths: ~1e-12).

    /usr/bin/python3 tests/reference/mla_ref_test.py MLA_FIXTURES_DIR
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
import mla_ref  # noqa: E402
from llama_ref import load_hf  # noqa: E402


def read_gguf_f32(path):
    """name -> float64 tensor (row-major, numpy order) of a GGUF v3 file whose tensors are all F32,
    and the metadata dict (scalars and strings only; arrays skipped)."""
    data = open(path, "rb").read()
    assert data[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    off = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fmts = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def string():
        nonlocal off
        (n,) = struct.unpack_from("<Q", data, off)
        s = data[off + 8: off + 8 + n].decode("utf-8")
        off += 8 + n
        return s

    def value(t):
        nonlocal off
        if t == 8:
            return string()
        if t == 9:
            et, cnt = struct.unpack_from("<IQ", data, off)
            off += 12
            for _ in range(cnt):
                value(et)
            return None
        (v,) = struct.unpack_from(fmts[t], data, off)
        off += sizes[t]
        return v

    meta = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", data, off)
        off += 4
        meta[key] = value(t)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (nd,) = struct.unpack_from("<I", data, off)
        off += 4
        ne = struct.unpack_from(f"<{nd}Q", data, off)
        off += 8 * nd
        ttype, toff = struct.unpack_from("<IQ", data, off)
        off += 12
        assert ttype == 0, f"{name}: not F32"
        infos.append((name, list(reversed(ne)), toff))
    align = meta.get("general.alignment", 32)
    base = (off + align - 1) // align * align
    out = {}
    for name, shape, toff in infos:
        n = int(np.prod(shape))
        out[name] = torch.from_numpy(
            np.frombuffer(data, dtype="<f4", count=n, offset=base + toff).astype(np.float64).reshape(shape))
    return out, meta


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope_complex(x, pos, theta, yarn=None):
    """x [..., d]: pairs (2i, 2i+1) as complex numbers times exp(i theta_i), theta_i = pos
    theta^(-2i/d), or with yarn = (freq_scale, orig ctx, beta_fast, beta_slow) llama.cpp's
    rope_yarn: theta_i = interp (1 - mix) + extrap mix, mix = rope_yarn_ramp(corr dims, 2i)."""
    d = x.shape[-1]
    extrap = pos / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = extrap
    if yarn:
        fs, orig, bf, bs = yarn

        def corr(n_rot):  # ggml_rope_yarn_corr_dim
            return d * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = max(0, math.floor(corr(bf))), min(d - 1, math.ceil(corr(bs)))
        i0 = torch.arange(0, d, 2, dtype=torch.float64)
        y = (i0 / 2 - lo) / max(0.001, hi - lo)
        mix = 1 - torch.clamp(y, 0, 1)
        ang = fs * extrap * (1 - mix) + extrap * mix
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)).reshape(x.shape)


def torch_incremental(path, tokens):
    """Token-by-token forward with an explicit latent cache, from the GGUF file."""
    w, meta = read_gguf_f32(path)
    a = "deepseek2"
    H = meta[f"{a}.attention.head_count"]
    n_layers = meta[f"{a}.block_count"]
    rope = meta[f"{a}.rope.dimension_count"]
    nope = meta[f"{a}.attention.key_length"] - rope
    vh = meta[f"{a}.attention.value_length"]
    r = meta[f"{a}.attention.kv_lora_rank"]
    eps = meta[f"{a}.attention.layer_norm_rms_epsilon"]
    theta = meta[f"{a}.rope.freq_base"]
    scale = 1.0 / math.sqrt(nope + rope)
    yarn = None
    if meta.get(f"{a}.rope.scaling.type") == "yarn":  # build_deepseek2: kq_scale mscale^2 / sqrt(qk)
        factor = meta[f"{a}.rope.scaling.factor"]
        yarn = (1 / factor, meta[f"{a}.rope.scaling.original_context_length"], 32.0, 1.0)
        scale *= (1 + meta[f"{a}.rope.scaling.yarn_log_multiplier"] * math.log(factor)) ** 2
    cache = [[] for _ in range(n_layers)]  # per layer: [c (r) ; k_pe (rope)] rows
    logits = []
    for t, tok in enumerate(tokens):
        x = w["token_embd.weight"][tok]
        for i in range(n_layers):
            b = f"blk.{i}."
            h = rms(x, w[b + "attn_norm.weight"], eps)
            if b + "attn_q_a.weight" in w:
                q = w[b + "attn_q_b.weight"] @ rms(w[b + "attn_q_a.weight"] @ h, w[b + "attn_q_a_norm.weight"], eps)
            else:
                q = w[b + "attn_q.weight"] @ h
            q = q.reshape(H, nope + rope)
            kva = w[b + "attn_kv_a_mqa.weight"] @ h
            c = rms(kva[:r], w[b + "attn_kv_a_norm.weight"], eps)
            cache[i].append(torch.cat([c, rope_complex(kva[r:], float(t), theta, yarn)]))
            C = torch.stack(cache[i])  # [t + 1, r + rope]
            wkvb = w[b + "attn_kv_b.weight"].reshape(H, nope + vh, r)
            heads = []
            for hh in range(H):
                q_abs = wkvb[hh, :nope, :].T @ q[hh, :nope]
                q_row = torch.cat([q_abs, rope_complex(q[hh, nope:], float(t), theta, yarn)])
                p = torch.softmax(C @ q_row * scale, dim=0)
                heads.append(wkvb[hh, nope:, :] @ (p @ C[:, :r]))
            x = x + w[b + "attn_output.weight"] @ torch.cat(heads)
            h = rms(x, w[b + "ffn_norm.weight"], eps)
            g = w[b + "ffn_gate.weight"] @ h
            x = x + w[b + "ffn_down.weight"] @ (torch.nn.functional.silu(g) * (w[b + "ffn_up.weight"] @ h))
        lm = w.get("output.weight", w["token_embd.weight"])
        logits.append(lm @ rms(x, w["output_norm.weight"], eps))
    return torch.stack(logits).numpy()


def main():
    root = sys.argv[1]
    names = json.load(open(os.path.join(root, "fixtures.json")))["fixtures"]
    assert names, "no MLA fixtures"
    failures = 0
    for name in names:
        d = os.path.join(root, name)
        cfg, w = load_hf(os.path.join(d, "hf"))
        seqs = json.load(open(os.path.join(d, "tokens.json")))["sequences"]
        for seq in (seqs[1], seqs[-1]):
            dec = mla_ref.forward(cfg, w, seq, "decompressed")
            ab = mla_ref.forward(cfg, w, seq, "absorbed")
            inc = torch_incremental(os.path.join(d, "model.gguf"), seq)
            scale = float(np.abs(dec).max())
            for what, other in (("absorbed", ab), ("torch incremental (GGUF)", inc)):
                diff = float(np.abs(dec - other).max())
                ok = diff <= 1e-9 * scale
                failures += not ok
                print(f"{name} {len(seq)} tokens: decompressed vs {what}: max |diff| {diff:.3g} "
                      f"(scale {scale:.3g}) {'ok' if ok else 'FAIL'}")
        seq = seqs[1]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "l.f32")
            subprocess.run([sys.executable, os.path.join(HERE, "mla_ref.py"), "--model", os.path.join(d, "hf"),
                            "--tokens", ",".join(map(str, seq)), "--out", out], check=True)
            got = np.fromfile(out, dtype="<f4")
            want = mla_ref.forward(cfg, w, seq).astype(np.float32).ravel()
            ok = got.shape == want.shape and np.array_equal(got, want)
            failures += not ok
            print(f"{name}: CLI writes [{len(seq)}, {cfg['vocab_size']}] float32: {'ok' if ok else 'FAIL'}")
    if failures:
        sys.exit(f"mla_ref_test: {failures} check(s) failed")
    print("mla_ref_test: all checks passed")


if __name__ == "__main__":
    main()
