#!/usr/bin/python3
"""Export a kvlab-tiny checkpoint as GGUF (arch llama, tokenizer embedded) and as a Hugging Face
directory (config.json, model.safetensors, tokenizer.model), both float32 and holding the same
values.

Layouts:
  HF keeps PyTorch's rotate-half RoPE order (q/k rows as trained).
  GGUF (llama) expects interleaved RoPE pairs (2i, 2i+1); like llama.cpp's HF converter, the
  rows of attn_q / attn_k are permuted per head: row (p * hd/2 + i) of HF goes to row (2i + p),
  i.e. w.reshape(heads, 2, hd/2, dim).swapaxes(1, 2).reshape(heads*hd, dim).
  safetensors is written by hand: u64 header length, JSON header, raw little-endian data.

Usage: data/export.py --ckpt data/work/ckpt.pt --tokenizer data/work/tokenizer/tokenizer.model
                      --out data/models --name kvlab-tiny
"""
import argparse
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scripts" / "fixtures"))
import kvlab_tiny as kt  # noqa: E402
from gguf_writer import GgufWriter  # noqa: E402


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half rows -> interleaved rows (GGUF llama)."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_tensors(state, cfg: kt.Config):
    """{HF name: float32 array} from the model's state (names of data/kvlab_tiny.py)."""
    t = {"model.embed_tokens.weight": state["tok_embeddings"]}
    for i in range(cfg.n_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        t[q + "input_layernorm.weight"] = state[p + "attn_norm"]
        t[q + "self_attn.q_proj.weight"] = state[p + "wq"]
        t[q + "self_attn.k_proj.weight"] = state[p + "wk"]
        t[q + "self_attn.v_proj.weight"] = state[p + "wv"]
        t[q + "self_attn.o_proj.weight"] = state[p + "wo"]
        t[q + "post_attention_layernorm.weight"] = state[p + "ffn_norm"]
        t[q + "mlp.gate_proj.weight"] = state[p + "w_gate"]
        t[q + "mlp.up_proj.weight"] = state[p + "w_up"]
        t[q + "mlp.down_proj.weight"] = state[p + "w_down"]
    t["model.norm.weight"] = state["final_norm"]
    t["lm_head.weight"] = state["lm_head"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}


def write_safetensors(path: Path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = tensors[name]
        b = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_hf(out_dir: Path, state, cfg: kt.Config, tokenizer_model: Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(out_dir / "model.safetensors", hf_tensors(state, cfg))
    shutil.copyfile(tokenizer_model, out_dir / "tokenizer.model")
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": True,
        "model_max_length": cfg.max_seq_len}, indent=2) + "\n")


def write_gguf(path: Path, state, cfg: kt.Config, tokenizer_model: Path, name: str):
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_model))
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [float(sp.get_score(i)) for i in range(n)]
    # llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(n)]
    w = GgufWriter(str(path))
    w.add("general.architecture", "llama")
    w.add("general.name", name)
    w.add("general.file_type", 0, vtype="UINT32")   # all F32
    w.add("llama.context_length", cfg.max_seq_len, vtype="UINT32")
    w.add("llama.embedding_length", cfg.dim, vtype="UINT32")
    w.add("llama.block_count", cfg.n_layers, vtype="UINT32")
    w.add("llama.feed_forward_length", cfg.hidden_dim, vtype="UINT32")
    w.add("llama.attention.head_count", cfg.n_heads, vtype="UINT32")
    w.add("llama.attention.head_count_kv", cfg.n_kv_heads, vtype="UINT32")
    w.add("llama.attention.key_length", cfg.head_dim, vtype="UINT32")
    w.add("llama.attention.value_length", cfg.head_dim, vtype="UINT32")
    w.add("llama.rope.freq_base", float(cfg.rope_theta))
    w.add("llama.rope.dimension_count", cfg.head_dim, vtype="UINT32")
    w.add("llama.attention.layer_norm_rms_epsilon", float(cfg.rms_eps))
    w.add("llama.vocab_size", cfg.vocab_size, vtype="UINT32")
    w.add("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", tokens, "STRING")
    w.add_array("tokenizer.ggml.scores", scores, "FLOAT32")
    w.add_array("tokenizer.ggml.token_type", types, "INT32")
    w.add("tokenizer.ggml.bos_token_id", sp.bos_id(), vtype="UINT32")
    w.add("tokenizer.ggml.eos_token_id", sp.eos_id(), vtype="UINT32")
    w.add("tokenizer.ggml.unknown_token_id", sp.unk_id(), vtype="UINT32")
    w.add("tokenizer.ggml.add_bos_token", True)
    w.add("tokenizer.ggml.add_eos_token", False)
    w.add("tokenizer.ggml.add_space_prefix", True)
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
    w.add_tensor("token_embd.weight", f32(state["tok_embeddings"]))
    for i in range(cfg.n_layers):
        p, g = f"layers.{i}.", f"blk.{i}."
        w.add_tensor(g + "attn_norm.weight", f32(state[p + "attn_norm"]))
        w.add_tensor(g + "attn_q.weight", f32(permute_rope_rows(state[p + "wq"], cfg.n_heads)))
        w.add_tensor(g + "attn_k.weight", f32(permute_rope_rows(state[p + "wk"], cfg.n_kv_heads)))
        w.add_tensor(g + "attn_v.weight", f32(state[p + "wv"]))
        w.add_tensor(g + "attn_output.weight", f32(state[p + "wo"]))
        w.add_tensor(g + "ffn_norm.weight", f32(state[p + "ffn_norm"]))
        w.add_tensor(g + "ffn_gate.weight", f32(state[p + "w_gate"]))
        w.add_tensor(g + "ffn_up.weight", f32(state[p + "w_up"]))
        w.add_tensor(g + "ffn_down.weight", f32(state[p + "w_down"]))
    w.add_tensor("output_norm.weight", f32(state["final_norm"]))
    w.add_tensor("output.weight", f32(state["lm_head"]))
    w.write()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=HERE / "models")
    ap.add_argument("--name", default="kvlab-tiny")
    args = ap.parse_args()
    ck = torch.load(args.ckpt)
    cfg = kt.Config(**ck["config"])
    state = {k: v.numpy() for k, v in ck["model"].items()}
    args.out.mkdir(parents=True, exist_ok=True)
    write_gguf(args.out / f"{args.name}.gguf", state, cfg, args.tokenizer, args.name)
    write_hf(args.out / f"{args.name}-hf", state, cfg, args.tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
