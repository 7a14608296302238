#include "policies/budget.h"

#include <algorithm>
#include <cmath>

#include "framework/core/error.h"

namespace kvlab {

int64_t TokenBudget::kept(int64_t n) const {
  if (n <= 0) return 0;
  if (budget_tokens > 0) return std::min(n, budget_tokens);
  // floor(r * n) in double is exact for every n < 2^53 at the r values a grid uses; the clamp
  // keeps a ratio just below 1 from removing the last token.
  const int64_t removed = int64_t(std::floor(compression_ratio * double(n)));
  return std::clamp<int64_t>(n - removed, 1, n);
}

TokenBudget TokenBudget::from_params(const ParamValues& p) {
  TokenBudget b;
  b.compression_ratio = p.get_float("compression_ratio");
  b.budget_tokens = p.get_int("budget_tokens");
  if (b.compression_ratio > 0 && b.budget_tokens > 0)
    fail("compression_ratio (", b.compression_ratio, ") and budget_tokens (", b.budget_tokens,
         ") are two ways to give the same budget: set one of them");
  return b;
}

ParamSpecs budget_param_specs(double default_ratio) {
  return {
      {"compression_ratio", ParamType::kFloat, default_ratio,
       "fraction of the context removed (kvpress's): n tokens keep n - floor(r*n); 0 keeps all",
       0.0, 0.999999, {}},
      {"budget_tokens", ParamType::kInt, int64_t(0),
       "tokens kept per layer and KV head (0: use compression_ratio); sinks/windows count inside",
       0.0, std::nullopt, {}},
  };
}

ParamSpec budget_layers_param_spec() {
  return {"budget_layers", ParamType::kString, std::string("all"),
          "layers the budget applies to: all, or global (a model's sliding-window layers keep their window)",
          std::nullopt, std::nullopt, {"all", "global"}};
}

bool budget_global_layers_only(const ParamValues& p) { return p.get_string("budget_layers") == "global"; }

ParamSpecs with_budget_params(ParamSpecs specs, double default_ratio) {
  for (ParamSpec& s : budget_param_specs(default_ratio)) specs.push_back(std::move(s));
  return specs;
}

}  // namespace kvlab
