#!/usr/bin/python3
"""`kvlab model-info` on the tiny fixtures (every format) and on bad inputs.

    /usr/bin/python3 tests/model_info_test.py KVLAB_BINARY FIXTURES_DIR

Good files: the JSON output matches fixture.json (shapes, parameter count, KV bytes per token =
2 x layers x KV heads x head dim x bytes per element). Bad files: exit status 1, one line on
stderr naming the file and the problem, no crash.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile


def run(kvlab, *args):
    return subprocess.run([kvlab, "model-info", *args], capture_output=True, text=True, timeout=60)


def main():
    kvlab, fixtures = sys.argv[1], sys.argv[2]
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    for name in json.load(open(os.path.join(fixtures, "fixtures.json")))["fixtures"]:
        meta = json.load(open(os.path.join(fixtures, name, "fixture.json")))
        d, L, h, kv, hd, ff, v = (meta[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                                                     "hidden", "vocab"))
        gemma = meta["arch"] in ("gemma2", "gemma3")
        params = v * d * (1 if meta["tied"] else 2) + d + L * (
            2 * d + 2 * d * h * hd + 2 * d * kv * hd + 3 * d * ff + ((h + 2 * kv) * hd if meta["qkv_bias"] else 0)
            + (2 * hd if meta["qk_norm"] else 0) + (2 * d if gemma else 0))  # q/k norms; Gemma's post norms
        for key, rel in meta["files"].items():
            r = run(kvlab, os.path.join(fixtures, name, rel), "--json")
            if r.returncode != 0:
                check(False, f"{name}/{rel}: exit {r.returncode}: {r.stderr.strip()}")
                continue
            j = json.loads(r.stdout)
            got = (j["arch"], j["dim"], j["n_layers"], j["n_heads"], j["n_kv_heads"], j["head_dim"],
                   j["hidden_dim"], j["vocab_size"], j["max_seq_len"], j["parameters"])
            want = (meta["arch"], d, L, h, kv, hd, ff, v, meta["max_seq_len"], params)
            check(got == want, f"{name}/{rel}: config and parameter count {got}")
            if gemma:  # the layer kinds and Gemma's scalars as the config says
                n_local = sum(1 for i in range(L) if (i % 2 == 0 if meta["arch"] == "gemma2" else (i + 1) % 6))
                check(j["sliding_window"] == meta["sliding_window"] and j["local_layers"] == n_local
                      and j["attn_softcap"] == meta["attn_softcap"] and j["final_softcap"] == meta["final_softcap"],
                      f"{name}/{rel}: window {j.get('sliding_window')}, local layers {j.get('local_layers')}, "
                      f"soft-caps {j.get('attn_softcap')} / {j.get('final_softcap')}")
            check(j["kv_bytes_per_token"]["f16"] == 2 * L * kv * hd * 2 and
                  j["kv_bytes_per_token"]["f32"] == 2 * L * kv * hd * 4, f"{name}/{rel}: KV bytes per token")
            check(j["weights"]["wk"]["shape"] == [kv * hd, d] and j["weights"]["w_down"]["shape"] == [d, ff],
                  f"{name}/{rel}: weight shapes")
        r = run(kvlab, os.path.join(fixtures, name, "model.gguf"))
        check(r.returncode == 0 and f"KV bytes/token: f32 {2 * L * kv * hd * 4}, f16 {2 * L * kv * hd * 2}" in r.stdout
              and f"parameters:     {params}" in r.stdout, f"{name}: text output")

    tmp = tempfile.mkdtemp(prefix="kvlab_model_info_")
    try:
        small = os.path.join(fixtures, "llama_hd32_gqa1_tied")
        data = open(os.path.join(small, "model.gguf"), "rb").read()
        open(os.path.join(tmp, "truncated.gguf"), "wb").write(data[: len(data) // 3])
        open(os.path.join(tmp, "magic.gguf"), "wb").write(b"GGML" + data[4:])
        l2c = open(os.path.join(small, "model.bin"), "rb").read()
        open(os.path.join(tmp, "truncated.bin"), "wb").write(l2c[:-8])
        os.makedirs(os.path.join(tmp, "empty_dir"))
        # llama2.c headers whose block sizes multiply past int64 (issue 11: segfault / hang /
        # wrapped byte count), and a GGUF whose block_count had one bit flipped (21.5 GiB before).
        big = 1 << 24
        for k, h in enumerate([(big, big, big, 1 << 20, 1 << 20, big, big), (2, big, big, 1, 1, 1, 1)]):
            open(os.path.join(tmp, f"overflow{k}.bin"), "wb").write(struct.pack("<7i", *h) + bytes(8))
        key = b"llama.block_count"
        at = data.index(key) + len(key) + 4
        flipped = data[:at] + struct.pack("<I", struct.unpack_from("<I", data, at)[0] | 1 << 26) + data[at + 4:]
        open(os.path.join(tmp, "block_count.gguf"), "wb").write(flipped)
        bad = [
            (os.path.join(tmp, "overflow0.bin"), "needs more than 36 (at block"),
            (os.path.join(tmp, "overflow1.bin"), "needs more than 36 (at block"),
            (os.path.join(tmp, "block_count.gguf"), "missing tensor 'blk.2.attn_norm.weight'"),
            (os.path.join(tmp, "x" * 300 + ".gguf"), "x" * 300),
            (os.path.join(tmp, "truncated.gguf"), "truncated"),
            (os.path.join(tmp, "magic.gguf"), "wrong magic"),
            (os.path.join(tmp, "truncated.bin"), "truncated"),
            (os.path.join(tmp, "missing.gguf"), "no such file"),
            (os.path.join(tmp, "empty_dir"), "no config.json"),
            (os.path.join(fixtures, "bad", "iq4_nl_tensor.gguf"),
             "tensor 'token_embd.weight': unsupported tensor type IQ4_NL (20); supported: F32, F16, BF16, "
             "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"),
            (os.path.join(fixtures, "bad", "unknown_arch.gguf"), "unsupported architecture 'gpt2'"),
            (os.path.join(fixtures, "bad", "shape_mismatch.gguf"), "has shape [96, 64], expected [64, 64]"),
        ]
        for path, problem in bad:
            r = run(kvlab, path)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 1 and len(lines) == 1 and path in lines[0] and problem in lines[0],
                  f"bad input {os.path.basename(path)}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
        # a llama2.c checkpoint without tokenizer.bin still describes itself
        shutil.copy(os.path.join(small, "model.bin"), os.path.join(tmp, "model.bin"))
        r = run(kvlab, os.path.join(tmp, "model.bin"))
        check(r.returncode == 0 and "tokenizer:      none" in r.stdout, "llama2.c without tokenizer.bin")
        r = run(kvlab, os.path.join(tmp, "model.bin"), "--tokenizer", os.path.join(tmp, "nope.bin"))
        check(r.returncode == 1 and "nope.bin" in r.stderr, f"missing --tokenizer file: {r.stderr.strip()!r}")
    finally:
        shutil.rmtree(tmp)
    if failures:
        sys.exit(f"{len(failures)} checks failed")


if __name__ == "__main__":
    main()
