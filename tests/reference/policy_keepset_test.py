#!/usr/bin/python3
"""NumPy references of the score-based policies' keep-sets, against kvlab's choices.

kvlab_policy_trace runs a policy through the engine-free simulator and prints the simulator's q
and k (exactly what the policy saw) and the positions each (layer, KV head) kept after every
step. This file recomputes the keep-sets from the papers' definitions (POLICIES.md 11-14, the
kvpress presses), written independently of policies/*.cpp:
  snapkv     window attention summed over the last w rows, avg/max pooling (PyTorch
             avg_pool1d semantics: zero padding counted), GQA mean, top (B - w) + window
  pyramidkv  the same scores with PyramidKV's per-layer budgets
  adakv      the joint top-k across KV heads with the alpha safeguard (protected = max score)
  tova       after every step, the last query's attention (GQA mean), current token kept
Budgets: n - floor(r * n) (kvpress's compression_ratio).

Scores are float32 in kvlab and float64 here: a candidate may differ only where its reference
score is within 1e-5 (relative) of the cut-off score (float rounding of probabilities summed over
a few dozen terms is ~1e-7; 1e-5 leaves two orders of margin and still catches any real error,
which moves scores by far more).

    /usr/bin/python3 tests/reference/policy_keepset_test.py KVLAB_POLICY_TRACE
"""

import json
import math
import subprocess
import sys

import numpy as np

TRACE = sys.argv[1]
FAILS = []


def trace(policy, params, **opt):
    args = [TRACE, policy] + [f"{k}={v}" for k, v in params.items()]
    for k, v in opt.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    t = json.loads(out)
    L, H, K, D = t["layers"], t["heads"], t["kv_heads"], t["dim"]
    t["q"] = np.array(t["q"], dtype=np.float64).reshape(L, -1, H, D)
    t["k"] = np.array(t["k"], dtype=np.float64).reshape(L, -1, K, D)
    return t


def probs(q, keys):
    """softmax over keys of q . k / sqrt(d); q [d], keys [n, d]."""
    s = keys @ q / math.sqrt(q.shape[0])
    e = np.exp(s - s.max())
    return e / e.sum()


def kept_count(n, ratio):
    return n - math.floor(ratio * n)


def window_attention(t, layer, positions, rows):
    """[H, len(positions)]: sum over query rows `rows` of each head's probability of each
    resident key (resident = `positions`, causal)."""
    H, K = t["heads"], t["kv_heads"]
    G = H // K
    out = np.zeros((H, len(positions)))
    pos = np.array(positions)
    for r in rows:
        for h in range(H):
            allowed = pos <= r
            keys = t["k"][layer, pos[allowed], h // G]
            out[h, allowed] += probs(t["q"][layer, r, h], keys)
    return out


def pool(a, k, mode):
    n, half = len(a), k // 2
    out = np.empty(n)
    for c in range(n):
        lo, hi = max(0, c - half), min(n, c + half + 1)
        out[c] = a[lo:hi].max() if mode == "max" else a[lo:hi].sum() / k
    return out


def snapkv_scores(t, layer, positions, w, k, mode):
    """[K, len(positions) - w] pooled, group-averaged scores of the prefix keys."""
    H, Kv = t["heads"], t["kv_heads"]
    G = H // Kv
    n = len(positions)
    wa = window_attention(t, layer, positions, range(n - w, n))
    prefix = n - w
    s = np.zeros((Kv, prefix))
    for h in range(H):
        s[h // G] += pool(wa[h, :prefix], k, mode) / G
    return s


def compare(name, got, want, scores, cut):
    """got/want: sets of kept candidate indices; scores: the reference scores; cut: the score
    of the last kept one (the boundary)."""
    diff = got.symmetric_difference(want)
    bad = [i for i in diff if abs(scores[i] - cut) > 1e-5 * max(abs(cut), 1e-30)]
    if bad:
        FAILS.append(f"{name}: kvlab and the reference differ at candidates {sorted(bad)[:8]} "
                     f"(scores {[float(scores[i]) for i in sorted(bad)[:4]]}, cut {cut})")


def top(scores, count):
    """indices of the `count` best (higher first, ties to the lower index)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return set(order[:count]), (scores[order[count - 1]] if count > 0 else math.inf)


def check_snapkv_family(policy, params, budget_of_layer, **opt):
    t = trace(policy, params, **opt)
    n = t["prompt"]
    w = int(params.get("window", 64))
    k = int(params.get("kernel_size", 5))
    mode = params.get("pooling", "avg")
    kept_after = t["steps"][-1 - t["decode"]]["kept"]
    for layer in range(t["layers"]):
        positions = list(range(n))
        s = snapkv_scores(t, layer, positions, w, k, mode)
        B = budget_of_layer(layer, n, t)
        for h in range(t["kv_heads"]):
            want_idx, cut = top(list(s[h]), max(0, B - w))
            got = set(p for p in kept_after[layer][h] if p < n - w)
            compare(f"{policy} {params} layer {layer} head {h}", got, want_idx, s[h], cut)
            window_kept = all(p in kept_after[layer][h] for p in range(n - w, n))
            if not window_kept:
                FAILS.append(f"{policy} {params} layer {layer} head {h}: the window was not kept")
    return t


def uniform(ratio):
    return lambda layer, n, t: kept_count(n, ratio)


def pyramid(ratio, w, beta=20.0):
    def f(layer, n, t):
        B, L = kept_count(n, ratio), t["layers"]
        if B <= w or L <= 1:
            return min(B, n)
        lo = (B - w) / beta
        hi = 2 * (B - w) - lo
        return min(n, max(0, math.floor(w + hi - layer * (hi - lo) / (L - 1) + 0.5)))
    return f


def check_adakv(params, **opt):
    t = trace("adakv", params, **opt)
    n = t["prompt"]
    w = int(params.get("window", 64))
    alpha = float(params.get("alpha", 0.2))
    ratio = float(params["compression_ratio"])
    B = kept_count(n, ratio)
    kept_after = t["steps"][-1 - t["decode"]]["kept"]
    Kv = t["kv_heads"]
    for layer in range(t["layers"]):
        s = snapkv_scores(t, layer, list(range(n)), w, int(params.get("kernel_size", 5)),
                          params.get("pooling", "avg"))
        # kvpress: the window at the maximum score, each head's top floor(alpha * B) first, then
        # the joint best across heads for the rest of the layer's Kv * B.
        safe = max(0, math.floor(alpha * B) - w)
        keep = [set() for _ in range(Kv)]
        pool_entries = []
        for h in range(Kv):
            sel, _ = top(list(s[h]), min(safe, n - w))
            keep[h] |= sel
            pool_entries += [(-s[h][i], h, i) for i in range(n - w) if i not in sel]
        left = Kv * (B - w) - sum(len(x) for x in keep)
        pool_entries.sort()
        for sc, h, i in pool_entries[:left]:
            keep[h].add(i)
        cut = -pool_entries[left - 1][0] if left > 0 else math.inf
        for h in range(Kv):
            got = set(p for p in kept_after[layer][h] if p < n - w)
            compare(f"adakv {params} layer {layer} head {h}", got, keep[h], s[h], cut)
        sizes = [len(kept_after[layer][h]) for h in range(Kv)]
        if sum(sizes) != Kv * B:
            FAILS.append(f"adakv layer {layer}: {sum(sizes)} tokens kept in all, expected {Kv * B}")
    return t


def check_tova(params, **opt):
    t = trace("tova", params, **opt)
    ratio = float(params["compression_ratio"])
    H, Kv = t["heads"], t["kv_heads"]
    G = H // Kv
    for layer in range(t["layers"]):
        resident = [[] for _ in range(Kv)]
        seen = 0
        for step in t["steps"]:
            new = list(range(seen, step["n_seen"]))
            seen = step["n_seen"]
            last = seen - 1
            B = kept_count(seen, ratio)
            for h in range(Kv):
                resident[h] += new
                if len(resident[h]) <= B:
                    continue
                pos = np.array(resident[h])
                score = np.zeros(len(pos))
                for g in range(G):
                    score += probs(t["q"][layer, last, h * G + g], t["k"][layer, pos, h]) / G
                cand = list(range(len(pos) - 1))  # the current token is kept
                want, cut = top([score[i] for i in cand], B - 1)
                got = set(i for i in cand if pos[i] in step["kept"][layer][h])
                compare(f"tova layer {layer} head {h} at {seen}", got, want, score, cut)
                resident[h] = [int(p) for p in step["kept"][layer][h]]  # follow kvlab's state
    return t


for kernel in (1, 5, 9):
    for mode in ("avg", "max"):
        p = {"compression_ratio": 0.6, "window": 8, "kernel_size": kernel, "pooling": mode}
        check_snapkv_family("snapkv", p, uniform(0.6), layers=2, heads=6, kv_heads=2, dim=8,
                            prompt=53, decode=3, seed=kernel)
check_snapkv_family("snapkv", {"compression_ratio": 0.5, "window": 6}, uniform(0.5), layers=1,
                    heads=8, kv_heads=1, dim=16, prompt=61, chunk=16, seed=4)
check_snapkv_family("pyramidkv", {"compression_ratio": 0.5, "window": 4, "beta": 4},
                    pyramid(0.5, 4, 4.0), layers=4, heads=4, kv_heads=2, dim=8, prompt=57, seed=5)
check_snapkv_family("pyramidkv", {"compression_ratio": 0.75, "window": 4},
                    pyramid(0.75, 4), layers=3, heads=2, kv_heads=2, dim=8, prompt=80, seed=6)
check_adakv({"compression_ratio": 0.6, "window": 4, "alpha": 0.2}, layers=2, heads=8, kv_heads=4,
            dim=8, prompt=60, seed=7)
check_adakv({"compression_ratio": 0.5, "window": 2, "alpha": 0.5, "pooling": "max"}, layers=1,
            heads=3, kv_heads=3, dim=12, prompt=45, seed=8)
check_tova({"compression_ratio": 0.5}, layers=2, heads=4, kv_heads=2, dim=8, prompt=20, chunk=7,
           decode=25, seed=9)

if FAILS:
    print("\n".join(FAILS))
    sys.exit(1)
print("policy keep-sets equal the NumPy references (snapkv, pyramidkv, adakv, tova)")
