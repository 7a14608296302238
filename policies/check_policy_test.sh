#!/bin/bash
# `kvlab check-policy` passes on the example plugin (knorm) and fails, naming the check, on the
# two deliberately broken policies of the test plugin pair (framework/policy/testdata/plugin_pair.cpp).
# Usage: check_policy_test.sh KVLAB KNORM.so PAIR.so
set -uo pipefail
kvlab=$1 knorm=$2 pair=$3
status=0
die() { echo "FAILED: $*" >&2; status=1; }

out=$("$kvlab" check-policy --plugin "$knorm" 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 ]] || die "check-policy on knorm exited $rc"
for c in sim.unlimited_equals_full sim.mask_equals_dense sim.invariants sim.deterministic_batched_reset \
         engine.unlimited_equals_full engine.mask_equals_dense engine.resident_within_budget engine.batched_reset; do
  grep -qE "^(PASS|SKIP)  $c +knorm_plugin" <<<"$out" || die "no line for $c on knorm"
done
grep -qE "^PASS  sim.invariants +knorm_plugin\{keep=0.2" <<<"$out" || die "knorm's own acting configuration did not run"
grep -q "^FAIL" <<<"$out" && die "a check failed on knorm"
grep -qE "^check-policy: [0-9]+ checks: [0-9]+ passed, 0 failed" <<<"$out" || die "no summary line"

# over_budget keeps one token more than the budget it reports.
out=$("$kvlab" check-policy --plugin "$pair" --policy over_budget 2>&1); rc=$?
echo "$out"
[[ $rc -eq 1 ]] || die "check-policy on over_budget exited $rc, not 1"
grep -qE "^FAIL  sim.invariants +over_budget\{recent=8 \}: .*resident > budget" <<<"$out" || die "sim budget breach not reported"
grep -qE "^FAIL  engine.resident_within_budget +over_budget" <<<"$out" || die "engine budget breach not reported"
grep -qE "^PASS  sim.unlimited_equals_full +over_budget" <<<"$out" || die "over_budget's unlimited check should pass"

# unseeded picks its victims from a process-wide counter: not deterministic.
out=$("$kvlab" check-policy --plugin "$pair" --policy unseeded --check sim.deterministic_batched_reset \
      --check engine.batched_reset 2>&1); rc=$?
echo "$out"
[[ $rc -eq 1 ]] || die "check-policy on unseeded exited $rc, not 1"
grep -qE "^FAIL  sim.deterministic_batched_reset +unseeded.*not deterministic" <<<"$out" || die "nondeterminism not reported"
grep -qE "^FAIL  engine.batched_reset +unseeded" <<<"$out" || die "engine nondeterminism not reported"

# Bad input: one clear error line, exit status 1.
err=$("$kvlab" check-policy --plugin /nonexistent/nope.so 2>&1); rc=$?
[[ $rc -eq 1 && $err == *"/nonexistent/nope.so"* ]] || die "missing plugin: exit $rc, '$err'"
err=$("$kvlab" check-policy 2>&1); rc=$?
[[ $rc -eq 1 && $err == *"--plugin"* ]] || die "no arguments: exit $rc, '$err'"
err=$("$kvlab" check-policy --policy knorm_plugin 2>&1); rc=$?
[[ $rc -eq 1 && $err == *"unknown policy 'knorm_plugin'"* ]] || die "unknown policy: exit $rc, '$err'"
err=$("$kvlab" check-policy --plugin "$knorm" --check sim.nope 2>&1); rc=$?
[[ $rc -eq 1 && $err == *"sim.nope"* ]] || die "unknown check: exit $rc, '$err'"
[[ $status -eq 0 ]] && echo "check-policy OK"
exit $status
