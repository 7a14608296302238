#!/usr/bin/python3
"""End-to-end checks of `kvlab generate` and `kvlab perplexity` on a tiny fixture model.

    engine_cli_test.py KVLAB_EXE FIXTURES_DIR SHARED_DIR

- generate (greedy) streams text and exits 0; the same seed gives the same sampled text;
  a --policy with --policy-param runs;
- a prompt longer than the model's context is one clear error line, exit status 1;
- perplexity prints "PPL = x +/- y" (needs SHARED_DIR/text/pride_and_prejudice.txt, else that
  part is skipped with a message); --ctx above the context and a missing file are clear errors.
"""
import os
import re
import subprocess
import sys

exe, fixtures, shared = sys.argv[1], sys.argv[2], sys.argv[3]
model = os.path.join(fixtures, "llama_hd64_gqa2_untied", "model.gguf")
failures = []


def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, errors="replace", timeout=120)


def check(cond, what, proc=None):
    if not cond:
        detail = f"\n  rc={proc.returncode}\n  stdout={proc.stdout!r}\n  stderr={proc.stderr!r}" if proc else ""
        failures.append(what + detail)


p = run("generate", "--model", model, "--prompt", "the sister of elizabeth", "-n", "12",
        "--temperature", "0", "--threads", "1")
check(p.returncode == 0 and p.stdout.strip() != "" and "generated 12 tokens" in p.stderr, "greedy generate", p)

a = run("generate", "--model", model, "--prompt", "mr darcy", "-n", "10", "--seed", "7", "--threads", "1")
b = run("generate", "--model", model, "--prompt", "mr darcy", "-n", "10", "--seed", "7", "--threads", "1")
check(a.returncode == 0 and a.stdout == b.stdout, "same seed, same text", a)

p = run("generate", "--model", model, "--prompt", "the sister of elizabeth", "-n", "30", "--temperature", "0",
        "--threads", "1", "--policy", "sinks", "--policy-param", "sinks=2", "--policy-param", "recent=8")
check(p.returncode == 0, "generate with a policy", p)

p = run("generate", "--model", model, "--prompt", "the " * 400, "-n", "4")
check(p.returncode == 1 and "longer than the model's context of 256 tokens" in p.stderr
      and len(p.stderr.strip().splitlines()) == 1, "prompt longer than the context", p)

p = run("generate", "--model", model, "--prompt", "x", "--policy", "no_such_policy")
check(p.returncode == 1 and "no_such_policy" in p.stderr, "unknown policy", p)

text = os.path.join(shared, "text", "pride_and_prejudice.txt")
if os.path.exists(text):
    p = run("perplexity", "--model", model, "--text", text, "--ctx", "64", "--max-windows", "3", "--threads", "1")
    m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", p.stdout)
    check(p.returncode == 0 and m and float(m.group(1)) > 1 and float(m.group(2)) > 0
          and "93 scored tokens in 3 windows of 64" in p.stdout, "perplexity", p)
    p = run("perplexity", "--model", model, "--text", text, "--ctx", "512")
    check(p.returncode == 1 and "longer than the model's context" in p.stderr, "perplexity --ctx too long", p)
else:
    print(f"skipped perplexity checks: needs {text}: absent")
p = run("perplexity", "--model", model, "--text", "/nonexistent/file.txt")
check(p.returncode == 1 and "/nonexistent/file.txt" in p.stderr, "perplexity missing text", p)

for f in failures:
    print("FAILED:", f)
print(f"{'ok' if not failures else 'FAILED'}")
sys.exit(1 if failures else 0)
