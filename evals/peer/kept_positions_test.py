#!/usr/bin/python3
"""kvlab_kept_positions against `kvlab run` and against the sinks rule, on the bundled model.

    kept_positions_test.py KVLAB KVLAB_KEPT_POSITIONS SOURCE_DIR

Runs evals/peer/testdata/kept_tiny.yaml (RULER niah_single_1 at 512 tokens, 2 samples,
query_agnostic; tova at the prompt end with one selection per layer, sinks with original
positions; prompts stored), then the tool on each stored prompt with the run's effective
parameters, and checks:
- the tool's greedy answer is `kvlab run`'s prediction (the same engine and the same feeding:
  the context with the prompt-end signal, then the question, then greedy decoding);
- per (layer, KV head), the number of positions it reports equals the cell's kv_resident_tokens
  (the engine's own count at the prompt end); for tova that is n - floor(r n) for n context
  tokens (sinks keeps what the next query reads besides itself, one fewer here: policies/sinks.cpp);
- every reported position lies in [0, n), ascending;
- sinks: the set is exactly the S first positions and the last (count - S) (StreamingLLM's rule,
  POLICIES.md 9), independent of the engine; tova (gqa: layer): the 3 KV heads of a layer keep
  one set and the last context position is among it (the current token is always kept);
- each cell's sample_cpu_s (process CPU per sample, the peer runner's figure) has one entry per
  sample, each > 0 (a sample prefills ~500 tokens: milliseconds of CPU, far above the clock's
  nanosecond step) and at most the sample's wall sample_s times the thread count (1) plus 0.01 s
  (the two clocks are read microseconds apart; 0.01 s is the slack for that, not a tolerance on
  a measured figure).
Skips (exit 77) without the bundled model or Debian's h5py.
"""
import json
import os
import subprocess
import sys
import tempfile

exe, tool, src = sys.argv[1], sys.argv[2], sys.argv[3]
model = os.path.join(src, "data", "models", "kvlab-tiny.gguf")
if not os.path.exists(model):
    print("SKIP: data/models/kvlab-tiny.gguf is absent")
    sys.exit(77)
try:
    import h5py
except ImportError:
    print("SKIP: no h5py for /usr/bin/python3 (apt install python3-h5py)")
    sys.exit(77)

failures = []
with tempfile.TemporaryDirectory() as tmp:
    h5 = os.path.join(tmp, "kept.h5")
    subprocess.run([exe, "run", os.path.join(src, "evals", "peer", "testdata", "kept_tiny.yaml"), "-o", h5,
                    "--threads", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    checked = 0
    with h5py.File(h5, "r") as f:
        for run, g in f["runs"].items():
            policy = g.attrs["policy_type"]
            policy = policy.decode() if isinstance(policy, bytes) else str(policy)
            params = {k[len("effective."):]: (v.decode() if isinstance(v, bytes) else str(v))
                      for k, v in g.attrs.items() if k.startswith("effective.")}
            args = [f"{k}={v}" for k, v in params.items()]
            for cell, c in g["cells"].items():
                wall, cpu = c.attrs["sample_s"], c.attrs.get("sample_cpu_s")
                threads = 1  # kvlab run --threads 1 below
                if cpu is None or len(cpu) != len(c["score"]) or len(wall) != len(cpu):
                    failures.append(f"{run}/{cell}: sample_cpu_s {cpu}, expected one per sample")
                elif not all(0 < x <= w * threads + 0.01 for x, w in zip(cpu, wall)):
                    failures.append(f"{run}/{cell}: sample_cpu_s {list(cpu)} against sample_s {list(wall)}, "
                                    f"{threads} thread(s)")
                r = float(params["compression_ratio"])
                for i in range(len(c["score"])):
                    plen, q = int(c["prompt_length"][i]), int(c["question_tokens"][i])
                    n = plen - q
                    ids = os.path.join(tmp, "ids.txt")
                    with open(ids, "w") as out:
                        out.write(" ".join(str(int(x)) for x in c["prompt_tokens"][i, :plen]))
                    answer_tokens = int(c.attrs["max_answer_tokens"])
                    p = subprocess.run([tool, model, ids, str(n), policy, *args, "--threads", "1",
                                        "--answer-tokens", str(answer_tokens)],
                                       capture_output=True, text=True)
                    if p.returncode != 0:
                        failures.append(f"{run}/{cell} sample {i}: the tool failed: {p.stderr[-500:]}")
                        continue
                    j = json.loads(p.stdout)
                    where = f"{run}/{cell} sample {i}"
                    pred = c["prediction"][i].decode()
                    if j["answer"] != pred:
                        failures.append(f"{where}: the tool answered {j['answer']!r}, kvlab run {pred!r}")
                    want = n - int(r * n)  # kvlab's kept count (policies/budget.h), r n < 2^53: exact
                    resident = c["kv_resident_tokens"][i]
                    for l, layer in enumerate(j["kept"]):
                        for h, pos in enumerate(layer):
                            if len(pos) != resident[l][h] or (policy == "tova" and len(pos) != want):
                                failures.append(f"{where} layer {l} head {h}: {len(pos)} positions, the cell's "
                                                f"kv_resident_tokens {resident[l][h]}, n - floor(r n) = {want}")
                            if pos != sorted(pos) or (pos and (pos[0] < 0 or pos[-1] >= n)):
                                failures.append(f"{where} layer {l} head {h}: positions not ascending in [0, {n})")
                            if policy == "sinks":
                                s = int(params["sinks"])
                                rule = list(range(s)) + list(range(n - (len(pos) - s), n))
                                if pos != rule:
                                    failures.append(f"{where} layer {l} head {h}: sinks kept {pos[:6]}...{pos[-3:]}, "
                                                    f"the rule {rule[:6]}...{rule[-3:]}")
                        if policy == "tova" and (any(x != layer[0] for x in layer) or n - 1 not in layer[0]):
                            failures.append(f"{where} layer {l}: tova gqa=layer: heads differ or {n - 1} dropped")
                    checked += 1
    if checked != 4:
        failures.append(f"{checked} samples checked, expected 4 (2 runs x 2 samples)")

if failures:
    print("FAILED:\n" + "\n".join(failures[:20]))
    sys.exit(1)
print(f"kept_positions_test: passed ({checked} samples)")
