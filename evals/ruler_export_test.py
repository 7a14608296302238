#!/usr/bin/python3
"""kvlab report --json and kvlab export --format kvpress read back with Python's json and csv.

Runs evals/testdata/ruler_export.yaml on the bundled model, then checks that every summary row
names run, policy, parameters, task, context length, ratio, score and achieved KV bytes, equal to
the cells' attributes in the HDF5 file; and that the export has one kvpress directory per
(press, ratio, protocol) holding predictions.csv (one row per sample, kvpress's columns, answer
as a Python list literal), metrics.json (per task the mean score x 100 of its rows) and
config.yaml. Usage: ruler_export_test.py KVLAB; exit 77 (skipped) without the bundled model.
"""
import ast
import csv
import json
import os
import subprocess
import sys
import tempfile

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    kvlab = sys.argv[1]
    if not os.path.exists(os.path.join(ROOT, "data/models/kvlab-tiny.gguf")):
        print("skipped: data/models/kvlab-tiny.gguf is absent")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        h5 = os.path.join(tmp, "r.h5")
        subprocess.run([kvlab, "run", os.path.join(HERE, "testdata/ruler_export.yaml"), "-o", h5],
                       check=True, stdout=subprocess.DEVNULL)
        report = json.loads(subprocess.run([kvlab, "report", h5, "--json"], check=True,
                                           capture_output=True, text=True).stdout)
        rows = report["summaries"]
        # 3 runs x 2 tasks x 2 protocols
        assert len(rows) == 12, len(rows)
        with h5py.File(h5, "r") as f:
            for r in rows:
                a = f["runs"][r["run"]]["cells"][r["cell"]].attrs
                assert r["evaluation"] == "ruler"
                assert r["task"] == a["task"].decode() if isinstance(a["task"], bytes) else a["task"]
                assert r["context_length"] == 512
                assert abs(r["score"] - float(a["score"])) < 1e-12, (r, a["score"])
                assert r["kv_bytes_peak"] == int(a["kv_bytes_peak"])
                assert 0 < r["kv_kept_fraction"] <= 1
                ratio = 0.0 if r["policy_type"] == "full" else float(r["run"].split("=")[1])
                assert r["compression_ratio"] == ratio, r
                assert r["policy_type"] in ("full", "snapkv")
                assert isinstance(r["params"], dict)
        out = os.path.join(tmp, "kvpress")
        subprocess.run([kvlab, "export", "--format", "kvpress", h5, out], check=True, stdout=subprocess.DEVNULL)
        dirs = sorted(os.listdir(out))
        # (no_press 0.00, snapkv 0.50, snapkv 0.75) x (query_agnostic, query_aware)
        assert len(dirs) == 6, dirs
        assert "ruler__512__kvlab-tiny__snapkv__0.75__query_aware" in dirs, dirs
        assert "ruler__512__kvlab-tiny__no_press__0.00" in dirs, dirs
        for d in dirs:
            with open(os.path.join(out, d, "predictions.csv"), newline="") as fh:
                preds = list(csv.DictReader(fh))
            assert len(preds) == 4, (d, len(preds))  # 2 tasks x 2 samples
            for p in preds:
                for col in ("task", "question", "answer", "predicted_answer", "compression_ratio", "max_new_tokens"):
                    assert col in p, col
                refs = ast.literal_eval(p["answer"])
                assert isinstance(refs, list) and len(refs) == 1
                assert int(p["prompt_length"]) == 512 - 8
            with open(os.path.join(out, d, "metrics.json")) as fh:
                metrics = json.load(fh)
            for task in ("niah_single_1", "passkey"):
                scores = [float(p["score"]) for p in preds if p["task"] == task]
                assert abs(metrics[task]["string_match"] - 100 * sum(scores) / len(scores)) < 1e-9, (d, task)
            with open(os.path.join(out, d, "config.yaml")) as fh:
                cfg = dict(line.split(": ", 1) for line in fh.read().splitlines() if ": " in line)
            assert cfg["dataset"] == "ruler" and cfg["query_aware"] in ("true", "false"), cfg
            assert float(cfg["compression_ratio"]) == float(d.split("__")[4]), (cfg, d)
    print("ok: report --json summaries and the kvpress export read back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
