#!/usr/bin/python3
"""The model registry (framework/model/model_registry.h) end to end, on the bundled model.

    models_registry_test.py KVLAB_EXE SOURCE_DIR

Registers data/models/kvlab-tiny.gguf under the name `tiny` in a temporary KVLAB_MODELS_DIR and
checks: `kvlab models` (empty, listed, --json, a missing file); `--model tiny`, `model-info tiny`,
`tokenize --tokenizer tiny` and `model.path: tiny` in an experiment resolve to the file; an
existing path named like a registered model wins; an unknown name, a missing file and a broken
index (header, field count, duplicate name) are each one clear error line with exit status 1.
Needs no installed model.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

exe, src = sys.argv[1], sys.argv[2]
tiny = os.path.join(src, "data", "models", "kvlab-tiny.gguf")
heldout = os.path.join(src, "data", "eval", "heldout.txt")
HEADER = "name\tfile\tarchitecture\tsource_quantization\tstored_dtype\tcontext_length\tlicense\tsource\n"
failures = []


def run(args, env_dir, cwd=None, stdin=None):
    env = dict(os.environ, KVLAB_MODELS_DIR=env_dir)
    return subprocess.run([exe, *args], capture_output=True, text=True, errors="replace", timeout=300,
                          env=env, cwd=cwd, input=stdin)


def check(cond, what, proc=None):
    if not cond:
        detail = f"\n  rc={proc.returncode}\n  stdout={proc.stdout!r}\n  stderr={proc.stderr!r}" if proc else ""
        failures.append(what + detail)


def one_error_line(p, *needles):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    return p.returncode == 1 and len(lines) == 1 and all(n in lines[0] for n in needles)


def write_index(d, rows):
    with open(os.path.join(d, "index.tsv"), "w") as f:
        f.write(HEADER + "".join("\t".join(r) + "\n" for r in rows))


with tempfile.TemporaryDirectory() as tmp:
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    p = run(["models"], empty)
    check(p.returncode == 0 and "none" in p.stdout, "models with no index", p)
    p = run(["model-info", "tiny"], empty)
    check(one_error_line(p, "'tiny' is neither a file nor a registered model", "index.tsv", "setup_models.sh"),
          "unknown name with no index", p)

    reg = os.path.join(tmp, "reg")
    os.makedirs(reg)
    shutil.copy(tiny, os.path.join(reg, "kvlab-tiny.gguf"))
    row = ["tiny", "kvlab-tiny.gguf", "llama", "F32", "F32", "512", "mit", "bundled"]
    write_index(reg, [row])
    p = run(["models"], reg)
    check(p.returncode == 0 and "tiny" in p.stdout and "yes" in p.stdout and "F32 -> F32" in p.stdout,
          "models lists the registered model", p)
    p = run(["models", "--json"], reg)
    ok = p.returncode == 0
    if ok:
        j = json.loads(p.stdout)
        ok = (len(j) == 1 and j[0]["name"] == "tiny" and j[0]["present"] is True
              and j[0]["file"] == os.path.join(reg, "kvlab-tiny.gguf") and j[0]["context_length"] == "512")
    check(ok, "models --json", p)

    p = run(["model-info", "tiny"], reg)
    check(p.returncode == 0 and os.path.join(reg, "kvlab-tiny.gguf") in p.stdout, "model-info NAME", p)
    p = run(["tokenize", "--tokenizer", "tiny"], reg, stdin="Hello world")
    check(p.returncode == 0 and p.stdout.strip() != "", "tokenize --tokenizer NAME", p)
    a = run(["perplexity", "--model", "tiny", "--text", heldout, "--ctx", "64", "--max-windows", "2", "--threads", "1"], reg)
    b = run(["perplexity", "--model", tiny, "--text", heldout, "--ctx", "64", "--max-windows", "2", "--threads", "1"], reg)
    check(a.returncode == 0 and "PPL" in a.stdout and a.stdout == b.stdout,
          "perplexity --model NAME equals --model PATH", a if a.returncode else b)
    p = run(["model-info", "tinyy"], reg)
    check(one_error_line(p, "'tinyy' is neither a file nor a registered model", "registered in", ": tiny;"),
          "unknown name lists the registered ones", p)

    # An existing path wins over a registered name.
    cwd = os.path.join(tmp, "cwd")
    os.makedirs(cwd)
    other = os.path.join(cwd, "tiny")
    os.symlink(tiny, other)
    p = run(["model-info", "tiny"], reg, cwd=cwd)
    check(p.returncode == 0 and "model:          tiny " in p.stdout, "an existing path wins over the registry", p)

    # model.path: NAME in an experiment.
    yaml = os.path.join(tmp, "exp.yaml")
    with open(yaml, "w") as f:
        f.write("name: reg\nmodel: {path: tiny}\npolicies: [{name: full, type: full}]\n"
                f"evals: {{perplexity: {{text: {heldout}, tokens: 64}}}}\n")
    p = run(["validate", yaml], reg)
    check(p.returncode == 0, "validate: model.path NAME", p)
    with open(yaml, "w") as f:
        f.write("name: reg\nmodel: {path: nosuch-model}\npolicies: [{name: full, type: full}]\n"
                f"evals: {{perplexity: {{text: {heldout}, tokens: 64}}}}\n")
    p = run(["validate", yaml], reg)
    check(one_error_line(p, yaml, "model.path", "'nosuch-model' is neither a file nor a registered model"),
          "validate: unknown model.path NAME", p)

    # A registered file that is gone.
    gone = os.path.join(tmp, "gone")
    os.makedirs(gone)
    write_index(gone, [["tiny", "missing.gguf", "llama", "F32", "F32", "512", "mit", "bundled"]])
    p = run(["models"], gone)
    check(p.returncode == 0 and "MISSING" in p.stdout, "models flags a missing file", p)
    p = run(["model-info", "tiny"], gone)
    check(one_error_line(p, "registered in", "missing.gguf", "is missing"), "a registered file that is gone", p)

    # Broken indexes.
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    index = os.path.join(bad, "index.tsv")
    for text, needle in [("name\tfile\n", "index.tsv:1: expected the header"),
                         (HEADER + "tiny\tkvlab-tiny.gguf\tllama\n", "index.tsv:2: expected 8 tab-separated fields, got 3"),
                         (HEADER + "\t".join(row) + "\n" + "\t".join(row) + "\n", "index.tsv:3: model 'tiny' is registered twice")]:
        with open(index, "w") as f:
            f.write(text)
        for args in (["models"], ["model-info", "tiny"]):
            p = run(args, bad)
            check(one_error_line(p, needle), f"bad index ({needle}): {args}", p)

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("models_registry_test: all checks passed")
