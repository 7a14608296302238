#!/bin/bash
# Per-sample time, kvlab against kvpress, on the same prompts, CPU and thread count, interleaved
# A B A B (kvlab run, then the peer runner on that run's stored prompts, REPS times), so that a
# change in the machine's load hits both sides alike. Prints the load average before each step,
# each process's wall/user/sys (GNU time), and the per-sample figures:
#   wall: kvlab's sample_s and kvpress's sample_s (per sample, from the results file);
#   CPU:  kvpress's sample_cpu_s (process CPU over each sample); kvlab records no CPU time per
#         sample, so each rep also runs a copy of EXP with `samples: 1`, and kvlab's CPU per
#         sample is the difference of the two runs' process CPU (user + sys) over the
#         difference in samples (the fixed part -- model load, haystack tokenisation -- cancels).
# On a loaded machine wall time measures mostly the load; CPU time much less so.
# EXP: a RULER experiment with store_prompts: true and a `samples: S` line, S >= 2.
#   evals/peer/time_vs_kvpress.sh EXP.yaml [REPS] [THREADS] [OUTDIR]
# Needs KVLAB_VENV (scripts/setup_peer.sh) and the model EXP names (KVLAB_MODELS_DIR).
set -euo pipefail
exp=${1:?usage: time_vs_kvpress.sh EXP.yaml [REPS] [THREADS] [OUTDIR]}
reps=${2:-2}
threads=${3:-1}
out=${4:-$(mktemp -d)}
src=$(cd "$(dirname "$0")/../.." && pwd)
kvlab=${KVLAB:-$src/build/bin/kvlab}
py=${KVLAB_VENV:-$src/.venv}/bin/python
[ -x "$py" ] || { echo "time_vs_kvpress.sh: no peer venv at ${KVLAB_VENV:-$src/.venv} (scripts/setup_peer.sh)" >&2; exit 1; }
grep -Eq '^ *samples: *[0-9]+ *$' "$exp" || { echo "time_vs_kvpress.sh: $exp: needs a 'samples: S' line" >&2; exit 1; }
mkdir -p "$out"
# beside EXP: its relative paths (haystack, model) are relative to its folder
one="$(dirname "$exp")/.time_vs_kvpress_samples1.$$.yaml"
trap 'rm -f "$one"' EXIT
sed -E 's/^( *samples:) *[0-9]+ *$/\1 1/' "$exp" > "$one"
load() { cut -d' ' -f1-3 /proc/loadavg; }
for rep in $(seq 1 "$reps"); do
  echo "rep $rep kvlab: load $(load)"
  /usr/bin/time -f "rep $rep kvlab: %e s wall, %U s user, %S s sys" -a -o "$out/times.txt" \
    "$kvlab" run "$exp" -o "$out/r$rep.h5" --overwrite --threads "$threads" > "$out/kvlab$rep.log" 2>&1
  echo "rep $rep kvpress: load $(load)"
  /usr/bin/time -f "rep $rep kvpress: %e s wall, %U s user, %S s sys" -a -o "$out/times.txt" \
    "$py" "$src/evals/peer/kvpress_runner.py" "$out/r$rep.h5" --kvlab "$kvlab" --threads "$threads" > "$out/kvpress$rep.log" 2>&1
  echo "rep $rep kvlab samples 1: load $(load)"
  /usr/bin/time -f "rep $rep kvlab1: %e s wall, %U s user, %S s sys" -a -o "$out/times.txt" \
    "$kvlab" run "$one" -o "$out/s1_$rep.h5" --overwrite --threads "$threads" > "$out/kvlab1_$rep.log" 2>&1
done
echo "end: load $(load)"
cat "$out/times.txt"
/usr/bin/python3 - "$out" "$reps" <<'PY'
import re, sys
import h5py, numpy as np
out, reps = sys.argv[1], int(sys.argv[2])
def cpu(tag):
    v = []
    for line in open(f"{out}/times.txt"):
        m = re.match(rf"rep \d+ {tag}: [\d.]+ s wall, ([\d.]+) s user, ([\d.]+) s sys", line)
        if m: v.append(float(m.group(1)) + float(m.group(2)))
    return np.array(v)
kw, pw, pc, n_full, n_one, same, total = [], [], [], 0, 0, 0, 0
for rep in range(1, reps + 1):
    with h5py.File(f"{out}/r{rep}.h5", "r") as f:
        for run, g in f["runs"].items():
            for cell, c in g["cells"].items():
                p = f["peer"][run][cell]
                kw += list(c["sample_s"][()] if "sample_s" in c else np.atleast_1d(c.attrs["sample_s"])); pw += list(p["sample_s"][()]); pc += list(p["sample_cpu_s"][()])
                a = [x.decode() for x in c["prediction"][()]]; b = [x.decode() for x in p["prediction"][()]]
                same += sum(x == y for x, y in zip(a, b)); total += len(a)
                n_full += len(a)
    with h5py.File(f"{out}/s1_{rep}.h5", "r") as f:
        n_one += sum(len(c["score"]) for g in f["runs"].values() for c in g["cells"].values())
n_full //= reps; n_one //= reps
k_all, k_one = cpu("kvlab"), cpu("kvlab1")
k_cpu = (k_all.mean() - k_one.mean()) / (n_full - n_one)
print(f"samples per kvlab run: {n_full} (and {n_one} in the samples-1 copy); answers equal: {same}/{total}")
print(f"wall s/sample:  kvlab {np.mean(kw):.2f} (min {np.min(kw):.2f}, max {np.max(kw):.2f}), "
      f"kvpress {np.mean(pw):.2f} (min {np.min(pw):.2f}, max {np.max(pw):.2f}), ratio {np.mean(kw) / np.mean(pw):.2f}")
print(f"CPU s/sample:   kvlab {k_cpu:.2f} (process CPU {k_all.round(2).tolist()} with {n_full}, "
      f"{k_one.round(2).tolist()} with {n_one} samples), kvpress {np.mean(pc):.2f} "
      f"(min {np.min(pc):.2f}, max {np.max(pc):.2f}), ratio {k_cpu / np.mean(pc):.2f}")
PY
