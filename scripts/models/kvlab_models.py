#!/usr/bin/env python3
"""Model files for kvlab from PyPI packages: dequantise a GGUF, register it under a short name.

Run inside the project venv (scripts/setup_models.sh creates it; needs the `gguf` package):

  kvlab_models.py dequantize IN.gguf OUT.gguf     # quantised tensors -> F32, metadata copied
  kvlab_models.py register --index DIR NAME FILE.gguf --source-quant Q4_1 --license L --source S
  kvlab_models.py check-index DIR                 # every registered file exists and parses

Dequantisation. Every quantised tensor becomes F32 through the gguf package's dequantiser
(gguf.quants.dequantize); F32/F16/BF16 tensors are copied unchanged. The stored values are
exactly the format's values: each quantised weight is an exact expression in f16 block scales
and small integers (Q8_0: d*q, q in int8 -> at most 11+8 significant bits; Q4_1: d*q + m, d*q
exact in 15 bits, then one rounding of the sum; Q4_K: (d*sc)*q - dmin*m with every product
exact in <= 21 bits, one rounding of the difference; Q6_K: d*sc*q, one rounding of the exact
product however it is associated), so there is one correctly rounded f32 per weight and any
correct dequantiser produces it. For Q8_0 and Q4_1 (the types in SmolLM2's file) `dequantize`
re-derives every value independently in float64 (where these expressions are exact) and
requires bitwise equality after rounding to f32; other types are not independently checked.
F16 output is not used: d*q + m does not fit f16's 11 bits in general.

The index (DIR/index.tsv) is what `kvlab models`, `--model NAME` and `model.path: NAME` read:
a header line, then one tab-separated line per model:
  name  file  architecture  source_quantization  stored_dtype  context_length  license  source
`file` is relative to DIR (or absolute). Registering an existing name replaces its line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

INDEX_HEADER = ["name", "file", "architecture", "source_quantization", "stored_dtype",
                "context_length", "license", "source"]


def _gguf():
    try:
        import gguf  # noqa: PLC0415
    except ImportError:
        sys.exit("kvlab_models.py: the 'gguf' package is missing; run scripts/setup_models.sh "
                 "(it installs it into the project venv) and use .venv/bin/python")
    return gguf


# ---- independent float64 decoders for the two types SmolLM2's file uses -------------------
def _ref_q8_0(raw: np.ndarray, n: int) -> np.ndarray:
    # block: f16 d, int8 q[32]; value = d * q
    b = raw.reshape(-1, 34)
    d = b[:, :2].copy().view("<f2").astype(np.float64)
    q = b[:, 2:].copy().view(np.int8).astype(np.float64)
    return (d * q).astype(np.float32).reshape(-1)[:n]


def _ref_q4_1(raw: np.ndarray, n: int) -> np.ndarray:
    # block: f16 d, f16 m, u8 qs[16]; value j (0..15) = d*(qs[j] & 15) + m, j+16 = d*(qs[j]>>4) + m
    b = raw.reshape(-1, 20)
    d = b[:, 0:2].copy().view("<f2").astype(np.float64)
    m = b[:, 2:4].copy().view("<f2").astype(np.float64)
    qs = b[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
    return (d * q + m).astype(np.float32).reshape(-1)[:n]


def dequantize(src: Path, dst: Path) -> None:
    gguf = _gguf()
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V  # noqa: PLC0415
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    keep = {Q.F32, Q.F16, Q.BF16}
    refs = {Q.Q8_0: _ref_q8_0, Q.Q4_1: _ref_q4_1}
    source_types = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in keep})
    tmp = dst.with_name(dst.name + ".part")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_key_value(name, int(gguf.LlamaFileType.ALL_F32), V.UINT32)
            continue
        main = field.types[0]
        sub = field.types[-1] if main == V.ARRAY else None
        if main == V.ARRAY and len(field.types) > 2:
            sys.exit(f"{src}: key '{name}' is a nested array, which this converter does not copy")
        writer.add_key_value(name, field.contents(), main, sub_type=sub)
    writer.add_key_value("kvlab.dequantized_from", ",".join(source_types) or "none", V.STRING)
    checked = 0
    for t in reader.tensors:
        if t.tensor_type in keep:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        n = int(np.prod([int(x) for x in t.shape]))
        if values.size != n:
            sys.exit(f"{src}: tensor '{t.name}' dequantised to {values.size} values, shape says {n}")
        ref = refs.get(t.tensor_type)
        if ref is not None:
            expect = ref(np.asarray(t.data).reshape(-1), n)
            if not np.array_equal(values.reshape(-1).view(np.uint32), expect.view(np.uint32)):
                bad = int(np.count_nonzero(values.reshape(-1).view(np.uint32) != expect.view(np.uint32)))
                sys.exit(f"{src}: tensor '{t.name}' ({t.tensor_type.name}): gguf's dequantiser and the "
                         f"float64 reference differ in {bad} of {n} values")
            checked += 1
        writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
    print(f"{dst}: {len(reader.tensors)} tensors, {', '.join(source_types) or 'none'} -> F32 "
          f"({checked} tensors checked bitwise against the float64 reference)")


# ---- the index ----------------------------------------------------------------------------
def read_index(index_dir: Path) -> list[list[str]]:
    path = index_dir / "index.tsv"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split("\t") != INDEX_HEADER:
        sys.exit(f"{path}:1: expected the header '{chr(9).join(INDEX_HEADER)}'")
    rows = []
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        row = line.split("\t")
        if len(row) != len(INDEX_HEADER):
            sys.exit(f"{path}:{i}: expected {len(INDEX_HEADER)} tab-separated fields, got {len(row)}")
        rows.append(row)
    return rows


def register(index_dir: Path, name: str, file: Path, source_quant: str, license_: str, source: str) -> None:
    gguf = _gguf()
    reader = gguf.GGUFReader(str(file))
    f = reader.fields
    arch = f["general.architecture"].contents()
    ctx_key = f"{arch}.context_length"
    ctx = str(f[ctx_key].contents()) if ctx_key in f else "?"
    stored = sorted({t.tensor_type.name for t in reader.tensors})
    # A quantised file's F32 tensors are its norms: name only the quantised types.
    quantised = [t for t in stored if t not in ("F32", "F16", "BF16")]
    stored_dtype = "+".join(quantised) if quantised else "+".join(stored)
    for field in (name, source_quant, license_, source):
        if "\t" in field or "\n" in field or not field:
            sys.exit(f"register: empty field or a tab/newline in '{field}'")
    try:
        rel = file.resolve().relative_to(index_dir.resolve())
    except ValueError:
        rel = file.resolve()
    row = [name, str(rel), arch, source_quant, stored_dtype, ctx, license_, source]
    rows = [r for r in read_index(index_dir) if r[0] != name] + [row]
    index_dir.mkdir(parents=True, exist_ok=True)
    text = "\t".join(INDEX_HEADER) + "\n" + "".join("\t".join(r) + "\n" for r in rows)
    fd, tmp = tempfile.mkstemp(dir=index_dir, prefix=".index.")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600
    os.replace(tmp, index_dir / "index.tsv")
    print(f"registered {name}: {arch}, {source_quant} -> {stored_dtype}, context {ctx}, {license_}")


def check_index(index_dir: Path) -> int:
    gguf = _gguf()
    rows = read_index(index_dir)
    for r in rows:
        p = Path(r[1]) if os.path.isabs(r[1]) else index_dir / r[1]
        gguf.GGUFReader(str(p))  # raises on a missing or corrupt file
        print(f"{r[0]}: {p} ok")
    return 0 if rows else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dequantize")
    d.add_argument("src", type=Path)
    d.add_argument("dst", type=Path)
    r = sub.add_parser("register")
    r.add_argument("--index", type=Path, required=True)
    r.add_argument("name")
    r.add_argument("file", type=Path)
    r.add_argument("--source-quant", required=True)
    r.add_argument("--license", required=True)
    r.add_argument("--source", required=True)
    c = sub.add_parser("check-index")
    c.add_argument("index", type=Path)
    a = ap.parse_args()
    if a.cmd == "dequantize":
        dequantize(a.src, a.dst)
        return 0
    if a.cmd == "register":
        register(a.index, a.name, a.file, a.source_quant, a.license, a.source)
        return 0
    return check_index(a.index)


if __name__ == "__main__":
    sys.exit(main())
