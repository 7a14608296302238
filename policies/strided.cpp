// strided: Sparse Transformer patterns (POLICIES.md 3), stride / block l:
//   pattern=strided  A = local {i - l < j <= i}          B = {j <= i : (i - j) mod l == 0}
//   pattern=fixed    A = same block {j/l == i/l}         B = summary {j mod l in [l-c, l-1]}
//   combine=union (default): A u B;  alternate_layer: even layers A, odd layers B;
//   alternate_head: even KV heads A, odd KV heads B.  Plus the first `global` positions always.
// Eviction (only with evict=true, pattern=fixed): once a block is over, a key that no later
// query of its (layer, KV head) can read is dropped (non-summary keys; with A-only heads every
// key of the closed block). Strided evicts nothing (every key stays reachable). Original
// positions.
// No compression_ratio / budget_tokens (POLICIES.md 9), a decision: the pattern's size follows
// from l (strided reads about l + i/l keys, at least 2*sqrt(i + 1) for any l; fixed keeps
// l + c*i/l) and no budget picks an l that meets it at every length, so the pattern would only
// be cut arbitrarily. Compare it at equal memory by its `stride` (and its reported reads).
#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "kernels/common/masks.h"
#include "policies/builtin.h"
#include "policies/cache_scan.h"

namespace kvlab {
namespace {

enum class Combine { kUnion, kAlternateLayer, kAlternateHead };

struct StridedConfig {
  bool fixed = false;
  int64_t stride = 128;  // l
  int64_t summary = 8;   // c (fixed)
  int64_t global = 0;    // g
  Combine combine = Combine::kUnion;
  bool evict = false;

  // Which components (A, B) layer `layer`, KV head h reads.
  bool uses_a(int layer, int h) const {
    return combine == Combine::kUnion || (combine == Combine::kAlternateLayer ? layer % 2 == 0 : h % 2 == 0);
  }
  bool uses_b(int layer, int h) const {
    return combine == Combine::kUnion || (combine == Combine::kAlternateLayer ? layer % 2 == 1 : h % 2 == 1);
  }
  // Independent statement of the pattern (the kernels/common/masks.h functors for the union).
  bool allow(int layer, int h, int64_t i, int64_t j) const {
    if (j > i) return false;
    if (j < global) return true;
    const bool a = fixed ? j / stride == i / stride : i - j < stride;
    const bool b = fixed ? j % stride >= stride - summary : (i - j) % stride == 0;
    return (uses_a(layer, h) && a) || (uses_b(layer, h) && b);
  }
};

class StridedPolicy final : public AttentionPolicy {
 public:
  explicit StridedPolicy(const StridedConfig& c) : c_(c) {}

  void select(const LayerStep& step, KeySelection& out) override {
    select_position_ranges(step, step.shape.n_kv_heads, out, [&](int64_t i, int h) {
      ranges_.clear();
      ranges_.push_back({0, c_.global});
      const int64_t l = c_.stride;
      if (c_.uses_a(step.layer, h))
        ranges_.push_back(c_.fixed ? PosRange{i / l * l, i + 1} : PosRange{i - l + 1, i + 1});
      if (c_.uses_b(step.layer, h)) {
        if (c_.fixed)
          for (int64_t b0 = 0; b0 <= i; b0 += l) ranges_.push_back({b0 + l - c_.summary, b0 + l});
        else
          for (int64_t j = i % l; j <= i; j += l) ranges_.push_back({j, j + 1});
      }
      normalize_ranges(ranges_, i + 1);
      return std::span<const PosRange>(ranges_);
    });
  }

  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    if (!c_.evict) return;
    // Keys in blocks before the next query's block are read again only as globals or summaries.
    const int64_t closed_end = tokens_seen(step) / c_.stride * c_.stride;
    const CacheScan scan(*step.cache, step.shape.n_kv_heads);
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      const bool keep_summary = c_.uses_b(step.layer, h);
      for (int s = 0; s < scan.n_slots(); ++s) {
        const int64_t j = scan.position(s, h);
        if (j >= closed_end) break;
        if (!scan.valid(s, h) || j < c_.global) continue;
        if (keep_summary && j % c_.stride >= c_.stride - c_.summary) continue;
        out.slots[h].push_back(s);
      }
    }
  }

  int64_t budget_tokens(int, int64_t n_seen) const override {
    if (!c_.evict) return -1;
    // globals + one summary group per closed block + the open block.
    return c_.global + n_seen / c_.stride * c_.summary + c_.stride;
  }
  void reset() override {}
  std::optional<ClaimedMask> claimed_mask() const override {
    const StridedConfig c = c_;
    return ClaimedMask{[c](int layer, int h, int64_t i, int64_t j) { return c.allow(layer, h, i, j); }};
  }

 private:
  StridedConfig c_;
  std::vector<PosRange> ranges_;  // scratch
};

}  // namespace

std::unique_ptr<PolicyFactory> make_strided_factory() {
  ParamSpecs specs = {
      {"pattern", ParamType::kString, std::string("strided"),
       "strided: local + every l-th key back; fixed: own block + summary columns", std::nullopt,
       std::nullopt, {"strided", "fixed"}},
      {"stride", ParamType::kInt, int64_t(128), "l: stride (strided) or block length (fixed)", 1.0,
       std::nullopt, {}},
      {"summary", ParamType::kInt, int64_t(8), "c: summary columns at the end of each block (fixed)",
       0.0, std::nullopt, {}},
      {"global", ParamType::kInt, int64_t(0), "g: first positions every query reads", 0.0,
       std::nullopt, {}},
      {"combine", ParamType::kString, std::string("union"),
       "union of the two components, or alternate them by layer or by KV head", std::nullopt,
       std::nullopt, {"union", "alternate_layer", "alternate_head"}},
      {"evict", ParamType::kBool, false,
       "fixed only: drop keys of closed blocks that no later query reads", std::nullopt,
       std::nullopt, {}},
  };
  return std::make_unique<SimplePolicyFactory>(
      "strided", "Sparse Transformer strided / fixed patterns, optional global tokens",
      std::move(specs), [](const ParamValues& p, const PolicyModelShape&) {
        StridedConfig c;
        c.fixed = p.get_string("pattern") == "fixed";
        c.stride = p.get_int("stride");
        c.summary = p.get_int("summary");
        c.global = p.get_int("global");
        const std::string& comb = p.get_string("combine");
        c.combine = comb == "union" ? Combine::kUnion
                    : comb == "alternate_layer" ? Combine::kAlternateLayer
                                                : Combine::kAlternateHead;
        c.evict = p.get_bool("evict");
        if (c.fixed && c.summary > c.stride)
          fail("strided: summary (", c.summary, ") must be <= stride (", c.stride, ")");
        if (c.evict && !c.fixed) fail("strided: evict=true needs pattern=fixed (strided keeps every key reachable)");
        return std::make_unique<StridedPolicy>(c);
      },
      std::map<std::string, ParamValue>{{"stride", int64_t(1)}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets
          {.params = {{"stride", int64_t(6)}}, .mask_based = true},
          {.params = {{"stride", int64_t(5)}, {"global", int64_t(2)}, {"combine", std::string("alternate_head")}},
           .mask_based = true},
          {.params = {{"pattern", std::string("fixed")}, {"stride", int64_t(8)}, {"summary", int64_t(2)}},
           .mask_based = true},
          {.params = {{"pattern", std::string("fixed")}, {"stride", int64_t(8)}, {"summary", int64_t(3)},
                      {"global", int64_t(1)}, {"evict", true}, {"combine", std::string("alternate_layer")}},
           .evicts = true, .mask_based = true}});
}

}  // namespace kvlab
