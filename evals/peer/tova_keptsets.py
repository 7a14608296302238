#!/usr/bin/env python3
"""kvlab's and kvpress's TOVA kept sets on one sample, beside a float64 reference of the score.

    $KVLAB_VENV/bin/python evals/peer/tova_keptsets.py --ids IDS.txt --head N --ratio R
        --kvlab-json KEPT.json [--kvlab-json KEPT2.json ...] --model FILE.gguf [--threads T]
        [--answer-tokens 12]

IDS.txt: the sample's token ids (a RULER cell's prompt_tokens); the first N are the context
(query_agnostic), the rest the question. KEPT.json: build/bin/kvlab_kept_positions's output for
the same ids and `tova compression_ratio=R compress=prompt_end gqa=layer` (kvlab's kept positions
per layer and KV head after the prompt-end prefill, and its greedy answer).

What it does, on transformers' LlamaForCausalLM loaded from the GGUF file:
1. kvpress's TOVAPress(R) (float32, SDPA, kvpress/pipeline.py's query_agnostic order on ids, as
   evals/peer/kvpress_runner.py): records the kept indices per layer (kvpress's own score and
   top-k, unchanged) and the greedy answer;
2. a float64 reference of TOVA's score (POLICIES.md 14; kvpress tova_press.py; arXiv 2401.06104):
   the model in float64, per layer the last context token's query (q_proj, RoPE at its
   position) against every post-RoPE key of the layer, softmax over all N keys, the mean over
   the layer's query heads of the probabilities of keys 0..N-2, the last key always kept;
   keep = the n_kept best (n_kept = int(N (1 - R)), equal to kvlab's N - floor(R N) when R N is
   an integer);
3. per layer: the positions kvlab keeps and kvpress drops and the reverse, with their float64
   scores and the float64 score at the budget boundary (the n_kept-th best), i.e. whether the
   difference is a near-tie or a different definition;
4. kvpress's pipeline with kvlab's kept set imposed (every layer keeps exactly kvlab's positions):
   if its answer becomes kvlab's, the kept sets alone explain the answers' difference.
Prints a JSON summary.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ids", required=True)
    ap.add_argument("--head", type=int, required=True, help="context tokens (the rest is the question)")
    ap.add_argument("--ratio", type=float, required=True)
    ap.add_argument("--kvlab-json", action="append", default=[], help="kvlab_kept_positions output (repeatable)")
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--answer-tokens", type=int, default=12)
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch  # noqa: PLC0415
    import kvpress  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from kvpress.presses.scorer_press import ScorerPress  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: PLC0415
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(a.threads)

    ids = [int(x) for x in open(a.ids).read().split()]
    n = a.head
    if not 1 < n <= len(ids):
        sys.exit(f"tova_keptsets.py: --head {n} outside 2..{len(ids)}")
    n_kept = max(1, int(n * (1 - a.ratio)))  # kvpress utils.compute_n_kept
    kvlab_runs = []
    for path in a.kvlab_json:
        with open(path) as f:
            j = json.load(f)
        if j["head"] != n:
            sys.exit(f"tova_keptsets.py: {path}: head {j['head']}, expected {n}")
        kvlab_runs.append((path, j))

    d, name = os.path.split(os.path.abspath(a.model))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    model.set_attn_implementation("sdpa")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    n_layers = model.config.num_hidden_layers

    def pipeline(press):
        """kvpress's query_agnostic order on ids (kvpress_runner.run_sample): the answer's ids."""
        cache = DynamicCache()
        t = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            with press(model):
                model.model(input_ids=t[:, :n], past_key_values=cache)
            out = model(input_ids=t[:, n:], past_key_values=cache, position_ids=torch.arange(n, len(ids)).unsqueeze(0),
                        logits_to_keep=1)
            nxt = int(out.logits[0, -1].argmax())
            answer, p = [nxt], len(ids)
            while len(answer) < a.answer_tokens and (len(answer) == 1 or nxt not in eos):
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, position_ids=torch.tensor([[p]]))
                p += 1
                nxt = int(out.logits[0, -1].argmax())
                answer.append(nxt)
        return answer

    # 1. kvpress's TOVAPress as shipped; the subclass only records what its compress keeps.
    kvpress_kept: dict[int, list[int]] = {}

    class RecordingTova(kvpress.TOVAPress):
        def compress(self, module, hidden_states, keys, values, attentions, kwargs):
            scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
            idx = scores.topk(n_kept, dim=-1).indices  # ScorerPress.compress's selection
            sets = {tuple(sorted(idx[0, h].tolist())) for h in range(idx.shape[1])}
            assert len(sets) == 1, "TOVAPress repeats one selection over the KV heads"
            kvpress_kept[module.layer_idx] = sorted(sets.pop())
            return super().compress(module, hidden_states, keys, values, attentions, kwargs)

    kvpress_answer = pipeline(RecordingTova(compression_ratio=a.ratio))

    # 2. The float64 reference of the score (our own formula, kvpress's hook only hands us the layer's
    # input and its cache): one selection per layer.
    ref_scores: dict[int, np.ndarray] = {}

    class ReferenceTova(ScorerPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            cfg = module.config
            hq, hk, dh = cfg.num_attention_heads, cfg.num_key_value_heads, module.head_dim
            q = module.q_proj(hidden_states[:, -1:]).view(1, 1, hq, dh).transpose(1, 2)  # [1, hq, 1, dh]
            cos, sin = kwargs["position_embeddings"]
            q, _ = apply_rotary_pos_emb(q, q, cos[:, -1:], sin[:, -1:])
            k = keys.repeat_interleave(hq // hk, dim=1)  # [1, hq, N, dh], query head i reads KV head i // G
            logits = (q @ k.transpose(2, 3))[0, :, 0, :] / math.sqrt(dh)  # [hq, N]
            p = torch.softmax(logits, dim=-1)
            s = p[:, :-1].mean(0)  # mean over the layer's query heads, keys 0..N-2
            ref_scores[module.layer_idx] = s.numpy().astype(np.float64)
            full = torch.cat([s, torch.tensor([2.0], dtype=s.dtype)])  # the last key kept (p <= 1 < 2)
            return full.view(1, 1, -1).expand(1, hk, -1)

    model.double()
    pipeline(ReferenceTova(compression_ratio=a.ratio))
    model.float()

    # 3. Per layer, the differences.
    layers = []
    for l in range(n_layers):
        s = ref_scores[l]
        order = np.argsort(-s, kind="stable")
        ref_keep = set(order[: n_kept - 1].tolist()) | {n - 1}
        boundary = float(s[order[n_kept - 2]])  # the worst kept score (n_kept - 1 scored slots + the last)
        first_out = float(s[order[n_kept - 1]])
        row = {"layer": l, "ref_boundary_kept": boundary, "ref_best_dropped": first_out}
        kp = set(kvpress_kept[l])
        row["kvpress_vs_ref"] = [sorted(kp - ref_keep), sorted(ref_keep - kp)]
        for path, j in kvlab_runs:
            heads = [set(h) for h in j["kept"][l]]
            if any(h != heads[0] for h in heads):
                row[f"{path}: heads differ"] = True
            kv = heads[0]
            only_kvlab, only_kvpress = sorted(kv - kp), sorted(kp - kv)
            row[path] = {
                "kept": len(kv),
                "only_kvlab": [(p, float(s[p]) if p < n - 1 else None) for p in only_kvlab],
                "only_kvpress": [(p, float(s[p]) if p < n - 1 else None) for p in only_kvpress],
                "kvlab_vs_ref": [sorted(kv - ref_keep), sorted(ref_keep - kv)],
            }
        layers.append(row)

    # 4. kvpress's pipeline with kvlab's kept set imposed.
    transplant = {}
    for path, j in kvlab_runs:
        keep = [sorted(set(j["kept"][l][0])) for l in range(n_layers)]

        class Imposed(ScorerPress):
            def score(self, module, hidden_states, keys, values, attentions, kwargs):
                s = torch.zeros(keys.shape[2], dtype=keys.dtype)
                s[keep[module.layer_idx]] = 1.0
                return s.view(1, 1, -1).expand(1, keys.shape[1], -1)

        if any(len(k) != n_kept for k in keep):
            transplant[path] = f"kvlab keeps {sorted({len(k) for k in keep})} per layer, kvpress {n_kept}: not imposed"
            continue
        ans = pipeline(Imposed(compression_ratio=a.ratio))
        transplant[path] = {"answer": tok.decode(ans, skip_special_tokens=True)}

    out = {
        "n_context": n, "n_kept": n_kept,
        "kvpress_answer": tok.decode(kvpress_answer, skip_special_tokens=True),
        "kvlab_answers": {p: j["answer"] for p, j in kvlab_runs},
        "kvpress_with_kvlab_kept_set": transplant,
        "layers_differing": {p: [r["layer"] for r in layers if r[p]["only_kvlab"]] for p, _ in kvlab_runs},
        "layers_kvpress_vs_ref_differing": [r["layer"] for r in layers if r["kvpress_vs_ref"][0]],
        "layers": layers,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
