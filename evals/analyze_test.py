#!/usr/bin/python3
"""Test of evals/analyze.py: writes a small results file in the documented layout
(docs/results_schema.md) with h5py, runs the script, checks the PNG files it reports."""

import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def write_results(path):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = 1
        f.attrs["name"] = "synthetic"
        runs = f.create_group("runs")
        for k, run in enumerate(["full", "win@window=64", "sinks"]):
            g = runs.create_group(run)
            g.attrs["policy_type"] = run.split("@")[0]
            niah = g.create_group("niah")
            niah["context_lengths"] = np.array([256, 512, 1024], dtype=np.int64)
            niah["depths"] = np.array([0.0, 50.0, 100.0])
            acc = rng.random((3, 3))
            acc[2, 1] = math.nan  # a missing cell
            niah["accuracy"] = acc
            niah["value_logprob"] = -rng.random((3, 3, 2)) * 10
            niah["kv_bytes_peak"] = np.full((3, 3), 2.0**20 * (k + 1))
            ppl = g.create_group("perplexity")
            ppl["ppl"] = np.array([10.0 + k])
            ppl["kv_bytes_peak"] = np.array([2.0**20 * (k + 1)])
            cell = g.create_group("cells").create_group("ppl_T0")
            cell["nll"] = (2.0 + rng.random(500)).astype(np.float32)
            cell.attrs["protocol"] = "streaming"
            cell.attrs["complete"] = np.int64(1)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "synthetic.h5")
        write_results(results)
        out = subprocess.run([sys.executable, os.path.join(HERE, "analyze.py"), results],
                             capture_output=True, text=True, check=True)
        written = out.stdout.split()
        expected = ["synthetic_niah_full.png", "synthetic_niah_win_window_64.png",
                    "synthetic_niah_sinks.png", "synthetic_niah.png", "synthetic_ppl.png",
                    "synthetic_tradeoff.png"]
        names = sorted(os.path.basename(p) for p in written)
        assert names == sorted(expected), names
        for p in written:
            assert os.path.dirname(p) == tmp, p  # next to the results file
            with open(p, "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n", p
            assert os.path.getsize(p) > 2000, p
        # Not a results file: a clear error, exit status 1.
        other = os.path.join(tmp, "other.h5")
        with h5py.File(other, "w") as f:
            f["x"] = np.zeros(3)
        bad = subprocess.run([sys.executable, os.path.join(HERE, "analyze.py"), other],
                             capture_output=True, text=True)
        assert bad.returncode == 1 and "not a kvlab results file" in bad.stderr, bad.stderr
    print("analyze_test: ok")


if __name__ == "__main__":
    main()
