// tova (POLICIES.md 14; arXiv 2401.06104; kvpress tova_press.py): a fixed-size cache; whenever it
// is over budget, the keys with the lowest attention from the current (last) query are dropped.
// The score is StepStats::window_attention with a one-row window: per query head the last row's
// softmax probability; under GQA the mean over the KV head's group (`gqa: group`, kvlab choice)
// or over all the layer's heads (`gqa: layer`, the paper's one selection per layer and kvpress's
// mean over heads). The current token is always kept (kvpress gives its position the maximum
// score). By default it evicts after every step (the paper's decode-time form: a prefill chunk is
// reduced by its last row, as kvpress's prompt-end form); `compress: prompt_end` is kvpress's.
#include <cmath>
#include <vector>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/scorers.h"

namespace kvlab {
namespace {

class TovaScorer final : public WindowScorer {
 public:
  TovaScorer(bool whole_layer, bool every_step) : WindowScorer("tova", 1, every_step), whole_layer_(whole_layer) {}

  void score(const LayerStep& step, const StepStats& stats, int kv_head,
             std::span<const ScoredSlot> candidates, std::span<float> scores) override {
    const int G = step.shape.n_heads / step.shape.n_kv_heads;
    const int first = whole_layer_ ? 0 : kv_head * G;
    const int count = whole_layer_ ? step.shape.n_heads : G;
    // A head of another KV head attends over ITS slots: under per-head eviction the same slot
    // may hold another token there, so `layer` reads each head's probability of the same
    // position (the layer's heads evict alike under `layer`, so their slots agree).
    rows_.resize(count);
    for (int i = 0; i < count; ++i) rows_[i] = window_of(stats, first + i);
    for (size_t c = 0; c < candidates.size(); ++c) {
      double sum = 0;
      for (const float* w : rows_) sum += w[candidates[c].slot];
      scores[c] = float(sum / count);
    }
  }

 private:
  bool whole_layer_;
  std::vector<const float*> rows_;  // scratch: the averaged heads' window rows
};

ParamSpecs tova_specs() {
  return {{"gqa", ParamType::kString, std::string("group"),
           "heads averaged per KV head: its query group, or the whole layer (the paper)",
           std::nullopt, std::nullopt, {"group", "layer"}}};
}

}  // namespace

ScorerEntry tova_scorer() {
  ScorerEntry e;
  e.name = "tova";
  e.params = tova_specs();
  e.make = [](const ParamValues& p, bool every_step) -> std::unique_ptr<KeyScorer> {
    return std::make_unique<TovaScorer>(p.get_string("gqa") == "layer", every_step);
  };
  e.protected_recent = [](const ParamValues&) { return int64_t(1); };
  return e;
}

std::unique_ptr<PolicyFactory> make_tova_factory() {
  return make_uniform_scorer_factory(
      tova_scorer, "TOVA: evicts the keys the current query attends to least, after every step", "every_step",
      {{.params = {{"compression_ratio", 0.6}}, .evicts = true},  // conformance suite: acting sets
       {.params = {{"budget_tokens", int64_t(7)}, {"gqa", std::string("layer")}}, .evicts = true},
       {.params = {{"compression_ratio", 0.5}, {"compress", std::string("prompt_end")}}, .evicts = true}});
}

}  // namespace kvlab
