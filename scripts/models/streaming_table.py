#!/usr/bin/python3
"""The streaming-perplexity table of a model card from kvlab results files (perplexity cells).

    scripts/models/streaming_table.py RESULTS.h5 [RESULTS.h5 ...] [--segments 0,256,1024,...]

For every perplexity cell (/runs/RUN/cells/ppl_*) it reads the per-token NLL and positions and
prints one Markdown row per run: the perplexity over each segment [a, b) of scored positions
(exp of the mean NLL of the tokens whose position p, the predicted token's index, has a <= p < b;
a segment the run did not reach is '-'), the overall PPL, the scored count, the KV peak and where
streaming stopped, if it did. Segment PPLs rather than running PPL show a blow-up where it happens:
a running mean dilutes it with everything before. The last row compares each run with the first
run (the reference) on the segments both have: PPL ratio - 1.
"""
import argparse
import math
import sys

import h5py
import numpy as np


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--segments", default="1,256,1024,2048,4096,8192,10240,12288",
                    help="segment edges in positions (the first scored position is 1)")
    a = ap.parse_args()
    edges = [int(x) for x in a.segments.split(",")]
    if edges != sorted(edges) or len(edges) < 2:
        sys.exit("streaming_table.py: --segments must be at least 2 increasing integers")
    rows = []
    for path in a.results:
        with h5py.File(path, "r") as f:
            if "runs" not in f:
                sys.exit(f"streaming_table.py: {path}: no /runs group (not a kvlab results file?)")
            for run, g in f["runs"].items():
                for cell, c in g.get("cells", {}).items():
                    if "nll" not in c or "positions" not in c:
                        continue
                    nll = c["nll"][()].astype(np.float64)
                    pos = c["positions"][()]
                    seg = []
                    for lo, hi in zip(edges[:-1], edges[1:]):
                        m = (pos >= lo) & (pos < hi)
                        full = m.sum() == hi - lo
                        seg.append(math.exp(nll[m].mean()) if full else None)
                    kv = c.attrs.get("kv_bytes_peak", float("nan"))
                    status = text(c.attrs.get("status", "ok"))  # "ok", or where streaming stopped
                    stopped = "" if status == "ok" else status
                    rows.append((f"{run} ({text(c.attrs.get('protocol', ''))})", seg, math.exp(nll.mean()), len(nll),
                                 float(kv) / 2**20, stopped))
    if not rows:
        sys.exit("streaming_table.py: no perplexity cells with nll and positions")
    head = [f"[{lo}, {hi})" for lo, hi in zip(edges[:-1], edges[1:])]
    print("| run | " + " | ".join(head) + " | all | scored | KV peak MiB |")
    print("|---" * (len(head) + 4) + "|")
    for name, seg, ppl, n, kv, stopped in rows:
        cells = [f"{x:.3f}" if x is not None else "-" for x in seg]
        print(f"| {name} | " + " | ".join(cells) + f" | {ppl:.3f} | {n} | {kv:.2f} |" + (f" {stopped}" if stopped else ""))
    ref = rows[0][1]
    print()
    print(f"vs {rows[0][0]} (PPL ratio - 1, per segment):")
    for name, seg, *_ in rows[1:]:
        cells = [f"{(x / r - 1) * 100:+.1f}%" if x is not None and r is not None else "-" for x, r in zip(seg, ref)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
