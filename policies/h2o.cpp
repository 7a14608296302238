// h2o: Heavy-Hitter Oracle (POLICIES.md 5), a ScorerPolicy. The score of a cached key is its
// accumulated attention mass A_j = sum over every query so far (and, under GQA, over the KV
// head's G query heads) of the probability it received; no decay. The kernels provide the
// per-step mass (PolicyNeeds::key_attention_mass); a prefill chunk's mass is the causal
// attention matrix's column sums, so the prefill is reduced to budget in one step. The base
// keeps `recent` most recent + `heavy` top-scored tokens (ties: lower position), optional sinks.
// Keys keep their original RoPE positions.
//
// State per (layer, KV head): the resident tokens' (position, score), in position order.
#include <algorithm>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/builtin.h"
#include "policies/budget.h"
#include "policies/cache_scan.h"
#include "policies/scorer.h"

namespace kvlab {
namespace {

struct PositionScore {
  int64_t position;
  float score;
};

class H2oPolicy final : public ScorerPolicy {
 public:
  explicit H2oPolicy(const ScorerBudget& b) : ScorerPolicy(b) {}
  explicit H2oPolicy(ScorerPlan plan) : ScorerPolicy(std::move(plan)) {}

  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.key_attention_mass = true;
    return n;
  }

 protected:
  // Adds this step's mass to every resident token's score (new tokens start at 0).
  void observe(const LayerStep& step, const StepStats& stats) override {
    const int n_kv = step.shape.n_kv_heads;
    if (int(state_.size()) <= step.layer) state_.resize(step.layer + 1);
    auto& layer = state_[step.layer];
    layer.resize(n_kv);
    if (stats.key_mass.empty())
      fail("h2o: the attention kernel provided no key mass (PolicyNeeds::key_attention_mass)");
    KVLAB_CHECK(int64_t(stats.key_mass.size()) == int64_t(n_kv) * stats.n_slots);
    const CacheScan scan(*step.cache, n_kv);
    for (int h = 0; h < n_kv; ++h) {
      const std::vector<PositionScore>& old = layer[h];
      next_.clear();
      size_t k = 0;
      for (int s = 0; s < scan.n_slots(); ++s) {
        if (!scan.valid(s, h)) continue;
        const int64_t p = scan.position(s, h);
        while (k < old.size() && old[k].position < p) ++k;  // tokens no longer resident
        float score = (k < old.size() && old[k].position == p) ? old[k].score : 0.f;
        if (s < stats.n_slots) score += stats.key_mass[size_t(h) * stats.n_slots + s];
        next_.push_back({p, score});
      }
      layer[h].swap(next_);
    }
  }

  void score(const LayerStep& step, const StepStats&, int kv_head,
             std::span<const ScoredSlot> candidates, std::span<float> scores) override {
    const std::vector<PositionScore>& st = state_[step.layer][kv_head];
    size_t k = 0;
    for (size_t c = 0; c < candidates.size(); ++c) {
      while (k < st.size() && st[k].position < candidates[c].position) ++k;
      KVLAB_CHECK(k < st.size() && st[k].position == candidates[c].position);
      scores[c] = st[k].score;
    }
  }

  void on_evict(int layer, int kv_head, std::span<const int64_t> positions) override {
    auto& st = state_[layer][kv_head];
    size_t k = 0;
    std::erase_if(st, [&](const PositionScore& e) {
      while (k < positions.size() && positions[k] < e.position) ++k;
      return k < positions.size() && positions[k] == e.position;
    });
  }

  void on_reset() override { state_.clear(); }

 private:
  std::vector<std::vector<std::vector<PositionScore>>> state_;  // [layer][kv_head][resident]
  std::vector<PositionScore> next_;                              // scratch
};

}  // namespace

std::unique_ptr<PolicyFactory> make_h2o_factory() {
  ScorerDefaults d;
  d.keep_name = "heavy";
  d.keep_doc = "HH: heavy hitters kept (highest accumulated attention mass)";
  d.sinks = 0;
  d.recent = 0.1;
  d.keep = 0.1;
  d.units = "ratio";
  ParamSpecs specs = scorer_param_specs(d);
  specs.push_back(budget_layers_param_spec());
  return std::make_unique<SimplePolicyFactory>(
      "h2o", "heavy hitters (accumulated attention mass) + recent tokens, evicted after each step",
      with_budget_params(std::move(specs)), [d](const ParamValues& p, const PolicyModelShape&) -> std::unique_ptr<AttentionPolicy> {
        const TokenBudget b = TokenBudget::from_params(p);
        if (!b.limited()) {
          ScorerBudget first = ScorerBudget::from_params(p, "heavy");
          first.global_layers_only = budget_global_layers_only(p);
          return std::make_unique<H2oPolicy>(first);
        }
        // The one convention (POLICIES.md 9): kept(n_seen) tokens in all, sinks inside, the
        // rest split evenly between recent and heavy (the paper's 10% + 10% default is even).
        if (p.get_float("heavy") != d.keep || p.get_float("recent") != d.recent || p.get_string("units") != d.units)
          fail("h2o: compression_ratio / budget_tokens set the whole budget; leave heavy, recent "
               "and units at their defaults (heavy=", d.keep, ", recent=", d.recent, ", units=", d.units,
               ") or use them instead");
        const int64_t sinks = p.get_int("sinks");
        ScorerPlan plan;
        plan.global_layers_only = budget_global_layers_only(p);
        plan.retention = [b, sinks](int, int64_t n) {
          Retention r;
          r.total = b.kept(n);
          r.sinks = sinks;
          r.recent = std::max<int64_t>(0, r.total - sinks) / 2;
          return r;
        };
        return std::make_unique<H2oPolicy>(std::move(plan));
      },
      std::map<std::string, ParamValue>{{"heavy", 1.0}, {"recent", 0.0}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets
          {.params = {{"heavy", 0.2}, {"recent", 0.1}}, .evicts = true, .sinks_param = "sinks"},
          {.params = {{"units", std::string("tokens")}, {"heavy", 8.0}, {"recent", 4.0}, {"sinks", int64_t(2)}},
           .evicts = true, .sinks_param = "sinks"},
          {.params = {{"compression_ratio", 0.7}, {"sinks", int64_t(1)}}, .evicts = true, .sinks_param = "sinks"}});
}

}  // namespace kvlab
