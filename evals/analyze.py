#!/usr/bin/python3
"""Plots a kvlab results file (docs/results_schema.md) next to it, as PNG files:

    /usr/bin/python3 evals/analyze.py results/quickstart.h5 [--out DIR]

  STEM_niah_RUN.png    NIAH heatmap of one run: x = context length, y = needle depth (%),
                       colour = exact-match accuracy over the trials (red 0 -> green 1), the
                       mean value log-probability written in each cell.
  STEM_niah.png        all runs' heatmaps side by side.
  STEM_ppl.png         perplexity versus tokens scored (log x), one curve per run: the running
                       PPL exp(mean NLL of the first n scored tokens) of the first text.
  STEM_tradeoff.png    memory / quality trade-off: peak KV bytes per run against NIAH accuracy,
                       the NIAH value log-probability (the graded signal) and perplexity.

Needs Debian's python3-h5py, python3-numpy and python3-matplotlib (non-interactive Agg backend).
Prints the files it wrote, one per line.
"""

import argparse
import os
import re
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402


def safe_name(run):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("_")


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def runs_of(f):
    return sorted(f["runs"].keys()) if "runs" in f else []


def niah_heatmap(ax, group, title, ylabel=True):
    lengths = group["context_lengths"][()]
    depths = group["depths"][()]
    acc = group["accuracy"][()]  # [L, D], NaN where cells are missing
    logp = group["value_logprob"][()]  # [L, D, T]
    image = ax.imshow(acc.T, origin="lower", aspect="auto", cmap="RdYlGn", vmin=0.0, vmax=1.0,
                      interpolation="nearest")
    ax.set_xticks(range(len(lengths)), [str(int(x)) for x in lengths], rotation=45)
    ax.set_yticks(range(len(depths)), ["%g" % d for d in depths])
    ax.set_xlabel("context length (tokens)")
    if ylabel:
        ax.set_ylabel("needle depth (%)")
    ax.set_title(title, fontsize=9)
    with np.errstate(all="ignore"):
        mean_logp = np.nanmean(np.where(np.isfinite(logp), logp, np.nan), axis=2)
    if len(lengths) * len(depths) <= 120:
        for i in range(len(lengths)):
            for j in range(len(depths)):
                if np.isfinite(mean_logp[i, j]):
                    ax.text(i, j, "%.1f" % mean_logp[i, j], ha="center", va="center", fontsize=6)
    return image


def plot_niah(f, stem, out_dir):
    written = []
    runs = [r for r in runs_of(f) if "niah" in f["runs"][r] and "accuracy" in f["runs"][r]["niah"]]
    if not runs:
        return written
    for run in runs:
        fig, ax = plt.subplots(figsize=(5, 4))
        image = niah_heatmap(ax, f["runs"][run]["niah"], run)
        fig.colorbar(image, ax=ax, label="accuracy (exact match)")
        fig.tight_layout()
        path = os.path.join(out_dir, "%s_niah_%s.png" % (stem, safe_name(run)))
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    cols = min(4, len(runs))
    rows = (len(runs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 4.2 * rows), squeeze=False)
    fig.subplots_adjust(hspace=0.55)
    image = None
    for k, run in enumerate(runs):
        image = niah_heatmap(axes[k // cols][k % cols], f["runs"][run]["niah"], run, ylabel=k % cols == 0)
    for k in range(len(runs), rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.colorbar(image, ax=axes, label="accuracy (exact match)", shrink=0.8)
    path = os.path.join(out_dir, "%s_niah.png" % stem)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def plot_ppl(f, stem, out_dir):
    curves = []
    for run in runs_of(f):
        cells = f["runs"][run].get("cells")
        if cells is None or "ppl_T0" not in cells or cells["ppl_T0"].attrs.get("complete") != 1:
            continue
        nll = cells["ppl_T0"]["nll"][()].astype(np.float64)
        if nll.size == 0:
            continue
        n = np.arange(1, nll.size + 1)
        curves.append((run, n, np.exp(np.cumsum(nll) / n), text(cells["ppl_T0"].attrs.get("protocol", ""))))
    if not curves:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, n, running, _ in curves:
        ax.plot(n, running, label=run, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens scored")
    ax.set_ylabel("running perplexity")
    ax.set_title("perplexity vs tokens (%s)" % curves[0][3])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "%s_ppl.png" % stem)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_tradeoff(f, stem, out_dir):
    points = []  # (run, kv MiB, accuracy, value log-prob, ppl)
    for run in runs_of(f):
        g = f["runs"][run]
        kv, acc, logp, ppl = [], np.nan, np.nan, np.nan
        if "niah" in g and "accuracy" in g["niah"]:
            a = g["niah"]["accuracy"][()]
            lp = g["niah"]["value_logprob"][()]
            if np.isfinite(a).any():
                acc = float(np.nanmean(a))
            if np.isfinite(lp).any():
                logp = float(np.nanmean(lp[np.isfinite(lp)]))
            kv.extend(g["niah"]["kv_bytes_peak"][()].ravel().tolist())
        if "perplexity" in g and "ppl" in g["perplexity"]:
            p = g["perplexity"]["ppl"][()]
            if np.isfinite(p).any():
                ppl = float(np.nanmean(p))
            kv.extend(g["perplexity"]["kv_bytes_peak"][()].ravel().tolist())
        kv = [k for k in kv if np.isfinite(k)]
        if kv:
            points.append((run, max(kv) / 2**20, acc, logp, ppl))
    if not points:
        return []
    panels = ((2, "NIAH accuracy (exact match)"), (3, "NIAH value log-probability (nats)"),
              (4, "perplexity"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (index, label) in zip(axes, panels):
        for p in points:
            if np.isfinite(p[index]):
                ax.scatter(p[1], p[index], s=25)
                ax.annotate(p[0], (p[1], p[index]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("peak KV cache (MiB)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylim(-0.05, 1.05)
    axes[2].set_yscale("log")
    fig.suptitle("memory / quality trade-off (one point per run)")
    fig.tight_layout()
    path = os.path.join(out_dir, "%s_tradeoff.png" % stem)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results file written by kvlab run")
    parser.add_argument("--out", help="directory for the PNG files (default: next to the results)")
    args = parser.parse_args(argv)
    if not os.path.exists(args.results):
        print("analyze.py: %s: no such file" % args.results, file=sys.stderr)
        return 1
    out_dir = args.out or os.path.dirname(os.path.abspath(args.results))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.results))[0]
    with h5py.File(args.results, "r") as f:
        if "schema_version" not in f.attrs:
            print("analyze.py: %s: not a kvlab results file" % args.results, file=sys.stderr)
            return 1
        written = plot_niah(f, stem, out_dir) + plot_ppl(f, stem, out_dir) + plot_tradeoff(f, stem, out_dir)
    for path in written:
        print(path)
    if not written:
        print("analyze.py: nothing to plot (no complete cells)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
