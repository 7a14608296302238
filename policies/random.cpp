// random: evicts uniformly at random within the budget (kvpress random_press.py): the floor any
// scoring method must beat. The score of (layer, KV head, position) is a SplitMix64 hash of the
// sample's seed (LayerStep::seed) and those three, so a seed gives the same choice on every run
// and machine, and different samples different choices. Compresses at the prompt end by default.
#include "framework/core/splitmix.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/scorers.h"

namespace kvlab {
namespace {

class RandomScorer final : public KeyScorer {
 public:
  void score(const LayerStep& step, const StepStats&, int kv_head,
             std::span<const ScoredSlot> candidates, std::span<float> scores) override {
    const uint64_t base = splitmix64(splitmix64(step.seed) ^ (uint64_t(step.layer) << 32 | uint32_t(kv_head)));
    for (size_t c = 0; c < candidates.size(); ++c)
      scores[c] = float(splitmix64(base ^ uint64_t(candidates[c].position)) >> 40) * 0x1p-24f;  // [0, 1)
  }
};

}  // namespace

ScorerEntry random_scorer() { return parameterless_scorer<RandomScorer>("random"); }

std::unique_ptr<PolicyFactory> make_random_factory() {
  return make_uniform_scorer_factory(
      random_scorer, "evicts uniformly at random (seeded by the sample) within the budget", "prompt_end",
      {{.params = {{"budget_tokens", int64_t(6)}, {"compress", std::string("every_step")}}, .evicts = true},
       {.params = {{"compression_ratio", 0.75}}, .evicts = true}});  // conformance suite: acting sets
}

}  // namespace kvlab
