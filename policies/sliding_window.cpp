// sliding_window: query i reads keys i - W < j <= i (W keys including itself; with plus_one,
// i - W <= j <= i, the Mistral paper's W + 1), POLICIES.md 2.
//   mode=evict (default): after each step, drop every key no later query can read (the W-slot
//     rolling buffer); a prefill chunk's rows are still masked to their windows.
//   mode=mask: keep everything, select the window per query row.
// Keys keep their original RoPE positions.
// The budget convention (POLICIES.md 9, policies/budget.h): with compression_ratio or
// budget_tokens set, the window is the budget: query i (i + 1 tokens seen) reads the
// kept(i + 1) most recent keys, itself included, and evict mode keeps kept(n_seen + 1) - 1 keys
// after a step. kept(n + 1) - kept(n) is 0 or 1, so the window's start never moves back and no
// evicted key is ever needed again. Setting a budget together with `window` changed from its
// default, or with plus_one, is an error (both would give the window's size).
#include <algorithm>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "kernels/common/masks.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/cache_scan.h"

namespace kvlab {
namespace {

constexpr int64_t kDefaultWindow = 4096;

class SlidingWindowPolicy final : public AttentionPolicy {
 public:
  SlidingWindowPolicy(int64_t window, bool plus_one, bool evict, const TokenBudget& budget)
      : mask_{window, plus_one}, evict_(evict), budget_(budget) {}

  PolicyNeeds needs() const override {
    PolicyNeeds n;
    // row i reads first_readable(i) <= j <= i: i - j < W (plus_one: W + 1); a ratio budget's
    // window grows with i, which is no fixed position mask.
    if (!budget_.limited())
      n.prefill_mask = PositionMask{mask_.window + (mask_.plus_one ? 1 : 0), 0};
    else if (budget_.budget_tokens > 0)
      n.prefill_mask = PositionMask{budget_.budget_tokens, 0};
    return n;
  }

  void select(const LayerStep& step, KeySelection& out) override {
    PosRange range;
    select_position_ranges(step, step.shape.n_kv_heads, out, [&](int64_t i, int) {
      range = {first_readable(i), i + 1};
      return std::span<const PosRange>(&range, 1);
    });
  }

  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    if (!evict_) return;
    // The next query (position n_seen) reads nothing before first_readable(n_seen).
    const int64_t keep_from = first_readable(tokens_seen(step));
    const CacheScan scan(*step.cache, step.shape.n_kv_heads);
    for (int h = 0; h < step.shape.n_kv_heads; ++h)
      for (int s = 0; s < scan.n_slots() && scan.position(s, h) < keep_from; ++s)
        if (scan.valid(s, h)) out.slots[h].push_back(s);
  }

  int64_t budget_tokens(int, int64_t n_seen) const override {
    if (!evict_) return -1;
    // What after_attention leaves: the next query's window without itself.
    return budget_.limited() ? std::max<int64_t>(0, keys_read(n_seen + 1) - 1)
                             : mask_.window + (mask_.plus_one ? 1 : 0);
  }
  void reset() override {}
  std::optional<ClaimedMask> claimed_mask() const override {
    if (!budget_.limited()) {
      const SlidingWindowMask m = mask_;
      return ClaimedMask{[m](int, int, int64_t i, int64_t j) { return m(i, j); }};
    }
    const TokenBudget b = budget_;
    return ClaimedMask{[b](int, int, int64_t i, int64_t j) { return j <= i && i - j < b.kept(i + 1); }};
  }

 private:
  // Keys the query at position n - 1 reads (n tokens seen, itself included).
  int64_t keys_read(int64_t n) const {
    return budget_.limited() ? budget_.kept(n) : mask_.window + (mask_.plus_one ? 1 : 0);
  }
  int64_t first_readable(int64_t i) const { return i + 1 - keys_read(i + 1); }
  SlidingWindowMask mask_;
  bool evict_;
  TokenBudget budget_;
};

}  // namespace

std::unique_ptr<PolicyFactory> make_sliding_window_factory() {
  ParamSpecs specs = {
      {"window", ParamType::kInt, kDefaultWindow, "W: keys each query reads, itself included",
       1.0, std::nullopt, {}},
      {"plus_one", ParamType::kBool, false,
       "window semantics: false = i-W < j <= i (W keys, as HF); true = i-W <= j <= i (W+1, "
       "Mistral paper)", std::nullopt, std::nullopt, {}},
      {"mode", ParamType::kString, std::string("evict"),
       "evict = drop keys that left the window (rolling buffer); mask = keep them, select",
       std::nullopt, std::nullopt, {"evict", "mask"}},
  };
  return std::make_unique<SimplePolicyFactory>(
      "sliding_window", "the W most recent keys (sliding window; evicts or masks)",
      with_budget_params(std::move(specs)), [](const ParamValues& p, const PolicyModelShape&) {
        const TokenBudget budget = TokenBudget::from_params(p);
        if (budget.limited() && (p.get_int("window") != kDefaultWindow || p.get_bool("plus_one")))
          fail("compression_ratio / budget_tokens give the window's size (kept(n) keys, the current "
               "one included): leave window at its default (", kDefaultWindow,
               ") and plus_one false, or set no budget; got window = ", p.get_int("window"),
               ", plus_one = ", p.get_bool("plus_one") ? "true" : "false");
        return std::make_unique<SlidingWindowPolicy>(p.get_int("window"), p.get_bool("plus_one"),
                                                     p.get_string("mode") == "evict", budget);
      },
      std::map<std::string, ParamValue>{{"window", int64_t(1) << 40}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets
          {.params = {{"window", int64_t(9)}}, .evicts = true, .mask_based = true},
          {.params = {{"window", int64_t(9)}, {"plus_one", true}}, .evicts = true, .mask_based = true},
          {.params = {{"window", int64_t(9)}, {"mode", std::string("mask")}}, .mask_based = true}});
}

}  // namespace kvlab
