#!/usr/bin/env bash
# Builds kvlab's libFuzzer targets (fuzz/, clang-14, ASan + UBSan, CUDA/tests/benchmarks off) in
# their own build directory and runs each one for SECONDS (default 60), one after the other.
#
#   scripts/fuzz.sh [SECONDS]          build, regenerate the seeds, run every target
#   KVLAB_FUZZ_TARGETS="fuzz_gguf fuzz_hf" scripts/fuzz.sh 30     only these targets
#   KVLAB_FUZZ_BUILD_DIR=dir           build elsewhere (default build-fuzz)
#   KVLAB_FUZZ_RUNS=N                  also stop each target after N executions
#   KVLAB_FUZZ_SEED=n                  libFuzzer's -seed (default: a new random seed per run);
#                                      with KVLAB_FUZZ_RUNS and a fresh corpus, a run repeats
#   KVLAB_FUZZ_JOBS=n                  build jobs (default: nproc)
#   KVLAB_FUZZ_NO_BUILD=1              run what is built (no cmake)
#   KVLAB_FUZZ_NICE=19                 run the fuzzers under nice (shared machines)
#   KVLAB_FUZZ_TMPDIR=dir              where targets write their files (default: /dev/shm when
#                                      writable, else BUILD/tmp)
#   KVLAB_FUZZ_TIMEOUT=s               libFuzzer's -timeout per input (default 10)
#
# Per target: seeds (fuzz/make_corpus.py, regenerated each time into BUILD/seeds/TARGET) and the
# persistent corpus BUILD/corpus/TARGET (new inputs land there), the dictionary fuzz/dict/*.dict,
# limits -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048, leak detection on. A crash, leak,
# timeout or OOM leaves the input in BUILD/artifacts/TARGET/ and makes this script exit 1 after
# the remaining targets ran; the summary table lists executions, exec/s, coverage (cov, ft), corpus
# size and result per target (also in BUILD/fuzz-summary.txt, the latest invocation's, and in
# BUILD/fuzz-summary-PID.txt, kept per invocation for side-by-side runs; logs in BUILD/logs/,
# one per target, the latest run's). Replay an artifact with
#   BUILD/fuzz/TARGET BUILD/artifacts/TARGET/crash-...      (then add a regression test)
#
# A long campaign (10M+ executions per target), in the background on a shared machine:
#   KVLAB_FUZZ_RUNS=10000000 nice -n 19 scripts/fuzz.sh 86400 > fuzz.log 2>&1 &
# Each target stops at 10M executions or a day. To resume, run the same command again: the
# corpus in BUILD/corpus/TARGET is where it left off (libFuzzer reads it first). Between
# campaigns, shrink a corpus without losing coverage:
#   BUILD/fuzz/TARGET -merge=1 BUILD/corpus/TARGET.min BUILD/corpus/TARGET && mv ...
# Several cores: run targets side by side (KVLAB_FUZZ_TARGETS=one per shell), or give one target
# -fork=N by hand. Fuzz targets write only under their temporary directory (TMPDIR is set to
# KVLAB_FUZZ_TMPDIR/TARGET-PID here) and are deterministic. The temporary directory is in memory
# by default: fuzz_results writes results files as kvlab does (fsync, rename), and on a busy
# disk those fsyncs alone passed libFuzzer's 10 s timeout (an input that ran in 1.1 s alone).
# libFuzzer's -timeout is wall-clock time, so under nice on a loaded machine raise it
# (KVLAB_FUZZ_TIMEOUT) rather than take a slow run for a hang; replay a timeout without nice.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${KVLAB_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${KVLAB_FUZZ_JOBS:-$(nproc)}
all_targets=(fuzz_gguf fuzz_hf fuzz_llama2c fuzz_tokenizer_json fuzz_spm_model fuzz_llama2c_vocab
             fuzz_tokenizer_codec fuzz_experiment fuzz_results)
read -r -a targets <<<"${KVLAB_FUZZ_TARGETS:-${all_targets[*]}}"
dict_of() { local t=${1#fuzz_}; echo "fuzz/dict/$t.dict"; }

if [[ -z ${KVLAB_FUZZ_NO_BUILD:-} ]]; then
  command -v clang++-14 >/dev/null || { echo "fuzz: clang++-14 not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
  start=$(date +%s)
  log="$build/build.log"
  mkdir -p "$build"
  echo "fuzz: building $build (log: $log)" >&2
  generator=()
  command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]] && generator=(-G Ninja)
  if ! { cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
           -DCMAKE_CXX_COMPILER=clang++-14 -DKVLAB_FUZZ=ON -DKVLAB_CUDA=OFF -DKVLAB_BUILD_TESTS=OFF \
           -DKVLAB_BUILD_BENCH=OFF ${KVLAB_FUZZ_CMAKE_ARGS:-} &&
         cmake --build "$build" -j "$jobs" --target fuzz_all; } >"$log" 2>&1; then
    grep -E "error|Error" "$log" | head -n 40 >&2 || tail -n 40 "$log" >&2
    echo "fuzz: build failed (full log: $log)" >&2
    exit 1
  fi
  echo "fuzz: built in $(( $(date +%s) - start )) s" >&2
fi

# Seeds are regenerated per invocation (several invocations may run side by side).
seeds="$build/seeds-$$"
trap 'rm -rf "$seeds"' EXIT
writer=()
[[ -x $build/fuzz/make_results_seeds ]] && writer=(--results-seed-writer "$build/fuzz/make_results_seeds")
/usr/bin/python3 fuzz/make_corpus.py "$seeds" "${writer[@]}" >/dev/null
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
summary="$build/fuzz-summary-$$.txt"
printf "%-22s %10s %8s %7s %7s %7s  %s\n" target execs exec/s cov ft corpus result >"$summary"
failed=0
for t in "${targets[@]}"; do
  tmp_root=${KVLAB_FUZZ_TMPDIR:-}
  if [[ -z $tmp_root ]]; then
    tmp_root="$build/tmp"
    [[ -d /dev/shm && -w /dev/shm ]] && tmp_root=/dev/shm/kvlab-fuzz
  fi
  corpus="$build/corpus/$t" artifacts="$build/artifacts/$t" tmp="$tmp_root/$t-$$"
  mkdir -p "$corpus" "$artifacts" "$tmp"
  libfuzzer_args=()
  [[ -n ${KVLAB_FUZZ_RUNS:-} ]] && libfuzzer_args=(-runs="$KVLAB_FUZZ_RUNS")
  [[ -n ${KVLAB_FUZZ_SEED:-} ]] && libfuzzer_args+=(-seed="$KVLAB_FUZZ_SEED")
  log="$build/logs/$t.log"
  mkdir -p "$build/logs"
  echo "fuzz: $t for ${seconds}s" >&2
  rc=0
  TMPDIR="$tmp" nice -n "${KVLAB_FUZZ_NICE:-0}" "$build/fuzz/$t" -max_total_time="$seconds" -timeout="${KVLAB_FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 \
      -malloc_limit_mb=2048 -print_final_stats=1 -dict="$(dict_of "$t")" -artifact_prefix="$artifacts/" \
      "${libfuzzer_args[@]}" "$corpus" "$seeds/$t" >"$log" 2>&1 || rc=$?
  rm -rf "$tmp"
  execs=$(awk '/^stat::number_of_executed_units:/ {print $2}' "$log" | tail -1)
  rate=$(awk '/^stat::average_exec_per_sec:/ {print $2}' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  result=ok
  if ((rc != 0)); then
    failed=1
    result="FAILED (exit $rc): $(grep -m1 -oE 'ERROR: [A-Za-z]+: [a-z-]+[^ ]*|runtime error: .*|ERROR: libFuzzer: [a-z-]+' "$log" || echo see "$log") -> $artifacts"
  fi
  printf "%-22s %10s %8s %7s %7s %7s  %s\n" "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" \
      "$(ls "$corpus" | wc -l)" "$result" >>"$summary"
done
cat "$summary"
cp "$summary" "$build/fuzz-summary.txt"
if ((failed)); then
  echo "fuzz: a target failed; logs in $build/logs, inputs in $build/artifacts" >&2
  exit 1
fi
