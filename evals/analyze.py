#!/usr/bin/python3
"""Paper-ready figures of a kvlab results file (docs/results_schema.md), as PDF, SVG and PNG:

    /usr/bin/python3 evals/analyze.py results/quickstart.h5 [--out DIR] [--formats pdf,svg,png]
                                      [--heatmap-values accuracy|logprob] [--x read|kept]

  STEM_niah_RUN.*          NIAH heatmap of one run (gkamradt's convention): x = context length,
                           y = needle depth with 0% at the top, colour = exact-match accuracy
                           over the cell's trials (sequential, colour-blind-safe viridis), the
                           value written in each cell; --heatmap-values logprob colours and
                           labels the mean log-probability of the value instead.
  STEM_niah.*              every run's heatmap on one page, one shared colour bar.
  STEM_accuracy_vs_context.*  NIAH accuracy against context length, one colour per policy family,
                           one marker per parameter setting, error bars = binomial standard error
                           over the trials of all depths.
  STEM_score_vs_compression.*  NIAH accuracy (and perplexity, when measured) against the
                           compression ratio 1 - keys read / keys seen per decode step.
  STEM_tradeoff.*          quality against achieved KV bytes per decode step, per layer and KV
                           head (--x read: bytes of K and V read, the default; --x kept: peak
                           bytes held), each policy family's settings connected.
  STEM_ppl.*               running perplexity against tokens scored, one curve per run.

Everything is read from the complete cells, so a partial file (a killed or running sweep) plots
what is complete; every title says how many cells it uses. Files of schema 1 are read too.
Needs Debian's python3-h5py, python3-numpy and python3-matplotlib (Agg backend). Prints the
files it wrote, one per line.
"""

import argparse
import json
import math
import os
import re
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Okabe & Ito's colour-blind-safe palette (Color Universal Design), one colour per family.
# Ordered so that the first five families get the most distinct hues (orange after sky blue).
FAMILY_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#E69F00", "#000000", "#F0E442"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
LINESTYLES = ["-", "--", ":", "-."]
HEATMAP_CMAP = "viridis"

plt.rcParams.update({
    "font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "figure.dpi": 100,
    "pdf.fonttype": 42, "svg.fonttype": "none",  # editable text in PDF and SVG
    "axes.spines.top": False, "axes.spines.right": False,
})


def text(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return ",".join(str(v) for v in value.tolist())
    return str(value)


def natural_key(name):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def safe_name(run):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("_")


def number(attrs, key, default=math.nan):
    if key not in attrs:
        return default
    try:
        return float(attrs[key])
    except (TypeError, ValueError):
        return default


class Results:
    """The complete cells of one file, as plain Python values."""

    def __init__(self, f, path):
        self.path = path
        root = f.attrs
        self.name = text(root.get("name", os.path.splitext(os.path.basename(path))[0]))
        self.model = os.path.basename(text(root.get("model_path", "?")))
        self.cells_total = int(number(root, "cells_total", 0))
        try:
            config = json.loads(text(root.get("model_config", "{}")))
        except ValueError:
            config = {}
        self.layer_heads = int(config.get("n_layers", 0)) * int(config.get("n_kv_heads", 0))
        self.head_dim = int(config.get("head_dim", 0))
        self.runs = {}  # run -> {"type", "params", "effective", "niah": [cells], "ppl": [cells]}
        for run in sorted(f["runs"].keys() if "runs" in f else [], key=natural_key):
            g = f["runs"][run]
            entry = {"type": text(g.attrs.get("policy_type", run.split("@")[0])),
                     "params": text(g.attrs.get("params", "")),
                     "effective": text(g.attrs.get("effective_params", "")), "niah": [], "ppl": []}
            cells = g.get("cells")
            for name in (sorted(cells.keys(), key=natural_key) if cells is not None else []):
                c = cells[name]
                if int(number(c.attrs, "complete", 0)) != 1:
                    continue
                kind = text(c.attrs.get("kind", "niah" if name.startswith("niah_") else "perplexity"))
                cell = self._common(c)
                if kind == "niah":
                    correct = c["correct"][()].astype(float) if "correct" in c else np.array([])
                    logp = c["value_logprob"][()] if "value_logprob" in c else np.array([])
                    cell.update(length=number(c.attrs, "context_length"), depth=number(c.attrs, "depth"),
                                accuracy=number(c.attrs, "accuracy"), correct=correct,
                                logprob=float(np.mean(logp[np.isfinite(logp)])) if np.isfinite(logp).any() else math.nan)
                    entry["niah"].append(cell)
                else:
                    nll = c["nll"][()].astype(np.float64) if "nll" in c else np.array([])
                    cell.update(ppl=number(c.attrs, "ppl"), ppl_stderr=number(c.attrs, "ppl_stderr"), nll=nll,
                                protocol=text(c.attrs.get("protocol", "")), text=text(c.attrs.get("text", "")))
                    entry["ppl"].append(cell)
            self.runs[run] = entry
        self.cells_complete = sum(len(r["niah"]) + len(r["ppl"]) for r in self.runs.values())
        types = []
        for r in self.runs.values():
            if r["type"] not in types:
                types.append(r["type"])
        self.family_colour = {t: FAMILY_COLOURS[i % len(FAMILY_COLOURS)] for i, t in enumerate(types)}
        self.marker = {}
        self.linestyle = {}
        for t in types:
            members = [run for run, r in self.runs.items() if r["type"] == t]
            for i, run in enumerate(members):
                self.marker[run] = MARKERS[i % len(MARKERS)]
                self.linestyle[run] = LINESTYLES[i % len(LINESTYLES)]

    def _common(self, c):
        a = c.attrs
        read = number(a, "keys_read_mean")
        if not np.isfinite(read) and number(a, "decode_tokens", 0) > 0:  # schema 1
            read = number(a, "attended_achieved_mean")
        read_bytes = number(a, "kv_read_bytes_per_layer_head")
        if not np.isfinite(read_bytes) and np.isfinite(read) and self.head_dim:
            read_bytes = read * 2 * self.head_dim * 4  # fp32 K and V
        kept = number(a, "kv_kept_bytes_peak_per_layer_head")
        if not np.isfinite(kept) and self.layer_heads:
            kept = number(a, "kv_bytes_peak") / self.layer_heads
        return {"keys_read": read, "keys_seen": number(a, "keys_seen_mean"), "read_bytes": read_bytes,
                "kept_bytes": kept}

    def label(self, run):
        """'run (setting)' for legends: the parameters as written."""
        params = self.runs[run]["params"]
        return run if not params or "@" in run else "%s (%s)" % (run, params)

    def niah_runs(self):
        return [r for r, e in self.runs.items() if e["niah"]]

    def ppl_runs(self):
        return [r for r, e in self.runs.items() if e["ppl"] and e["ppl"][0]["nll"].size]

    def used(self, kind, runs=None):
        runs = self.runs if runs is None else runs
        return sum(len(self.runs[r][kind]) for r in runs)

    def title(self, task, budget, used):
        """Model, task and budget on the first line; cells used on the second."""
        partial = "" if self.cells_complete >= self.cells_total else " (partial file: %d of %d cells complete)" % (
            self.cells_complete, self.cells_total)
        return "%s  ·  %s  ·  budget: %s\n%s: %d cells%s" % (self.model, task, budget, self.name, used, partial)


def niah_task(res, runs):
    cells = [c for r in runs for c in res.runs[r]["niah"]]
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    trials = sorted({c["correct"].size for c in cells})
    t = "/".join(str(n) for n in trials)
    return "NIAH, %d lengths × %d depths, %s trial%s per cell" % (len(lengths), len(depths), t,
                                                                  "" if trials == [1] else "s")


def heatmap_grid(cells, values):
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    grid = np.full((len(depths), len(lengths)), np.nan)  # [depth, length]: row 0 = depth 0 (top)
    trials = np.zeros((len(depths), len(lengths)), dtype=int)
    for c in cells:
        i, j = depths.index(c["depth"]), lengths.index(c["length"])
        grid[i, j] = c["accuracy"] if values == "accuracy" else c["logprob"]
        trials[i, j] = c["correct"].size
    return lengths, depths, grid, trials


def value_text(v, values):
    if not np.isfinite(v):
        return ""
    if values == "accuracy":
        return "%.2f" % v
    s = "%.1f" % v
    return "0.0" if s == "-0.0" else s


def draw_heatmap(ax, cells, values, norm, cmap, title=None, ylabel=True, annotate=True):
    lengths, depths, grid, trials = heatmap_grid(cells, values)
    masked = np.ma.masked_invalid(grid)
    cm = plt.get_cmap(cmap).copy()
    cm.set_bad("#d9d9d9")
    image = ax.imshow(masked, origin="upper", aspect="auto", cmap=cm, norm=norm, interpolation="nearest")
    ax.set_xticks(range(len(lengths)), ["%d" % x for x in lengths])
    ax.set_yticks(range(len(depths)), ["%g" % d for d in depths])
    ax.set_xlabel("context length (tokens)")
    if ylabel:
        ax.set_ylabel("needle depth (%)")
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        ax.set_title(title)
    if annotate and grid.size <= 200:
        size = 8 if grid.shape[1] <= 8 else 6
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                v = grid[i, j]
                if not np.isfinite(v):
                    ax.text(j, i, "–", ha="center", va="center", fontsize=size, color="#555555")
                    continue
                r, g, b, _ = cm(norm(v))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, value_text(v, values), ha="center", va="center", fontsize=size,
                        color="white" if dark else "black")
    return image


def heatmap_norm(res, runs, values):
    if values == "accuracy":
        return matplotlib.colors.Normalize(vmin=0.0, vmax=1.0)
    lp = [c["logprob"] for r in runs for c in res.runs[r]["niah"] if np.isfinite(c["logprob"])]
    low = min(lp) if lp else -1.0
    return matplotlib.colors.Normalize(vmin=min(low, -1e-3), vmax=0.0)


def colour_label(values, res, runs):
    trials = sorted({c["correct"].size for r in runs for c in res.runs[r]["niah"]})
    t = "/".join(str(n) for n in trials)
    if values == "accuracy":
        return "accuracy (exact match, %s trial%s per cell)" % (t, "" if trials == [1] else "s")
    return "mean log p(value) (nats; 0 = certain)"


def save(fig, out_dir, stem, formats):
    paths = []
    for fmt in formats:
        path = os.path.join(out_dir, "%s.%s" % (stem, fmt))
        fig.savefig(path, dpi=200 if fmt == "png" else None, bbox_inches="tight")
        paths.append(path)
    plt.close(fig)
    return paths


def heatmap_figure(res, run, values="accuracy"):
    cells = res.runs[run]["niah"]
    norm = heatmap_norm(res, [run], values)
    lengths = {c["length"] for c in cells}
    fig, ax = plt.subplots(figsize=(1.6 + 0.75 * len(lengths), 3.2))
    image = draw_heatmap(ax, cells, values, norm, HEATMAP_CMAP)
    fig.colorbar(image, ax=ax, label=colour_label(values, res, [run]), fraction=0.08, pad=0.03)
    budget = res.runs[run]["params"] or "none (%s)" % res.runs[run]["type"]
    ax.set_title(res.title(niah_task(res, [run]), budget, len(cells)) + "\nrun: %s" % run, loc="left")
    return fig


def heatmap_grid_figure(res, runs, values="accuracy"):
    n = len(runs)
    cols = n if n <= 4 else min(4, math.ceil(n / math.ceil(n / 4)))  # balanced rows: 5 -> 3+2, not 4+1
    rows = math.ceil(n / cols)
    lengths = {c["length"] for r in runs for c in res.runs[r]["niah"]}
    panel_w = 1.0 + 0.55 * len(lengths)
    title_lines = max(2 + wrap_setting(res.runs[r]["params"] or "-", 24).count("\n") for r in runs)
    title_in = 0.16 * title_lines  # inches of panel title
    height = (2.3 + title_in + 0.35) * rows + 0.75
    fig = plt.figure(figsize=(max(panel_w, 2.1) * cols + 1.2, height))
    # Room at the top for the two-line figure title above the panel titles.
    gs = fig.add_gridspec(rows, cols + 1, width_ratios=[1] * cols + [0.06], wspace=0.3,
                          hspace=(title_in + 0.45) / 2.3, top=1 - (0.6 + title_in) / height, bottom=0.45 / height)
    norm = heatmap_norm(res, runs, values)
    image = None
    for k, run in enumerate(runs):
        ax = fig.add_subplot(gs[k // cols, k % cols])
        budget = wrap_setting(res.runs[run]["params"] or "no budget", 24)
        image = draw_heatmap(ax, res.runs[run]["niah"], values, norm, HEATMAP_CMAP,
                             title="%s\n%s" % (run, budget), ylabel=k % cols == 0)
        if k // cols < rows - 1 and (k + cols) < n:
            ax.set_xlabel("")
    cax = fig.add_subplot(gs[:, cols])
    fig.colorbar(image, cax=cax, label=colour_label(values, res, runs))
    fig.suptitle(res.title(niah_task(res, runs), "per panel", res.used("niah", runs)), x=0.02, ha="left",
                 y=1 - 0.08 / height, va="top")
    return fig


def wrap_setting(setting, width):
    """'a=1, b=2, c=3' on lines of at most `width` characters, broken after commas."""
    lines, line = [], ""
    for item in setting.split(", "):
        if line and len(line) + 2 + len(item) > width:
            lines.append(line + ",")
            line = item
        else:
            line = item if not line else line + ", " + item
    return "\n".join(lines + [line])


def binomial_se(p, n):
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n > 0 else math.nan


def legend_outside(ax, handles=None, labels=None):
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, borderaxespad=0)


def accuracy_vs_context_figure(res, runs):
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for index, run in enumerate(runs):
        # Runs with equal accuracy would hide each other: dodge them by a few percent in x.
        dodge = 2.0 ** ((index - (len(runs) - 1) / 2.0) * 0.012)
        by_length = {}
        for c in res.runs[run]["niah"]:
            by_length.setdefault(c["length"], []).append(c["correct"])
        xs = sorted(by_length)
        ys, es = [], []
        for x in xs:
            trials = np.concatenate(by_length[x])
            p = float(trials.mean()) if trials.size else math.nan
            ys.append(p)
            es.append(binomial_se(p, trials.size))
        ax.errorbar([x * dodge for x in xs], ys, yerr=es, color=res.family_colour[res.runs[run]["type"]], marker=res.marker[run],
                    linestyle=res.linestyle[run], linewidth=1.2, markersize=5, capsize=2.5, label=res.label(run))
    lengths = sorted({c["length"] for r in runs for c in res.runs[r]["niah"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, ["%d" % x for x in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylim(-0.04, 1.04)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("NIAH accuracy (exact match)")
    ax.grid(True, alpha=0.3)
    legend_outside(ax)
    ax.set_title(res.title(niah_task(res, runs) + "; bars: ±1 s.e. over trials; runs dodged in x", "per legend",
                           res.used("niah", runs)), loc="left")
    return fig


def run_points(res, run, x_key):
    """(x, accuracy, accuracy s.e., ppl, ppl s.e.) of one run over all its cells."""
    e = res.runs[run]
    cells = e["niah"] + e["ppl"]
    if x_key == "compression":
        fr = [c["keys_read"] / c["keys_seen"] for c in cells
              if np.isfinite(c["keys_read"]) and np.isfinite(c["keys_seen"]) and c["keys_seen"] > 0]
        x = 1.0 - float(np.mean(fr)) if fr else math.nan
    else:
        xs = [c[x_key] for c in cells if np.isfinite(c[x_key])]
        x = float(np.mean(xs)) if xs else math.nan
    acc = se = ppl = ppl_se = math.nan
    if e["niah"]:
        trials = np.concatenate([c["correct"] for c in e["niah"]])
        if trials.size:
            acc = float(trials.mean())
            se = binomial_se(acc, trials.size)
    if e["ppl"]:
        ppl = float(np.nanmean([c["ppl"] for c in e["ppl"]]))
        ppl_se = float(np.nanmean([c["ppl_stderr"] for c in e["ppl"]]))
    return x, acc, se, ppl, ppl_se


def quality_figure(res, x_key, xlabel, title_task, log_x):
    runs = list(res.runs)
    niah = any(res.runs[r]["niah"] for r in runs)
    ppl = any(res.runs[r]["ppl"] for r in runs)
    panels = ([("acc", "NIAH accuracy (exact match)")] if niah else []) + ([("ppl", "perplexity")] if ppl else [])
    if not panels:
        return None
    points = {r: run_points(res, r, x_key) for r in runs}
    if not any(np.isfinite(p[0]) for p in points.values()):
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels) + 2.2, 3.5), squeeze=False)
    axes = axes[0]
    for ax, (key, ylabel) in zip(axes, panels):
        for family in res.family_colour:
            members = [r for r in runs if res.runs[r]["type"] == family]
            line = []
            for r in members:
                x, acc, se, p, pse = points[r]
                y, e = (acc, se) if key == "acc" else (p, pse)
                if np.isfinite(x) and np.isfinite(y):
                    line.append((x, y))
                    ax.errorbar([x], [y], yerr=[e] if np.isfinite(e) else None, color=res.family_colour[family],
                                marker=res.marker[r], markersize=6, capsize=2.5, linestyle="none",
                                label=res.label(r))
            if len(line) > 1:  # connect the family's budgets
                line.sort()
                ax.plot([p[0] for p in line], [p[1] for p in line], color=res.family_colour[family],
                        linewidth=1.0, alpha=0.7)
        if log_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2, numticks=30))
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(bytes_label))
        ax.set_ylabel(ylabel)
        if key == "acc":
            ax.set_ylim(-0.04, 1.04)
        else:
            ys = [points[r][3] for r in runs if np.isfinite(points[r][3])]
            if ys and max(ys) / max(min(ys), 1e-9) > 8:  # perplexities spanning a decade: log y
                ax.set_yscale("log")
                log_y_ticks(ax)
        ax.grid(True, alpha=0.3)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    legend_outside(axes[-1], handles, labels)
    used = res.used("niah") + res.used("ppl")
    axes[0].set_title(res.title(title_task, "per legend", used), loc="left")
    fig.supxlabel(xlabel, fontsize=9)
    fig.tight_layout()
    return fig


def bytes_label(v, _pos=None):
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if v >= scale:
            return "%g %s" % (round(v / scale, 2), unit)
    return "%g B" % v


def log_y_ticks(ax):
    """Labels at 1, 2, 5 x 10^k on a log y axis (plain numbers), unlabelled minor ticks."""
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def ax_range(values):
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return (float(v.min()), float(v.max())) if v.size else (1.0, 1.0)


def ppl_figure(res, runs):
    fig, ax = plt.subplots(figsize=(6.8, 3.6))
    protocols = set()
    for run in runs:
        c = res.runs[run]["ppl"][0]
        protocols.add(c["protocol"])
        n = np.arange(1, c["nll"].size + 1)
        ax.plot(n, np.exp(np.cumsum(c["nll"]) / n), color=res.family_colour[res.runs[run]["type"]],
                linestyle=res.linestyle[run], linewidth=1.3, label=res.label(run))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    lows, highs = zip(*[ax_range(line.get_ydata()) for line in ax.get_lines()])
    if max(highs) / max(min(lows), 1e-9) > 8:  # a log axis only when the curves span a decade or so
        ax.set_yscale("log")
        log_y_ticks(ax)
    ax.set_xlabel("tokens scored")
    ax.set_ylabel("running perplexity (first text)")
    ax.grid(True, which="both", alpha=0.25)
    legend_outside(ax)
    task = "perplexity (%s), %d tokens" % ("/".join(sorted(protocols)),
                                            max(res.runs[r]["ppl"][0]["nll"].size for r in runs))
    ax.set_title(res.title(task, "per legend", res.used("ppl", runs)), loc="left")
    return fig


def plot_all(res, out_dir, stem, formats, values="accuracy", x="read"):
    written = []
    niah_runs = res.niah_runs()
    for run in niah_runs:
        written += save(heatmap_figure(res, run, values), out_dir, "%s_niah_%s" % (stem, safe_name(run)), formats)
    if niah_runs:
        written += save(heatmap_grid_figure(res, niah_runs, values), out_dir, "%s_niah" % stem, formats)
        written += save(accuracy_vs_context_figure(res, niah_runs), out_dir, "%s_accuracy_vs_context" % stem, formats)
    fig = quality_figure(res, "compression", "compression ratio (1 − keys read / keys seen per decode step)",
                         "score vs compression", log_x=False)
    if fig is not None:
        written += save(fig, out_dir, "%s_score_vs_compression" % stem, formats)
    if x == "read":
        fig = quality_figure(res, "read_bytes", "KV bytes read per decode step, per layer and KV head",
                             "quality vs KV read", log_x=True)
    else:
        fig = quality_figure(res, "kept_bytes", "peak KV bytes held, per layer and KV head",
                             "quality vs KV kept", log_x=True)
    if fig is not None:
        written += save(fig, out_dir, "%s_tradeoff" % stem, formats)
    ppl_runs = res.ppl_runs()
    if ppl_runs:
        written += save(ppl_figure(res, ppl_runs), out_dir, "%s_ppl" % stem, formats)
    return written


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results file written by kvlab run (a partial one too)")
    parser.add_argument("--out", help="directory for the figures (default: next to the results)")
    parser.add_argument("--formats", default="pdf,svg,png", help="comma-separated: pdf, svg, png (default all three)")
    parser.add_argument("--heatmap-values", choices=["accuracy", "logprob"], default="accuracy",
                        help="what the heatmaps colour and print (default accuracy)")
    parser.add_argument("--x", choices=["read", "kept"], default="read",
                        help="trade-off x axis: KV bytes read per step (default) or peak KV bytes held")
    args = parser.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in ("pdf", "svg", "png"):
            print("analyze.py: --formats: unknown format '%s' (expected pdf, svg, png)" % f, file=sys.stderr)
            return 2
    if not os.path.exists(args.results):
        print("analyze.py: %s: no such file" % args.results, file=sys.stderr)
        return 1
    out_dir = args.out or os.path.dirname(os.path.abspath(args.results))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.results))[0]
    try:
        f = h5py.File(args.results, "r")
    except OSError as e:
        print("analyze.py: %s: not readable as HDF5 (%s)" % (args.results, e), file=sys.stderr)
        return 1
    with f:
        if "schema_version" not in f.attrs:
            print("analyze.py: %s: not a kvlab results file" % args.results, file=sys.stderr)
            return 1
        res = Results(f, args.results)
    if res.cells_complete == 0:
        print("analyze.py: %s: no complete cells yet (0 of %d): nothing to plot" % (args.results, res.cells_total),
              file=sys.stderr)
        return 1
    written = plot_all(res, out_dir, stem, formats, args.heatmap_values, args.x)
    for path in written:
        print(path)
    print("analyze.py: %d figure files from %d of %d cells" % (len(written), res.cells_complete, res.cells_total),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
