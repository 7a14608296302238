#!/usr/bin/python3
"""The peer runner (kvpress_runner.py) on a tiny input: the bundled model, 4 runs x 2 protocols.

    kvpress_runner_test.py KVLAB SOURCE_DIR

Skips (exit 77) with a message without the peer venv ($KVLAB_VENV, default SOURCE_DIR/.venv, with
kvpress, transformers, torch and h5py: scripts/setup_peer.sh) or without the bundled model.
Otherwise runs evals/peer/testdata/peer_tiny.yaml with kvlab, then the runner, and checks:
- a results file without prompt_tokens is refused with a message naming the cell, exit != 0;
- /peer/RUN/CELL exists for every RULER cell, with one prediction, score and time per sample;
- without a press (`full`) kvpress's answers equal kvlab's, token for token decoded: the same
  ids through the same F32 weights, greedy. kvlab's f32 and torch's f32 sum in different orders,
  so logits differ by ~1e-6 relative; a flipped argmax needs two logits that close, which these
  8-token answers do not have (the margin is printed on failure by comparing the strings);
- the presses keep what kvpress's definition says: int(n (1 - r)) context tokens per layer
  (kvpress utils.compute_n_kept), n the compressed prefill's length (the context under
  query_agnostic, the prompt under query_aware);
- a press's score is the runner's re-score of its prediction (string_match_all);
- `kvlab report` prints the side-by-side table with a row per peer group.
"""
import os
import subprocess
import sys
import tempfile

exe, src = sys.argv[1], sys.argv[2]
venv = os.environ.get("KVLAB_VENV", os.path.join(src, ".venv"))
py = os.path.join(venv, "bin", "python")
here = os.path.join(src, "evals", "peer")
if not os.path.exists(os.path.join(src, "data", "models", "kvlab-tiny.gguf")):
    print("SKIP: data/models/kvlab-tiny.gguf is absent")
    sys.exit(77)
if not os.access(py, os.X_OK) or subprocess.run([py, "-c", "import kvpress, transformers, torch, h5py"],
                                                capture_output=True).returncode != 0:
    print(f"SKIP: no peer venv at {venv} with kvpress, transformers, torch, h5py (scripts/setup_peer.sh; "
          "KVLAB_VENV points elsewhere)")
    sys.exit(77)

failures = []
with tempfile.TemporaryDirectory() as tmp:
    h5 = os.path.join(tmp, "peer.h5")
    subprocess.run([exe, "run", os.path.join(here, "testdata", "peer_tiny.yaml"), "-o", h5], check=True,
                   stdout=subprocess.DEVNULL)
    runner = [py, os.path.join(here, "kvpress_runner.py"), "--kvlab", exe, "--threads", "1"]

    # Bad input: a RULER run without store_prompts.
    bare = os.path.join(tmp, "bare.yaml")
    with open(bare, "w") as f:
        f.write(f"name: bare\nmodel: {{path: {os.path.join(src, 'data', 'models', 'kvlab-tiny.gguf')}, threads: 1}}\n"
                "engine: {probe: false}\npolicies:\n  - {name: full, type: full}\nseeds: [0]\n"
                "evals:\n  ruler: {tasks: [niah_single_1], context_lengths: [512], samples: 1, max_answer_tokens: 4}\n")
    bare_h5 = os.path.join(tmp, "bare.h5")
    subprocess.run([exe, "run", bare, "-o", bare_h5], check=True, stdout=subprocess.DEVNULL)
    p = subprocess.run(runner + [bare_h5], capture_output=True, text=True)
    if p.returncode == 0 or "has no prompt_tokens" not in p.stderr or "/runs/full/cells/ruler_" not in p.stderr:
        failures.append(f"a file without prompt_tokens: rc {p.returncode}, stderr {p.stderr[-500:]!r}")

    p = subprocess.run(runner + [h5], capture_output=True, text=True, timeout=1200)
    print(p.stdout)
    if p.returncode != 0:
        print("FAILED: kvpress_runner.py\n", p.stderr[-3000:])
        sys.exit(1)

    import h5py  # noqa: E402 (Debian's, for reading only)

    with h5py.File(h5, "r") as f:
        groups = 0
        for run, g in f["runs"].items():
            for cell, c in g["cells"].items():
                if "peer" not in f or run not in f["peer"] or cell not in f["peer"][run]:
                    failures.append(f"/peer/{run}/{cell} missing")
                    continue
                groups += 1
                pc = f["peer"][run][cell]
                n = len(c["score"])
                for d in ("prediction", "score", "sample_s", "sample_cpu_s", "answer_tokens", "kv_tokens"):
                    if pc[d].shape != (n,):
                        failures.append(f"/peer/{run}/{cell}/{d}: shape {pc[d].shape}, expected ({n},)")
                # A sample runs at least one forward pass: some CPU time, finite.
                if not all(0 < x < 1e6 for x in pc["sample_cpu_s"][()]):
                    failures.append(f"/peer/{run}/{cell}/sample_cpu_s: {pc['sample_cpu_s'][()]}")
                mine = [x.decode() for x in c["prediction"][()]]
                theirs = [x.decode() for x in pc["prediction"][()]]
                qa = c.attrs["protocol"] in (b"query_aware", "query_aware")
                for i in range(n):
                    ref = c["references"][i].decode().split("\n")
                    s = sum(r.lower() in theirs[i].lower() for r in ref) / len(ref)
                    if s != pc["score"][i]:
                        failures.append(f"/peer/{run}/{cell} sample {i}: score {pc['score'][i]}, re-scored {s}")
                    plen, q = int(c["prompt_length"][i]), int(c["question_tokens"][i])
                    ctx = plen if qa else plen - q
                    ratio = 0.0 if run == "full" else float(g.attrs["effective.compression_ratio"])
                    want = ctx if run == "full" else max(1, int(ctx * (1 - ratio)))
                    if pc["kv_tokens"][i] != want:
                        failures.append(f"/peer/{run}/{cell} sample {i}: kv_tokens {pc['kv_tokens'][i]}, "
                                        f"kvpress keeps int({ctx} x (1 - {ratio})) = {want}")
                if run == "full" and mine != theirs:
                    failures.append(f"full/{cell}: kvpress answered {theirs}, kvlab {mine}")
    if groups != 8:
        failures.append(f"{groups} peer groups, expected 8 (4 runs x 2 protocols)")
    rep = subprocess.run([exe, "report", h5], capture_output=True, text=True, check=True).stdout
    table = rep[rep.find("kvlab and the peer"):]
    rows = [line for line in table.splitlines() if "ruler_query_" in line]
    if "kvlab and the peer" not in rep or len(rows) != 8:
        failures.append(f"kvlab report: the peer table has {len(rows)} rows, expected 8")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("kvpress_runner_test: passed")
