#!/bin/bash
# Builds policies/examples against an installed kvlab plugin API (its own CMake project) and
# loads the plugin into the kvlab binary. Usage: test_out_of_tree.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=$1
bin=$2
kvlab=$bin/bin/kvlab
if [[ ! -x $kvlab ]]; then
  echo "needs the kvlab executable at $kvlab (build target kvlab first)" >&2
  exit 1
fi
work=$bin/plugin-out-of-tree
rm -rf "$work"
cmake --install "$bin" --prefix "$work/prefix" --component policy_api
cmake -S "$src/policies/examples" -B "$work/build" -DKVLAB_ROOT="$work/prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$work/build"
out=$("$kvlab" policies --instantiate --plugin "$work/build/knorm.so")
echo "$out"
grep -q "^knorm_plugin" <<<"$out" || { echo "knorm_plugin not listed by kvlab policies" >&2; exit 1; }
grep -q "keep" <<<"$out" || { echo "knorm parameters not listed" >&2; exit 1; }
# A library that is not a plugin: the error names the file and the symbol.
nosym=$(find "$bin" -name 'libkvlab_test_plugin_nosym.so' | head -n 1)
if err=$("$kvlab" policies --plugin "$nosym" 2>&1); then
  echo "loading a non-plugin succeeded" >&2; exit 1
fi
grep -q "kvlab_policy_plugin" <<<"$err" || { echo "error does not name the symbol: $err" >&2; exit 1; }
echo "out-of-tree plugin OK"
