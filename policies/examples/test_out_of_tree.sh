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
# Every header a plugin needs is installed, and each compiles on its own against the installed
# tree only (one translation unit per installed header, in a plugin of its own project).
inc=$work/prefix/include/kvlab
for h in framework/policy/policy.h framework/policy/params.h framework/policy/plugin.h \
         framework/policy/simple_factory.h policies/scorer.h policies/budget.h policies/cache_scan.h \
         kernels/common/selection.h; do
  [[ -f $inc/$h ]] || { echo "plugin header $h is not installed (component policy_api)" >&2; exit 1; }
done
hdr=$work/headers
mkdir -p "$hdr"
mapfile -t headers < <(cd "$inc" && find . -name '*.h' | sed 's|^\./||' | sort)
sources=()
for h in "${headers[@]}"; do
  f=$hdr/tu_$(tr '/.' '__' <<<"$h").cpp
  printf '#include "%s"\n' "$h" >"$f"
  sources+=("$f")
done
cat >"$hdr/entry.cpp" <<'CPP'
#include "framework/policy/plugin.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/cache_scan.h"
#include "policies/scorer.h"
namespace {
struct Nothing final : kvlab::AttentionPolicy {
  void reset() override {}
};
struct NothingFactory final : kvlab::SimplePolicyFactory {
  NothingFactory()
      : SimplePolicyFactory("headers_a", "every installed header", {},
                            [](const kvlab::ParamValues&, const kvlab::PolicyModelShape&) {
                              return std::make_unique<Nothing>();
                            }) {}
};
struct OtherFactory final : kvlab::SimplePolicyFactory {
  OtherFactory()
      : SimplePolicyFactory("headers_b", "every installed header", {},
                            [](const kvlab::ParamValues&, const kvlab::PolicyModelShape&) {
                              return std::make_unique<Nothing>();
                            }) {}
};
}  // namespace
KVLAB_POLICY_PLUGINS(KVLAB_POLICY_ENTRY("headers_a", NothingFactory), KVLAB_POLICY_ENTRY("headers_b", OtherFactory))
CPP
{
  echo 'cmake_minimum_required(VERSION 3.20)'
  echo 'project(kvlab_headers LANGUAGES CXX)'
  echo 'find_package(kvlab REQUIRED)'
  echo "kvlab_add_policy_plugin(headers entry.cpp ${sources[*]})"
} >"$hdr/CMakeLists.txt"
cmake -S "$hdr" -B "$hdr/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$hdr/build"
out=$("$kvlab" policies --names-only --plugin "$hdr/build/headers.so")
grep -qx "headers_a" <<<"$out" && grep -qx "headers_b" <<<"$out" ||
  { echo "the two policies of the headers plugin are not listed: $out" >&2; exit 1; }
echo "${#headers[@]} installed headers compile on their own"

out=$("$kvlab" policies --instantiate --plugin "$work/build/knorm.so")
echo "$out"
grep -q "^knorm_plugin" <<<"$out" || { echo "knorm_plugin not listed by kvlab policies" >&2; exit 1; }
grep -q "keep" <<<"$out" || { echo "knorm parameters not listed" >&2; exit 1; }
# The whole conformance suite on the out-of-tree build.
"$kvlab" check-policy --plugin "$work/build/knorm.so" || { echo "check-policy failed on knorm.so" >&2; exit 1; }
# A library that is not a plugin: the error names the file and the symbol.
nosym=$(find "$bin" -name 'libkvlab_test_plugin_nosym.so' | head -n 1)
if err=$("$kvlab" policies --plugin "$nosym" 2>&1); then
  echo "loading a non-plugin succeeded" >&2; exit 1
fi
grep -q "kvlab_policy_plugin" <<<"$err" || { echo "error does not name the symbol: $err" >&2; exit 1; }
echo "out-of-tree plugin OK"
