// Conformance of every registered policy (built-ins and the example plugin, loaded through the
// plugin loader), on the engine-free simulator (policy_testing.h). The checks live in
// policies/conformance.h (also run by `kvlab check-policy`); each factory supplies its acting
// parameter sets (PolicyFactory::conformance_configs):
//   1. with its unlimited parameters every policy equals `full` (same outputs to fp tolerance);
//   2. every mask-based policy equals dense attention under the mask it claims, the reference
//      built from the generator (for the union patterns, from kernels/common/masks.h functors);
//   3. invariants each step: contract-valid selections and evictions, resident <= budget,
//      sinks kept, evicting configurations evict;
//   4. deterministic, two interleaved sequences == each alone, reset == new.
#include <gtest/gtest.h>

#include "framework/policy/simple_factory.h"
#include "policies/builtin.h"
#include "policies/conformance.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

using conformance::Case;
using conformance::Verdict;

PolicyRegistry& registry() { return testing::builtins_and_plugin(KVLAB_EXAMPLE_PLUGIN); }

std::vector<Case> cases() { return conformance::cases(registry(), registry().names()); }

// Runs `check` on every case (or every policy, for a per-policy check); returns how many ran
// (not skipped).
int expect_passes(const std::string& check_name) {
  int ran = 0;
  for (const conformance::Outcome& o : conformance::run_check_over(conformance::check_named(check_name), registry(),
                                                                   registry().names(), cases())) {
    EXPECT_NE(o.verdict.kind, Verdict::kFail) << check_name << " " << o.subject << ": " << o.verdict.detail;
    ran += o.verdict.kind == Verdict::kPass;
  }
  return ran;
}

TEST(PolicyConformance, RegistryHoldsBuiltinsAndPlugin) {
  EXPECT_EQ(registry().names().size(), make_builtin_registry().names().size() + 1);
  EXPECT_NE(registry().find("knorm_plugin"), nullptr);
  EXPECT_EQ(registry().origin("knorm_plugin"), KVLAB_EXAMPLE_PLUGIN);
}

// The policies whose entries left the central table supply their own acting configurations
// (flags asserted); every registered policy runs with acting parameters from its factory or the
// compat table, never only with its defaults.
TEST(PolicyConformance, EveryPolicyHasActingConfigurations) {
  for (const std::string& n : registry().names())
    EXPECT_FALSE(registry().at(n).conformance_configs().empty()) << n;
  int declared = 0;
  for (const Case& c : cases()) declared += c.declared;
  EXPECT_GE(declared, 39);  // 17 before API v4's baselines, their 22
  const auto compat = testing::acting_policy_configs(registry().names());
  for (const std::string& n : registry().names()) {
    bool acting = !registry().at(n).conformance_configs().empty();
    for (const auto& c : compat) acting |= c.policy == n;
    EXPECT_TRUE(acting) << n << " has neither conformance_configs() nor a compat entry";
  }
}

// A factory without conformance_configs() (written before API v4) still runs, with its
// defaults and no flag asserted; its "sinks" parameter is checked as before.
TEST(PolicyConformance, FactoryWithoutConfigsRunsItsDefaults) {
  PolicyRegistry r = make_builtin_registry();
  r.add(std::make_unique<SimplePolicyFactory>(
      "old_sinks", "sinks under another name, no conformance configurations",
      registry().at("sinks").params(), [](const ParamValues& p, const PolicyModelShape& shape) {
        return make_sinks_factory()->create(p, shape);
      }));
  const std::vector<Case> c = conformance::cases(r, {"old_sinks"});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].declared);
  EXPECT_TRUE(c[0].config.params.empty());
  EXPECT_EQ(c[0].config.sinks_param, "sinks");
  for (const char* check : {"sim.invariants", "sim.deterministic_batched_reset"})
    EXPECT_EQ(conformance::run_check(conformance::check_named(check), r, c[0]).kind, Verdict::kPass) << check;
}

TEST(PolicyConformance, UnlimitedBudgetEqualsFull) { expect_passes("sim.unlimited_equals_full"); }

// The mask a policy claims, checked against an independent statement where one exists.
TEST(PolicyConformance, MaskPoliciesEqualDenseMaskedReference) {
  EXPECT_GE(expect_passes("sim.mask_equals_dense"), 8);
}

TEST(PolicyConformance, InvariantsEachStep) { expect_passes("sim.invariants"); }

TEST(PolicyConformance, DeterministicBatchedAndReset) { expect_passes("sim.deterministic_batched_reset"); }

// The checks can fail: a configuration that lies about its flags is caught.
TEST(PolicyConformance, WrongFlagsFail) {
  Case c{"sliding_window", {.params = {{"window", int64_t(9)}, {"mode", std::string("mask")}}}, true};
  c.config.evicts = true;  // mask mode keeps every key
  c.config.mask_based = true;
  EXPECT_EQ(conformance::run_check(conformance::check_named("sim.invariants"), registry(), c).kind, Verdict::kFail);
  c.config.evicts = false;
  c.config.mask_based = false;  // it does claim a mask
  EXPECT_EQ(conformance::run_check(conformance::check_named("sim.mask_equals_dense"), registry(), c).kind,
            Verdict::kFail);
  // "the first 9 positions stay resident" is false of a 9-token sliding window
  Case s{"sliding_window", {.params = {{"window", int64_t(9)}}, .evicts = true, .mask_based = true,
                            .sinks_param = "window"}, true};
  EXPECT_EQ(conformance::run_check(conformance::check_named("sim.invariants"), registry(), s).kind, Verdict::kFail);
}

}  // namespace
}  // namespace kvlab
