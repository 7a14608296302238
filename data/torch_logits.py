#!/usr/bin/python3
"""The PyTorch model's logits on held-out text, for kvlab's bundled-model test.

Loads the exported Hugging Face directory back into data/kvlab_tiny.py's TinyLlama (the very
module it was trained as), tokenises the start of data/eval/heldout.txt with the exported
tokenizer.model (BOS first) and writes:
  data/models/kvlab-tiny.torch-logits.f32     float32 [n_tokens, vocab], row-major
  data/models/kvlab-tiny.torch-logits.tokens  the token ids, one line, space-separated
tests/bundled_model_test.cpp loads the GGUF and the HF directory with kvlab and asserts
max |logit difference| <= 1e-3 against these. Re-run after every export:
  /usr/bin/python3 data/torch_logits.py [--tokens 256]
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kvlab_tiny as kt  # noqa: E402
from reference_logits import read_safetensors  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf", type=Path, default=HERE / "models" / "kvlab-tiny-hf")
    ap.add_argument("--text", type=Path, default=HERE / "eval" / "heldout.txt")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=HERE / "models" / "kvlab-tiny.torch-logits")
    args = ap.parse_args()

    hf = json.loads((args.hf / "config.json").read_text())
    cfg = kt.Config(vocab_size=hf["vocab_size"], dim=hf["hidden_size"],
                    n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
                    n_kv_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"],
                    hidden_dim=hf["intermediate_size"], rope_theta=hf["rope_theta"],
                    rms_eps=hf["rms_norm_eps"], max_seq_len=hf["max_position_embeddings"])
    w = read_safetensors(args.hf / "model.safetensors")
    state = {"tok_embeddings": w["model.embed_tokens.weight"],
             "final_norm": w["model.norm.weight"], "lm_head": w["lm_head.weight"]}
    names = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
             "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "w_gate": "mlp.gate_proj",
             "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
    for i in range(cfg.n_layers):
        for ours, theirs in names.items():
            state[f"layers.{i}.{ours}"] = w[f"model.layers.{i}.{theirs}.weight"]
    model = kt.TinyLlama(cfg)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    model.eval()

    sp = spm.SentencePieceProcessor(model_file=str(args.hf / "tokenizer.model"))
    ids = [sp.bos_id()] + sp.encode(args.text.read_text(encoding="utf-8")[:20000])
    ids = ids[:args.tokens]
    with torch.no_grad():
        logits = model(torch.tensor([ids], dtype=torch.int64))[0].float().numpy()
    logits.astype("<f4").tofile(str(args.out) + ".f32")
    Path(str(args.out) + ".tokens").write_text(" ".join(map(str, ids)) + "\n")
    print(f"wrote {args.out}.f32 [{len(ids)}, {cfg.vocab_size}] and {args.out}.tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
