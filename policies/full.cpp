// full: exact attention over every valid, causal cached key. The selection stays "all", so the
// kernels take their dense path (tiled online softmax, POLICIES.md 1). Nothing is evicted.
#include "framework/policy/simple_factory.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

class FullPolicy final : public AttentionPolicy {
 public:
  void reset() override {}
  std::optional<ClaimedMask> claimed_mask() const override {
    return ClaimedMask{[](int, int, int64_t i, int64_t j) { return j <= i; }};
  }
};

}  // namespace

std::unique_ptr<PolicyFactory> make_full_factory() {
  return std::make_unique<SimplePolicyFactory>(
      "full", "exact attention over every cached key (tiled online softmax)", ParamSpecs{},
      [](const ParamValues&, const PolicyModelShape&) { return std::make_unique<FullPolicy>(); },
      std::map<std::string, ParamValue>{}, SimplePolicyFactory::Conformance{{.mask_based = true}});
}

}  // namespace kvlab
