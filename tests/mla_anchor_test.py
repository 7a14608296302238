#!/usr/bin/python3
"""kvlab against llama.cpp (the anchor at c392e50, ../shared/anchors) on a random-weight deepseek2
(multi-head latent attention) GGUF: `kvlab perplexity` and `llama-perplexity` on the same file and
text, the same protocol as gemma2_anchor_test.py (windows of CTX tokens, the second half scored,
F32 KV cache in llama.cpp).

    mla_anchor_test.py KVLAB_EXE SOURCE_DIR

Two models (scripts/fixtures/make_mla_fixtures.py's GGUF writer and weights), one with YaRN
(rope.scaling.type yarn, factor 4, original context 32 < CTX): 2 layers (llama.cpp
at c392e50 needs q_lora_rank unless block_count is 27), dim 64, 4 heads, q_lora_rank 16,
kv_lora_rank 32, qk_nope 16, qk_rope 8, v_head_dim 16, FFN 128, the fixtures' synthetic vocabulary
(1173 pieces, byte fallback). llama.cpp at that commit caches the decompressed per-head K and V
(build_deepseek2); kvlab the absorbed latent rows: the two differ by float summation order only.
PPL within 1e-3 relative, as the other anchor tests (fp32 rounding is ~1e-6 relative here: a few
hundred-term sums per stage, u = 2^-24).

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
import make_mla_fixtures as mla  # noqa: E402

base = dict(dim=64, n_heads=4, q_lora_rank=16, kv_lora_rank=32, qk_nope=16, qk_rope=8, v_head=16, hidden=128,
            vocab=1173, n_layers=2)
# the second model: YaRN factor 4 over an original context of 32 (CTX = 128 reaches past it),
# mscale = mscale_all_dim = 1.25 (yarn_log_multiplier 0.125, exact in float32)
yarn = dict(factor=4.0, original_max_position_embeddings=32, beta_fast=32, beta_slow=1, mscale=1.25, mscale_all_dim=1.25)
text = os.path.join(src, "data", "eval", "heldout.txt")
failed = False
for label, extra, seed in (("plain RoPE", {}, 78), ("yarn x4", {"yarn": yarn}, 80)):
    cfg = {**mla.DEFAULTS, **base, **extra, "name": "deepseek2_anchor"}
    with tempfile.TemporaryDirectory() as tmp:
        gguf = os.path.join(tmp, "deepseek2.gguf")
        mla.write_gguf(gguf, cfg, mla.make_weights(cfg, seed=seed))
        kv_ppl, ref = anchor_ppl.perplexities(exe, anchor, gguf, text)
    rel = abs(kv_ppl - ref) / ref
    print(f"deepseek2 {label} (2 layers, q_lora 16, kv_lora 32, nope 16, rope 8, v 16): kvlab PPL {kv_ppl:.4f}, "
          f"llama-perplexity {ref:.4f}, relative difference {rel:.2e} (bound 1e-3)")
    failed = failed or rel > 1e-3
if failed:
    print("FAILED")
    sys.exit(1)
