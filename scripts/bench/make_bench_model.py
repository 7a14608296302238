#!/usr/bin/python3
"""Writes the random-weight Llama that scripts/bench_vs_anchors.sh runs kvlab and the anchors on.

    /usr/bin/python3 scripts/bench/make_bench_model.py OUTDIR [--shape 110m|1b] [--seed N]

110m (llama2.c's stories110M shape: dim 768, 12 layers, 12 heads, hidden 2048, vocab 32000, tied):
  OUTDIR/model-f32.gguf      GGUF v3, every tensor F32 (Q/K rows permuted for interleaved RoPE, as
                             llama.cpp's converter writes them), context_length 8192
  OUTDIR/model.bin           the same weights in llama2.c run.c's legacy layout (seq_len 1024)
  OUTDIR/tokenizer.bin       its tokenizer (the same vocabulary)
1b (dim 2048, 16 layers, 32 query / 8 KV heads, hidden 8192, vocab 32000, untied):
  OUTDIR/model-bf16.gguf     matrices BF16 (1-D tensors F32), written directly: an f32 copy would be
                             4 GiB; no llama2.c file (run.c has no bf16)

Weights as scripts/fixtures/make_fixtures.py draws them (N(0, 1/fan_in) matrices, norms
1 + N(0, 0.1)), except the embedding: N(0, 1/dim), so that the tied output layer gives logits of
O(1) (a perplexity well below overflow, comparable between programs). The vocabulary is the fixtures'
synthetic SentencePiece one (<unk> <s> </s>, 256 byte pieces, common English words) filled up to
32000 with "▁w<i>" pieces, so English text tokenizes into words, letters and bytes.
"""

import argparse
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from gguf_writer import GgufWriter  # noqa: E402
from make_fixtures import (  # noqa: E402
    add_spm_tokenizer, permute_for_interleaved, synthetic_vocab, write_llama2c_tokenizer)

SHAPES = {
    "110m": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, hidden=2048, vocab=32000, tied=True),
    "1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, hidden=8192, vocab=32000, tied=False),
}
GGUF_CONTEXT = 8192     # room for the 4096-token-prompt decode test
LLAMA2C_SEQ_LEN = 1024  # run.c allocates its KV cache for seq_len
ROPE_THETA, RMS_EPS = 10000.0, 1e-5


def vocab(n):
    """(pieces, scores, token_types): the fixtures' synthetic vocabulary at its largest, then
    "\u2581w<i>" fillers up to n entries; scores decreasing after the 259 special and byte pieces."""
    size = 259
    while True:  # the largest vocabulary synthetic_vocab can build from its word list
        try:
            synthetic_vocab(size + 1)
        except ValueError:
            break
        size += 1
    pieces = list(synthetic_vocab(min(n, size))[0])
    seen = set(pieces)
    i = 0
    while len(pieces) < n:
        p = f"\u2581w{i}"
        i += 1
        if p not in seen:
            pieces.append(p)
            seen.add(p)
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(n - 259)]
    return pieces, scores, types


class Weights:
    """Draws the model's tensors in a fixed order from one PCG64 stream (same bytes every run)."""

    def __init__(self, cfg, seed):
        self.cfg, self.rng = cfg, np.random.Generator(np.random.PCG64(seed))

    def mat(self, rows, cols, scale=None):
        s = 1.0 / math.sqrt(cols) if scale is None else scale
        return self.rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(s)

    def norm(self, n):
        return (1.0 + 0.1 * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def layer_tensors(W, cfg):
    """One layer's tensors (GGUF names, GGUF row order), in draw order."""
    d, h, kv, ff = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["hidden"]
    hd = d // h
    out = {}
    out["attn_norm.weight"] = W.norm(d)
    out["attn_q.weight"] = permute_for_interleaved(W.mat(h * hd, d), h)
    out["attn_k.weight"] = permute_for_interleaved(W.mat(kv * hd, d), kv)
    out["attn_v.weight"] = W.mat(kv * hd, d)
    out["attn_output.weight"] = W.mat(d, h * hd)
    out["ffn_norm.weight"] = W.norm(d)
    out["ffn_gate.weight"] = W.mat(ff, d)
    out["ffn_up.weight"] = W.mat(ff, d)
    out["ffn_down.weight"] = W.mat(d, ff)
    return out


def gguf_header(path, cfg, name, file_type):
    g = GgufWriter(path)
    g.add("general.architecture", "llama")
    g.add("general.name", name)
    g.add("general.file_type", file_type, vtype="UINT32")
    g.add("llama.context_length", GGUF_CONTEXT, vtype="UINT32")
    g.add("llama.embedding_length", cfg["dim"], vtype="UINT32")
    g.add("llama.block_count", cfg["n_layers"], vtype="UINT32")
    g.add("llama.feed_forward_length", cfg["hidden"], vtype="UINT32")
    g.add("llama.attention.head_count", cfg["n_heads"], vtype="UINT32")
    g.add("llama.attention.head_count_kv", cfg["n_kv_heads"], vtype="UINT32")
    g.add("llama.rope.dimension_count", cfg["dim"] // cfg["n_heads"], vtype="UINT32")
    g.add("llama.rope.freq_base", ROPE_THETA)
    g.add("llama.attention.layer_norm_rms_epsilon", RMS_EPS)
    g.add("llama.vocab_size", cfg["vocab"], vtype="UINT32")
    pieces, scores, types = vocab(cfg["vocab"])
    add_spm_tokenizer(g, pieces, scores, types)
    return g


def write_110m(outdir, cfg, seed):
    W = Weights(cfg, seed)
    emb = W.mat(cfg["vocab"], cfg["dim"], scale=1.0 / math.sqrt(cfg["dim"]))
    layers = [layer_tensors(W, cfg) for _ in range(cfg["n_layers"])]
    out_norm = W.norm(cfg["dim"])
    g = gguf_header(os.path.join(outdir, "model-f32.gguf"), cfg, "kvlab bench 110m", 0)
    g.add_tensor("token_embd.weight", emb)
    g.add_tensor("output_norm.weight", out_norm)
    for i, lt in enumerate(layers):
        for n, t in lt.items():
            g.add_tensor(f"blk.{i}.{n}", t)
    g.write()
    del g
    # llama2.c legacy layout: header, then each kind of tensor for all layers; Q/K already in
    # interleaved order (llama2.c's export permutes them the same way)
    header = struct.pack("<7i", cfg["dim"], cfg["hidden"], cfg["n_layers"], cfg["n_heads"],
                         cfg["n_kv_heads"], cfg["vocab"], LLAMA2C_SEQ_LEN)
    hd = cfg["dim"] // cfg["n_heads"]
    inv = 1.0 / (ROPE_THETA ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(LLAMA2C_SEQ_LEN), inv)
    order = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
             "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight", "ffn_up.weight"]
    with open(os.path.join(outdir, "model.bin"), "wb") as f:
        f.write(header)
        f.write(emb.astype("<f4").tobytes())
        for n in order:
            for lt in layers:
                f.write(np.ascontiguousarray(lt[n], dtype="<f4").tobytes())
        f.write(out_norm.astype("<f4").tobytes())
        f.write(np.cos(ang).astype("<f4").tobytes())  # freq_cis_real/imag (run.c skips them)
        f.write(np.sin(ang).astype("<f4").tobytes())
    pieces, scores, _ = vocab(cfg["vocab"])
    write_llama2c_tokenizer(os.path.join(outdir, "tokenizer.bin"), pieces, scores)


def write_1b(outdir, cfg, seed):
    W = Weights(cfg, seed)
    g = gguf_header(os.path.join(outdir, "model-bf16.gguf"), cfg, "kvlab bench 1b", 32)
    g.add_tensor("token_embd.weight", W.mat(cfg["vocab"], cfg["dim"], scale=1.0 / math.sqrt(cfg["dim"])), "BF16")
    g.add_tensor("output_norm.weight", W.norm(cfg["dim"]))
    g.add_tensor("output.weight", W.mat(cfg["vocab"], cfg["dim"]), "BF16")
    for i in range(cfg["n_layers"]):
        for n, t in layer_tensors(W, cfg).items():
            g.add_tensor(f"blk.{i}.{n}", t, "BF16" if t.ndim == 2 else "F32")
    g.write()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="110m")
    ap.add_argument("--seed", type=int, default=110)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    (write_110m if a.shape == "110m" else write_1b)(a.outdir, SHAPES[a.shape], a.seed)
    print(f"wrote the {a.shape} model to {a.outdir}")


if __name__ == "__main__":
    main()
