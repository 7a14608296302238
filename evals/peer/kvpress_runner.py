#!/usr/bin/env python3
"""kvpress on exactly the prompts of a kvlab results file, its answers beside kvlab's.

    $KVLAB_VENV/bin/python evals/peer/kvpress_runner.py RESULTS.h5 [--kvlab build/bin/kvlab]
        [--threads N] [--runs RUN,...] [--model FILE] [--dry-run]

Input: a results file of `kvlab run` with RULER cells written with `evals.ruler.store_prompts:
true` (each cell then holds `prompt_tokens`, the ids kvlab fed; docs/results_schema.md). For
every RULER cell of every run whose policy has a kvpress press (PRESSES below), and every sample:

- the model: transformers' AutoModelForCausalLM loaded from the GGUF file kvlab ran (the root
  attribute model_path; a registered name is resolved with `kvlab models --json`), in float32
  (transformers dequantises the file with the gguf package; SDPA attention, eager for
  ObservedAttentionPress, which needs the attention weights);
- the press: the kvlab run's policy type and effective parameters mapped to kvpress's press
  with the same compression ratio (kvpress's definition: the fraction of the context removed);
- the protocol (kvpress's pipeline, kvpress/pipeline.py `_forward` and `generate_answer`,
  followed step by step on token ids instead of text): query_agnostic prefills the context
  (prompt minus its last question_tokens) with the press active, then the question + answer
  prefix without it, then greedy decoding; query_aware prefills the whole prompt with the press
  active (kvpress's evaluation puts the question into the context) and decodes from its last
  logits. Position ids continue from the uncompressed length, as kvpress does. Decoding stops at
  the model's EOS (generation_config.eos_token_id, as kvpress) or after the cell's
  max_answer_tokens; the answer is decoded with skip_special_tokens, as kvpress;
- the score: RULER's string_match_all (passkey: the first number equals the reference), the
  same rule as kvlab's (evals/ruler_tasks.cpp); the script first re-scores kvlab's own stored
  predictions with it and stops if any differs from kvlab's stored score;
- the wall time per sample: prefill + question + decoding, after tokenisation and model load,
  as kvlab's `sample_s` (same thread count: torch.set_num_threads(--threads, default the
  results file's `threads` root attribute)).

Output: the group /peer/RUN/CELL in the same results file (schema in docs/results_schema.md,
"peer group"): datasets prediction, score, sample_s, sample_cpu_s, answer_tokens, kv_tokens (mean tokens
resident per layer and KV head after the prefill that ended the compression) and attributes
press, compression_ratio, query_aware, score (mean), versions, threads. `kvlab report` prints
them beside kvlab's. A group written before is replaced.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import h5py
import numpy as np


def text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ---- scoring (evals/ruler_tasks.cpp ruler_score) --------------------------------------------
def score_prediction(task: str, prediction: str, references: list[str]) -> float:
    if task == "passkey":  # the first run of digits equals the (single) reference
        m = re.search(r"[0-9]+", prediction)
        return 1.0 if references and m and m.group(0) == references[0] else 0.0
    if not references:
        return 0.0
    p = prediction.lower()
    return sum(r.lower() in p for r in references) / len(references)


# ---- kvlab policy -> kvpress press -----------------------------------------------------------
def make_press(kvpress, policy: str, params: dict[str, str], sample_seed: int):
    """The kvpress press paired with a kvlab policy, or None for full; (press, label, eager)."""
    def f(k, default=None):
        if k not in params:
            if default is None:
                raise KeyError(k)
            return default
        return float(params[k])
    if policy == "full":
        return None, "no_press", False
    if f("budget_tokens", 0) > 0:
        raise ValueError("kvpress takes a compression ratio; this run sets budget_tokens")
    r = f("compression_ratio", 0)
    if policy == "sinks":
        n_sink = int(f("sinks"))
        return kvpress.StreamingLLMPress(compression_ratio=r, n_sink=n_sink), f"StreamingLLMPress(n_sink={n_sink})", False
    if policy == "h2o":
        return kvpress.ObservedAttentionPress(compression_ratio=r), "ObservedAttentionPress", True
    if policy in ("snapkv", "pyramidkv") or (policy == "adakv" and params.get("scorer") == "snapkv"):
        if params.get("pooling", "avg") != "avg":
            raise ValueError("kvpress's SnapKV pools with avg_pool1d; this run pools with " + params["pooling"])
        w, k = int(f("window")), int(f("kernel_size"))
        if policy == "pyramidkv":
            beta = f("beta")
            return (kvpress.PyramidKVPress(compression_ratio=r, window_size=w, kernel_size=k, beta=int(beta)),
                    f"PyramidKVPress(window_size={w}, kernel_size={k}, beta={int(beta)})", False)
        snap = kvpress.SnapKVPress(compression_ratio=r, window_size=w, kernel_size=k)
        if policy == "snapkv":
            return snap, f"SnapKVPress(window_size={w}, kernel_size={k})", False
        a = f("alpha")
        return (kvpress.AdaKVPress(press=snap, alpha_safeguard=a),
                f"AdaKVPress(SnapKVPress(window_size={w}, kernel_size={k}), alpha_safeguard={a:g})", False)
    if policy == "tova":
        return kvpress.TOVAPress(compression_ratio=r), "TOVAPress", False
    if policy == "knorm":
        return kvpress.KnormPress(compression_ratio=r), "KnormPress", False
    if policy == "random":
        seed = sample_seed & 0x7FFFFFFF
        return kvpress.RandomPress(compression_ratio=r, seed=seed), "RandomPress(seed=sample_seed)", False
    raise ValueError(f"kvlab policy '{policy}' has no kvpress press paired here")


# ---- one sample, kvpress's pipeline on token ids ---------------------------------------------
def run_sample(torch, model, press, prompt: list[int], question_tokens: int, query_aware: bool,
               max_new: int, eos: set[int]):
    """kvpress/pipeline.py _forward + generate_answer on ids; returns (answer ids, kv tokens)."""
    from transformers import DynamicCache  # noqa: PLC0415
    import contextlib  # noqa: PLC0415
    cache = DynamicCache()
    ids = torch.tensor([prompt], dtype=torch.long)
    split = len(prompt) if query_aware else len(prompt) - question_tokens
    ctx = press(model) if press is not None else contextlib.nullcontext()
    with torch.no_grad():
        with ctx:
            if query_aware:  # the whole prompt is the compressed context; its last logits start the answer
                out = model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
            else:  # kvpress prefills the context without the LM head
                model.model(input_ids=ids[:, :split], past_key_values=cache)
        kv_tokens = float(np.mean([cache.get_seq_length(i) for i in range(len(cache))]))
        pos = torch.arange(split, len(prompt)).unsqueeze(0)
        if not query_aware:
            out = model(input_ids=ids[:, split:], past_key_values=cache, position_ids=pos, logits_to_keep=1)
        nxt = int(out.logits[0, -1].argmax())
        answer = [nxt]
        p = len(prompt)
        # kvpress's loop: max_new tokens at most, the EOS test from the second token on.
        while len(answer) < max_new and (len(answer) == 1 or nxt not in eos):
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, position_ids=torch.tensor([[p]]))
            p += 1
            nxt = int(out.logits[0, -1].argmax())
            answer.append(nxt)
    return answer, kv_tokens


def resolve_model(kvlab: str, model_path: str, results: str) -> str:
    if os.path.isfile(model_path):
        return model_path
    if os.path.isfile(os.path.join(os.path.dirname(results), model_path)):
        return os.path.join(os.path.dirname(results), model_path)
    out = subprocess.run([kvlab, "models", "--json"], capture_output=True, text=True, check=True).stdout
    found = [m for m in json.loads(out) if m["name"] == model_path]
    if not found or not found[0]["present"]:
        sys.exit(f"kvpress_runner.py: {results}: model_path '{model_path}' is neither a file nor a registered "
                 "model (kvlab models); give --model FILE")
    return found[0]["file"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--kvlab", default=os.path.join(os.path.dirname(__file__), "../../build/bin/kvlab"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: the file's threads attribute)")
    ap.add_argument("--runs", default="", help="comma-separated run names (default: every run with a press)")
    ap.add_argument("--model", default="", help="the GGUF file (default: the file's model_path)")
    ap.add_argument("--dry-run", action="store_true", help="check the file and list the work; run nothing")
    a = ap.parse_args()

    work = []  # (run, cell, policy, params)
    with h5py.File(a.results, "r") as f:
        root = f.attrs
        model_path = a.model or text(root["model_path"])
        threads = a.threads or int(root.get("threads", 1)) or 1
        wanted = set(filter(None, a.runs.split(",")))
        if "runs" not in f:
            sys.exit(f"kvpress_runner.py: {a.results}: no /runs group (not a kvlab results file?)")
        order = [r for r in a.runs.split(",") if r] or list(f["runs"].keys())
        for run in order:
            if run not in f["runs"]:
                continue
            g = f["runs"][run]
            policy = text(g.attrs.get("policy_type", g.attrs.get("type", "")))
            params = {k[len("effective."):]: text(v) for k, v in g.attrs.items() if k.startswith("effective.")}
            for cell, c in g.get("cells", {}).items():
                if text(c.attrs.get("kind", "")) != "ruler" or int(c.attrs.get("complete", 0)) != 1:
                    continue
                if "prompt_tokens" not in c:
                    sys.exit(f"kvpress_runner.py: {a.results}: /runs/{run}/cells/{cell} has no prompt_tokens "
                             "(run kvlab with evals.ruler.store_prompts: true)")
                work.append((run, cell, policy, params))
        if wanted - set(f["runs"].keys()):
            sys.exit(f"kvpress_runner.py: {a.results}: no run named {sorted(wanted - set(f['runs'].keys()))}")
    if not work:
        sys.exit(f"kvpress_runner.py: {a.results}: no complete RULER cells")

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch  # noqa: PLC0415
    import kvpress  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415
    torch.set_num_threads(threads)
    # Map every run before loading the model: an unpaired policy is reported, not run.
    todo = []
    for run, cell, policy, params in work:
        try:
            make_press(kvpress, policy, params, 0)
            todo.append((run, cell, policy, params))
        except (ValueError, KeyError) as e:
            print(f"skip {run}/{cell}: {e}")
    if a.dry_run:
        for run, cell, policy, params in todo:
            print(f"would run {run}/{cell} ({policy})")
        return 0

    gguf = resolve_model(a.kvlab, model_path, a.results)
    d, name = os.path.split(os.path.abspath(gguf))
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    import importlib.metadata as md  # noqa: PLC0415
    versions = f"kvpress {md.version('kvpress')}, transformers {transformers.__version__}, torch {torch.__version__}"
    print(f"loaded {gguf} in {time.time() - t0:.1f} s ({versions}, {threads} threads)")

    for run, cell, policy, params in todo:
        with h5py.File(a.results, "r") as f:
            c = f["runs"][run]["cells"][cell]
            task = text(c.attrs["task"])
            protocol = text(c.attrs["protocol"])
            max_new = int(c.attrs["max_answer_tokens"])
            prompts = c["prompt_tokens"][()]
            plen = c["prompt_length"][()]
            qtok = c["question_tokens"][()]
            seeds = c["sample_seed"][()]
            refs = [text(x).split("\n") for x in c["references"][()]]
            kv_pred = [text(x) for x in c["prediction"][()]]
            kv_score = c["score"][()]
        for i, (p, r) in enumerate(zip(kv_pred, refs)):
            s = score_prediction(task, p, r)
            if s != kv_score[i]:
                sys.exit(f"kvpress_runner.py: {run}/{cell} sample {i}: this script scores kvlab's prediction "
                         f"{p!r} {s}, kvlab stored {kv_score[i]}: the two scorers differ")
        preds, scores, secs, cpus, ntok, kvt, status = [], [], [], [], [], [], []
        label = ""
        for i in range(len(plen)):
            press, label, eager = make_press(kvpress, policy, params, int(seeds[i]))
            model.set_attn_implementation("eager" if eager else "sdpa")
            prompt = [int(x) for x in prompts[i, :plen[i]]]
            t, c0 = time.perf_counter(), time.process_time()
            try:
                answer, kv_tokens = run_sample(torch, model, press, prompt, int(qtok[i]), protocol == "query_aware",
                                               max_new, eos)
                status.append("ok")
            except RuntimeError as e:  # kvpress or transformers failing on this press: recorded, not hidden
                answer, kv_tokens = [], float("nan")
                status.append(f"{type(e).__name__}: {e}")
                print(f"{run}/{cell} sample {i}: {status[-1]}")
            secs.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c0)
            pred = tok.decode(answer, skip_special_tokens=True)
            preds.append(pred)
            scores.append(score_prediction(task, pred, refs[i]) if status[-1] == "ok" else float("nan"))
            ntok.append(len(answer))
            kvt.append(kv_tokens)
        ratio = float(params.get("compression_ratio", 0)) if policy != "full" else 0.0
        with h5py.File(a.results, "a") as f:
            peer = f.require_group("peer")
            g = peer.require_group(run)
            if cell in g:
                del g[cell]
            out = g.create_group(cell)
            out.create_dataset("prediction", data=np.array(preds, dtype=object), dtype=h5py.string_dtype("utf-8"))
            out.create_dataset("score", data=np.array(scores, dtype=np.float64))
            out.create_dataset("sample_s", data=np.array(secs, dtype=np.float64))
            out.create_dataset("sample_cpu_s", data=np.array(cpus, dtype=np.float64))
            out.create_dataset("answer_tokens", data=np.array(ntok, dtype=np.int64))
            out.create_dataset("kv_tokens", data=np.array(kvt, dtype=np.float64))
            out.create_dataset("status", data=np.array(status, dtype=object), dtype=h5py.string_dtype("utf-8"))
            out.attrs["press"] = label
            out.attrs["compression_ratio"] = ratio
            out.attrs["query_aware"] = np.int64(protocol == "query_aware")
            out.attrs["score"] = float(np.mean(scores))
            out.attrs["threads"] = np.int64(threads)
            out.attrs["versions"] = versions
            out.attrs["model_file"] = gguf
            out.attrs["complete"] = np.int64(1)
        same = sum(p == q for p, q in zip(preds, kv_pred))
        print(f"{run}/{cell}: {label} score {np.mean(scores):.3f} (kvlab {np.mean(kv_score):.3f}), "
              f"{np.mean(secs):.2f} s/sample, {same}/{len(preds)} answers equal to kvlab's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
