#!/usr/bin/python3
"""What a KV-compression policy kept of the needle, next to whether NIAH was answered.

Reads a kvlab results file whose NIAH cells carry `needle_kept` [trials, layers, KV heads, needle
tokens] (1 = resident right after the prompt) and prints, per run and context length, a Markdown
table: accuracy, the measured kept fraction of the cache (`kv_kept_fraction`), the share of needle
tokens each layer kept (mean over trials and KV heads), and, over the failed trials, how the
needle was cut: `whole` (every layer kept every needle token: the loss is elsewhere), `prefix`
(some layer kept a first part of the needle and lost the rest), `gaps` (some layer kept a
non-contiguous part), `none` (some layer kept no needle token). Then one failed trial's mask per
layer (`#` kept, `.` evicted; KV head 0) for each run.

    /usr/bin/python3 scripts/niah_kept.py results/compression_niah.h5 [--masks]
"""

import sys
from collections import defaultdict

import h5py
import numpy as np


def cut_kind(mask):
    """mask [layers, heads, tokens] of one trial (-1 = padding): the worst layer's cut."""
    kinds = []
    for layer in mask:
        for head in layer:
            m = head[head >= 0]
            if m.all():
                kinds.append("whole")
            elif not m.any():
                kinds.append("none")
            else:
                first_lost = int(np.argmin(m))
                kinds.append("prefix" if not m[first_lost:].any() else "gaps")
    for k in ("none", "gaps", "prefix"):
        if k in kinds:
            return k
    return "whole"


def main():
    path = sys.argv[1]
    show_masks = "--masks" in sys.argv
    f = h5py.File(path, "r")
    rows = defaultdict(lambda: {"correct": [], "kept": [], "layer": [], "cuts": defaultdict(int),
                                "example": None})
    for run in f["runs"]:
        for name, cell in f["runs"][run]["cells"].items():
            if cell.attrs.get("kind") != "niah" or "needle_kept" not in cell:
                continue
            key = (run, int(cell.attrs["context_length"]))
            r = rows[key]
            mask = cell["needle_kept"][()]
            correct = cell["correct"][()]
            r["correct"] += list(correct)
            r["kept"].append(float(cell.attrs.get("kv_kept_fraction", np.nan)))
            for t in range(mask.shape[0]):
                m = mask[t].astype(float)
                m[mask[t] < 0] = np.nan
                r["layer"].append(np.nanmean(m, axis=(1, 2)))
                if not correct[t]:
                    r["cuts"][cut_kind(mask[t])] += 1
                    if r["example"] is None:
                        r["example"] = (name, mask[t][:, 0, :])
    n_layers = max(len(r["layer"][0]) for r in rows.values() if r["layer"])
    head = "| run | ctx | NIAH acc | cache kept | " + " | ".join(f"needle kept L{i}" for i in range(n_layers))
    print(head + " | failed trials: how the needle was cut |")
    print("|" + "---|" * (5 + n_layers))
    for (run, ctx), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        layer = np.mean(r["layer"], axis=0)
        cuts = ", ".join(f"{k} {v}" for k, v in sorted(r["cuts"].items(), key=lambda kv: -kv[1])) or "-"
        print(f"| {run} | {ctx} | {np.mean(r['correct']):.3f} | {np.nanmean(r['kept']):.3f} | "
              + " | ".join(f"{x:.2f}" for x in layer) + f" | {cuts} |")
    if show_masks:
        print()
        for (run, ctx), r in sorted(rows.items()):
            if r["example"] is None:
                continue
            name, m = r["example"]
            print(f"{run} {name}: " + "  ".join(
                f"L{l} " + "".join("#" if x == 1 else "." for x in m[l] if x >= 0) for l in range(len(m))))


if __name__ == "__main__":
    main()
