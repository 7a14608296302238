#!/usr/bin/python3
"""`kvlab tokenize` end to end: ids equal the references on a few texts (when ../shared is there),
and every bad tokenizer file ends in exit status 1 with one stderr line naming the file, never a
crash.

    cli_test.py --kvlab BUILD/bin/kvlab --tmp BUILD/tokenizer_cli_tmp
"""

import argparse
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "fixtures"))

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def tokenize(kvlab, path, data, *flags):
    return subprocess.run([kvlab, "tokenize", "--tokenizer", path, *flags], input=data,
                          capture_output=True, timeout=120)


def check_bad_file(kvlab, path, problem):
    r = tokenize(kvlab, path, b"hello")
    err = r.stderr.decode("utf-8", "replace").strip()
    lines = err.splitlines()
    check(r.returncode == 1 and len(lines) == 1 and path in err and problem in err,
          f"bad file {os.path.basename(path)}: exit {r.returncode}, stderr {err!r} (want '{problem}')")


def bad_files(kvlab, tmp):
    def write(name, data):
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    check_bad_file(kvlab, os.path.join(tmp, "absent.model"), "no such")
    check_bad_file(kvlab, write("empty.model", b""), "empty")
    check_bad_file(kvlab, write("junk.model", b"\x0a\xff\xff\xff\xff\x0f junk"), "SentencePiece")
    check_bad_file(kvlab, write("cut.json", b'{"model": {"type": "BPE", "vocab": {'), "malformed JSON")
    check_bad_file(kvlab, write("nomodel.json", b'{"added_tokens": []}'), "'model'")
    # llama2.c layout: max_token_length, then (score, len, bytes); the last token is cut short.
    tok_bin = struct.pack("<i", 8) + struct.pack("<fi", 0.0, 5) + b"<unk>" + struct.pack("<fi", 0.0, 6) + b"ab"
    check_bad_file(kvlab, write("cut_tokenizer.bin", tok_bin), "truncated")
    check_bad_file(kvlab, write("cut.gguf", b"GGUF\x03\x00\x00\x00\x00"), "cut.gguf")
    from gguf_writer import GgufWriter
    p = os.path.join(tmp, "no_tokenizer.gguf")
    w = GgufWriter(p)
    w.add("general.architecture", "llama")
    w.write()
    check_bad_file(kvlab, p, "tokenizer.ggml.model")
    p = os.path.join(tmp, "bad_types.gguf")
    w = GgufWriter(p)
    w.add("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", ["<unk>", "a"], "STRING")
    w.add_array("tokenizer.ggml.token_type", [2], "INT32")
    w.write()
    check_bad_file(kvlab, p, "tokenizer.ggml.token_type")
    p = os.path.join(tmp, "bad_pre.gguf")
    w = GgufWriter(p)
    w.add("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"], "STRING")
    w.add_array("tokenizer.ggml.merges", ["a b"], "STRING")
    w.add("tokenizer.ggml.pre", "no-such-family")
    w.write()
    check_bad_file(kvlab, p, "tokenizer.ggml.pre")
    r = tokenize(kvlab, os.path.join(tmp, "absent.model"), b"", "--pieces", "--ids")
    check(r.returncode == 1, "conflicting flags exit 1")


def against_references(kvlab, shared, tmp):
    import sentencepiece
    from bpe_reference import Gpt2Bpe
    spm_path = os.path.join(shared, "tokenizers/llama2/tokenizer.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    gpt2 = os.path.join(shared, "tokenizers/gpt2")
    bpe = Gpt2Bpe(os.path.join(gpt2, "vocab.json"), os.path.join(gpt2, "merges.txt"))
    texts = ["Hello world", "  It is a truth universally acknowledged,\n\tthat 1234 \u00e9\u4e2d\U0001F600 ",
             "", "\n"]
    for text in texts:
        data = text.encode()
        r = tokenize(kvlab, spm_path, data)
        ids = [int(x) for x in r.stdout.split()]
        check(r.returncode == 0 and ids == sp.encode(text), f"spm ids of {text!r}")
        r = tokenize(kvlab, os.path.join(gpt2, "tokenizer.json"), data)
        ids = [int(x) for x in r.stdout.split()]
        check(r.returncode == 0 and ids == bpe.encode(data), f"bpe ids of {text!r}")
        r = tokenize(kvlab, gpt2, " ".join(map(str, ids)).encode(), "--decode")
        check(r.returncode == 0 and r.stdout == data, f"bpe --decode of {text!r}")
    with open(spm_path, "rb") as f:
        model = f.read()
    for cut in (1000, len(model) // 2, len(model) - 1):
        p = os.path.join(tmp, f"cut_{cut}.model")
        with open(p, "wb") as f:
            f.write(model[:cut])
        check_bad_file(kvlab, p, "not a valid SentencePiece model")
    r = tokenize(kvlab, spm_path, b"Hello world", "--pieces")
    check(r.stdout.decode() == "15043\t\u2581Hello\n3186\t\u2581world\n", "spm --pieces")
    r = tokenize(kvlab, spm_path, b"<s>hi", "--bos", "--special")
    check([int(x) for x in r.stdout.split()][:2] == [1, 1], "--bos --special")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvlab", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--shared", default=os.environ.get("KVLAB_SHARED_DIR") or
                    os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared")))
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)
    bad_files(args.kvlab, args.tmp)
    needed = ["tokenizers/llama2/tokenizer.model", "tokenizers/gpt2/tokenizer.json",
              "tokenizers/gpt2/vocab.json", "tokenizers/gpt2/merges.txt"]
    missing = [p for p in needed if not os.path.exists(os.path.join(args.shared, p))]
    if missing:
        print(f"skip reference comparison: needs {args.shared}/{missing[0]}: absent")
    else:
        against_references(args.kvlab, args.shared, args.tmp)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
