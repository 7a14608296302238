#!/usr/bin/python3
"""NumPy reference for the `quest` policy (POLICIES.md 15; Quest, arXiv 2406.10774): recomputes,
from the raw keys and queries, every page selection kvlab's quest made, and checks they agree.

The C++ helper (policies/quest_reference_dump.cpp) runs quest on the engine-free simulator and
prints the keys of every layer, and per (step, layer) the query rows and the slot ranges quest
selected per KV head. This script knows nothing of kvlab's bookkeeping: it recomputes the page
bounds M, m (elementwise max / min over a page's keys), the scores
u_p = sum_d max(q_d M_d, q_d m_d) per query head, the page budget P = max(1, B // page_size) with
B = min(n, budget_tokens) or n - floor(r n) (policies/budget.h; every page when B = n), the current page plus the top
P - 1 other pages (gqa=max: max of u_p over the KV head's query heads; gqa=union: the union of
each query head's own top P - 1), and dense attention in prefill and in the first dense_layers.

Float tolerance: kvlab scores in float32, this script in float64. Each term max(q M, q m) is one
rounded product (relative error u = 2^-24; kvlab writes it q+ M + q- m with one product exactly 0)
and the d terms are summed in float32 in some order (any summation tree: error <= (d - 1) u
sum |terms|), so a kvlab score is within d u sum|terms| (to first order; x1.01 covers the
rest) of the exact one. Two pages may therefore swap places only when their exact scores differ
by less than the sum of their bounds; any other difference fails.

    /usr/bin/python3 tests/reference/quest_ref_test.py PATH/TO/quest_reference_dump
"""

import json
import math
import subprocess
import sys

import numpy as np

U32 = 2.0 ** -24


def run_dump(exe, seed, gqa, dense_layers, budget_tokens, ratio):
    out = subprocess.run([exe, str(seed), gqa, str(dense_layers), str(budget_tokens), repr(ratio)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def kept(n, budget_tokens, ratio):
    """Tokens of budget out of n seen (policies/budget.h)."""
    if budget_tokens > 0:
        return min(n, budget_tokens)
    return min(max(n - math.floor(ratio * n), 1), n)


def selected_pages(ranges, n_slots, ps):
    """Page set of one KV head's slot ranges; every page must be selected whole."""
    slots = np.zeros(n_slots, dtype=bool)
    for b, e in ranges:
        assert 0 <= b < e <= n_slots, (b, e, n_slots)
        assert not slots[b:e].any(), "overlapping ranges"
        slots[b:e] = True
    pages = set()
    for p in range((n_slots + ps - 1) // ps):
        part = slots[p * ps:min(n_slots, (p + 1) * ps)]
        assert part.all() or not part.any(), f"page {p} selected in part"
        if part.all():
            pages.add(p)
    return pages


def top(scores, k):
    """Indices of the k best scores, higher first, ties to the lower index."""
    order = sorted(range(len(scores)), key=lambda p: (-scores[p], p))
    return order[:k]


def check_config(exe, seed, gqa, dense_layers, budget_tokens, ratio, counts):
    d = run_dump(exe, seed, gqa, dense_layers, budget_tokens, ratio)
    H, Hkv, D, ps = d["n_heads"], d["n_kv_heads"], d["head_dim"], d["page_size"]
    G = H // Hkv
    keys = [np.array(k, dtype=np.float64) for k in d["keys"]]  # [layer] -> [slot, kv_head, feat]
    limited = budget_tokens > 0 or ratio > 0
    label = f"seed {seed} gqa {gqa} dense_layers {dense_layers} budget_tokens {budget_tokens} ratio {ratio}"
    for st in d["steps"]:
        where = f"{label}: layer {st['layer']} position {st['position']}"
        n_slots = st["n_slots"]
        sel = st["selection"]
        if st["n_new"] > 1 or st["layer"] < dense_layers or not limited:
            assert sel == "all", f"{where}: expected dense attention, got {sel}"
            counts["dense"] += 1
            continue
        n_seen = st["position"] + 1
        n_pages = (n_slots + ps - 1) // ps
        B = kept(n_seen, budget_tokens, ratio)
        P = n_pages if B >= n_seen else max(1, B // ps)
        last = n_pages - 1
        q = np.array(st["queries"], dtype=np.float64).reshape(H, D)
        assert sel != "all", f"{where}: a limited decode step must select explicitly"
        for h in range(Hkv):
            got = selected_pages(sel[h], n_slots, ps)
            assert last in got, f"{where} head {h}: the current page {last} is not read"
            if n_pages <= P:
                assert got == set(range(n_pages)), f"{where} head {h}: {got} != all {n_pages} pages"
                counts["all_pages"] += 1
                continue
            k = P - 1
            K = keys[st["layer"]][:n_slots, h, :]
            M = np.array([K[p * ps:(p + 1) * ps].max(axis=0) for p in range(last)])  # [last, D]
            m = np.array([K[p * ps:(p + 1) * ps].min(axis=0) for p in range(last)])
            qg = q[h * G:(h + 1) * G]                                   # [G, D]
            terms = np.maximum(qg[:, None, :] * M[None], qg[:, None, :] * m[None])  # [G, last, D]
            u = terms.sum(axis=2)
            tol = 1.01 * D * U32 * np.abs(terms).sum(axis=2)
            got_other = got - {last}
            if gqa == "max":
                score = u.max(axis=0)
                stol = tol.max(axis=0)
                want = set(top(list(score), k))
                assert len(got_other) == k, f"{where} head {h}: {len(got_other)} pages besides the current, want {k}"
                if got_other != want:
                    for a in got_other - want:
                        for b in want - got_other:
                            assert abs(score[a] - score[b]) <= stol[a] + stol[b], (
                                f"{where} head {h}: kvlab read page {a} (score {score[a]}) instead of "
                                f"page {b} (score {score[b]})")
                    counts["near_ties"] += 1
            else:
                per_head = [set(top(list(u[g]), k)) for g in range(G)]
                want = set().union(*per_head)
                if got_other != want:
                    for p in got_other ^ want:
                        ok = False
                        for g in range(G):
                            cutoff = sorted(u[g], reverse=True)[k - 1]
                            if abs(u[g][p] - cutoff) <= 2 * tol[g].max():
                                ok = True
                        assert ok, f"{where} head {h}: page {p} differs from the reference union {sorted(want)}"
                    counts["near_ties"] += 1
                counts["union_extra"] += len(want) - k
            counts["selected"] += 1
            # Reads never exceed the budget under gqa=max (pages before the last are full).
            reads = sum(min(n_slots, (p + 1) * ps) - p * ps for p in got)
            if gqa == "max" and kept(n_seen, budget_tokens, ratio) >= ps:
                assert reads <= kept(n_seen, budget_tokens, ratio), f"{where} head {h}: {reads} reads"


def main():
    exe = sys.argv[1]
    counts = {"dense": 0, "all_pages": 0, "selected": 0, "near_ties": 0, "union_extra": 0}
    configs = [
        # (gqa, dense_layers, budget_tokens, compression_ratio)
        ("max", 0, 12, 0.0), ("max", 1, 9, 0.0), ("max", 2, 12, 0.0), ("max", 0, 3, 0.0),
        ("max", 0, 0, 0.6), ("max", 1, 0, 0.85), ("union", 0, 12, 0.0), ("union", 1, 0, 0.7),
        ("union", 0, 5, 0.0), ("max", 0, 0, 0.0), ("max", 0, 40, 0.0), ("union", 1, 40, 0.0),
    ]
    for seed in (1, 2, 3):
        for gqa, dense, bt, r in configs:
            check_config(exe, seed, gqa, dense, bt, r, counts)
    print("quest reference:", counts)
    assert counts["selected"] > 300, counts       # the selective path really ran
    assert counts["all_pages"] > 0, counts        # and the "budget covers every page" path
    assert counts["union_extra"] > 0, counts      # union read more pages than max somewhere
    assert counts["near_ties"] <= counts["selected"] // 100, counts  # float ties stay rare
    print("ok")


if __name__ == "__main__":
    main()
