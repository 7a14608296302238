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
#include "framework/policy/simple_factory.h"
#include "policies/builtin.h"
#include "policies/cache_scan.h"

namespace kvlab {
namespace {

class SinksPolicy final : public AttentionPolicy {
 public:
  SinksPolicy(int64_t sinks, int64_t recent, bool cache_positions)
      : sinks_(sinks), recent_(recent), cache_positions_(cache_positions) {}

  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.rope_at_cache_position = cache_positions_;
    n.prefill_mask = PositionMask{recent_ + 1, sinks_};  // j < S or i - j <= R (select below)
    return n;
  }

  void select(const LayerStep& step, KeySelection& out) override {
    const CacheScan scan(*step.cache, step.shape.n_kv_heads);
    out.begin(step.n_new, step.shape.n_kv_heads);
    for (int r = 0; r < step.n_new; ++r) {
      const int64_t i = step.positions[r];
      std::vector<PosRange> ranges{{0, sinks_}, {i - recent_, i + 1}};
      normalize_ranges(ranges, i + 1);
      for (int h = 0; h < step.shape.n_kv_heads; ++h) {
        add_position_ranges(scan, h, ranges, out);
        out.close_list();
      }
    }
  }

  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    const CacheScan scan(*step.cache, step.shape.n_kv_heads);
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      scan.valid_slots(h, slots_);
      const int64_t n = int64_t(slots_.size());
      if (n <= sinks_ + recent_) continue;
      for (int64_t r = sinks_; r < n - recent_; ++r) out.slots[h].push_back(slots_[r]);
    }
  }

  int64_t budget_tokens(int, int64_t) const override { return sinks_ + recent_; }
  void reset() override {}
  std::optional<ClaimedMask> claimed_mask() const override {
    if (cache_positions_) return std::nullopt;  // keys are re-rotated: not a mask of dense attention
    const int64_t s = sinks_, rr = recent_;
    return ClaimedMask{[s, rr](int, int, int64_t i, int64_t j) { return j <= i && (j < s || i - j <= rr); }};
  }

 private:
  int64_t sinks_, recent_;
  bool cache_positions_;
  std::vector<int32_t> slots_;  // scratch
};

}  // namespace

std::unique_ptr<PolicyFactory> make_sinks_factory() {
  ParamSpecs specs = {
      {"sinks", ParamType::kInt, int64_t(4), "S: first tokens always kept (attention sinks)", 0.0,
       std::nullopt, {}},
      {"recent", ParamType::kInt, int64_t(1020), "R: most recent tokens kept", 0.0, std::nullopt, {}},
      {"rope_positions", ParamType::kString, std::string("cache"),
       "cache: rotate keys by their rank in the cache (StreamingLLM); original: text positions",
       std::nullopt, std::nullopt, {"cache", "original"}},
  };
  return std::make_unique<SimplePolicyFactory>(
      "sinks", "StreamingLLM: S attention sinks + R recent tokens, evicted after each step",
      std::move(specs), [](const ParamValues& p, const PolicyModelShape&) {
        return std::make_unique<SinksPolicy>(p.get_int("sinks"), p.get_int("recent"),
                                             p.get_string("rope_positions") == "cache");
      },
      std::map<std::string, ParamValue>{{"recent", int64_t(1) << 40}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets
          {.params = {{"sinks", int64_t(4)}, {"recent", int64_t(10)}}, .evicts = true, .sinks_param = "sinks"},
          {.params = {{"sinks", int64_t(2)}, {"recent", int64_t(7)}, {"rope_positions", std::string("original")}},
           .evicts = true, .mask_based = true, .sinks_param = "sinks"}});
}

}  // namespace kvlab
