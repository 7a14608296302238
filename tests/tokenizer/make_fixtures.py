#!/usr/bin/python3
"""CTest fixture for the tokenizer tests: computes expected ids with independent references and
writes the SentencePiece vocabulary into the other containers kvlab reads.

    make_fixtures.py --out BUILD/tokenizer_fixtures [--shared DIR]
    (--shared defaults to $KVLAB_SHARED_DIR, else ../shared next to the source tree)

Writes into --out:
  cases.json            {"cases": [{"name", "hex"}]}: edge cases + Pride and Prejudice paragraphs
  spm_expected.json     {"ids": [[...]], "decoded_hex": [...]}: python3-sentencepiece on
                        tokenizers/llama2/tokenizer.model (encode of the bytes, then decode)
  bpe_expected.json     {"ids": [[...]]}: bpe_reference.py on tokenizers/gpt2/vocab.json + merges.txt
  llama2_vocab.gguf     the llama2 SentencePiece vocabulary as GGUF tokenizer.ggml.* metadata
  llama2_tokenizer.bin  the same vocabulary in llama2.c's tokenizer.bin layout
  gpt2_vocab.gguf       GPT-2's vocab + merges as GGUF metadata (tokenizer.ggml.model = "gpt2")
When --shared lacks the tokenizers or the text, prints why and writes nothing (the C++ tests then
skip with that message).
"""

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "fixtures"))

import cases as cases_mod  # noqa: E402
from bpe_reference import Gpt2Bpe  # noqa: E402

SPM_MODEL = "tokenizers/llama2/tokenizer.model"
GPT2_FILES = ["tokenizers/gpt2/vocab.json", "tokenizers/gpt2/merges.txt"]
NOVEL = "text/pride_and_prejudice.txt"

# SentencePiece piece types (sentencepiece_model.proto; GGUF's token_type uses the same numbers).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def piece_types(sp):
    types = []
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.is_unused(i):
            types.append(UNUSED)
        else:
            types.append(NORMAL)
    return types


def write_llama2c_tokenizer_bin(sp, path):
    """llama2.c's layout: int32 max_token_length, then per token float32 score, int32 length,
    bytes; "▁" stored as " ", BOS/EOS stored as "\\n<s>\\n" / "\\n</s>\\n" (as its exporter does)."""
    tokens = []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if i == sp.bos_id():
            piece = "\n<s>\n"
        elif i == sp.eos_id():
            piece = "\n</s>\n"
        tokens.append((sp.get_score(i), piece.replace("\u2581", " ").encode("utf-8")))
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(b) for _, b in tokens)))
        for score, b in tokens:
            f.write(struct.pack("<fi", score, len(b)))
            f.write(b)


def write_llama_gguf(sp, path):
    from gguf_writer import GgufWriter
    w = GgufWriter(path)
    w.add("general.architecture", "llama")
    w.add("tokenizer.ggml.model", "llama")
    n = sp.get_piece_size()
    w.add_array("tokenizer.ggml.tokens", [sp.id_to_piece(i) for i in range(n)], "STRING")
    w.add_array("tokenizer.ggml.scores", [sp.get_score(i) for i in range(n)], "FLOAT32")
    w.add_array("tokenizer.ggml.token_type", piece_types(sp), "INT32")
    w.add("tokenizer.ggml.bos_token_id", sp.bos_id(), vtype="UINT32")
    w.add("tokenizer.ggml.eos_token_id", sp.eos_id(), vtype="UINT32")
    w.add("tokenizer.ggml.unknown_token_id", sp.unk_id(), vtype="UINT32")
    w.add("tokenizer.ggml.add_bos_token", True)
    w.add("tokenizer.ggml.add_space_prefix", True)
    w.write()


def write_gpt2_gguf(shared, path):
    from gguf_writer import GgufWriter
    with open(os.path.join(shared, GPT2_FILES[0]), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(shared, GPT2_FILES[1]), encoding="utf-8") as f:
        merges = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#version")]
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    w = GgufWriter(path)
    w.add("general.architecture", "gpt2")
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens, "STRING")
    w.add_array("tokenizer.ggml.token_type",
                [CONTROL if t == "<|endoftext|>" else NORMAL for t in tokens], "INT32")
    w.add_array("tokenizer.ggml.merges", merges, "STRING")
    w.add("tokenizer.ggml.bos_token_id", vocab["<|endoftext|>"], vtype="UINT32")
    w.add("tokenizer.ggml.eos_token_id", vocab["<|endoftext|>"], vtype="UINT32")
    w.add("tokenizer.ggml.add_bos_token", False)
    w.write()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=os.environ.get("KVLAB_SHARED_DIR") or
                    os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared")))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    needed = [SPM_MODEL, NOVEL] + GPT2_FILES
    missing = [p for p in needed if not os.path.exists(os.path.join(args.shared, p))]
    if missing:
        print(f"make_fixtures: needs {args.shared}/{missing[0]}: absent; tokenizer reference tests will skip")
        stale = os.path.join(args.out, "cases.json")
        if os.path.exists(stale):
            os.remove(stale)
        return 0

    import sentencepiece
    os.makedirs(args.out, exist_ok=True)
    cases = cases_mod.all_cases(args.shared)
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump({"cases": [{"name": n, "hex": t.hex()} for n, t in cases]}, f)

    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(args.shared, SPM_MODEL))
    spm_ids = [sp.encode(t) for _, t in cases]  # bytes in: sentencepiece sees exactly these bytes
    with open(os.path.join(args.out, "spm_expected.json"), "w") as f:
        json.dump({"ids": spm_ids, "decoded_hex": [sp.decode(ids).encode("utf-8").hex() for ids in spm_ids]}, f)

    bpe = Gpt2Bpe(*(os.path.join(args.shared, p) for p in GPT2_FILES))
    with open(os.path.join(args.out, "bpe_expected.json"), "w") as f:
        json.dump({"ids": [bpe.encode(t) for _, t in cases]}, f)

    write_llama2c_tokenizer_bin(sp, os.path.join(args.out, "llama2_tokenizer.bin"))
    write_llama_gguf(sp, os.path.join(args.out, "llama2_vocab.gguf"))
    write_gpt2_gguf(args.shared, os.path.join(args.out, "gpt2_vocab.gguf"))
    print(f"make_fixtures: {len(cases)} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
