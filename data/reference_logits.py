#!/usr/bin/python3
"""Independent NumPy reference forward for exported kvlab-tiny files (and any small F32 Llama).

Reads a Hugging Face directory (config.json + model.safetensors; RoPE rotate-half pairs
(i, i + hd/2)) or a GGUF file (arch llama, F32 tensors; RoPE interleaved pairs (2i, 2i+1), applied
as such -- the rows are NOT un-permuted, so agreement between the two files checks the export's
permutation), runs the full-attention Llama forward in float64, and prints or saves logits.

  data/reference_logits.py --model data/models/kvlab-tiny.gguf --tokens 1,324,1384
  data/reference_logits.py --model data/models/kvlab-tiny-hf --text-file data/eval/heldout.txt \
      --max-tokens 128 --out logits.npy          # tokenises with BOS via the model's tokenizer

Output: --out FILE.npy saves logits [n_tokens, vocab] float32 (and FILE.tokens.txt with the
ids); without --out, prints one line per position: "pos token_id argmax max_logit".
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np


# ---- readers ---------------------------------------------------------------------------------
def read_safetensors(path: Path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name}: only F32 supported, got {info['dtype']}")
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(raw[base + a:base + b], dtype="<f4").reshape(info["shape"])
    return out


def read_gguf(path: Path):
    """Minimal GGUF v2/v3 reader: returns (metadata dict, {name: F32 array in row-major})."""
    raw = path.read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, raw, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = raw[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t in scalar:
            return take(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"{path}: unknown GGUF value type {t}")

    if raw[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        ttype, off = take("I"), take("Q")
        infos.append((name, ne, ttype, off))
    align = meta.get("general.alignment", 32)
    data = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, ttype, off in infos:
        if ttype != 0:
            raise ValueError(f"{path}: tensor {name}: only F32 supported, got type {ttype}")
        count = int(np.prod(ne))
        a = np.frombuffer(raw, dtype="<f4", count=count, offset=data + off)
        tensors[name] = a.reshape(list(reversed(ne)))
    return meta, tensors


def load(path: Path):
    """-> (cfg dict, weights dict in HF naming, tokenizer path or None)."""
    if path.is_dir():
        c = json.loads((path / "config.json").read_text())
        cfg = dict(dim=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                   n_kv_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
                   rope_theta=c["rope_theta"], eps=c["rms_norm_eps"])
        return cfg, read_safetensors(path / "model.safetensors"), path / "tokenizer.model"
    meta, t = read_gguf(path)
    a = meta["general.architecture"]
    H, KV = meta[f"{a}.attention.head_count"], meta[f"{a}.attention.head_count_kv"]
    dim = meta[f"{a}.embedding_length"]
    cfg = dict(dim=dim, n_layers=meta[f"{a}.block_count"], n_heads=H, n_kv_heads=KV,
               head_dim=meta.get(f"{a}.attention.key_length", dim // H),
               rope_theta=meta[f"{a}.rope.freq_base"], eps=meta[f"{a}.attention.layer_norm_rms_epsilon"])
    w = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
         "lm_head.weight": t.get("output.weight", t["token_embd.weight"])}
    names = dict(attn_norm="input_layernorm", attn_q="self_attn.q_proj", attn_k="self_attn.k_proj",
                 attn_v="self_attn.v_proj", attn_output="self_attn.o_proj", ffn_norm="post_attention_layernorm",
                 ffn_gate="mlp.gate_proj", ffn_up="mlp.up_proj", ffn_down="mlp.down_proj")
    for i in range(cfg["n_layers"]):
        for g, h in names.items():
            w[f"model.layers.{i}.{h}.weight"] = t[f"blk.{i}.{g}.weight"]
    cfg["rope_style"] = "interleaved"
    return cfg, w, None


# ---- forward ---------------------------------------------------------------------------------
def forward(cfg, w, tokens):
    """Full causal attention over `tokens` (positions 0..n-1) -> logits [n, vocab] (float64)."""
    f = lambda n: w[n].astype(np.float64)
    n = len(tokens)
    D, H, KV, hd = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    half = hd // 2
    theta = cfg["rope_theta"] ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)
    ang = np.arange(n, dtype=np.float64)[:, None] * theta[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["eps"]) * g

    def rope(x):  # x [n, heads, hd]; pair i turns by pos * theta_i
        c, s = cos[:, None, :], sin[:, None, :]
        if cfg.get("rope_style") == "interleaved":   # pairs (2i, 2i+1)
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = x1 * c - x2 * s, x1 * s + x2 * c
            return out
        x1, x2 = x[..., :half], x[..., half:]           # rotate-half pairs (i, i + hd/2)
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)

    x = f("model.embed_tokens.weight")[np.asarray(tokens)]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(cfg["n_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, f(p + "input_layernorm.weight"))
        q = rope((h @ f(p + "self_attn.q_proj.weight").T).reshape(n, H, hd))
        k = rope((h @ f(p + "self_attn.k_proj.weight").T).reshape(n, KV, hd))
        v = (h @ f(p + "self_attn.v_proj.weight").T).reshape(n, KV, hd)
        out = np.zeros((n, H, hd))
        for head in range(H):
            kv = head // (H // KV)
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(n, H * hd) @ f(p + "self_attn.o_proj.weight").T
        h = rms(x, f(p + "post_attention_layernorm.weight"))
        g = h @ f(p + "mlp.gate_proj.weight").T
        x = x + ((g / (1 + np.exp(-g))) * (h @ f(p + "mlp.up_proj.weight").T)) @ f(p + "mlp.down_proj.weight").T
    return rms(x, f("model.norm.weight")) @ f("lm_head.weight").T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="HF directory or .gguf file")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--text-file", type=Path, help="text to tokenise (BOS added)")
    ap.add_argument("--tokenizer", type=Path,
                    help="tokenizer.model (default: the HF dir's, or for X.gguf the one in X-hf/)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cfg, w, tok_path = load(args.model)
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",")]
    elif args.text_file:
        import sentencepiece as spm
        if args.tokenizer is None and tok_path is None:
            # a GGUF: use the HF twin's tokenizer.model (<stem>-hf/) when it is there
            tok_path = args.model.with_name(args.model.stem + "-hf") / "tokenizer.model"
            if not tok_path.exists():
                ap.error(f"{args.model}: give --tokenizer (no {tok_path})")
        sp = spm.SentencePieceProcessor(model_file=str(args.tokenizer or tok_path))
        tokens = [sp.bos_id()] + sp.encode(args.text_file.read_text("utf-8"))
    else:
        ap.error("give --tokens or --text-file")
    tokens = tokens[:args.max_tokens]
    logits = forward(cfg, w, tokens)
    if args.out:
        np.save(args.out, logits.astype(np.float32))
        Path(str(args.out) + ".tokens.txt").write_text(",".join(map(str, tokens)) + "\n")
    else:
        for i, t in enumerate(tokens):
            print(i, t, int(logits[i].argmax()), f"{logits[i].max():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
