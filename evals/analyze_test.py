#!/usr/bin/python3
"""Test of evals/analyze.py: writes small results files in the documented layout
(docs/results_schema.md) with h5py — complete, partial (cells without `complete`, cells
missing), and of schema 1 — runs the script on each, checks every figure file it reports in
every format, and checks the heatmap's orientation (0% depth at the top), ticks, labels, cell
values and titles on the matplotlib objects."""

import json
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import analyze  # noqa: E402

LENGTHS = [256, 512, 1024]
DEPTHS = [0.0, 50.0, 100.0]
TRIALS = 4
RUNS = [("full", "full", ""), ("win@window=64", "sliding_window", "window=64"),
        ("win@window=128", "sliding_window", "window=128"), ("sinks", "sinks", "recent=60, sinks=4")]


def accuracy_of(run_index, li, di):
    """A known pattern: correct trials = (run + length + 2 * depth index) mod (TRIALS + 1)."""
    return ((run_index + li + 2 * di) % (TRIALS + 1)) / TRIALS


def write_results(path, schema=2, drop=(), incomplete=()):
    """drop: (run, cell) pairs left out; incomplete: pairs written without complete = 1."""
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = schema
        f.attrs["name"] = "synthetic"
        f.attrs["model_path"] = "data/models/tiny-test.gguf"
        f.attrs["model_config"] = json.dumps({"n_layers": 2, "n_kv_heads": 2, "head_dim": 16})
        f.attrs["cells_total"] = len(RUNS) * (len(LENGTHS) * len(DEPTHS) + 1)
        runs = f.create_group("runs")
        for k, (run, ptype, params) in enumerate(RUNS):
            g = runs.create_group(run)
            g.attrs["policy_type"] = ptype
            g.attrs["params"] = params
            cells = g.create_group("cells")
            budget = {0: 1.0, 1: 0.25, 2: 0.5, 3: 0.3}[k]
            for li, length in enumerate(LENGTHS):
                for di, depth in enumerate(DEPTHS):
                    name = "niah_L%d_D%g" % (length, depth)
                    if (run, name) in drop:
                        continue
                    c = cells.create_group(name)
                    n_correct = int(round(accuracy_of(k, li, di) * TRIALS))
                    c["correct"] = np.array([1] * n_correct + [0] * (TRIALS - n_correct), dtype=np.int8)
                    c["value_logprob"] = -np.arange(TRIALS, dtype=np.float64) * (k + 1)
                    c.attrs["kind"] = "niah"
                    c.attrs["context_length"] = np.int64(length)
                    c.attrs["depth"] = depth
                    c.attrs["trials"] = np.int64(TRIALS)
                    c.attrs["accuracy"] = n_correct / TRIALS
                    c.attrs["kv_bytes_peak"] = np.int64(length * budget * 2 * 2 * 16 * 4 * 2)
                    c.attrs["decode_tokens"] = np.int64(10)
                    if schema >= 2:
                        c.attrs["keys_read_mean"] = length * budget
                        c.attrs["keys_seen_mean"] = float(length)
                        c.attrs["kv_read_bytes_per_layer_head"] = length * budget * 2 * 16 * 4
                        c.attrs["kv_kept_bytes_peak_per_layer_head"] = length * budget * 2 * 16 * 4
                    else:
                        c.attrs["attended_achieved_mean"] = length * budget
                    if (run, name) not in incomplete:
                        c.attrs["complete"] = np.int64(1)
            if (run, "ppl_T0") in drop:
                continue
            c = cells.create_group("ppl_T0")
            c["nll"] = (2.0 + 0.2 * k + 0.1 * np.sin(np.arange(500))).astype(np.float32)
            c.attrs["kind"] = "perplexity"
            c.attrs["protocol"] = "streaming"
            c.attrs["ppl"] = math.exp(2.0 + 0.2 * k)
            c.attrs["ppl_stderr"] = 0.1
            c.attrs["kv_bytes_peak"] = np.int64(4096 * (k + 1))
            c.attrs["decode_tokens"] = np.int64(499)
            if schema >= 2:
                c.attrs["keys_read_mean"] = 250.0 * budget
                c.attrs["keys_seen_mean"] = 250.0
                c.attrs["kv_read_bytes_per_layer_head"] = 250.0 * budget * 128
                c.attrs["kv_kept_bytes_peak_per_layer_head"] = 1024.0 * (k + 1)
            c.attrs["complete"] = np.int64(1)


EXPECTED_STEMS = ["niah_full", "niah_win_window_64", "niah_win_window_128", "niah_sinks", "niah",
                  "accuracy_vs_context", "score_vs_compression", "tradeoff", "ppl"]
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF", "svg": None}


def run_script(results, *extra):
    return subprocess.run([sys.executable, os.path.join(HERE, "analyze.py"), results, *extra],
                          capture_output=True, text=True)


def check_files(written, tmp, stem, stems, formats=("pdf", "svg", "png")):
    names = sorted(os.path.basename(p) for p in written)
    expected = sorted("%s_%s.%s" % (stem, s, fmt) for s in stems for fmt in formats)
    assert names == expected, (names, expected)
    for p in written:
        assert os.path.dirname(p) == tmp, p  # next to the results file
        with open(p, "rb") as fh:
            head = fh.read(400)
        fmt = p.rsplit(".", 1)[1]
        if MAGIC[fmt]:
            assert head.startswith(MAGIC[fmt]), p
        else:
            assert b"<svg" in head or head.startswith(b"<?xml"), p
        assert os.path.getsize(p) > 2000, p


def check_heatmap(results_path):
    """Orientation, ticks, labels, cell texts and title of one run's heatmap."""
    with h5py.File(results_path, "r") as f:
        res = analyze.Results(f, results_path)
    k, run = 1, "win@window=64"
    fig = analyze.heatmap_figure(res, run)
    ax = fig.axes[0]
    image = ax.images[0]
    assert image.origin == "upper", image.origin
    # y ticks read top to bottom 0, 50, 100: with origin upper, row 0 is drawn at the top.
    ylabels = [t.get_text() for t in ax.get_yticklabels()]
    assert ylabels == ["0", "50", "100"], ylabels
    assert ax.get_ylim()[0] > ax.get_ylim()[1], ax.get_ylim()  # y axis runs downwards
    xlabels = [t.get_text() for t in ax.get_xticklabels()]
    assert xlabels == ["256", "512", "1024"], xlabels
    assert ax.get_xlabel() == "context length (tokens)" and ax.get_ylabel() == "needle depth (%)"
    data = np.asarray(image.get_array())
    for di in range(len(DEPTHS)):
        for li in range(len(LENGTHS)):
            assert data[di, li] == accuracy_of(k, li, di), (di, li, data[di, li])
    # The numbers in the cells are the accuracies (row-major from the top-left cell).
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert texts[(0, 0)] == "%.2f" % accuracy_of(k, 0, 0), texts
    assert texts[(2, 1)] == "%.2f" % accuracy_of(k, 1, 2), texts
    title = ax.get_title(loc="left")
    for part in ("tiny-test.gguf", "NIAH", "budget: window=64", "%d trials" % TRIALS, "run: win@window=64"):
        assert part in title, (part, title)
    colourbar = fig.axes[1]
    assert "accuracy" in colourbar.get_ylabel() and "%d trials" % TRIALS in colourbar.get_ylabel()
    cmap = image.get_cmap().name
    assert cmap.startswith("viridis"), cmap
    analyze.plt.close(fig)
    # The log-probability option says so on its colour bar and formats no "-0.0".
    fig = analyze.heatmap_figure(res, "full", values="logprob")
    assert "log p(value)" in fig.axes[1].get_ylabel(), fig.axes[1].get_ylabel()
    assert all(t.get_text() != "-0.0" for t in fig.axes[0].texts)
    analyze.plt.close(fig)
    # The grid of 4 runs: balanced, one shared colour bar, budgets in the panel titles.
    fig = analyze.heatmap_grid_figure(res, res.niah_runs())
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == 4, len(panels)
    assert any("window=128" in a.get_title() for a in panels)
    analyze.plt.close(fig)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        # A complete file: every figure in every format.
        results = os.path.join(tmp, "synthetic.h5")
        write_results(results)
        out = run_script(results)
        assert out.returncode == 0, out.stderr
        check_files(out.stdout.split(), tmp, "synthetic", EXPECTED_STEMS)
        assert "from 40 of 40 cells" in out.stderr, out.stderr
        check_heatmap(results)
        # The 5-panel layout (3 + 2, no floating colour bar) and the kept-bytes axis.
        with h5py.File(results, "r") as f:
            res = analyze.Results(f, results)
        res.runs["extra"] = dict(res.runs["full"])
        res.runs["extra"]["type"] = "full"
        res.marker["extra"], res.linestyle["extra"] = "s", "--"
        fig = analyze.heatmap_grid_figure(res, res.niah_runs())
        rows = {round(a.get_position().y0, 3) for a in fig.axes if a.images}
        assert len(rows) == 2, rows
        analyze.plt.close(fig)
        tradeoff = analyze.quality_figure(res, "kept_bytes", "kept", "t", log_x=True)
        assert tradeoff is not None and len(tradeoff.axes) == 2
        analyze.plt.close(tradeoff)

        # A partial file: missing cells, an interrupted cell, a run without NIAH cells.
        partial = os.path.join(tmp, "partial.h5")
        drop = {("sinks", "niah_L%d_D%g" % (L, D)) for L in LENGTHS for D in DEPTHS} | {("full", "niah_L1024_D50")}
        write_results(partial, drop=drop, incomplete={("full", "niah_L1024_D100")})
        out = run_script(partial, "--formats", "png")
        assert out.returncode == 0, out.stderr
        stems = [s for s in EXPECTED_STEMS if s != "niah_sinks"]
        check_files(out.stdout.split(), tmp, "partial", stems, formats=("png",))
        assert "from 29 of 40 cells" in out.stderr, out.stderr
        with h5py.File(partial, "r") as f:
            res = analyze.Results(f, partial)
        fig = analyze.heatmap_figure(res, "full")
        ax = fig.axes[0]
        data = np.ma.filled(ax.images[0].get_array(), np.nan)
        assert np.isnan(data[1, 2]) and np.isnan(data[2, 2]) and np.isfinite(data[0, 2]), data
        assert "partial file: 29 of 40 cells complete" in ax.get_title(loc="left"), ax.get_title(loc="left")
        assert "7 cells" in ax.get_title(loc="left"), ax.get_title(loc="left")
        analyze.plt.close(fig)

        # Schema 1 (no keys_read_mean: from attended_achieved_mean; kept bytes from model_config).
        old = os.path.join(tmp, "old.h5")
        write_results(old, schema=1)
        out = run_script(old, "--formats", "svg", "--x", "kept")
        assert out.returncode == 0, out.stderr
        # (no keys seen in schema 1, so no compression ratio: that figure is left out)
        check_files(out.stdout.split(), tmp, "old", [s for s in EXPECTED_STEMS if s != "score_vs_compression"],
                    formats=("svg",))

        # No complete cell: a clear message, exit status 1.
        empty = os.path.join(tmp, "empty.h5")
        drop_all = {(r, "niah_L%d_D%g" % (L, D)) for r, _, _ in RUNS for L in LENGTHS for D in DEPTHS}
        drop_all |= {(r, "ppl_T0") for r, _, _ in RUNS}
        write_results(empty, drop=drop_all)
        bad = run_script(empty)
        assert bad.returncode == 1 and "no complete cells yet" in bad.stderr, bad.stderr

        # Not a results file: a clear error, exit status 1.
        other = os.path.join(tmp, "other.h5")
        with h5py.File(other, "w") as f:
            f["x"] = np.zeros(3)
        bad = run_script(other)
        assert bad.returncode == 1 and "not a kvlab results file" in bad.stderr, bad.stderr
    print("analyze_test: ok")


if __name__ == "__main__":
    main()
