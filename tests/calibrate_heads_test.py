#!/usr/bin/python3
"""`kvlab calibrate-heads` on the bundled model, its head file used by the `duo` policy, and bad
inputs.

    /usr/bin/python3 tests/calibrate_heads_test.py KVLAB_BINARY SOURCE_DIR

kvlab-tiny copies through one hand-wired 4-gram induction head (layer 2, query head 0;
data/models/kvlab-tiny.md): for every value token it copies, that head attends to the needle
token it copies, so when every trial is answered correctly the calibration must give layer 2's
KV head a retrieval score of exactly 1 (hits / copy tokens, no rounding) and it must be the
unique best pair. Bad inputs: exit status 1 and one line on stderr naming the option or file.
Skips (exit 77) when the bundled model is absent.
"""

import os
import subprocess
import sys
import tempfile


def main():
    kvlab, src = sys.argv[1], sys.argv[2]
    model = os.path.join(src, "data", "models", "kvlab-tiny.gguf")
    hay = os.path.join(src, "data", "eval", "heldout.txt")
    if not (os.path.exists(model) and os.path.exists(hay)):
        print(f"skip: {model} or {hay} absent")
        return 77
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    def run(*args):
        return subprocess.run([kvlab, *args], capture_output=True, text=True, timeout=300)

    with tempfile.TemporaryDirectory() as tmp:
        heads = os.path.join(tmp, "heads.tsv")
        r = run("calibrate-heads", model, "--haystack", hay, "-o", heads, "--lengths", "256,512",
                "--depths", "0,50,100", "--trials", "2", "--threads", "1")
        check(r.returncode == 0, f"calibrate-heads exit 0 ({r.stderr.strip()[-300:]})")
        if r.returncode != 0:
            return 1
        lines = open(heads).read().splitlines()
        check(lines[0] == "# kvlab duo heads v1", "magic line")
        comments = [l for l in lines if l.startswith("#")]
        check(any("model=kvlab-tiny.gguf" in l for l in comments), "a comment names the model file")
        check(any("lengths=256,512" in l and "depths=0,50,100" in l for l in comments),
              "a comment names the calibration settings")
        stats = dict(kv.split("=") for kv in comments[-1][2:].split())
        header = lines.index("layer\tkv_head\tscore")
        rows = [l.split("\t") for l in lines[header + 1:]]
        scores = {(int(a), int(b)): float(c) for a, b, c in rows}
        check(sorted(scores) == [(l, 0) for l in range(5)], f"one row per (layer, KV head) of 5 x 1: {sorted(scores)}")
        check(stats["trials"] == "12", f"12 trials ({stats})")
        best = max(scores, key=scores.get)
        check(best == (2, 0) and all(s < scores[best] for k, s in scores.items() if k != best),
              f"layer 2 is the unique best pair: {scores}")
        if stats["correct"] == stats["trials"]:
            check(scores[(2, 0)] == 1.0, f"every copied token found by the induction head: {scores[(2, 0)]}")
        check("retrieval_fraction 0.25 -> retrieval heads (layer/kv_head): 0/0 2/0" in r.stdout, "summary lines")

        # The file drives the duo policy (retrieval_fraction 0.2 of 5 pairs: layer 2 alone).
        g = run("generate", "--model", model, "--prompt", "The special magic number is 4815162. What is the "
                "special magic number? The special magic number is", "-n", "8", "--temperature", "0",
                "--threads", "1", "--policy", "duo", "--policy-param", f"heads={heads}",
                "--policy-param", "retrieval_fraction=0.2", "--policy-param", "sinks=4",
                "--policy-param", "recent=8")
        check(g.returncode == 0 and "4815162" in g.stdout, f"generate with duo copies the value ({g.stdout.strip()!r})")

        # Bad inputs: one line, exit 1.
        bad_heads = os.path.join(tmp, "bad.tsv")
        with open(bad_heads, "w") as f:
            f.write("# kvlab duo heads v1\nlayer\tkv_head\tscore\n0\t0\t0.5\n7\t0\t0.5\n")
        cases = [
            (["calibrate-heads", model, "-o", heads], "--haystack"),
            (["calibrate-heads", model, "--haystack", os.path.join(tmp, "none.txt"), "-o", heads], "none.txt"),
            (["calibrate-heads", model, "--haystack", hay, "-o", heads, "--lengths", "256,x"], "--lengths"),
            (["calibrate-heads", model, "--haystack", hay, "-o", heads, "--depths", "150"], "--depths"),
            (["calibrate-heads", model, "--haystack", hay, "-o", heads, "--lengths", "99999"], "--lengths"),
            (["calibrate-heads", model, "--haystack", hay, "-o", os.path.join(tmp, "no", "dir.tsv"),
              "--lengths", "256", "--depths", "50"], "dir.tsv"),
            (["generate", "--model", model, "--prompt", "Hi", "-n", "1", "--policy", "duo",
              "--policy-param", f"heads={bad_heads}"], f"{bad_heads}:4: layer '7'"),
            (["generate", "--model", model, "--prompt", "Hi", "-n", "1", "--policy", "duo",
              "--policy-param", "retrieval_fraction=0.3"], "parameter 'heads'"),
        ]
        for args, want in cases:
            b = run(*args)
            err = b.stderr.strip()
            check(b.returncode == 1 and len(err.splitlines()) == 1 and want in err,
                  f"{' '.join(args[:1] + args[-2:])}: exit {b.returncode}, one line naming {want!r}: {err!r}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
