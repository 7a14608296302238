#!/usr/bin/python3
"""kvlab against llama.cpp (the anchor at c392e50, ../shared/anchors) on a random-weight Gemma 2
GGUF: `kvlab perplexity` and `llama-perplexity` on the same file and text, the same protocol
(real_models_test.py's: windows of CTX tokens, the second half scored, F32 KV cache in llama.cpp).

    gemma2_anchor_test.py KVLAB_EXE SOURCE_DIR

The model (written with scripts/fixtures/make_fixtures.py's GGUF writer and weights): 26 layers
(llama.cpp at c392e50 aborts on a gemma2 of another depth: its query scale is chosen by model
type, 26 layers = "2B" -> 1/sqrt(head_dim), kvlab's rule for that depth too), dim 64, 2 query
heads / 1 KV head of 32, FFN 128, the fixtures' synthetic vocabulary (1173 pieces, byte fallback),
window 32 on the even layers (shorter than CTX = 128: the local layers' mask matters), attention
soft-cap 5 and final soft-cap 10 (small enough to bend the random scores and logits).
PPL within 1e-3 relative, as real_models_test.py. Here the two differ by more than summation order:
llama.cpp's CPU GELU rounds each activation's input and output through fp16 (ggml-cpu.c,
GGML_GELU_FP16: up to ~2^-10 relative per activation); measured this session: 2.5e-4. The check
still tells the features apart: the same weights with window 31 give a PPL 1.8e-2 away, an
attention soft-cap of 1e-4 instead of 5 one 7.5e-2 away (measured with kvlab on such files).

Skips (exit 77) without ../shared or a built llama-perplexity (anchor_ppl.anchor_or_skip).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchor_ppl  # noqa: E402

exe, src = sys.argv[1], sys.argv[2]
anchor = anchor_ppl.anchor_or_skip(src)

sys.path.insert(0, os.path.join(src, "scripts", "fixtures"))
import make_fixtures as mf  # noqa: E402

cfg = {**mf.DEFAULTS, **dict(name="gemma2_anchor", arch="gemma2", dim=64, n_heads=2, n_kv_heads=1, head_dim=32,
                             hidden=128, vocab=1173, tied=True, rms_eps=1e-6, n_layers=26, sliding_window=32,
                             attn_softcap=5.0, final_softcap=10.0)}
text = os.path.join(src, "data", "eval", "heldout.txt")
with tempfile.TemporaryDirectory() as tmp:
    gguf = os.path.join(tmp, "gemma2.gguf")
    mf.write_gguf(gguf, cfg, mf.make_weights(cfg, seed=77), "F32")
    kv_ppl, ref = anchor_ppl.perplexities(exe, anchor, gguf, text)
rel = abs(kv_ppl - ref) / ref
print(f"gemma2 (26 layers, window 32, soft-caps 5/10): kvlab PPL {kv_ppl:.4f}, llama-perplexity {ref:.4f}, "
      f"relative difference {rel:.2e} (bound 1e-3)")
if rel > 1e-3:
    print("FAILED")
    sys.exit(1)
