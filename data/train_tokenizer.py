#!/usr/bin/python3
"""Train kvlab-tiny's SentencePiece BPE tokenizer on the training split only.

Settings: BPE, vocabulary 2048, byte fallback (every byte string encodes), digits split into
single tokens (so a 7-digit needle value is 7 digit tokens), ids unk=0 bos=1 eos=2 (Llama
convention), identity normalisation (no NFKC: decode(encode(s)) == s for ordinary text),
dummy prefix on (like Llama). Deterministic given the input file.

Usage: data/train_tokenizer.py --input data/work/corpus/train.txt --out data/work/tokenizer
"""
import argparse
import sys
from pathlib import Path

import sentencepiece as spm

VOCAB_SIZE = 2048


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="output prefix directory")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # One paragraph per line is what SentencePiece expects; drop the document separators.
    lines = [l for l in args.input.read_text("utf-8").splitlines() if l.strip() and l != "\f"]
    flat = args.out / "train_lines.txt"
    flat.write_text("\n".join(lines) + "\n", "utf-8")
    spm.SentencePieceTrainer.train(
        input=str(flat), model_prefix=str(args.out / "tokenizer"), model_type="bpe",
        vocab_size=VOCAB_SIZE, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=0.9995,
        max_sentence_length=100000, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=1, minloglevel=2)
    flat.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
