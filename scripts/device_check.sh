#!/usr/bin/env bash
# The GPU check of the CUDA backend, one prepared script for a machine with an NVIDIA GPU.
#
#   scripts/device_check.sh [OUT_DIR]        (default: $OUT, else ./device_check_out)
#
# 1. configures and builds kernels/cuda standalone (needs only CUDA, cuBLAS, GoogleTest: the
#    vendored copy when the system has none) in a clean build dir, timed; architectures from
#    KVLAB_CUDA_ARCHS (default 90);
# 2. runs every CUDA test through ctest: each kernel against its CPU reference on random inputs
#    over awkward shapes (pages 1/7/16, head dims 64/128, GQA 1/4/8, lengths not a multiple of
#    the page, empty and full selections), plus the shared-math CPU tests;
# 3. one small decode and prefill test under compute-sanitizer memcheck, when it is installed
#    (KVLAB_SANITIZE=0 skips it; each run is capped at 90 s);
# 4. runs the benchmarks (bench.csv) and PyTorch SDPA flash on the prefill shapes (sdpa.csv) and
#    prints the speed targets (summary.txt);
# 5. when the machine has kvlab's other dependencies (yaml-cpp, HDF5, Boost, OpenBLAS,
#    sentencepiece, ...: scripts/setup.sh's list), builds the whole project with CUDA and runs the
#    engine on the GPU against the CPU engine (engine_device_test) and a whole experiment on both
#    (RunE2e.CudaRunAgreesWithTheCpuRun); otherwise says it skipped them (KVLAB_FULL_CHECK=0
#    skips it always).
# Everything lands in OUT_DIR: build.log, ctest.log, bench.csv, sdpa.csv, summary.txt, times.txt.
# Without a GPU it still builds; the tests skip with a message and the benchmarks say so.
# Exit status: non-zero when the build or a test fails (benchmarks never fail the check).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${OUT:-$PWD/device_check_out}}"
build="${KVLAB_CUDA_BUILD_DIR:-${TMPDIR:-/tmp}/kvlab-cuda-check-build}"
archs="${KVLAB_CUDA_ARCHS:-90}"
jobs="$(nproc 2>/dev/null || echo 4)"
python="${PYTHON:-python3}"
mkdir -p "$out"
status=0
t0=$(date +%s)
stamp() { echo "$1: $(( $(date +%s) - t0 )) s" | tee -a "$out/times.txt"; }

{
  echo "# $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 | tail -2 || echo "nvcc: not on PATH"
} | tee "$out/machine.txt"

# 1. Clean build.
rm -rf "$build"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if cmake -S "$root/kernels/cuda" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_ARCHITECTURES="$archs" >"$out/build.log" 2>&1 &&
   cmake --build "$build" -j "$jobs" >>"$out/build.log" 2>&1; then
  stamp "build (clean, archs $archs, $jobs jobs)"
else
  stamp "build FAILED"
  tail -40 "$out/build.log"
  exit 1
fi

# 2. Tests.
if ctest --test-dir "$build" --output-on-failure --timeout 300 -j 4 >"$out/ctest.log" 2>&1; then
  stamp "tests passed"
else
  status=1
  stamp "tests FAILED"
fi
tail -15 "$out/ctest.log"
if grep -q "(Skipped)" "$out/ctest.log"; then
  reason="$("$build/kernels_cuda_layer_test" --gtest_filter=LayerOpsGpu.RmsNorm 2>&1 | grep -m1 -o "needs a CUDA GPU.*")"
  echo "GPU tests skipped: ${reason:-unknown reason}"
  if nvidia-smi -L 2>/dev/null | grep -q "GPU"; then
    status=1  # a GPU is there but the tests could not use it: not a pass
    echo "ERROR: nvidia-smi lists a GPU but the CUDA tests skipped"
  fi
fi

# 3. Memory check of one small case of each attention kernel.
if [[ "${KVLAB_SANITIZE:-1}" == "1" ]] && command -v compute-sanitizer >/dev/null 2>&1; then
  for t in "kernels_cuda_decode_test --gtest_filter=*ManySplits*" \
           "kernels_cuda_prefill_test --gtest_filter=*LongCausalDense*"; do
    # shellcheck disable=SC2086
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$build"/$t \
      >>"$out/sanitizer.log" 2>&1 || { status=1; echo "compute-sanitizer: $t failed (sanitizer.log)"; }
  done
  stamp "compute-sanitizer"
fi

# 4. Benchmarks (never fail the check).
"$build/kvlab_cuda_bench" --csv "$out/bench.csv" 2>&1 | tee "$out/bench.log" || echo "kvlab_cuda_bench failed"
stamp "benchmarks"
"$python" "$root/kernels/cuda/bench_sdpa.py" --csv "$out/sdpa.csv" 2>&1 | tee "$out/sdpa.log" || echo "bench_sdpa failed"
stamp "sdpa reference"
"$python" "$root/kernels/cuda/bench_summary.py" "$out/bench.csv" "$out/sdpa.csv" | tee "$out/summary.txt"

# 5. The engine on the GPU against the CPU engine (needs the full dependency set).
if [[ "${KVLAB_FULL_CHECK:-1}" == "1" ]]; then
  full="${build}-full"
  rm -rf "$full"
  if cmake -S "$root" -B "$full" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKVLAB_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="$archs" >"$out/full_build.log" 2>&1; then
    if timeout 300 cmake --build "$full" -j "$jobs" --target engine_device_test run_e2e_test kvlab \
         >>"$out/full_build.log" 2>&1; then
      stamp "full build"
      (cd "$full" && timeout 240 ctest --output-on-failure -R "EngineDevice|RunE2e" >"$out/engine_device.log" 2>&1) \
        || { status=1; echo "engine on the GPU: FAILED (engine_device.log)"; }
      tail -8 "$out/engine_device.log"
      stamp "engine device tests"
    else
      status=1
      echo "full build FAILED (full_build.log)"; tail -20 "$out/full_build.log"
    fi
  else
    echo "engine device tests skipped: the full kvlab does not configure here (missing dependencies; full_build.log):"
    grep -m3 -iE "could not find|not found" "$out/full_build.log" || true
  fi
fi
stamp "total"
exit $status
