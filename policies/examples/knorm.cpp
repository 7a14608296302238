// knorm_plugin: an out-of-tree eviction policy plugin, built against an installed kvlab (kvlab
// also has a built-in `knorm`, policies/knorm.cpp; the plugin's registry name differs so both load).
// Keeps the keys with the smallest L2 norm (low-norm keys tend to receive high attention,
// "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression", arXiv 2406.11430).
// Budget, sinks, recent window and top-k come from kvlab's ScorerPolicy; this file only scores.
#include <cmath>
#include <vector>

#include "framework/policy/plugin.h"
#include "framework/policy/simple_factory.h"
#include "policies/scorer.h"

namespace {

class KnormPolicy final : public kvlab::ScorerPolicy {
 public:
  using ScorerPolicy::ScorerPolicy;

 protected:
  // score = -||k||: the base keeps the highest scores, i.e. the smallest norms.
  void score(const kvlab::LayerStep& step, const kvlab::StepStats&, int kv_head,
             std::span<const kvlab::ScoredSlot> candidates, std::span<float> scores) override {
    std::vector<float> key(step.shape.head_dim);
    for (size_t c = 0; c < candidates.size(); ++c) {
      step.cache->load_key(candidates[c].slot, kv_head, key.data());
      float norm2 = 0.f;
      for (float x : key) norm2 += x * x;
      scores[c] = -std::sqrt(norm2);
    }
  }
};

class KnormFactory final : public kvlab::SimplePolicyFactory {
 public:
  KnormFactory()
      : SimplePolicyFactory(
            "knorm_plugin", "keeps the lowest-L2-norm keys + sinks + recent (example plugin)",
            kvlab::scorer_param_specs({.keep_name = "keep", .sinks = 4, .recent = 0.1, .keep = 0.1}),
            [](const kvlab::ParamValues& p, const kvlab::PolicyModelShape&) {
              return std::make_unique<KnormPolicy>(kvlab::ScorerBudget::from_params(p));
            },
            std::map<std::string, kvlab::ParamValue>{{"keep", 1.0}},
            // The conformance suite's acting parameters (`kvlab check-policy --plugin knorm.so`):
            // it evicts within a few dozen tokens, and its 2 sinks stay resident.
            Conformance{{.params = {{"keep", 0.2}, {"recent", 0.1}, {"sinks", int64_t(2)}},
                         .evicts = true,
                         .sinks_param = "sinks"}}) {}
};

}  // namespace

KVLAB_POLICY_PLUGIN("knorm_plugin", KnormFactory)
