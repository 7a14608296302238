#!/usr/bin/python3
"""NIAH and perplexity through `kvlab run` on a random multi-head latent attention (deepseek2) GGUF
(scripts/fixtures/make_mla_fixtures.py's writer; the fixtures' synthetic 1173-piece vocabulary,
so the bundled heldout text tokenises), with full attention and two policies acting on the
latent slots (one KV head); and `kvlab model-info --json` on the same file.

    mla_run_test.py KVLAB_EXE SOURCE_DIR

Checks: the run exits 0; every cell has its accuracy / ppl attributes, finite; full attention's
probe recall is 1 (the probe's dense reference reads the same latent slots); the results'
kv_bytes_per_token is (kv_lora_rank + qk_rope_head_dim) x layers x 4 (f32) and 2 (f16), and the
model_config records the equivalent per-head cache; a budgeted policy holds fewer KV bytes than
full attention; model-info reports the same bytes and the MHA comparison. A random model finds
no needle: NIAH scores are only checked to be in [0, 1].
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py

exe, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "scripts", "fixtures"))
import make_mla_fixtures as mla  # noqa: E402

cfg = {**mla.DEFAULTS, **dict(name="deepseek2_run", dim=64, n_heads=4, q_lora_rank=16, kv_lora_rank=32,
                              qk_nope=16, qk_rope=8, v_head=16, hidden=128, vocab=1173, n_layers=2)}
row = (cfg["kv_lora_rank"] + cfg["qk_rope"]) * cfg["n_layers"]
mha = cfg["n_layers"] * cfg["n_heads"] * (cfg["qk_nope"] + cfg["qk_rope"] + cfg["v_head"])
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    gguf = os.path.join(tmp, "deepseek2.gguf")
    mla.write_gguf(gguf, cfg, mla.make_weights(cfg, seed=79))
    heldout = os.path.join(src, "data", "eval", "heldout.txt")
    out = os.path.join(tmp, "mla.h5")
    yaml = os.path.join(tmp, "mla.yaml")
    with open(yaml, "w") as f:
        f.write(f"""name: mla_random
model: {{path: {gguf}, threads: 1}}
kv: {{format: [f32, f16]}}
policies:
  - {{name: full, type: full}}
  - {{name: h2o, type: h2o, params: {{budget_tokens: 64}}}}
  - {{name: window, type: sliding_window, params: {{window: 64}}}}
seeds: [0]
output: {out}
evals:
  niah:
    haystack: {heldout}
    context_lengths: [200]
    depths: [0, 100]
    trials: 1
    max_answer_tokens: 4
  perplexity:
    text: {heldout}
    tokens: 256
    protocol: streaming
""")
    p = subprocess.run([exe, "run", yaml], capture_output=True, text=True, timeout=1200)
    check(p.returncode == 0, f"kvlab run exits 0 ({p.stderr.strip()[-400:]})")
    if p.returncode == 0:
        with h5py.File(out, "r") as h:
            cfg_json = json.loads(h.attrs["model_config"])
            check(cfg_json.get("kv_lora_rank") == cfg["kv_lora_rank"], "model_config records kv_lora_rank")
            check(cfg_json.get("kv_bytes_per_token_f32") == row * 4 and cfg_json.get("mha_kv_bytes_per_token_f32") == mha * 4,
                  f"model_config: latent {row * 4} vs MHA {mha * 4} bytes per token (f32)")
            peak = {}
            for run_name, run in h["runs"].items():
                fmt = run.attrs["kv_format"]
                fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
                want = row * {"f32": 4, "f16": 2}[fmt]
                check(int(run.attrs["kv_bytes_per_token"]) == want, f"{run_name}: kv_bytes_per_token {want}")
                for cell_name, cell in run["cells"].items():
                    a = cell.attrs
                    kind = a["kind"].decode() if isinstance(a["kind"], bytes) else a["kind"]
                    if kind == "perplexity":
                        check(math.isfinite(float(a["ppl"])) and float(a["ppl"]) > 1,
                              f"{run_name}/{cell_name}: ppl {float(a['ppl']):.3f} finite, > 1")
                    else:
                        check(kind == "niah" and 0 <= float(a["accuracy"]) <= 1,
                              f"{run_name}/{cell_name}: NIAH accuracy in [0, 1]")
                    if run_name.startswith("full"):  # the probe's dense reference on the latent slots
                        check(float(a["recall_mean"]) > 1 - 1e-9, f"{run_name}/{cell_name}: full attention's recall 1")
                    if "kv_bytes_peak" in a:
                        peak.setdefault(run_name, []).append(int(a["kv_bytes_peak"]))
            full = [v for k, v in peak.items() if k.startswith("full") and "f32" in k]
            h2o = [v for k, v in peak.items() if k.startswith("h2o") and "f32" in k]
            check(bool(full) and bool(h2o) and max(h2o[0]) < max(full[0]), f"h2o holds fewer KV bytes than full ({peak})")
    info = subprocess.run([exe, "model-info", gguf, "--json"], capture_output=True, text=True)
    check(info.returncode == 0, "model-info exits 0")
    if info.returncode == 0:
        j = json.loads(info.stdout)
        check(j["kv_bytes_per_token"]["f32"] == row * 4 and j["mha_kv_bytes_per_token"]["f32"] == mha * 4,
              "model-info: latent and MHA-equivalent bytes per token")
        check(j["n_kv_heads"] == 1 and j["head_dim"] == cfg["kv_lora_rank"] + cfg["qk_rope"], "model-info: one latent KV head")
if failures:
    sys.exit(f"mla_run_test: {len(failures)} check(s) failed")
print("mla_run_test: all checks passed")
