// sinks: StreamingLLM (POLICIES.md 4). Each layer's cache keeps the first S tokens (attention
// sinks) and the R most recent: after every forward step, if n > S + R resident tokens, keep
// ranks [0, S) u [n - R, n) and evict the rest, so a decode step reads at most S + R + 1 keys.
// The rows of a prefill chunk are masked to the same pattern, allow(i, j) = j < S or i - j <= R,
// so a chunked prefill reads the same keys token-by-token streaming would (with
// rope_positions=cache their rotations then follow ranks in the chunk's pre-eviction cache, so
// only one-token steps reproduce StreamingLLM's positions exactly).
//   rope_positions=cache (default): keys stored before RoPE and rotated at read time with their
//     rank in the cache; the query gets position = number of cached tokens (PolicyNeeds).
//   rope_positions=original: keys rotated at their text positions; then the reads equal dense
//     attention under the mask above (claimed_mask).
// The budget convention (POLICIES.md 9, policies/budget.h): with compression_ratio or
// budget_tokens set, the S sinks count inside the budget and the recent part is what is left:
// query i (i + 1 tokens seen) reads the sinks and its R_i + 1 = max(1, kept(i + 1) - S) most
// recent tokens, itself included (R_i in the mask above), so it reads max(kept(i + 1), S + 1)
// keys (S + 1 = the floor: the sinks and the current token); after a step the cache keeps
// S + R_{n_seen}. R_i grows by at most one per token, so no evicted token is needed again.
// budget_tokens must exceed S; setting a budget with `recent` changed from its default is an
// error (both would give the recent part's size).
#include <algorithm>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/cache_scan.h"

namespace kvlab {
namespace {

constexpr int64_t kDefaultRecent = 1020;

class SinksPolicy final : public AttentionPolicy {
 public:
  SinksPolicy(int64_t sinks, int64_t recent, bool cache_positions, const TokenBudget& budget)
      : sinks_(sinks), recent_(recent), cache_positions_(cache_positions), budget_(budget) {}

  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.rope_at_cache_position = cache_positions_;
    // j < S or i - j <= R (select below); a ratio budget's R grows with i: no fixed mask.
    // (budget_tokens B: R_i + 1 = B - S once i + 1 >= B, and earlier rows read everything,
    // which the mask B - S allows too.)
    if (!budget_.limited())
      n.prefill_mask = PositionMask{recent_ + 1, sinks_};
    else if (budget_.budget_tokens > 0)
      n.prefill_mask = PositionMask{budget_.budget_tokens - sinks_, sinks_};
    return n;
  }

  void select(const LayerStep& step, KeySelection& out) override {
    select_position_ranges(step, step.shape.n_kv_heads, out, [&](int64_t i, int) {
      ranges_.assign({{0, sinks_}, {i - recent_at(i), i + 1}});
      normalize_ranges(ranges_, i + 1);
      return std::span<const PosRange>(ranges_);
    });
  }

  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    // Keep what the next query (position n_seen) reads besides itself.
    const int64_t recent = recent_at(tokens_seen(step));
    const CacheScan scan(*step.cache, step.shape.n_kv_heads);
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      scan.valid_slots(h, slots_);
      const int64_t n = int64_t(slots_.size());
      if (n <= sinks_ + recent) continue;
      for (int64_t r = sinks_; r < n - recent; ++r) out.slots[h].push_back(slots_[r]);
    }
  }

  int64_t budget_tokens(int, int64_t n_seen) const override { return sinks_ + recent_at(n_seen); }
  void reset() override {}
  std::optional<ClaimedMask> claimed_mask() const override {
    if (cache_positions_) return std::nullopt;  // keys are re-rotated: not a mask of dense attention
    const int64_t s = sinks_, rr = recent_;
    if (!budget_.limited())
      return ClaimedMask{[s, rr](int, int, int64_t i, int64_t j) { return j <= i && (j < s || i - j <= rr); }};
    const TokenBudget b = budget_;
    return ClaimedMask{[s, b](int, int, int64_t i, int64_t j) {
      return j <= i && (j < s || i - j < std::max<int64_t>(1, b.kept(i + 1) - s));
    }};
  }

 private:
  // R for the query at position i: recent tokens it reads besides itself.
  int64_t recent_at(int64_t i) const {
    return budget_.limited() ? std::max<int64_t>(1, budget_.kept(i + 1) - sinks_) - 1 : recent_;
  }
  int64_t sinks_, recent_;
  bool cache_positions_;
  TokenBudget budget_;
  std::vector<int32_t> slots_;  // scratch
  std::vector<PosRange> ranges_;  // scratch
};

}  // namespace

std::unique_ptr<PolicyFactory> make_sinks_factory() {
  ParamSpecs specs = {
      {"sinks", ParamType::kInt, int64_t(4), "S: first tokens always kept (attention sinks)", 0.0,
       std::nullopt, {}},
      {"recent", ParamType::kInt, kDefaultRecent, "R: most recent tokens kept", 0.0, std::nullopt, {}},
      {"rope_positions", ParamType::kString, std::string("cache"),
       "cache: rotate keys by their rank in the cache (StreamingLLM); original: text positions",
       std::nullopt, std::nullopt, {"cache", "original"}},
  };
  return std::make_unique<SimplePolicyFactory>(
      "sinks", "StreamingLLM: S attention sinks + R recent tokens, evicted after each step",
      with_budget_params(std::move(specs)), [](const ParamValues& p, const PolicyModelShape&) {
        const TokenBudget budget = TokenBudget::from_params(p);
        const int64_t sinks = p.get_int("sinks");
        if (budget.limited() && p.get_int("recent") != kDefaultRecent)
          fail("compression_ratio / budget_tokens give the recent part's size (the budget minus the ",
               sinks, " sinks): leave recent at its default (", kDefaultRecent,
               ") or set no budget; got recent = ", p.get_int("recent"));
        if (budget.budget_tokens > 0 && budget.budget_tokens <= sinks)
          fail("budget_tokens (", budget.budget_tokens, ") must exceed sinks (", sinks,
               "): the sinks count inside the budget, and each query also reads itself");
        return std::make_unique<SinksPolicy>(sinks, p.get_int("recent"),
                                             p.get_string("rope_positions") == "cache", budget);
      },
      std::map<std::string, ParamValue>{{"recent", int64_t(1) << 40}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets
          {.params = {{"sinks", int64_t(4)}, {"recent", int64_t(10)}}, .evicts = true, .sinks_param = "sinks"},
          {.params = {{"sinks", int64_t(2)}, {"recent", int64_t(7)}, {"rope_positions", std::string("original")}},
           .evicts = true, .mask_based = true, .sinks_param = "sinks"},
          // The budget convention (POLICIES.md 9; budget_policies_test checks it in detail).
          {.params = {{"sinks", int64_t(2)}, {"compression_ratio", 0.5}, {"rope_positions", std::string("original")}},
           .evicts = true, .mask_based = true, .sinks_param = "sinks"},
          {.params = {{"sinks", int64_t(4)}, {"budget_tokens", int64_t(12)}}, .evicts = true, .sinks_param = "sinks"}});
}

}  // namespace kvlab
