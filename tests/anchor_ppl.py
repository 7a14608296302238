"""What the anchor tests (gemma2_anchor_test.py, mla_anchor_test.py) share: finding llama.cpp's
llama-perplexity (the anchor at c392e50, built by ../shared/anchors/build.sh) and running
`kvlab perplexity` and `llama-perplexity` on one GGUF and text under one protocol: windows of
CTX tokens, the second half of each scored, llama.cpp with an F32 KV cache, 2 threads.
"""
import os
import re
import subprocess
import sys

CTX, WINDOWS = "128", "3"


def anchor_or_skip(src):
    """llama-perplexity's path; exits 77 (CTest's skip) with a message when ../shared
    (KVLAB_SHARED_DIR) or the built anchor ($KVLAB_ANCHORS_BIN, default /tmp/kvlab-anchors/bin)
    is absent."""
    shared = os.environ.get("KVLAB_SHARED_DIR", os.path.join(src, "..", "shared"))
    if not os.path.isdir(os.path.join(shared, "anchors")):
        print(f"SKIP: no {shared}/anchors (set KVLAB_SHARED_DIR)")
        sys.exit(77)
    anchor = os.path.join(os.environ.get("KVLAB_ANCHORS_BIN", "/tmp/kvlab-anchors/bin"), "llama-perplexity")
    if not os.access(anchor, os.X_OK):
        print(f"SKIP: llama-perplexity not found at {anchor} ({shared}/anchors/build.sh builds it)")
        sys.exit(77)
    return anchor


def perplexities(exe, anchor, gguf, text):
    """(kvlab's PPL, llama-perplexity's PPL) on `gguf` and `text`; exits 1 with the output when
    either fails or prints no PPL."""
    p = subprocess.run([exe, "perplexity", "--model", gguf, "--text", text, "--ctx", CTX, "--max-windows", WINDOWS,
                        "--threads", "2"], capture_output=True, text=True, timeout=1200)
    m = re.search(r"PPL = ([0-9.]+)", p.stdout)
    if p.returncode != 0 or not m:
        print("FAILED: kvlab perplexity", p.stdout, p.stderr)
        sys.exit(1)
    kv_ppl = float(m.group(1))
    a = subprocess.run([anchor, "-m", gguf, "-f", text, "-c", CTX, "--chunks", WINDOWS, "-t", "2", "-b", CTX,
                        "-ctk", "f32", "-ctv", "f32"], capture_output=True, text=True, timeout=1200)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", a.stdout + a.stderr)
    if a.returncode != 0 or not m:
        print("FAILED: llama-perplexity", (a.stdout + a.stderr)[-3000:])
        sys.exit(1)
    return kv_ppl, float(m.group(1))
