// Test plugin holding two policies in one library (KVLAB_POLICY_PLUGINS), both deliberately
// broken so that `kvlab check-policy` has something to fail on:
//   over_budget  keeps the `recent` newest tokens but reports a budget of recent - 1;
//   unseeded     keeps `keep` tokens, evicting victims chosen by a process-wide counter that no
//                reset or seed touches (nondeterministic across runs of the same sample).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "framework/policy/plugin.h"
#include "framework/policy/simple_factory.h"

namespace {

using kvlab::Evictions;
using kvlab::LayerStep;
using kvlab::ParamSpecs;
using kvlab::ParamType;
using kvlab::ParamValue;
using kvlab::ParamValues;
using kvlab::PolicyModelShape;
using kvlab::StepStats;

std::vector<int32_t> valid_slots(const LayerStep& step, int h) {
  std::vector<int32_t> s;
  for (int i = 0; i < step.cache->n_slots(); ++i)
    if (step.cache->slot_valid(i, h)) s.push_back(i);
  return s;
}

class OverBudget final : public kvlab::AttentionPolicy {
 public:
  explicit OverBudget(int64_t recent) : recent_(recent) {}
  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      const std::vector<int32_t> s = valid_slots(step, h);
      for (int64_t i = 0; i + recent_ < int64_t(s.size()); ++i) out.slots[h].push_back(s[i]);
    }
  }
  int64_t budget_tokens(int, int64_t) const override { return recent_ - 1; }  // the lie
  void reset() override {}

 private:
  int64_t recent_;
};

int64_t g_counter = 0;  // process-wide: the bug

class Unseeded final : public kvlab::AttentionPolicy {
 public:
  explicit Unseeded(int64_t keep) : keep_(keep) {}
  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      std::vector<int32_t> s = valid_slots(step, h);
      while (int64_t(s.size()) > keep_) {
        const size_t victim = size_t(g_counter++ % int64_t(s.size()));
        out.slots[h].push_back(s[victim]);
        s.erase(s.begin() + victim);
      }
      std::sort(out.slots[h].begin(), out.slots[h].end());
    }
  }
  int64_t budget_tokens(int, int64_t) const override { return keep_; }
  void reset() override {}

 private:
  int64_t keep_;
};

class OverBudgetFactory final : public kvlab::SimplePolicyFactory {
 public:
  OverBudgetFactory()
      : SimplePolicyFactory(
            "over_budget", "test plugin: keeps `recent` tokens, reports one fewer as its budget",
            ParamSpecs{{"recent", ParamType::kInt, int64_t(8), "tokens kept", 1.0, std::nullopt, {}}},
            [](const ParamValues& p, const PolicyModelShape&) { return std::make_unique<OverBudget>(p.get_int("recent")); },
            std::map<std::string, ParamValue>{{"recent", int64_t(1) << 40}},
            Conformance{{.params = {{"recent", int64_t(8)}}, .evicts = true}}) {}
};

class UnseededFactory final : public kvlab::SimplePolicyFactory {
 public:
  UnseededFactory()
      : SimplePolicyFactory(
            "unseeded", "test plugin: evicts victims chosen by a process-wide counter",
            ParamSpecs{{"keep", ParamType::kInt, int64_t(8), "tokens kept", 1.0, std::nullopt, {}}},
            [](const ParamValues& p, const PolicyModelShape&) { return std::make_unique<Unseeded>(p.get_int("keep")); },
            std::map<std::string, ParamValue>{{"keep", int64_t(1) << 40}},
            Conformance{{.params = {{"keep", int64_t(8)}}, .evicts = true}}) {}
};

}  // namespace

KVLAB_POLICY_PLUGINS(KVLAB_POLICY_ENTRY("over_budget", OverBudgetFactory),
                     KVLAB_POLICY_ENTRY("unseeded", UnseededFactory))
