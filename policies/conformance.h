// The policy conformance suite as a library: the checks that policy_conformance_test and
// policy_engine_conformance_test assert, and that `kvlab check-policy --plugin FILE.so` runs on a
// user's plugin. Each check runs one policy under one parameter set and returns a Verdict.
//
// Cases: for each policy, its factory's conformance_configs() (PolicyFactory::ConformanceConfig:
// acting parameters and the flags evicts / mask_based / sinks_param, all asserted), plus the
// entries of the central compat table (policy_testing.h acting_policy_configs) with no flag
// asserted; a policy with neither runs with its defaults.
//
// Simulator checks (engine-free, policy_testing.h; fp64 reference attention):
//   sim.unlimited_equals_full      unlimited_params() equals `full` (1e-5), two schedules
//   sim.mask_equals_dense          a claimed mask equals dense attention under it (2e-5); the
//                                  built-in patterns' claims against kernels/common/masks.h
//   sim.invariants                 valid selections/evictions, resident <= budget_tokens,
//                                  sinks resident, evicts really evicts
//   sim.deterministic_batched_reset  same run twice == ; two interleaved == alone; reset == new
// Engine checks (framework/engine on a random-weight 2-layer model, 110 tokens):
//   engine.unlimited_equals_full   logits within two fp32 passes' bound (logit_bound.h)
//   engine.mask_equals_dense       logits vs a double-precision masked forward pass
//   engine.resident_within_budget  per step, per layer and KV head; fewer KV bytes than full
//                                  when the budget is under half the length; evicts evicts
//   engine.batched_reset           batch of two == alone (1e-5), reset == new (exact)
//   engine.per_head_tables         per-head block tables: logits == per-layer tables' bit for
//                                  bit, same tokens resident, a head holds blocks only where it
//                                  has a live token (KvStore "Per-head block tables")
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/policy/policy.h"
#include "framework/policy/registry.h"

namespace kvlab::conformance {

// One policy under one parameter set.
struct Case {
  std::string policy;
  PolicyFactory::ConformanceConfig config;
  bool declared = false;  // from the factory: its flags are asserted
  std::string describe() const;  // "policy{key=value ...}"
};

// The cases of `names` (see above), in the order given.
std::vector<Case> cases(const PolicyRegistry& registry, const std::vector<std::string>& names);

struct Verdict {
  enum Kind { kPass, kFail, kSkip } kind = kPass;
  std::string detail;  // the first failure, or why skipped
  static Verdict pass() { return {}; }
  static Verdict fail(std::string d) { return {kFail, std::move(d)}; }
  static Verdict skip(std::string d) { return {kSkip, std::move(d)}; }
};

struct Check {
  std::string name;
  bool per_config = true;  // false: once per policy (the case's config is unused)
  std::function<Verdict(const PolicyRegistry&, const Case&)> run;
};
const std::vector<Check>& simulator_checks();
const std::vector<Check>& engine_checks();
const Check& check_named(const std::string& name);  // of either list; throws when unknown

// `check` on `c`; an exception (a policy that throws, bad parameters) is a failure.
Verdict run_check(const Check& check, const PolicyRegistry& registry, const Case& c);

// Every check of both lists on `names` (per-policy checks once per name, the others per case);
// `each` is called after each check with its name, the subject and the verdict.
struct Outcome {
  std::string check, subject;
  Verdict verdict;
};
std::vector<Outcome> run_all(const PolicyRegistry& registry, const std::vector<std::string>& names,
                             const std::function<void(const Outcome&)>& each = {});
// One check over `all` (the cases of `names`), or once per name when it is per policy.
std::vector<Outcome> run_check_over(const Check& check, const PolicyRegistry& registry,
                                    const std::vector<std::string>& names, const std::vector<Case>& all,
                                    const std::function<void(const Outcome&)>& each = {});

// ---- pieces the gtest suites reuse for their built-in-specific tests ------------------------
namespace engine {
inline constexpr int kPrefill = 20;  // run_logits' prompt: the first kPrefill tokens, one prefill
const Model& tiny_model();  // 2 layers, 6 heads, 2 KV heads, head_dim 16, vocab 97, random weights
std::vector<int32_t> random_tokens(int n, uint32_t seed);
EngineOptions engine_options(int max_batch = 1);  // threads 1, prefill chunks of 256
// All logits of a prefill of 20 tokens (all logits; it ends the prompt) then one-token decode steps; each_step
// after the prefill and after every decode step, with the tokens seen.
std::vector<float> run_logits(Engine& e, std::unique_ptr<AttentionPolicy> p, const std::vector<int32_t>& tokens,
                              const std::function<void(SeqId, int64_t n_seen)>& each_step = {});
// Logits of a token-by-token double-precision forward pass whose attention reads exactly the
// keys mask(layer, kv_head, i, j) allows (no KV store).
std::vector<float> masked_reference(const Model& m, const std::vector<int32_t>& tokens,
                                    const std::function<bool(int, int, int64_t, int64_t)>& mask);
}  // namespace engine

}  // namespace kvlab::conformance
