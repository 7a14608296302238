#!/usr/bin/python3
"""Crash-safety torture for `kvlab run`: SIGKILL a small sweep at random points, check, resume.

    /usr/bin/python3 scripts/torture.py [--kills 50] [--seed 1] [--kvlab build/bin/kvlab]
                                        [--quick] [--points both|time|write] [--work DIR] [--keep]

What it does (only through the command line: run, --resume, report):
  1. Writes a shipped-style experiment (the quickstart's keys, on the bundled model
     data/models/kvlab-tiny.gguf, kept short: a fraction of a second per cell) and runs it
     uninterrupted: the reference file. The same run under scripts/torture_shim.c counts the
     file-changing system calls kvlab makes on the results file (W).
  2. For each of --kills points (reproducible from --seed), starts the sweep afresh and kills it
     with SIGKILL, alternating between two kinds of point (--points picks one):
       time   a delay drawn uniformly from [0, 0.95 T] (T = the reference run's wall time),
              mostly landing inside compute, sometimes in model loading, file creation or the
              summaries (a run that finishes before its timer is started again with a new delay);
       write  just before the k-th of the W file-changing calls (k uniform in [1, W]), through the
              LD_PRELOAD shim: every write, rename and fsync boundary of the results file is a
              candidate, which a timer would almost never hit.
  3. After each kill: the file (if one exists yet) opens with h5py, `kvlab report` exits 0 on it,
     and every complete cell equals the reference's cell. Then `kvlab run --resume` completes it
     and the whole file must equal the reference: every group, every dataset of every cell and
     summary, every attribute, except those listed in IGNORED_* below (times and throughput).
Prints one line per kill and a summary; exits 1 when any file was unreadable or differed.
Needs h5py and numpy (Debian's python3-h5py, python3-numpy) and a C compiler for the shim.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Values that legitimately differ between an uninterrupted and a killed-then-resumed run: the
# wall-clock times and the throughput measured from them (docs/results_schema.md, "Timing
# attributes"). Everything else must be equal, bit for bit.
IGNORED_ROOT_ATTRS = {"start_time", "end_time"}
IGNORED_CELL_ATTRS = {"prefill_s", "decode_s", "tokens_per_s", "prefill_tokens_per_s",
                      "decode_tokens_per_s", "finished_at"}
IGNORED_DATASETS = re.compile(r"^runs/[^/]+/(niah|perplexity)/tokens_per_s$")  # summaries


def experiment_yaml(quick):
    model = os.path.join(ROOT, "data/models/kvlab-tiny.gguf")
    text = os.path.join(ROOT, "data/eval/heldout.txt")
    policies = ["  - {name: full, type: full}",
                "  - {name: window, type: sliding_window, params: {window: 64}}"]
    if not quick:
        policies.append("  - {name: h2o, type: h2o, params: {heavy: 32, recent: 32, units: tokens}}")
    lengths = "[96]" if quick else "[96, 192]"
    return f"""# scripts/torture.py's sweep: the quickstart's shape, a fraction of a second per cell.
name: torture
model: {{path: {model}, threads: 1}}
kv: {{block_size: 16}}
engine: {{prefill_chunk: 64, probe: true, probe_every: 4}}
policies:
{chr(10).join(policies)}
seeds: [0]
output: torture.h5
evals:
  niah:
    haystack: {text}
    context_lengths: {lengths}
    depths: [0, 100]
    trials: 1
    value_digits: 5
    max_answer_tokens: 6
  perplexity:
    text: {text}
    tokens: {96 if quick else 160}
    protocol: streaming
"""


def attrs_of(obj):
    return {k: obj.attrs[k] for k in obj.attrs}


def values_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def compare_attrs(path, a, b, ignored, out):
    ka, kb = set(a.attrs) - ignored, set(b.attrs) - ignored
    if ka != kb:
        out.append(f"{path}: attributes differ: {sorted(ka ^ kb)}")
        return
    for k in sorted(ka):
        if not values_equal(a.attrs[k], b.attrs[k]):
            out.append(f"{path}@{k}: {a.attrs[k]!r} != {b.attrs[k]!r}")


def compare_tree(ref, got, base, out):
    """Every group, dataset and attribute under `base` of both files (names relative to /)."""
    names_ref, names_got = [], []
    (ref[base] if base else ref).visit(names_ref.append)
    (got[base] if base else got).visit(names_got.append)
    prefix = base + "/" if base else ""
    if set(names_ref) != set(names_got):
        extra = sorted(set(names_got) - set(names_ref))[:5]
        missing = sorted(set(names_ref) - set(names_got))[:5]
        out.append(f"/{base}: objects differ (missing {missing}, extra {extra})")
        return
    for rel in sorted(names_ref):
        name = prefix + rel
        r, g = ref[name], got[name]
        cell = "/cells/" in name and name.count("/") == 3  # runs/RUN/cells/CELL
        compare_attrs(name, r, g, IGNORED_CELL_ATTRS if cell else set(), out)
        if isinstance(r, h5py.Dataset):
            if IGNORED_DATASETS.match(name):
                continue
            if not isinstance(g, h5py.Dataset) or not values_equal(r[()], g[()]):
                out.append(f"{name}: dataset differs")


def compare_files(ref_path, got_path):
    out = []
    with h5py.File(ref_path, "r") as ref, h5py.File(got_path, "r") as got:
        compare_attrs("/", ref, got, IGNORED_ROOT_ATTRS, out)
        compare_tree(ref, got, "", out)
    return out


def check_killed_file(ref_path, path, kvlab):
    """The file a kill left: opens, `kvlab report` works, complete cells equal the reference.
    Returns (complete cells, incomplete groups, problems)."""
    problems, complete, incomplete = [], 0, 0
    try:
        with h5py.File(ref_path, "r") as ref, h5py.File(path, "r") as f:
            for run in f.get("runs", {}):
                cells = f["runs"][run].get("cells", {})
                for cell in cells:
                    g = cells[cell]
                    if int(g.attrs.get("complete", 0)) != 1:
                        incomplete += 1
                        continue
                    complete += 1
                    name = f"runs/{run}/cells/{cell}"
                    if name not in ref:
                        problems.append(f"{name}: not in the reference")
                        continue
                    compare_attrs(name, ref[name], g, IGNORED_CELL_ATTRS, problems)
                    for ds in set(ref[name]) | set(g):
                        if ds not in g or ds not in ref[name] or not values_equal(ref[name][ds][()], g[ds][()]):
                            problems.append(f"{name}/{ds}: differs from the reference")
    except (OSError, KeyError, ValueError) as e:
        problems.append(f"h5py cannot read it: {e}")
        return complete, incomplete, problems
    r = subprocess.run([kvlab, "report", path], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(f"kvlab report exits {r.returncode}: {r.stderr.strip()[:300]}")
    return complete, incomplete, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50, help="kill points (default 50)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the kill points (default 1)")
    ap.add_argument("--kvlab", default=os.path.join(ROOT, "build/bin/kvlab"))
    ap.add_argument("--quick", action="store_true", help="a smaller sweep (the test suite's)")
    ap.add_argument("--points", choices=["both", "time", "write"], default="both",
                    help="kinds of kill point: alternate both (default), or only one kind")
    ap.add_argument("--work", help="working directory (default: a fresh temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args()
    kvlab = os.path.abspath(args.kvlab)
    if not os.path.exists(os.path.join(ROOT, "data/models/kvlab-tiny.gguf")):
        print("torture: data/models/kvlab-tiny.gguf is missing", file=sys.stderr)
        return 2
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="kvlab_torture_")
    os.makedirs(work, exist_ok=True)
    out_dir = os.path.join(work, "out")  # the results files (the shim's directory)
    os.makedirs(out_dir, exist_ok=True)
    exp = os.path.join(work, "torture.yaml")
    with open(exp, "w") as f:
        f.write(experiment_yaml(args.quick))
    shim = os.path.join(work, "torture_shim.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", shim,
                    os.path.join(ROOT, "scripts/torture_shim.c"), "-ldl"], check=True)
    run_cmd = lambda out: [kvlab, "run", exp, "-o", out, "--threads", "1"]
    log = open(os.path.join(work, "kvlab.log"), "w")
    # A sanitizer build (scripts/sanitize.sh) refuses to start unless its runtime is the first
    # library loaded ("ASan runtime does not come first"): preload it ahead of the shim.
    ldd = subprocess.run(["ldd", kvlab], capture_output=True, text=True).stdout
    preload = re.findall(r"^\s*\S*lib[at]san\.so\S*\s+=>\s+(\S+)", ldd, re.M) + [shim]

    def shim_env(kill_at, count_file=None):
        env = dict(os.environ, LD_PRELOAD=":".join(preload), KVLAB_TORTURE_DIR=out_dir,
                   KVLAB_TORTURE_KILL_AT=str(kill_at))
        if count_file:
            env["KVLAB_TORTURE_COUNT_FILE"] = count_file
        return env

    t_start = time.monotonic()
    # 1. The reference, counting file-changing calls.
    ref = os.path.join(out_dir, "reference.h5")
    count_file = os.path.join(work, "writes.txt")
    t0 = time.monotonic()
    subprocess.run(run_cmd(ref), check=True, stdout=log, stderr=log, env=shim_env(0, count_file))
    t_ref = time.monotonic() - t0
    with open(count_file) as f:
        n_writes = int(f.read())
    with h5py.File(ref, "r") as f:
        n_cells = sum(len(f["runs"][r]["cells"]) for r in f["runs"])
    print(f"torture: reference run {t_ref:.1f} s, {n_cells} cells, {n_writes} file-changing calls; "
          f"{args.kills} kills, seed {args.seed}, work {work}", flush=True)

    rng = random.Random(args.seed)
    identical = landed = finished_first = 0
    failures = []
    for i in range(args.kills):
        path = os.path.join(out_dir, f"kill{i:03d}.h5")
        kind = args.points if args.points != "both" else ("write" if i % 2 else "time")
        if kind == "time":
            # A run faster than the reference (machine load varies) may finish before its
            # timer: draw another delay, so that every point is a kill.
            for attempt in range(10):
                if os.path.exists(path):
                    os.remove(path)
                delay = rng.uniform(0, 0.95 * t_ref)
                point = f"time {delay:.2f}s"
                p = subprocess.Popen(run_cmd(path), stdout=log, stderr=log)
                try:
                    p.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                if p.returncode != 0:
                    break
                finished_first += 1
        else:
            k = rng.randint(1, n_writes)
            point = f"write {k}/{n_writes}"
            p = subprocess.run(run_cmd(path), stdout=log, stderr=log, env=shim_env(k))
        killed = p.returncode == -signal.SIGKILL
        landed += killed
        problems = []
        if not killed and p.returncode != 0:
            problems.append(f"kvlab run exited {p.returncode} instead of being killed")
        state = "no file yet"
        if os.path.exists(path):
            complete, incomplete, problems_after_kill = check_killed_file(ref, path, kvlab)
            problems += problems_after_kill
            state = f"{complete}/{n_cells} cells" + (f" + {incomplete} interrupted" if incomplete else "")
        r = subprocess.run(run_cmd(path) + ["--resume"], stdout=log, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            problems.append(f"--resume exits {r.returncode}: {r.stderr.strip()[-300:]}")
        else:
            problems += compare_files(ref, path)
            if os.path.exists(path + ".partial"):
                problems.append("a .partial copy was left behind after the resume finished")
        verdict = "identical" if not problems else "DIFFERENT: " + "; ".join(problems[:4])
        identical += not problems
        if problems:
            failures.append(i)
        print(f"kill {i + 1:3d}/{args.kills} at {point:<16} {'killed' if killed else 'finished first'}, "
              f"{state}; after --resume: {verdict}", flush=True)
        if not problems and not args.keep:
            os.remove(path)
    total = time.monotonic() - t_start
    print(f"torture: {identical}/{args.kills} identical after resume ({landed} of {args.kills} points "
          f"killed the run; {finished_first} timed runs finished before their timer and were drawn "
          f"again), {total:.0f} s in all", flush=True)
    log.close()
    if not failures and not args.keep and not args.work:
        shutil.rmtree(work)
    elif failures:
        print(f"torture: files and kvlab.log kept in {work}", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
