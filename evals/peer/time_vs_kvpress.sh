#!/bin/bash
# Per-sample time, kvlab against kvpress, on the same prompts, CPU and thread count, interleaved
# A B A B (kvlab run, then the peer runner on that run's stored prompts, REPS times), so that a
# change in the machine's load hits both sides alike. Prints the load average before each step,
# each process's wall/user/sys (GNU time), and the per-sample figures, both sides measured the
# same way over the same span (prefill, question, decoding; after tokenisation and model load):
#   wall: sample_s (kvlab's RULER cell attribute, kvpress's /peer dataset);
#   CPU:  sample_cpu_s, the process CPU seconds of all threads over the sample (kvlab:
#         CLOCK_PROCESS_CPUTIME_ID, evals/ruler_eval.cpp; kvpress: time.process_time()).
# On a loaded machine wall time measures mostly the load; CPU time much less so.
# EXP: a RULER experiment with store_prompts: true.
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
grep -Eq '^ *store_prompts: *true' "$exp" || { echo "time_vs_kvpress.sh: $exp: needs store_prompts: true" >&2; exit 1; }
mkdir -p "$out"
load() { cut -d' ' -f1-3 /proc/loadavg; }
for rep in $(seq 1 "$reps"); do
  echo "rep $rep kvlab: load $(load)"
  /usr/bin/time -f "rep $rep kvlab: %e s wall, %U s user, %S s sys" -a -o "$out/times.txt" \
    "$kvlab" run "$exp" -o "$out/r$rep.h5" --overwrite --threads "$threads" > "$out/kvlab$rep.log" 2>&1
  echo "rep $rep kvpress: load $(load)"
  /usr/bin/time -f "rep $rep kvpress: %e s wall, %U s user, %S s sys" -a -o "$out/times.txt" \
    "$py" "$src/evals/peer/kvpress_runner.py" "$out/r$rep.h5" --kvlab "$kvlab" --threads "$threads" > "$out/kvpress$rep.log" 2>&1
done
echo "end: load $(load)"
cat "$out/times.txt"
/usr/bin/python3 - "$out" "$reps" <<'PY'
import sys
import h5py, numpy as np
out, reps = sys.argv[1], int(sys.argv[2])
rows = []  # (run, cell, rep, sample, kvlab wall, kvlab cpu, kvpress wall, kvpress cpu, same answer)
for rep in range(1, reps + 1):
    with h5py.File(f"{out}/r{rep}.h5", "r") as f:
        for run, g in f["runs"].items():
            for cell, c in g["cells"].items():
                if "peer" not in f or run not in f["peer"] or cell not in f["peer"][run]:
                    continue  # no press paired
                p = f["peer"][run][cell]
                a = [x.decode() for x in c["prediction"][()]]; b = [x.decode() for x in p["prediction"][()]]
                for i in range(len(a)):
                    rows.append((run, cell, rep, i, c.attrs["sample_s"][i], c.attrs["sample_cpu_s"][i],
                                 p["sample_s"][i], p["sample_cpu_s"][i], a[i] == b[i]))
if not rows:
    sys.exit("time_vs_kvpress.sh: no sample has both sides")
print("run cell rep sample: kvlab wall/cpu s, kvpress wall/cpu s, same answer")
for r in rows:
    print(f"  {r[0]} {r[1]} {r[2]} {r[3]}: {r[4]:.2f}/{r[5]:.2f}, {r[6]:.2f}/{r[7]:.2f}, {r[8]}")
v = np.array([r[4:8] for r in rows], dtype=float)
print(f"samples: {len(rows)}; answers equal: {sum(r[8] for r in rows)}/{len(rows)}")
for name, k, p in (("wall", 0, 2), ("CPU", 1, 3)):
    print(f"{name} s/sample: kvlab {v[:, k].mean():.2f} (min {v[:, k].min():.2f}, max {v[:, k].max():.2f}), "
          f"kvpress {v[:, p].mean():.2f} (min {v[:, p].min():.2f}, max {v[:, p].max():.2f}), "
          f"ratio of means {v[:, k].mean() / v[:, p].mean():.2f}, per-sample ratios "
          f"{np.min(v[:, k] / v[:, p]):.2f}-{np.max(v[:, k] / v[:, p]):.2f}")
PY
