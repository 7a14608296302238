// The built-in KeyScorers (scorer.h), by name, for the policies made of them and for wrappers
// that take any of them (adakv's `scorer` parameter):
//   snapkv  observation-window attention, pooled (POLICIES.md 11)     snapkv.cpp
//   tova    the last query's attention (POLICIES.md 14)               tova.cpp
//   knorm   -||k||: low-norm keys kept (arXiv 2406.11430)             knorm.cpp
//   random  a seeded uniform score: the floor every method must beat  random.cpp
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/policy/params.h"
#include "framework/policy/simple_factory.h"
#include "policies/scorer.h"

namespace kvlab {

struct ScorerEntry {
  std::string name;
  ParamSpecs params;  // the scorer's own (budgets and `compress` are the policy's)
  // every_step: the scorer runs after every step (else at the prompt end only).
  std::function<std::unique_ptr<KeyScorer>(const ParamValues&, bool every_step)> make;
  // Most recent tokens the scorer needs kept (SnapKV's observation window), inside the budget.
  std::function<int64_t(const ParamValues&)> protected_recent;
};

// A scorer without parameters or protected tokens (knorm, random).
template <class Scorer>
ScorerEntry parameterless_scorer(std::string name) {
  ScorerEntry e;
  e.name = std::move(name);
  e.make = [](const ParamValues&, bool) -> std::unique_ptr<KeyScorer> { return std::make_unique<Scorer>(); };
  e.protected_recent = [](const ParamValues&) { return int64_t(0); };
  return e;
}

ScorerEntry snapkv_scorer();
ScorerEntry tova_scorer();
ScorerEntry knorm_scorer();
ScorerEntry random_scorer();
const std::vector<ScorerEntry>& builtin_scorers();
const ScorerEntry& find_scorer(const std::string& name);  // Error naming the known ones

// `compress`: prompt_end | every_step, with the given default.
ParamSpec compress_param_spec(const std::string& default_value);
bool compresses_every_step(const ParamValues& p);

// A scorer policy of the one budget convention: `entry` with compression_ratio/budget_tokens
// (budget.h) and `compress`, the entry's protected recent tokens inside the budget.
std::unique_ptr<AttentionPolicy> make_uniform_scorer_policy(const ScorerEntry& entry,
                                                            const ParamValues& p);

// `specs`, then compression_ratio/budget_tokens (budget.h; the ratio defaults to 0 as kvpress's:
// an experiment states its budget) and `compress` with the given default.
ParamSpecs with_budget(ParamSpecs specs, const std::string& compress_default);

// The factory of a scorer-based policy: unlimited (equal to `full`) at compression_ratio 0;
// `conformance`: its acting parameter sets (PolicyFactory::conformance_configs).
std::unique_ptr<PolicyFactory> make_scorer_factory(std::string name, std::string doc, ParamSpecs specs,
                                                   SimplePolicyFactory::CreateFn create,
                                                   SimplePolicyFactory::Conformance conformance);

// The factory of make_uniform_scorer_policy(entry(), ...): the entry's parameters with_budget.
std::unique_ptr<PolicyFactory> make_uniform_scorer_factory(ScorerEntry (*entry)(), std::string doc,
                                                           const std::string& compress_default,
                                                           SimplePolicyFactory::Conformance conformance);

}  // namespace kvlab
