"""kvlab's GGUF block (de)quantisers against gguf-py's gguf/quants.py, bit for bit.

Usage: quants_ref_test.py QUANT_TOOL KVLAB SOURCE_DIR

gguf-py comes from the llama.cpp tarball in ../shared/anchors (KVLAB_SHARED_DIR overrides the
default <source>/../shared); only gguf-py/gguf/{constants,lazy,quants,gguf_reader}.py are
extracted, into a temporary directory. Exit status 77 (ctest: skipped) with a message when the
tarball is absent.

1. Dequantisation, for Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K, on
   - random blocks: random bytes with the fp16 scale fields drawn as finite values (normal,
     subnormal, negative, up to 65504; any other byte pattern is a valid block),
   - adversarial blocks: zero scales, -0 scales, all code bits set (max codes, max 6-bit
     scales), all clear (min codes), the largest fp16 scale with max codes, the smallest subnormal,
   - for Q4_0/Q4_1/Q5_0/Q5_1 also blocks written by gguf-py's own quantize_blocks;
   kvlab_quant_tool dequant must return exactly gguf-py's float32 bits.
2. Quantisation, Q4_0/Q4_1/Q5_0/Q5_1 (the types gguf-py quantises): kvlab's blocks equal gguf-py's
   bytes on random and adversarial inputs (constant blocks, zeros, ties, one outlier).
3. When llama-quantize is present ($KVLAB_ANCHORS_BIN, default /tmp/kvlab-anchors/bin; built by
   ../shared/anchors/build.sh; otherwise this part is skipped with a message): a random Llama
   (dim 256, hidden 512, 2 layers, written by scripts/fixtures/make_fixtures.py's writer) is
   quantised to Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K; every quantised tensor of
   each file dequantises in kvlab exactly as in gguf-py, `kvlab model-info --json` lists the
   file's tensor types with their counts and bytes, and `kvlab generate` runs on it.
"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# byte offsets of each block's fp16 scales (ggml-common.h)
SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q2_K": [80, 82],
          "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def extract_gguf_py(tarball, dest):
    want = {f"llama.cpp/gguf-py/gguf/{n}.py" for n in ("constants", "lazy", "quants", "gguf_reader")}
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.name in want]
        if len(members) != len(want):
            raise SystemExit(f"{tarball}: gguf-py files missing ({sorted(want - {m.name for m in members})})")
        for m in members:
            data = tar.extractfile(m).read()
            os.makedirs(os.path.join(dest, "gguf"), exist_ok=True)
            with open(os.path.join(dest, "gguf", os.path.basename(m.name)), "wb") as f:
                f.write(data)
    with open(os.path.join(dest, "gguf", "__init__.py"), "w") as f:
        f.write("")  # the full package imports modules (and packages) this test does not need
    sys.path.insert(0, dest)


def kvlab_dequant(tool, tmp, qtype, raw):
    src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    raw.tofile(src)
    subprocess.run([tool, "dequant", qtype.lower(), src, dst], check=True)
    return np.fromfile(dst, dtype=np.float32)


def kvlab_quant(tool, tmp, qtype, x):
    src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    np.ascontiguousarray(x, dtype=np.float32).tofile(src)
    subprocess.run([tool, "quant", qtype.lower(), src, dst], check=True)
    return np.fromfile(dst, dtype=np.uint8)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_blocks(tool, tmp, quants, rng):
    for name in TYPES:
        qt = getattr(quants.GGMLQuantizationType, name)
        block_values, block_bytes = quants.GGML_QUANT_SIZES[qt]
        sets = {}
        n = 256
        blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        scale = rng.standard_normal((n, len(SCALES[name]))).astype(np.float32) * 0.05
        scale[::7] *= 1e-4  # fp16 subnormals
        scale[::11] = 60000.0 * np.sign(scale[::11])
        for k, off in enumerate(SCALES[name]):
            blocks[:, off:off + 2] = scale[:, k].astype(np.float16).view(np.uint8).reshape(n, 2)
        sets["random"] = blocks
        adv = []
        for fill in (0x00, 0xFF, 0x55, 0xAA):
            for h in (0x0000, 0x8000, 0x3C00, 0x7BFF, 0xFBFF, 0x0001, 0x2E66):
                b = np.full(block_bytes, fill, dtype=np.uint8)
                for off in SCALES[name]:
                    b[off:off + 2] = np.array([h], dtype=np.uint16).view(np.uint8)
                adv.append(b)
        sets["adversarial"] = np.stack(adv)
        if hasattr(quants, name) and name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
            x = rng.standard_normal((64, block_values)).astype(np.float32)
            sets["gguf-py quantised"] = quants.quantize(x, qt).reshape(-1, block_bytes)
        for what, raw in sets.items():
            want = quants.dequantize(raw, qt).reshape(-1)
            got = kvlab_dequant(tool, tmp, name, raw)
            ok = same_bits(got, want)
            if not ok and got.shape == want.shape:
                i = int(np.nonzero(got.view(np.uint32) != want.astype(np.float32).view(np.uint32))[0][0])
                detail = f" (first difference at value {i}: kvlab {got[i]!r}, gguf-py {want[i]!r})"
            else:
                detail = f" (shapes {got.shape} vs {want.shape})" if not ok else ""
            check(ok, f"dequantise {name}, {what} blocks{detail}")
        print(f"dequantise {name}: {sum(len(r) for r in sets.values())} blocks ({', '.join(sets)}) compared")


def test_quantisers(tool, tmp, quants, rng):
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        qt = getattr(quants.GGMLQuantizationType, name)
        x = rng.standard_normal((200, 32)).astype(np.float32)
        x[1] = 0.0                        # all zeros: d = 0
        x[2] = 0.75                       # constant block
        x[3, 5] = 100.0                   # one outlier
        x[4] = np.linspace(-8, 7, 32)     # exact grid points and ties
        x[5] = -x[4]
        x[6] = (np.arange(32) % 2) * 1e-30  # tiny values
        want = quants.quantize(x, qt).reshape(-1)
        got = kvlab_quant(tool, tmp, name, x)
        ok = np.array_equal(got, want)
        if not ok and got.shape == want.shape:
            block_bytes = quants.GGML_QUANT_SIZES[qt][1]
            detail = f" (first differing block {int(np.nonzero(got != want)[0][0]) // block_bytes})"
        else:
            detail = ""
        check(ok, f"quantise {name}: kvlab's bytes differ from gguf-py's{detail}")
        print(f"quantise {name}: {len(x)} blocks compared")


def test_llama_quantize(tool, kvlab, source, tmp, quants):
    anchors = os.environ.get("KVLAB_ANCHORS_BIN", "/tmp/kvlab-anchors/bin")
    lq = os.path.join(anchors, "llama-quantize")
    if not os.access(lq, os.X_OK):
        print(f"SKIP part 3: llama-quantize not found at {lq} (../shared/anchors/build.sh builds it)")
        return
    from gguf.gguf_reader import GGUFReader
    sys.path.insert(0, os.path.join(source, "scripts", "fixtures"))
    import make_fixtures as mf
    cfg = dict(mf.DEFAULTS, name="quants", arch="llama", dim=256, n_heads=4, n_kv_heads=2, head_dim=64,
               hidden=512, vocab=300, tied=False)
    f32 = os.path.join(tmp, "model-f32.gguf")
    mf.write_gguf(f32, cfg, mf.make_weights(cfg, 7), "F32")
    for ftype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"):
        out = os.path.join(tmp, f"model-{ftype}.gguf")
        r = subprocess.run([lq, f32, out, ftype], capture_output=True, text=True)
        if r.returncode != 0:
            check(False, f"llama-quantize {ftype} failed: {r.stderr[-500:]}")
            continue
        reader = GGUFReader(out)
        counts = {}
        for t in reader.tensors:
            tname = t.tensor_type.name
            counts.setdefault(tname, [0, 0])
            counts[tname][0] += 1
            counts[tname][1] += int(t.n_bytes)
            if tname in TYPES:
                raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
                want = quants.dequantize(raw.reshape(-1, quants.GGML_QUANT_SIZES[t.tensor_type][1]),
                                         t.tensor_type).reshape(-1)
                check(same_bits(kvlab_dequant(tool, tmp, tname, raw), want),
                      f"{ftype} file, tensor {t.name} ({tname}): kvlab's dequantisation differs from gguf-py's")
        info = subprocess.run([kvlab, "model-info", out, "--json"], capture_output=True, text=True)
        check(info.returncode == 0, f"kvlab model-info on the {ftype} file: {info.stderr.strip()}")
        if info.returncode == 0:
            shares = json.loads(info.stdout).get("tensor_types", {})
            got = {k.upper(): [v["count"], v["bytes"]] for k, v in shares.items()}
            check(got == counts, f"{ftype}: model-info tensor_types {got} != the file's {counts}")
        gen = subprocess.run([kvlab, "generate", "--model", out, "--prompt", "the", "-n", "4",
                              "--temperature", "0", "--threads", "1"], capture_output=True, text=True,
                             errors="replace")
        check(gen.returncode == 0, f"kvlab generate on the {ftype} file: {gen.stderr.strip()[-300:]}")
        print(f"llama-quantize {ftype}: types {counts}; dequantisation, model-info and generate checked")


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    tool, kvlab, source = sys.argv[1:]
    shared = os.environ.get("KVLAB_SHARED_DIR", os.path.join(source, "..", "shared"))
    tarball = os.path.join(shared, "anchors", "llama.cpp-c392e50.tar.gz")
    if not os.path.exists(tarball):
        print(f"SKIP: {tarball} is absent (gguf-py comes from the llama.cpp tarball in ../shared/anchors)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        extract_gguf_py(tarball, os.path.join(tmp, "py"))
        import gguf.quants as quants
        rng = np.random.default_rng(16)
        test_blocks(tool, tmp, quants, rng)
        test_quantisers(tool, tmp, quants, rng)
        test_llama_quantize(tool, kvlab, source, tmp, quants)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
