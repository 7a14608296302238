#!/usr/bin/python3
"""Writes the seed corpora of kvlab's fuzz targets (fuzz/README.md) from the project's own
fixture generators and files, so no binary seed is committed:

    /usr/bin/python3 fuzz/make_corpus.py OUTDIR [--results-seed-writer BUILD/fuzz/make_results_seeds]

OUTDIR/<target>/ gets one file per seed:
  fuzz_gguf             tiny GGUF models (scripts/fixtures/make_fixtures.py's writers on 1-layer
                        configs of dim 8: llama F32/F16, qwen2 with biases, llama3 rope_freqs)
  fuzz_hf               config.json | model.safetensors [| index.json], parts separated as in
                        fuzz/fuzz_util.h (F32, BF16, sharded)
  fuzz_llama2c          the same models as llama2.c v0 (shared and unshared classifier) and v1
  fuzz_tokenizer_json   small byte-level BPE tokenizer.json files (GPT-2, Llama-3 and Qwen2 style)
  fuzz_spm_model        data/models/kvlab-tiny-hf/tokenizer.model and hand-encoded ModelProtos
  fuzz_llama2c_vocab    llama2.c tokenizer.bin of the fixtures' synthetic vocabulary
  fuzz_tokenizer_codec  mode byte + text (tests/tokenizer/cases.py's edge cases), mode byte + ids
  fuzz_experiment       experiments/*.yaml, framework/experiment/testdata/invalid/*.yaml
  fuzz_results          results files written by kvlab's own writer (make_results_seeds, built
                        by scripts/fuzz.sh); skipped when --results-seed-writer is not given
Deterministic: the same bytes on every run."""

import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
import make_fixtures as mf  # noqa: E402  scripts/fixtures/make_fixtures.py (the model fixtures)

SEP = b"\n=====kvlab-fuzz-part=====\n"  # fuzz/fuzz_util.h kPartSeparator

TINY = [
    dict(name="llama_tiny", arch="llama", dim=8, n_heads=2, n_kv_heads=1, head_dim=4, hidden=16,
         vocab=259, tied=True),
    dict(name="llama_tiny_untied", arch="llama", dim=8, n_heads=2, n_kv_heads=2, head_dim=4, hidden=16,
         vocab=260, tied=False),
    dict(name="qwen2_tiny", arch="qwen2", dim=8, n_heads=2, n_kv_heads=1, head_dim=4, hidden=16,
         vocab=259, tied=True, qkv_bias=True, rope_theta=1000000.0, rms_eps=1e-6),
    dict(name="llama3_tiny", arch="llama", dim=8, n_heads=2, n_kv_heads=1, head_dim=4, hidden=16,
         vocab=259, tied=False, rope_theta=500000.0,
         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=8)),
]


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def models(out, tmp):
    mf.N_LAYERS, mf.MAX_SEQ_LEN = 1, 16
    for i, cfg in enumerate(TINY):
        cfg = {**mf.DEFAULTS, **cfg}
        w = mf.make_weights(cfg, seed=i + 1)
        name = cfg["name"]
        for t in ("F32", "F16"):
            p = os.path.join(tmp, "m.gguf")
            mf.write_gguf(p, cfg, w, t)
            write(os.path.join(out["fuzz_gguf"], f"{name}_{t}.gguf"), read(p))
        for dtype in ("F32", "BF16"):
            d = os.path.join(tmp, f"hf_{dtype}")
            mf.write_hf(d, cfg, w, dtype=dtype)
            seed = read(os.path.join(d, "config.json")) + SEP + read(os.path.join(d, "model.safetensors"))
            write(os.path.join(out["fuzz_hf"], f"{name}_{dtype}"), seed)
        # One shard under an index (fuzz_hf names the shard model-00001-of-00001.safetensors).
        st = mf.safetensors_bytes(w, "F32")
        shard = "model-00001-of-00001.safetensors"
        index = json.dumps({"metadata": {"total_size": sum(a.size * 4 for a in w.values())},
                            "weight_map": {n: shard for n in sorted(w)}}, indent=1).encode()
        cfg_json = json.dumps(mf.hf_config(cfg, "float32"), indent=1).encode()
        write(os.path.join(out["fuzz_hf"], f"{name}_sharded"), cfg_json + SEP + st + SEP + index)
        if mf.llama2c_ok(cfg):
            for version in (0, 1):
                p = os.path.join(tmp, "m.bin")
                mf.write_llama2c(p, cfg, w, version=version)
                write(os.path.join(out["fuzz_llama2c"], f"{name}_v{version}.bin"), read(p))
    pieces, scores, _ = mf.synthetic_vocab(300)
    p = os.path.join(tmp, "tokenizer.bin")
    mf.write_llama2c_tokenizer(p, pieces, scores)
    write(os.path.join(out["fuzz_llama2c_vocab"], "synthetic_300.bin"), read(p))
    mf.write_llama2c_tokenizer(p, pieces[:259], scores[:259])
    write(os.path.join(out["fuzz_llama2c_vocab"], "bytes_only.bin"), read(p))


def byte_level_tokens():
    """GPT-2's byte -> printable code point table (framework/tokenizer/byte_level.h)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(cs[bs.index(b)]) for b in range(256)]


def tokenizer_jsons(out):
    base = byte_level_tokens()
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("1", "2")]
    vocab = {t: i for i, t in enumerate(base)}
    for l, r in merges:
        vocab.setdefault(l + r, len(vocab))
    n = len(vocab)
    gpt2 = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": n, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": [f"{l} {r}" for l, r in merges]},
    }
    write(os.path.join(out["fuzz_tokenizer_json"], "gpt2_style.json"), json.dumps(gpt2, ensure_ascii=False).encode())
    llama3 = json.loads(json.dumps(gpt2))
    llama3["added_tokens"] = [
        {"id": n, "content": "<|begin_of_text|>", "special": True},
        {"id": n + 1, "content": "<|end_of_text|>", "special": True},
        {"id": n + 2, "content": "<extra>", "special": False}]
    llama3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    llama3["post_processor"] = {"type": "TemplateProcessing",
                                "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                           {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [], "special_tokens": {}}
    llama3["model"]["merges"] = [[l, r] for l, r in merges]
    llama3["model"]["ignore_merges"] = True
    write(os.path.join(out["fuzz_tokenizer_json"], "llama3_style.json"), json.dumps(llama3, ensure_ascii=False).encode())
    qwen2 = json.loads(json.dumps(gpt2))
    qwen2["normalizer"] = {"type": "NFC"}
    qwen2["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Split", "pattern": {"String": "<sep>"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}]}
    write(os.path.join(out["fuzz_tokenizer_json"], "qwen2_style.json"), json.dumps(qwen2, ensure_ascii=False).encode())


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload & 0xFFFFFFFFFFFFFFFF)
    if wire == 2:
        return key + varint(len(payload)) + payload
    if wire == 5:
        return key + payload
    raise ValueError(wire)


def model_proto(pieces, byte_fallback=True, add_dummy_prefix=True, remove_extra=False, model_type=2):
    """A SentencePiece ModelProto (framework/tokenizer/spm_model_proto.h has the field numbers)."""
    out = b""
    for text, score, ptype in pieces:
        out += field(1, 2, field(1, 2, text.encode()) + field(2, 5, struct.pack("<f", score)) + field(3, 0, ptype))
    trainer = field(3, 0, model_type) + field(35, 0, int(byte_fallback)) + field(40, 0, 0) + field(41, 0, 1) + field(42, 0, 2)
    out += field(2, 2, trainer)
    normalizer = (field(1, 2, b"identity") + field(3, 0, int(add_dummy_prefix)) + field(4, 0, int(remove_extra))
                  + field(5, 0, 1))
    out += field(3, 2, normalizer)
    return out


def spm_models(out):
    shutil.copy(os.path.join(ROOT, "data", "models", "kvlab-tiny-hf", "tokenizer.model"),
                os.path.join(out["fuzz_spm_model"], "kvlab_tiny.model"))
    base = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)] + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    words = [("\u2581", -1.0, 1), ("a", -2.0, 1), ("b", -3.0, 1), ("\u2581a", -4.0, 1), ("ab", -5.0, 1),
             ("\u2581ab", -6.0, 1), ("<user>", 0.0, 4)]
    write(os.path.join(out["fuzz_spm_model"], "bpe_bytes.model"), model_proto(base + words))
    write(os.path.join(out["fuzz_spm_model"], "unigram_no_fallback.model"),
          model_proto(base[:3] + words, byte_fallback=False, model_type=1))
    write(os.path.join(out["fuzz_spm_model"], "no_space_piece.model"),
          model_proto(base + words[1:], add_dummy_prefix=False, remove_extra=True))


def codec(out):
    sys.path.insert(0, os.path.join(ROOT, "tests", "tokenizer"))
    import cases  # tests/tokenizer/cases.py
    for k, (name, text) in enumerate(cases.EDGE_CASES):
        write(os.path.join(out["fuzz_tokenizer_codec"], f"{name}_{k % 8}"), bytes([k % 8]) + text)
    ids = b"".join(struct.pack("<H", i) for i in (1, 5, 300, 2, 0, 259, 40000, 7))
    for mode in (8, 9, 14, 15):
        write(os.path.join(out["fuzz_tokenizer_codec"], f"ids_{mode}"), bytes([mode]) + ids)


def experiments(out):
    for f in sorted(glob.glob(os.path.join(ROOT, "experiments", "*.yaml")) +
                    glob.glob(os.path.join(ROOT, "framework", "experiment", "testdata", "invalid", "*.yaml"))):
        shutil.copy(f, os.path.join(out["fuzz_experiment"], os.path.basename(f)))
    # A grid through one shared list (the 10^9-run file, here 20^3): max_cells applies.
    values = ", ".join(str(64 + 8 * i) for i in range(20))
    write(os.path.join(out["fuzz_experiment"], "alias_grid.yaml"), (
        "model: {path: m.gguf}\n"
        "model: {path: m.gguf}\n"
        "max_cells: 100000\n"
        "policies:\n"
        f"  - {{name: lm, type: landmark, params: {{chunk_size: &v [{values}], top_k: *v, window: *v}}}}\n"
        "evals: {niah: {haystack: h.txt, context_lengths: [64, 128], depths: [0, 50, 100]}}\n").encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--results-seed-writer", help="make_results_seeds executable (scripts/fuzz.sh builds it)")
    args = ap.parse_args()
    targets = ["fuzz_gguf", "fuzz_hf", "fuzz_llama2c", "fuzz_tokenizer_json", "fuzz_spm_model",
               "fuzz_llama2c_vocab", "fuzz_tokenizer_codec", "fuzz_experiment", "fuzz_results"]
    out = {t: os.path.join(args.outdir, t) for t in targets}
    for d in out.values():
        os.makedirs(d, exist_ok=True)
    tmp = os.path.join(args.outdir, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    models(out, tmp)
    tokenizer_jsons(out)
    spm_models(out)
    codec(out)
    experiments(out)
    if args.results_seed_writer:
        subprocess.run([args.results_seed_writer, out["fuzz_results"]], check=True)
    shutil.rmtree(tmp)
    for t in targets:
        print(f"{t}: {len(os.listdir(out[t]))} seeds")


if __name__ == "__main__":
    main()
