#include "policies/scorer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "framework/core/error.h"
#include "policies/cache_scan.h"

namespace kvlab {

// Ratios round up: a short sequence keeps at least one token of each non-zero kind. (Rounding
// down would evict everything during the first 1/ratio tokens of a stream, sinks included.)
// Counts saturate at 2^53 tokens (more than any sequence holds): the parameters are finite and
// non-negative (validate_params) but may be huge, and a double past int64 does not convert.
static int64_t saturated_tokens(double x) {
  constexpr double kMax = 9007199254740992.0;  // 2^53
  return x >= kMax ? int64_t(kMax) : int64_t(x);
}
int64_t ScorerBudget::recent_tokens(int64_t n_seen) const {
  return saturated_tokens(ratio ? std::ceil(recent * double(n_seen) - 1e-9) : recent);
}
int64_t ScorerBudget::keep_tokens(int64_t n_seen) const {
  return saturated_tokens(ratio ? std::ceil(keep * double(n_seen) - 1e-9) : keep);
}

ScorerBudget ScorerBudget::from_params(const ParamValues& p, const std::string& keep_name) {
  ScorerBudget b;
  b.sinks = p.get_int("sinks");
  b.recent = p.get_float("recent");
  b.keep = p.get_float(keep_name);
  b.ratio = p.get_string("units") == "ratio";
  // A ratio is a fraction of the tokens seen: above 1 it is almost surely a token count written
  // without `units: tokens` (heavy: 64 would keep 6400%). Not a static bound of the spec, since
  // the same parameters take token counts.
  for (const auto& [name, x] : {std::pair<std::string, double>{"recent", b.recent}, {keep_name, b.keep}})
    if (b.ratio && x > 1)
      fail(name, " = ", x, " with units: ratio (the default): a ratio must be in [0, 1] (a fraction "
           "of the tokens seen); for a token count set units: tokens");
  if (!b.ratio && (b.recent != std::floor(b.recent) || b.keep != std::floor(b.keep)))
    fail("units: tokens needs whole numbers for 'recent' and '", keep_name, "', got ",
         b.recent, " and ", b.keep);
  return b;
}

ParamSpecs scorer_param_specs(const ScorerDefaults& d) {
  return {
      {"sinks", ParamType::kInt, d.sinks, "first resident tokens always kept", 0.0, std::nullopt, {}},
      {"recent", ParamType::kFloat, d.recent,
       "most recent tokens always kept (tokens, or ratio of the length with units=ratio)", 0.0,
       std::nullopt, {}},
      {d.keep_name, ParamType::kFloat, d.keep, d.keep_doc + " (tokens, or ratio of the length)",
       0.0, std::nullopt, {}},
      {"units", ParamType::kString, d.units, "how recent and " + d.keep_name + " are given",
       std::nullopt, std::nullopt, {"ratio", "tokens"}},
  };
}

int64_t ScorerPolicy::budget_tokens(int layer, int64_t n_seen) const {
  const double scale = layer_budget_scale(layer);
  return budget_.sinks + saturated_tokens(std::floor(double(budget_.recent_tokens(n_seen)) * scale)) +
         saturated_tokens(std::floor(double(budget_.keep_tokens(n_seen)) * scale));
}

void ScorerPolicy::after_attention(const LayerStep& step, const StepStats& stats,
                                   Evictions& out) {
  observe(step, stats);
  const int64_t n_seen = tokens_seen(step);
  const int64_t sinks = budget_.sinks;
  const double scale = layer_budget_scale(step.layer);
  const int64_t recent = saturated_tokens(std::floor(double(budget_.recent_tokens(n_seen)) * scale));
  const int64_t keep = saturated_tokens(std::floor(double(budget_.keep_tokens(n_seen)) * scale));
  const CacheScan scan(*step.cache, step.shape.n_kv_heads);
  for (int h = 0; h < step.shape.n_kv_heads; ++h) {
    scan.valid_slots(h, slots_, &positions_);
    const int64_t n = int64_t(slots_.size());
    if (n <= sinks + recent + keep) continue;
    // Candidates: ranks [sinks, n - recent).
    const int64_t first = sinks, last = n - recent;
    candidates_.clear();
    for (int64_t r = first; r < last; ++r) candidates_.push_back({slots_[r], positions_[r]});
    scores_.assign(candidates_.size(), 0.f);
    score(step, stats, h, candidates_, scores_);
    order_.resize(candidates_.size());
    std::iota(order_.begin(), order_.end(), 0);
    // Higher score first; ties to the lower position (candidates are in position order).
    auto better = [&](int32_t a, int32_t b) {
      return scores_[a] != scores_[b] ? scores_[a] > scores_[b] : a < b;
    };
    std::nth_element(order_.begin(), order_.begin() + keep, order_.end(), better);
    evicted_positions_.clear();
    for (size_t k = size_t(keep); k < order_.size(); ++k) {
      out.slots[h].push_back(candidates_[order_[k]].slot);
      evicted_positions_.push_back(candidates_[order_[k]].position);
    }
    std::sort(out.slots[h].begin(), out.slots[h].end());
    std::sort(evicted_positions_.begin(), evicted_positions_.end());
    on_evict(step.layer, h, evicted_positions_);
  }
}

}  // namespace kvlab
