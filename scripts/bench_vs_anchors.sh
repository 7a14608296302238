#!/usr/bin/env bash
# kvlab's CPU decode / prefill speed against llama.cpp and llama2.c on the same files, same
# threads, interleaved in one run; prints one Markdown table of tok/s and ratios, the
# perplexity check against llama-perplexity and kvlab's peak RSS. Not a test; never in CI.
#
#   scripts/bench_vs_anchors.sh [--quick] [--1b] [--build DIR] [--work DIR] [-- extra options]
#     --quick     2 threads only, 1 round, 4 perplexity windows (a few minutes)
#     --1b        the ~1B shape (dim 2048, 16 layers, 32/8 heads, hidden 8192) in bf16 instead
#     --build     kvlab build directory (default: build); kvlab is built there first
#     --work      where the model files go and are reused (default: /tmp/kvlab-bench-models)
#   Extra options go to scripts/bench/bench_vs_anchors.py (--types, --threads, --rounds,
#   --no-depth, ...; see its --help).
# The anchors are built once per machine by ../shared/anchors/build.sh (~10 minutes the first
# time, then reused); the perplexity text is ../shared/text/pride_and_prejudice.txt
# (KVLAB_SHARED_DIR overrides ../shared; without it the perplexity check is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build work=/tmp/kvlab-bench-models shape=110m
args=()
while (($#)); do
  case "$1" in
    --quick) args+=(--threads 2 --rounds 1 --ppl-windows 4) ;;
    --1b) shape=1b ;;
    --build) build=$2; shift ;;
    --work) work=$2; shift ;;
    --) shift; args+=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench_vs_anchors.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
shared=${KVLAB_SHARED_DIR:-$PWD/../shared}
[[ -x $shared/anchors/build.sh ]] || { echo "bench_vs_anchors.sh: $shared/anchors/build.sh not found (set KVLAB_SHARED_DIR)" >&2; exit 1; }
anchors=$("$shared/anchors/build.sh" | tail -n 1)
cmake --build "$build" --target kvlab >/dev/null
text=$shared/text/pride_and_prejudice.txt
[[ -f $text ]] || text=""
[[ $shape == 1b ]] && work=$work-1b
exec /usr/bin/python3 scripts/bench/bench_vs_anchors.py --kvlab "$build/bin/kvlab" --anchors "$anchors" \
  --work "$work" --shape "$shape" --text "$text" "${args[@]}"
