#!/usr/bin/python3
"""kvlab on the installed SmolLM2-135M-Instruct against an independent implementation (llama.cpp).

    real_models_test.py KVLAB_EXE SOURCE_DIR

Skips (exit status 77, reported by CTest as skipped) with a message when `smollm2-135m` is not
registered (scripts/setup_models.sh installs it). Otherwise:
- llama.cpp's llama-perplexity (the anchor; $KVLAB_ANCHORS_BIN, default /tmp/kvlab-anchors/bin,
  see ../shared/anchors) on the F32 twin `smollm2-135m-f32` (the same weight values, see below) and
  `kvlab perplexity` on `smollm2-135m` (the Q4_1 file as shipped), the same text and protocol
  (windows of 256 tokens, second half scored, no BOS since the file says add_bos_token = false):
  PPL within 1e-3 relative. llama-perplexity prints 4 decimals (<= 5e-5 absolute, about 4e-6
  relative at PPL ~ 14), so the bound is 250x its print precision. The anchor runs with an F32
  KV cache (-ctk f32 -ctv f32) like kvlab's CPU store, so the two differ only in f32 summation
  order; with llama.cpp's default F16 cache the difference measured this session was 3.6e-5
  relative (8 windows of 512, docs/models/smollm2-135m.md). Skipped with a message without the
  anchor.
- `--nll-out` lines reproduce the printed PPL.
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

exe, src = sys.argv[1], sys.argv[2]
text = os.path.join(src, "data", "eval", "heldout.txt")
CTX, WINDOWS = "256", "2"
skips, failures = [], []

models = json.loads(subprocess.run([exe, "models", "--json"], capture_output=True, text=True, check=True).stdout)
smol = [m for m in models if m["name"] == "smollm2-135m" and m["present"]]
if not smol:
    print("SKIP: smollm2-135m is not installed (run scripts/setup_models.sh; `kvlab models` lists what is)")
    sys.exit(77)
# llama-perplexity reads the bit-exact F32 twin (smollm2-135m-f32): the anchor build (llama.cpp
# c392e50) routes Q4_0/Q4_1 matrices through its AMX buffer on CPUs with AMX_INT8 and gets them
# wrong there (upstream llama.cpp PR 16315 reports wrong AMX results for those two types; PR
# 19925 fixed them later): on this session's machine it printed PPL 151.48 for the
# shipped Q4_1 file against 13.87 for the F32 twin (docs/models/smollm2-135m.md). kvlab reads the
# Q4_1 file as shipped; its prefill multiplies f32-dequantised panels, the same values.
twin = [m for m in models if m["name"] == "smollm2-135m-f32" and m["present"]]
gguf = twin[0]["file"] if twin else None

with tempfile.TemporaryDirectory() as tmp:
    nll_file = os.path.join(tmp, "nll.txt")
    p = subprocess.run([exe, "perplexity", "--model", "smollm2-135m", "--text", text, "--ctx", CTX,
                        "--max-windows", WINDOWS, "--threads", "2", "--nll-out", nll_file],
                       capture_output=True, text=True, timeout=1200)
    m = re.search(r"PPL = ([0-9.]+)", p.stdout)
    if p.returncode != 0 or not m:
        print("FAILED: kvlab perplexity", p.stdout, p.stderr)
        sys.exit(1)
    kv_ppl = float(m.group(1))
    nll = [float(line.split()[2]) for line in open(nll_file)]
    if len(nll) != int(WINDOWS) * (int(CTX) // 2 - 1) or abs(math.exp(sum(nll) / len(nll)) - kv_ppl) > 1e-4 * kv_ppl:
        failures.append(f"--nll-out: {len(nll)} lines, exp(mean) {math.exp(sum(nll) / len(nll))} vs PPL {kv_ppl}")
    print(f"kvlab: {p.stdout.strip()}")

anchor = os.path.join(os.environ.get("KVLAB_ANCHORS_BIN", "/tmp/kvlab-anchors/bin"), "llama-perplexity")
if gguf is None:
    skips.append("smollm2-135m-f32 (the F32 twin the anchor reads) is not registered (scripts/setup_models.sh)")
elif os.access(anchor, os.X_OK):
    a = subprocess.run([anchor, "-m", gguf, "-f", text, "-c", CTX, "--chunks", WINDOWS, "-t", "2", "-b", CTX,
                        "-ctk", "f32", "-ctv", "f32"],
                       capture_output=True, text=True, timeout=1200)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", a.stdout + a.stderr)
    if a.returncode != 0 or not m:
        failures.append(f"llama-perplexity failed: {a.stderr[-2000:]}")
    else:
        ref = float(m.group(1))
        rel = abs(kv_ppl - ref) / ref
        print(f"llama-perplexity: PPL = {ref:.4f}; kvlab {kv_ppl:.4f}; relative difference {rel:.2e} (bound 1e-3)")
        if rel > 1e-3:
            failures.append(f"PPL: kvlab {kv_ppl} vs llama-perplexity {ref} (relative {rel:.2e} > 1e-3)")
else:
    skips.append(f"llama-perplexity not found at {anchor} (../shared/anchors/build.sh builds it)")

for s in skips:
    print("SKIP (part):", s)
if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("real_models_test: all checks that could run passed")
