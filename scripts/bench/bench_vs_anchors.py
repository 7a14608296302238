#!/usr/bin/python3
"""kvlab's CPU speed against llama.cpp and llama2.c on the same model files, same threads, one run.

Called by scripts/bench_vs_anchors.sh (which builds the anchors and passes their bin directory).
Not a test; never in CI (the figures are only meaningful as ratios measured side by side).

For each thread count, each round runs every case of every weight type as kvlab, then as the anchor
(A B A B ...), so load drift on a shared machine hits both programs alike; each figure is the median
over rounds. Cases (110M shape unless --shape 1b):
  decode    kvlab `generate --prompt hello -n 129 --ignore-eos --temperature 0` (its "decode" rate:
            128 one-token forward passes per second of the whole generation loop, sampling and
            detokenising included)  vs  llama-bench tg128 (128 one-token decodes, forward only)
  pp512     kvlab `generate` of a 512-token prompt (BOS + 511 words that are one token each), its prompt rate
            vs  llama-bench pp512
  depth4k   kvlab `generate` after a 4096-token prompt, decode rate of 128 steps  vs
            llama-batched-bench -npp 4096 -ntg 128 -npl 1, its S_TG column
  run.c     llama2.c `run model.bin -t 0 -n 129` "achieved tok/s" (f32 only)
A type kvlab cannot load shows "refused" (its error is printed once).
Perplexity: kvlab `perplexity --protocol chunked --ctx 512 --max-windows W` against
`llama-perplexity -c 512 --chunks W` on the same text (both: windows of 512 tokens from the start of
the BOS-prefixed text, each window's first token replaced by BOS, second half scored).
Peak RSS (/usr/bin/time -v) of the kvlab depth4k run against file size + KV + 15%.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
from make_fixtures import WORDS  # noqa: E402  (each "▁word" is one token of the bench vocabulary)

QUANT_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_K_M", "Q6_K"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, env=None, timeout=1800, stdin=None):
    """Runs cmd; returns (rc, stdout, stderr)."""
    e = dict(os.environ)
    if env:
        e.update(env)
    # errors="replace": a random-weight model generates byte tokens that are not UTF-8
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=e, timeout=timeout,
                       input=stdin)
    return p.returncode, p.stdout, p.stderr


def single_token_words(kvlab, model):
    """The fixture words that the bench vocabulary's tokenizer (kvlab tokenize, SentencePiece
    merges) turns into one "\u2581word" piece each."""
    rc, out, err = sh([kvlab, "tokenize", "--tokenizer", model, "--pieces"], stdin=" ".join(WORDS))
    if rc != 0:
        sys.exit(f"kvlab tokenize failed:\n{err[-1000:]}")
    pieces = {l.split("\t", 1)[1] for l in out.splitlines() if "\t" in l}
    words = [w for w in WORDS if "\u2581" + w in pieces]
    if len(words) < 8:
        sys.exit("fewer than 8 single-token words in the bench vocabulary")
    return words


def prompt_words(words, n):
    """n space-separated single-token words."""
    return " ".join(words[i % len(words)] for i in range(n))


class Bench:
    def __init__(self, a):
        self.a = a
        self.kvlab = a.kvlab
        self.bin = a.anchors
        self.dir = a.work
        self.refused = {}  # type -> kvlab's error line
        self.results = {}  # (case, type, threads, program) -> [tok/s per round]
        self.rss = {}      # type -> (peak MiB, expected MiB)

    def add(self, case, t, threads, prog, v):
        self.results.setdefault((case, t, threads, prog), []).append(v)

    def model(self, t):
        return os.path.join(self.dir, f"model-{t.lower()}.gguf")

    # -- files ------------------------------------------------------------------------------
    def prepare(self):
        os.makedirs(self.dir, exist_ok=True)
        if self.a.shape == "110m":
            if not os.path.exists(os.path.join(self.dir, "model.bin")):
                log("bench: writing the 110M random Llama (f32 GGUF + llama2.c .bin)")
                subprocess.run([sys.executable, os.path.join(HERE, "make_bench_model.py"), self.dir,
                                "--shape", "110m"], check=True)
            src = self.model("F32")
            for q in QUANT_TYPES:
                if q.upper() in self.a.types and not os.path.exists(self.model(q)):
                    log(f"bench: llama-quantize {q}")
                    rc, out, err = sh([os.path.join(self.bin, "llama-quantize"), src, self.model(q), q, "2"])
                    if rc != 0:
                        sys.exit(f"llama-quantize {q} failed:\n{err[-2000:]}")
        else:
            if not os.path.exists(self.model("BF16")):
                log("bench: writing the 1B random Llama (bf16 GGUF)")
                subprocess.run([sys.executable, os.path.join(HERE, "make_bench_model.py"), self.dir,
                                "--shape", "1b"], check=True)

    # -- kvlab ------------------------------------------------------------------------------
    def kvlab_generate(self, t, threads, prompt, n, rss=False, binary=None):
        cmd = [binary or self.kvlab, "generate", "--model", self.model(t), "--prompt", prompt, "-n", str(n),
               "--temperature", "0", "--ignore-eos", "--threads", str(threads)]
        if rss:
            cmd = ["/usr/bin/time", "-v"] + cmd
        rc, out, err = sh(cmd)
        if rc != 0:
            line = next((l for l in err.splitlines() if l.strip() and not l.startswith("\t")), err.strip())
            self.refused[t] = line[:200]
            return None
        m = re.search(r"prompt (\d+) tokens, ([\d.]+) tok/s .* decode (\d+) steps, ([\d.]+) tok/s", err)
        if not m:
            sys.exit(f"cannot parse kvlab generate's output:\n{err[-1000:]}")
        res = dict(prompt_tokens=int(m.group(1)), prefill=float(m.group(2)), steps=int(m.group(3)),
                   decode=float(m.group(4)))
        if rss:
            res["rss_mb"] = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) / 1024
        return res

    # -- anchors ----------------------------------------------------------------------------
    def llama_bench(self, t, threads):
        rc, out, err = sh([os.path.join(self.bin, "llama-bench"), "-m", self.model(t), "-p", "512", "-n", "128",
                           "-t", str(threads), "-r", str(self.a.llama_reps), "-o", "json"])
        if rc != 0:
            sys.exit(f"llama-bench failed on {t}:\n{err[-2000:]}")
        res = {}
        for row in json.loads(out):
            if row["n_prompt"] == 512 and row["n_gen"] == 0:
                res["pp512"] = row["avg_ts"]
            if row["n_prompt"] == 0 and row["n_gen"] == 128:
                res["tg128"] = row["avg_ts"]
        return res

    def batched_bench(self, t, threads):
        rc, out, err = sh([os.path.join(self.bin, "llama-batched-bench"), "-m", self.model(t), "-c", "4352",
                           "-b", "2048", "-ub", "512", "-npp", "4096", "-ntg", "128", "-npl", "1",
                           "-t", str(threads)])
        text = out + err
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 10 and cells[0] == "4096" and cells[1] == "128":
                return float(cells[7])  # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...
        sys.exit(f"cannot parse llama-batched-bench's table ({t}):\n{text[-2000:]}")

    def run_c(self, threads):
        rc, out, err = sh([os.path.join(self.bin, "run"), os.path.join(self.dir, "model.bin"), "-z",
                           os.path.join(self.dir, "tokenizer.bin"), "-t", "0", "-n", "129"],
                          env={"OMP_NUM_THREADS": str(threads)})
        m = re.search(r"achieved tok/s: ([\d.]+)", out + err)
        if rc != 0 or not m:
            sys.exit(f"llama2.c run failed:\n{(out + err)[-1000:]}")
        return float(m.group(1))

    def kvlabs(self):
        out = [("kvlab", self.kvlab)]
        if self.a.kvlab_before:
            out.insert(0, ("kvlab-before", self.a.kvlab_before))
        return out

    # -- the run ----------------------------------------------------------------------------
    def measure(self):
        words = single_token_words(self.kvlab, self.model(self.a.types[0]))
        p512 = prompt_words(words, 511)     # + BOS = 512 tokens
        p4k = prompt_words(words, 4095)     # + BOS = 4096 tokens
        for rnd in range(self.a.rounds):
            for threads in self.a.threads:
                for t in self.a.types:
                    log(f"bench: round {rnd + 1}/{self.a.rounds}, {threads} thread(s), {t}")
                    # decode + pp512, for the kvlab under test and (optionally) the one before
                    for prog, binary in self.kvlabs():
                        if t in self.refused:
                            break
                        r = self.kvlab_generate(t, threads, "hello", 129, binary=binary)
                        if r:
                            self.add("decode", t, threads, prog, r["decode"])
                            r = self.kvlab_generate(t, threads, p512, 1, binary=binary)
                            if r["prompt_tokens"] != 512:
                                sys.exit(f"the 512-token prompt encodes to {r['prompt_tokens']} tokens")
                            self.add("pp512", t, threads, prog, r["prefill"])
                    lb = self.llama_bench(t, threads)
                    self.add("decode", t, threads, "llama.cpp", lb["tg128"])
                    self.add("pp512", t, threads, "llama.cpp", lb["pp512"])
                    if t == "F32" and self.a.shape == "110m":
                        self.add("decode", t, threads, "run.c", self.run_c(threads))
                    if self.a.depth and threads in self.a.depth_threads and t in self.a.depth_types:
                        for prog, binary in self.kvlabs():
                            if t in self.refused:
                                break
                            rss = rnd == 0 and threads == self.a.depth_threads[-1] and prog == "kvlab"
                            r = self.kvlab_generate(t, threads, p4k, 129, rss=rss, binary=binary)
                            if r:
                                if r["prompt_tokens"] != 4096:
                                    sys.exit(f"the 4096-token prompt encodes to {r['prompt_tokens']} tokens")
                                self.add("depth4k", t, threads, prog, r["decode"])
                                if "rss_mb" in r:
                                    self.rss[t] = r["rss_mb"]
                        self.add("depth4k", t, threads, "llama.cpp", self.batched_bench(t, threads))

    def perplexity(self):
        out = []
        if not self.a.text:
            return out
        for t in self.a.types:
            if t in self.refused:
                out.append((t, None, None, "refused"))
                continue
            rc, o, e = sh([self.kvlab, "perplexity", "--model", self.model(t), "--text", self.a.text,
                           "--ctx", "512", "--max-windows", str(self.a.ppl_windows), "--threads", str(self.a.threads[-1])])
            m = re.search(r"PPL = ([\d.]+)", o)
            if rc != 0 or not m:
                out.append((t, None, None, "kvlab failed: " + (e.strip().splitlines() or [""])[-1][:120]))
                continue
            kv = float(m.group(1))
            rc, o, e = sh([os.path.join(self.bin, "llama-perplexity"), "-m", self.model(t), "-f", self.a.text,
                           "-c", "512", "-b", "512", "--chunks", str(self.a.ppl_windows), "-t", str(self.a.threads[-1])])
            m = re.search(r"Final estimate: PPL = ([\d.]+)", o + e)
            if rc != 0 or not m:
                sys.exit(f"llama-perplexity failed on {t}:\n{(o + e)[-2000:]}")
            out.append((t, kv, float(m.group(1)), ""))
        return out

    # -- table ------------------------------------------------------------------------------
    def med(self, case, t, threads, prog):
        v = self.results.get((case, t, threads, prog))
        return statistics.median(v) if v else None

    def table(self, ppl):
        lines = []
        f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
        r = lambda a, b: "–" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
        for threads in self.a.threads:
            lines.append(f"\n### {threads} thread(s) (tok/s, median of {self.a.rounds} round(s))\n")
            hdr = "| type | kvlab decode | llama.cpp tg128 | ratio | kvlab pp512 | llama.cpp pp512 | ratio |"
            sep = "|---|---|---|---|---|---|---|"
            if self.a.depth:
                hdr += " kvlab decode @4k | llama.cpp S_TG @4k | ratio |"
                sep += "---|---|---|"
            if self.a.kvlab_before:
                hdr += " kvlab before: decode | pp512 | after/before decode | pp512 |"
                sep += "---|---|---|---|"
                if self.a.depth:
                    hdr += " @4k | after/before @4k |"
                    sep += "---|---|"
            lines += [hdr, sep]
            for t in self.a.types:
                fk = lambda v: "refused" if t in self.refused else f(v)  # noqa: E731
                kd, ld = self.med("decode", t, threads, "kvlab"), self.med("decode", t, threads, "llama.cpp")
                kp, lp = self.med("pp512", t, threads, "kvlab"), self.med("pp512", t, threads, "llama.cpp")
                row = f"| {t.lower()} | {fk(kd)} | {f(ld)} | {r(kd, ld)} | {fk(kp)} | {f(lp)} | {r(kp, lp)} |"
                if self.a.depth:
                    k4, l4 = self.med("depth4k", t, threads, "kvlab"), self.med("depth4k", t, threads, "llama.cpp")
                    row += f" {fk(k4)} | {f(l4)} | {r(k4, l4)} |"
                if self.a.kvlab_before:
                    bd, bp = self.med("decode", t, threads, "kvlab-before"), self.med("pp512", t, threads, "kvlab-before")
                    row += f" {fk(bd)} | {fk(bp)} | {r(kd, bd)} | {r(kp, bp)} |"
                    if self.a.depth:
                        b4 = self.med("depth4k", t, threads, "kvlab-before")
                        row += f" {fk(b4)} | {r(k4, b4)} |"
                lines.append(row)
            rc_ = self.med("decode", "F32", threads, "run.c")
            if rc_ is not None:
                kd = self.med("decode", "F32", threads, "kvlab")
                lines.append(f"\nllama2.c run (f32 .bin, {threads} thread(s)): {rc_:.1f} tok/s; kvlab f32 decode / run.c = {r(kd, rc_)}")
        if self.refused:
            lines.append("\nrefused by kvlab: " + "; ".join(f"{t}: {m}" for t, m in self.refused.items()))
        if ppl:
            lines.append(f"\n### perplexity, ctx 512, {self.a.ppl_windows} windows of {os.path.basename(self.a.text)}\n")
            lines += ["| type | kvlab PPL | llama-perplexity PPL | kvlab / llama.cpp - 1 |", "|---|---|---|---|"]
            for t, kv, lc, note in ppl:
                if note:
                    lines.append(f"| {t.lower()} | {note} | | |")
                else:
                    lines.append(f"| {t.lower()} | {kv:.4f} | {lc:.4f} | {100 * (kv / lc - 1):+.3f}% |")
        if self.rss:
            # the process before any model: the binary and its shared libraries (a CUDA-enabled
            # build maps cuBLAS/cuBLASLt), measured the same way on `kvlab --help`
            rc, o, e = sh(["/usr/bin/time", "-v", self.kvlab, "--help"])
            base = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", e).group(1)) / 1024
            lines.append("\n### kvlab peak RSS (4096-token prompt + 128 decoded, /usr/bin/time -v)\n")
            lines.append(f"baseline (`kvlab --help`, no model): {base:.0f} MiB\n")
            lines += ["| type | peak RSS MiB | peak - baseline | file MiB | KV MiB (fp32, 4224 tokens) | (file + KV) x 1.15 "
                      "| peak within | peak - baseline within |", "|---|---|---|---|---|---|---|---|"]
            for t, mb in self.rss.items():
                file_mb = os.path.getsize(self.model(t)) / 2**20
                kv_mb = self.a.kv_bytes_per_token * (4096 + 128) / 2**20
                bound = (file_mb + kv_mb) * 1.15
                lines.append(f"| {t.lower()} | {mb:.0f} | {mb - base:.0f} | {file_mb:.0f} | {kv_mb:.0f} | {bound:.0f} "
                             f"| {'yes' if mb <= bound else 'NO'} | {'yes' if mb - base <= bound else 'NO'} |")
        return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvlab", required=True)
    ap.add_argument("--anchors", required=True, help="bin directory of the anchors")
    ap.add_argument("--work", required=True, help="directory for the model files (reused)")
    ap.add_argument("--shape", choices=["110m", "1b"], default="110m")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default="F32,F16,BF16,Q8_0,Q4_0,Q4_K_M,Q6_K")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-reps", type=int, default=2, help="llama-bench -r per round")
    ap.add_argument("--no-depth", dest="depth", action="store_false", help="skip the 4k-context decode case")
    ap.add_argument("--depth-threads", default="", help="thread counts of the 4k case (default: all)")
    ap.add_argument("--depth-types", default="", help="types of the 4k case (default: all)")
    ap.add_argument("--kvlab-before", default="", help="a second kvlab binary, run interleaved as 'before'")
    ap.add_argument("--text", default="", help="text for the perplexity check (empty: skip)")
    ap.add_argument("--ppl-windows", type=int, default=8)
    a = ap.parse_args()
    a.threads = [int(x) for x in a.threads.split(",")]
    a.types = [x.upper() for x in a.types.split(",")]
    a.depth_threads = [int(x) for x in a.depth_threads.split(",")] if a.depth_threads else a.threads
    a.depth_types = [x.upper() for x in a.depth_types.split(",")] if a.depth_types else a.types
    if a.shape == "1b":
        a.types = ["BF16"]
        dim, layers, kv_heads, heads = 2048, 16, 8, 32
    else:
        dim, layers, kv_heads, heads = 768, 12, 12, 12
    # kvlab's host KV pages hold fp32 K and V: 2 x layers x kv_dim x 4 bytes per token
    a.kv_bytes_per_token = 2 * layers * (dim // heads * kv_heads) * 4
    b = Bench(a)
    b.prepare()
    t0 = time.time()
    up0 = open("/proc/loadavg").read().split()[:3]
    # SIGTERM / Ctrl-C stop the run and print what was measured so far (marked partial)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    partial = False
    ppl = []
    try:
        b.measure()
        ppl = b.perplexity()
    except KeyboardInterrupt:
        partial = True
    up1 = open("/proc/loadavg").read().split()[:3]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    isa = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx_vnni") if f in flags)
    print(f"## kvlab vs llama.cpp / llama2.c ({a.shape}, {time.time() - t0:.0f} s{', PARTIAL: stopped early' if partial else ''})\n")
    print(f"CPU: {cpu}; {os.cpu_count()} logical CPUs; ISA: {isa}")
    print(f"load average (1/5/15 min) before: {' '.join(up0)}, after: {' '.join(up1)}")
    print(f"files: {a.work}")
    print(b.table(ppl))


if __name__ == "__main__":
    main()
