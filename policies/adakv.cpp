// adakv (POLICIES.md 13; arXiv 2407.11550; kvpress adakv_press.py): a wrapper over any built-in
// scorer (`scorer`: snapkv, tova, knorm, random, with that scorer's parameters). Per layer the
// budget of H_kv * B tokens is filled by the best scores across all KV heads jointly, so heads
// keep different numbers of tokens; each head first keeps its top floor(alpha * B), its
// protected tokens (SnapKV's window) counted among them as kvpress does by giving them the
// maximum score (alpha = 0.20 as kvpress). The allocation is ScorerPlan::across_heads
// (scorer.cpp). Heads of one layer then hold different token counts; in kvlab's store a block
// holds all KV heads of a layer, so a layer's blocks follow its fullest head (kv_store.h).
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/scorers.h"

namespace kvlab {

std::unique_ptr<PolicyFactory> make_adakv_factory() {
  std::vector<std::string> names;
  for (const ScorerEntry& e : builtin_scorers()) names.push_back(e.name);
  ParamSpecs specs = {
      {"scorer", ParamType::kString, std::string("snapkv"), "the scorer whose scores are allocated",
       std::nullopt, std::nullopt, names},
      {"alpha", ParamType::kFloat, 0.2, "safeguard: each head first keeps its top alpha * budget",
       0.0, 1.0, {}},
  };
  for (const ScorerEntry& e : builtin_scorers())  // every scorer's own parameters, by name
    for (const ParamSpec& s : e.params) {
      ParamSpec copy = s;
      copy.doc = "(scorer " + e.name + ") " + s.doc;
      specs.push_back(std::move(copy));
    }
  return make_scorer_factory(
      "adakv", "AdaKV: a scorer's budget allocated across the layer's KV heads jointly",
      with_budget(std::move(specs), "prompt_end"),
      [](const ParamValues& p, const PolicyModelShape& shape) {
        const ScorerEntry& e = find_scorer(p.get_string("scorer"));
        const TokenBudget b = TokenBudget::from_params(p);
        const bool every = compresses_every_step(p);
        ScorerPlan plan = uniform_plan(b.compression_ratio, b.budget_tokens, 0,
                                       e.protected_recent(p), !every);
        plan.across_heads = true;
        plan.global_layers_only = budget_global_layers_only(p);
        plan.alpha = p.get_float("alpha");
        plan.n_kv_heads = shape.n_kv_heads;
        return make_scorer_policy(e.make(p, every), std::move(plan));
      },
      {{.params = {{"compression_ratio", 0.5}, {"window", int64_t(2)}}, .evicts = true},  // conformance suite
       {.params = {{"budget_tokens", int64_t(9)}, {"scorer", std::string("tova")},
                   {"compress", std::string("every_step")}},
        .evicts = true},
       {.params = {{"compression_ratio", 0.6}, {"scorer", std::string("knorm")}, {"alpha", 0.5}}, .evicts = true}});
}

}  // namespace kvlab
