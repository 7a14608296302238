#!/usr/bin/env bash
# Builds the whole project and test suite with AddressSanitizer + UndefinedBehaviorSanitizer in
# its own tree (CUDA and benchmarks off) and runs the suite there. Any sanitizer report fails
# the test that triggered it (halt_on_error; leaks are reported at exit and fail it too).
#   scripts/sanitize.sh                 build build-sanitize, run every test
#   scripts/sanitize.sh -R PATTERN      extra arguments go to ctest
#   KVLAB_SANITIZE_DIR=dir  KVLAB_JOBS=n  CXX=clang++-14 (compiler; default c++)
#   KVLAB_CMAKE_ARGS="..."  extra CMake arguments (e.g. -G Ninja, compiler launchers)
# Suppressions: scripts/sanitize.supp (LeakSanitizer), each with its reason. Prints the time
# each phase took; the run takes far longer than the plain suite (see README, "Testing").
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVLAB_SANITIZE_DIR:-build-sanitize}
jobs=${KVLAB_JOBS:-$(nproc)}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
start=$SECONDS
# -O1 -g: usable stacks, and a build and run markedly faster than -O0.
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLAB_CUDA=OFF -DKVLAB_BUILD_BENCH=OFF \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" ${KVLAB_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j "$jobs"
built=$SECONDS
echo "sanitize: built $dir in $((built - start)) s" >&2
supp=$PWD/scripts/sanitize.supp
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp:print_suppressions=0}
status=0
ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 1800 "$@" || status=$?
echo "sanitize: suite ran in $((SECONDS - built)) s (total $((SECONDS - start)) s), ctest status $status" >&2
exit $status
