#!/usr/bin/env python3
"""Checks the CUDA benchmark CSVs against the issue's H200 speed targets and prints a table.

usage: bench_summary.py BENCH_CSV [SDPA_CSV]
Targets (benchmarks, not tests; the exit status is 0 either way):
  decode full and 25%-selection, bf16, batch 64 x 8192, 32/8 heads, d 128: >= 3.0 TB/s KV read
  prefill causal 16k, d 128, bf16: >= 60% of SDPA flash throughput (same shapes, same run)
  decode with the H2O key mass: <= 15% extra time over the same case without it
"""
import csv
import sys


def load(path):
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    bench = load(sys.argv[1])
    sdpa = load(sys.argv[2]) if len(sys.argv) > 2 else []
    if not bench:
        print("no benchmark rows (no GPU?): targets not checked")
        return 0

    def find(rows, **kw):
        for r in rows:
            if all(r.get(k) == v for k, v in kw.items()):
                return r
        return None

    lines = []
    copy = find(bench, bench="copy")
    if copy:
        lines.append(f"device copy ceiling       {float(copy['tb_per_s']):6.3f} TB/s (read + write)")
    for case in ("full", "select25", "full+positions", "select25+positions"):
        r = find(bench, bench="decode", case=case)
        if r:
            tbs = float(r["tb_per_s"])
            lines.append(f"decode {case:<22} {tbs:6.3f} TB/s  (target >= 3.0: "
                         f"{'MET' if tbs >= 3.0 else 'NOT MET'}; {r['time_ms']} ms, "
                         f"{r['splits']} splits)")
        m = find(bench, bench="decode", case=case + "+key_mass")
        if r and m:
            extra = float(m["time_ms"]) / float(r["time_ms"]) - 1
            lines.append(f"decode {case + '+key_mass':<22} +{100 * extra:5.1f}% time  (target <= 15%: "
                         f"{'MET' if extra <= 0.15 else 'NOT MET'})")
    for d in ("128", "64"):
        r = find(bench, bench="prefill", case="causal", head_dim=d)
        s = find(sdpa, bench="sdpa_flash", head_dim=d)
        if r:
            ours = float(r["tflop_per_s"])
            if s:
                ratio = ours / float(s["tflop_per_s"])
                target = f"target >= 60%: {'MET' if ratio >= 0.6 else 'NOT MET'}" if d == "128" else "no target"
                lines.append(f"prefill causal d{d:<4} {ours:7.1f} TFLOP/s = {100 * ratio:5.1f}% of SDPA flash "
                             f"{float(s['tflop_per_s']):.1f} ({target})")
            else:
                lines.append(f"prefill causal d{d:<4} {ours:7.1f} TFLOP/s (no SDPA figure to compare)")
        w = find(bench, bench="prefill", case="window4096+sinks4", head_dim=d)
        if w:
            lines.append(f"prefill window4096+sinks4 d{d:<4} {float(w['tflop_per_s']):7.1f} TFLOP/s ({w['time_ms']} ms)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
