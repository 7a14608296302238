#!/usr/bin/env bash
# Sets kvlab up on a fresh Debian 12 machine: installs the Debian packages it needs (only those
# missing, so it is cheap to re-run), then configures and builds a Release tree in ./build.
#   scripts/setup.sh            install + build
#   KVLAB_BUILD_DIR=dir ...     build elsewhere;  KVLAB_JOBS=n  parallel build jobs
# Why each package is there: see README.md, "Dependencies".
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config git
  libgtest-dev libgmock-dev googletest libbenchmark-dev   # tests, benchmarks
  libboost-program-options-dev   # command line
  libyaml-cpp-dev                # experiment files
  libhdf5-dev                    # results files
  zlib1g-dev                     # inflating string datasets' chunks to check them
  libsentencepiece-dev           # SentencePiece tokenizers
  libpcre2-dev                   # byte-level BPE pre-tokenizer regex
  libicu-dev                     # NFC normalizer of byte-level BPE tokenizers (Qwen2)
  libopenblas-dev                # prefill GEMMs
  nlohmann-json3-dev             # tokenizer.json, config.json, safetensors headers
  python3-numpy python3-regex python3-sentencepiece   # independent references in tests
  python3-torch                  # the second (PyTorch) reference of llama_reference_test
  python3-h5py python3-matplotlib                     # results analysis (evals/analyze.py)
  clang-14 libclang-rt-14-dev    # libFuzzer targets (scripts/fuzz.sh, the CI fuzz step)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_dir=${KVLAB_BUILD_DIR:-build}
jobs=${KVLAB_JOBS:-$(nproc)}
log="$build_dir/setup.log"
mkdir -p "$build_dir"
echo "setup: building $build_dir (log: $log)" >&2
if ! { cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${KVLAB_CMAKE_ARGS:-} &&
       cmake --build "$build_dir" -j "$jobs"; } >"$log" 2>&1; then
  grep -E "error|Error" "$log" | head -n 40 >&2 || tail -n 40 "$log" >&2
  echo "setup: build failed (full log: $log)" >&2
  exit 1
fi
echo "setup: built $build_dir/bin/kvlab" >&2
