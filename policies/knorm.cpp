// knorm (arXiv 2406.11430, "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression"; kvpress knorm_press.py): keys with the smallest L2 norm tend to receive the
// most attention, so the score is -||k|| (keys as attention reads them, after RoPE). Compresses
// at the prompt end by default (kvpress's protocol). The out-of-tree example plugin
// (policies/examples/knorm.cpp) is the same idea written as a plugin with the first budget form.
#include <cmath>

#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/scorers.h"

namespace kvlab {
namespace {

class KnormScorer final : public KeyScorer {
 public:
  void score(const LayerStep& step, const StepStats&, int kv_head,
             std::span<const ScoredSlot> candidates, std::span<float> scores) override {
    key_.resize(step.shape.head_dim);
    for (size_t c = 0; c < candidates.size(); ++c) {
      step.cache->load_key(candidates[c].slot, kv_head, key_.data());
      double norm2 = 0;
      for (float x : key_) norm2 += double(x) * x;
      scores[c] = float(-std::sqrt(norm2));
    }
  }

 private:
  std::vector<float> key_;
};

}  // namespace

ScorerEntry knorm_scorer() { return parameterless_scorer<KnormScorer>("knorm"); }

std::unique_ptr<PolicyFactory> make_knorm_factory() {
  return make_uniform_scorer_factory(
      knorm_scorer, "keeps the lowest-L2-norm keys; compresses at the prompt end", "prompt_end",
      {{.params = {{"compression_ratio", 0.5}}, .evicts = true},  // conformance suite: acting sets
       {.params = {{"budget_tokens", int64_t(7)}, {"compress", std::string("every_step")}}, .evicts = true}});
}

}  // namespace kvlab
