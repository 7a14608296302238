#include "policies/scorers.h"

#include "framework/core/error.h"
#include "policies/budget.h"

namespace kvlab {

const std::vector<ScorerEntry>& builtin_scorers() {
  static const std::vector<ScorerEntry> all = {snapkv_scorer(), tova_scorer(), knorm_scorer(),
                                               random_scorer()};
  return all;
}

const ScorerEntry& find_scorer(const std::string& name) {
  std::string known;
  for (const ScorerEntry& e : builtin_scorers()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  fail("unknown scorer '", name, "' (known: ", known, ")");
}

ParamSpec compress_param_spec(const std::string& default_value) {
  return {"compress", ParamType::kString, default_value,
          "when to compress: once at the prompt end (kvpress's protocol) or after every step",
          std::nullopt, std::nullopt, {"prompt_end", "every_step"}};
}

bool compresses_every_step(const ParamValues& p) { return p.get_string("compress") == "every_step"; }

std::unique_ptr<AttentionPolicy> make_uniform_scorer_policy(const ScorerEntry& entry,
                                                            const ParamValues& p) {
  const TokenBudget b = TokenBudget::from_params(p);
  const bool every = compresses_every_step(p);
  ScorerPlan plan = uniform_plan(b.compression_ratio, b.budget_tokens, 0, entry.protected_recent(p), !every);
  plan.global_layers_only = budget_global_layers_only(p);
  return make_scorer_policy(entry.make(p, every), std::move(plan));
}

ParamSpecs with_budget(ParamSpecs specs, const std::string& compress_default) {
  specs = with_budget_params(std::move(specs));
  specs.push_back(budget_layers_param_spec());
  specs.push_back(compress_param_spec(compress_default));
  return specs;
}

std::unique_ptr<PolicyFactory> make_scorer_factory(std::string name, std::string doc, ParamSpecs specs,
                                                   SimplePolicyFactory::CreateFn create,
                                                   SimplePolicyFactory::Conformance conformance) {
  return std::make_unique<SimplePolicyFactory>(std::move(name), std::move(doc), std::move(specs),
                                               std::move(create),
                                               std::map<std::string, ParamValue>{{"compression_ratio", 0.0}},
                                               std::move(conformance));
}

std::unique_ptr<PolicyFactory> make_uniform_scorer_factory(ScorerEntry (*entry)(), std::string doc,
                                                           const std::string& compress_default,
                                                           SimplePolicyFactory::Conformance conformance) {
  const ScorerEntry e = entry();
  return make_scorer_factory(
      e.name, std::move(doc), with_budget(e.params, compress_default),
      [entry](const ParamValues& p, const PolicyModelShape&) { return make_uniform_scorer_policy(entry(), p); },
      std::move(conformance));
}

}  // namespace kvlab
