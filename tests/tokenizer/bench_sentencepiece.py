#!/usr/bin/python3
"""python3-sentencepiece's single-thread encoding throughput on the same text as
kvlab_bench_tokenizer (every paragraph of Pride and Prejudice, one encode call each), plus the
pure-Python GPT-2 BPE reference for scale.

    bench_sentencepiece.py [--shared DIR] [--repeats N]
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cases  # noqa: E402


def best_pass(fn, texts, repeats):
    """Best process CPU time (as kvlab_bench_tokenizer: other processes on the cores do not count)."""
    fn(texts[0])
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for t in texts:
            fn(t)
        best = min(best, time.process_time() - start)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.environ.get("KVLAB_SHARED_DIR") or
                    os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared")))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import sentencepiece
    with open(os.path.join(args.shared, "text/pride_and_prejudice.txt"), "rb") as f:
        paras = cases.paragraphs(f.read())
    texts = [p.decode("utf-8") for p in paras]
    mb = sum(len(p) for p in paras) / 1e6
    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(args.shared, "tokenizers/llama2/tokenizer.model"))
    print(f"Pride and Prejudice: {len(paras)} paragraphs, {mb:.3f} MB, single thread, CPU time, best of {args.repeats}")
    t = best_pass(sp.encode, texts, args.repeats)
    print(f"python3-sentencepiece {sentencepiece.__version__} encode(str), one call per paragraph: {mb / t:7.2f} MB/s")
    t = best_pass(lambda s: sp.encode(s.encode("utf-8")), texts, args.repeats)
    print(f"python3-sentencepiece encode(bytes), one call per paragraph:        {mb / t:7.2f} MB/s")
    t = best_pass(lambda batch: sp.encode(batch, num_threads=1), [texts], args.repeats)
    print(f"python3-sentencepiece encode(list, num_threads=1), one call:        {mb / t:7.2f} MB/s")
    from bpe_reference import Gpt2Bpe
    gpt2 = os.path.join(args.shared, "tokenizers/gpt2")
    bpe = Gpt2Bpe(os.path.join(gpt2, "vocab.json"), os.path.join(gpt2, "merges.txt"))
    t = best_pass(bpe.encode, paras, 1)
    print(f"tests/tokenizer/bpe_reference.py (pure Python, word memo warm):     {mb / t:7.2f} MB/s")


if __name__ == "__main__":
    main()
