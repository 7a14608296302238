#include "policies/scorer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <string>
#include <utility>

#include "framework/core/error.h"
#include "policies/budget.h"
#include "policies/cache_scan.h"

namespace kvlab {

PolicyNeeds WindowScorer::needs() const {
  PolicyNeeds n;
  n.observation_window = window_;
  n.observe_every_step = every_step_;
  return n;
}

const float* WindowScorer::window_of(const StepStats& stats, int h) const {
  if (stats.window_attention.empty())
    fail(name_, ": no observation-window attention at this step (PolicyNeeds::observation_window)");
  return stats.window_attention.data() + size_t(h) * stats.n_slots;
}

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

ScorerPolicy::ScorerPolicy(const ScorerBudget& budget)
    : first_form_(true), budget_(budget), global_layers_only_(budget.global_layers_only) {}
ScorerPolicy::ScorerPolicy(ScorerPlan plan)
    : first_form_(false), plan_(std::move(plan)), global_layers_only_(plan_.global_layers_only) {
  KVLAB_CHECK(plan_.retention != nullptr);
}

void ScorerPolicy::reset() {
  prompt_tokens_ = -1;
  on_reset();
}

Retention ScorerPolicy::retention(int layer, int64_t n_seen) const {
  Retention r;
  if (first_form_) {
    const double scale = layer_budget_scale(layer);
    r.sinks = budget_.sinks;
    r.recent = saturated_tokens(std::floor(double(budget_.recent_tokens(n_seen)) * scale));
    r.total = r.sinks + r.recent + saturated_tokens(std::floor(double(budget_.keep_tokens(n_seen)) * scale));
  } else {
    r = plan_.retention(layer, n_seen);
  }
  if (r.total >= 0) {  // protected tokens are cut to fit the total, sinks first
    r.sinks = std::min(r.sinks, r.total);
    r.recent = std::min(r.recent, r.total - r.sinks);
  }
  return r;
}

int64_t ScorerPolicy::budget_tokens(int layer, int64_t n_seen) const {
  if (global_layers_only_ && layer >= 0 && size_t(layer) < local_layer_.size() && local_layer_[layer]) return -1;
  int64_t n = n_seen;
  if (!first_form_ && plan_.at_prompt_end) {
    if (prompt_tokens_ < 0 || n_seen < prompt_tokens_) return -1;
    n = prompt_tokens_;
  }
  const Retention r = retention(layer, n);
  if (r.total < 0) return -1;
  int64_t most = r.total;
  if (!first_form_ && plan_.across_heads) {
    // one head takes the layer's whole pool when the others keep only their safeguard
    const int64_t per_head = r.total - r.sinks - r.recent;
    const int64_t safe = std::clamp<int64_t>(int64_t(std::floor(plan_.alpha * double(r.total))) -
                                                 r.sinks - r.recent, 0, per_head);
    most = r.total + int64_t(plan_.n_kv_heads - 1) * (per_head - safe);
  }
  return std::min(most, n) + (n_seen - n);
}

void ScorerPolicy::after_attention(const LayerStep& step, const StepStats& stats, Evictions& out) {
  observe(step, stats);
  const int64_t n_seen = tokens_seen(step);
  if (!first_form_ && plan_.at_prompt_end) {
    if (!step.prompt_end) return;
    if (step.layer == 0) prompt_tokens_ = n_seen;
  }
  if (global_layers_only_ && step.sliding_window > 0) {  // a local layer: its window only
    if (local_layer_.size() <= size_t(step.layer)) local_layer_.resize(size_t(step.layer) + 1, 0);
    local_layer_[step.layer] = 1;
    return;
  }
  const Retention r = retention(step.layer, n_seen);
  if (r.total < 0) return;
  if (!first_form_ && plan_.across_heads)
    evict_across_heads(step, stats, r, out);
  else
    evict_per_head(step, stats, r, out);
}

void ScorerPolicy::evict_per_head(const LayerStep& step, const StepStats& stats, const Retention& r,
                                  Evictions& out) {
  const int64_t keep = r.total - r.sinks - r.recent;
  const CacheScan scan(*step.cache, step.shape.n_kv_heads);
  for (int h = 0; h < step.shape.n_kv_heads; ++h) {
    scan.valid_slots(h, slots_, &positions_);
    const int64_t n = int64_t(slots_.size());
    if (n <= r.total) continue;
    candidates_.clear();
    for (int64_t k = r.sinks; k < n - r.recent; ++k) candidates_.push_back({slots_[k], positions_[k]});
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

// AdaKV (POLICIES.md 13; kvpress adakv_press.py): the layer keeps H * (total - protected)
// candidates in all, the best across heads jointly, after each head's safeguard.
void ScorerPolicy::evict_across_heads(const LayerStep& step, const StepStats& stats,
                                      const Retention& r, Evictions& out) {
  const int n_kv = step.shape.n_kv_heads;
  const int64_t protect = r.sinks + r.recent;
  const int64_t per_head = r.total - protect;
  const int64_t safe = std::max<int64_t>(0, int64_t(std::floor(plan_.alpha * double(r.total))) - protect);
  struct Entry {
    float score;
    int32_t head, index;  // index into that head's candidates
  };
  std::vector<std::vector<ScoredSlot>> cands(n_kv);
  std::vector<std::vector<char>> kept(n_kv);
  std::vector<Entry> pool;
  const CacheScan scan(*step.cache, n_kv);
  bool over = false;
  int64_t n_candidates = 0;
  for (int h = 0; h < n_kv; ++h) {
    scan.valid_slots(h, slots_, &positions_);
    const int64_t n = int64_t(slots_.size());
    for (int64_t k = r.sinks; k < n - r.recent; ++k) cands[h].push_back({slots_[k], positions_[k]});
    n_candidates += int64_t(cands[h].size());
    over = over || n > r.total;
  }
  if (!over || n_candidates <= per_head * n_kv) return;
  int64_t pool_left = per_head * n_kv;
  for (int h = 0; h < n_kv; ++h) {
    scores_.assign(cands[h].size(), 0.f);
    if (!cands[h].empty()) score(step, stats, h, cands[h], scores_);
    kept[h].assign(cands[h].size(), 0);
    order_.resize(cands[h].size());
    std::iota(order_.begin(), order_.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      return scores_[a] != scores_[b] ? scores_[a] > scores_[b] : a < b;
    };
    const int64_t floor_h = std::min<int64_t>(safe, int64_t(order_.size()));
    std::partial_sort(order_.begin(), order_.begin() + floor_h, order_.end(), better);
    for (int64_t k = 0; k < floor_h; ++k) kept[h][order_[k]] = 1;
    pool_left -= floor_h;
    for (size_t k = 0; k < cands[h].size(); ++k)
      if (!kept[h][k]) pool.push_back({scores_[k], int32_t(h), int32_t(k)});
  }
  // Joint top pool_left; ties: higher score, then lower head, then lower position.
  pool_left = std::clamp<int64_t>(pool_left, 0, int64_t(pool.size()));
  auto better = [](const Entry& a, const Entry& b) {
    return std::tie(b.score, a.head, a.index) < std::tie(a.score, b.head, b.index);
  };
  std::nth_element(pool.begin(), pool.begin() + pool_left, pool.end(), better);
  for (int64_t k = 0; k < pool_left; ++k) kept[pool[k].head][pool[k].index] = 1;
  for (int h = 0; h < n_kv; ++h) {
    evicted_positions_.clear();
    for (size_t k = 0; k < cands[h].size(); ++k)
      if (!kept[h][k]) {
        out.slots[h].push_back(cands[h][k].slot);
        evicted_positions_.push_back(cands[h][k].position);
      }
    std::sort(out.slots[h].begin(), out.slots[h].end());
    on_evict(step.layer, h, evicted_positions_);
  }
}

namespace {

class ComposedScorerPolicy final : public ScorerPolicy {
 public:
  ComposedScorerPolicy(std::unique_ptr<KeyScorer> scorer, ScorerPlan plan)
      : ScorerPolicy(std::move(plan)), scorer_(std::move(scorer)) {}
  PolicyNeeds needs() const override { return scorer_->needs(); }

 protected:
  void score(const LayerStep& step, const StepStats& stats, int kv_head,
             std::span<const ScoredSlot> candidates, std::span<float> scores) override {
    scorer_->score(step, stats, kv_head, candidates, scores);
  }
  void observe(const LayerStep& step, const StepStats& stats) override { scorer_->observe(step, stats); }
  void on_evict(int layer, int kv_head, std::span<const int64_t> positions) override {
    scorer_->on_evict(layer, kv_head, positions);
  }
  void on_reset() override { scorer_->reset(); }

 private:
  std::unique_ptr<KeyScorer> scorer_;
};

}  // namespace

std::unique_ptr<AttentionPolicy> make_scorer_policy(std::unique_ptr<KeyScorer> scorer, ScorerPlan plan) {
  return std::make_unique<ComposedScorerPolicy>(std::move(scorer), std::move(plan));
}

ScorerPlan uniform_plan(double compression_ratio, int64_t budget_tokens, int64_t sinks,
                        int64_t recent, bool at_prompt_end) {
  TokenBudget b;
  b.compression_ratio = compression_ratio;
  b.budget_tokens = budget_tokens;
  ScorerPlan plan;
  plan.at_prompt_end = at_prompt_end;
  plan.retention = [b, sinks, recent](int, int64_t n) {
    Retention r;
    if (b.limited()) r.total = b.kept(n);
    r.sinks = sinks;
    r.recent = recent;
    return r;
  };
  return plan;
}

}  // namespace kvlab
