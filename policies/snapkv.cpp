// snapkv and pyramidkv (POLICIES.md 11, 12): the SnapKV scorer and two budgets over it.
//
// SnapKV (arXiv 2404.14469; FasterDecoding/SnapKV snapkv_utils.py; kvpress snapkv_press.py):
// at the prompt end the last `window` prompt tokens are the observation window. Per query head,
// a_j = sum over the window's rows of the probability row t gave prefix key j (the engine's
// StepStats::window_attention: the softmax over every key the row read, the window's own keys
// included in the normalisation, as the reference's window attention), then 1-D pooling over the
// prefix keys in position order with kernel k, stride 1, padding k/2: `avg` divides by k with
// the padded zeros counted (PyTorch avg_pool1d's default count_include_pad, as both references),
// `max` pads with -inf; under GQA the mean over the group's query heads (kvlab choice, as
// kvpress). The window is protected (kept) inside the budget: the top (budget - window) prefix
// keys per KV head survive. The references sum (SnapKV) or average (kvpress) over the window
// rows; a constant factor, so the same keep-set.
//
// PyramidKV (arXiv 2406.02069; kvpress pyramidkv_press.py): the same scores, a per-layer budget
// decreasing linearly with depth at the same mean B (window w inside, beta = 20 as kvpress):
// min = (B - w)/beta, max = 2(B - w) - min, layer l of L keeps w + max - l (max - min)/(L - 1),
// rounded to the nearest token (half up), at most the prompt; B <= w or L = 1: every layer B.
#include <algorithm>
#include <cmath>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/scorers.h"

namespace kvlab {
namespace {

class SnapKvScorer final : public WindowScorer {
 public:
  SnapKvScorer(int window, int kernel, bool max_pool, bool every_step)
      : WindowScorer("snapkv", window, every_step), kernel_(kernel), max_pool_(max_pool) {}

  void score(const LayerStep& step, const StepStats& stats, int kv_head,
             std::span<const ScoredSlot> candidates, std::span<float> scores) override {
    const int G = step.shape.n_heads / step.shape.n_kv_heads;
    const int n = int(candidates.size()), half = kernel_ / 2;
    a_.resize(n);
    sum_.assign(n, 0.0);
    for (int g = 0; g < G; ++g) {
      const float* w = window_of(stats, kv_head * G + g);
      for (int c = 0; c < n; ++c) a_[c] = w[candidates[c].slot];
      for (int c = 0; c < n; ++c) {
        const int lo = std::max(0, c - half), hi = std::min(n - 1, c + half);
        double pooled;
        if (max_pool_) {
          pooled = -INFINITY;
          for (int i = lo; i <= hi; ++i) pooled = std::max(pooled, a_[i]);
        } else {
          pooled = 0;
          for (int i = lo; i <= hi; ++i) pooled += a_[i];
          pooled /= kernel_;
        }
        sum_[c] += pooled;
      }
    }
    for (int c = 0; c < n; ++c) scores[c] = float(sum_[c] / G);
  }

 private:
  int kernel_;
  bool max_pool_;
  std::vector<double> a_, sum_;  // scratch
};

ParamSpecs snapkv_specs() {
  return {
      {"window", ParamType::kInt, int64_t(64),
       "observation window: the last prompt tokens whose attention scores the rest (kept)", 1.0,
       1e6, {}},
      {"kernel_size", ParamType::kInt, int64_t(5), "pooling kernel over key positions (odd)", 1.0,
       1001.0, {}},
      {"pooling", ParamType::kString, std::string("avg"), "pooling of the window scores",
       std::nullopt, std::nullopt, {"avg", "max"}},
  };
}

void check_kernel(const ParamValues& p) {
  if (p.get_int("kernel_size") % 2 == 0)
    fail("kernel_size must be odd (the pooling is centred, padding kernel_size/2), got ",
         p.get_int("kernel_size"));
}

}  // namespace

ScorerEntry snapkv_scorer() {
  ScorerEntry e;
  e.name = "snapkv";
  e.params = snapkv_specs();
  e.make = [](const ParamValues& p, bool every_step) -> std::unique_ptr<KeyScorer> {
    check_kernel(p);
    return std::make_unique<SnapKvScorer>(int(p.get_int("window")), int(p.get_int("kernel_size")),
                                          p.get_string("pooling") == "max", every_step);
  };
  e.protected_recent = [](const ParamValues& p) { return p.get_int("window"); };
  return e;
}

std::unique_ptr<PolicyFactory> make_snapkv_factory() {
  return make_uniform_scorer_factory(
      snapkv_scorer, "SnapKV: observation-window attention, pooled; compresses at the prompt end", "prompt_end",
      {{.params = {{"compression_ratio", 0.5}, {"window", int64_t(4)}}, .evicts = true},  // conformance suite
       {.params = {{"budget_tokens", int64_t(8)}, {"window", int64_t(3)}, {"kernel_size", int64_t(3)},
                   {"pooling", std::string("max")}, {"compress", std::string("every_step")}},
        .evicts = true}});
}

// The per-layer budgets of PyramidKV (top of file) for a mean of `mean` tokens per layer.
int64_t pyramid_layer_budget(int64_t mean, int64_t window, double beta, int layer, int n_layers,
                             int64_t n) {
  if (mean <= window || n_layers <= 1) return std::min(mean, n);
  const double lo = double(mean - window) / beta, hi = 2.0 * double(mean - window) - lo;
  const double b = double(window) + hi - double(layer) * (hi - lo) / double(n_layers - 1);
  return std::clamp<int64_t>(int64_t(std::floor(b + 0.5)), 0, n);
}

std::unique_ptr<PolicyFactory> make_pyramidkv_factory() {
  ParamSpecs specs = with_budget(snapkv_specs(), "prompt_end");
  specs.push_back({"beta", ParamType::kFloat, 20.0,
                   "pyramid steepness: the last layer keeps (B - window)/beta + window", 1.0,
                   std::nullopt, {}});
  return make_scorer_factory(
      "pyramidkv", "PyramidKV: SnapKV scores, budgets decreasing linearly with depth",
      std::move(specs),
      [](const ParamValues& p, const PolicyModelShape& shape) {
        const ScorerEntry e = snapkv_scorer();
        const TokenBudget b = TokenBudget::from_params(p);
        const bool every = compresses_every_step(p);
        const int64_t window = p.get_int("window");
        const double beta = p.get_float("beta");
        const int n_layers = shape.n_layers;
        ScorerPlan plan;
        plan.at_prompt_end = !every;
        plan.global_layers_only = budget_global_layers_only(p);
        plan.retention = [b, window, beta, n_layers](int layer, int64_t n) {
          Retention r;
          r.recent = window;
          if (b.limited()) r.total = pyramid_layer_budget(b.kept(n), window, beta, layer, n_layers, n);
          return r;
        };
        return make_scorer_policy(e.make(p, every), std::move(plan));
      },
      {{.params = {{"compression_ratio", 0.5}, {"window", int64_t(2)}, {"beta", 2.0}}, .evicts = true},
       {.params = {{"budget_tokens", int64_t(10)}, {"window", int64_t(2)}, {"beta", 4.0},
                   {"compress", std::string("every_step")}},
        .evicts = true}});  // conformance suite: acting sets
}

}  // namespace kvlab
