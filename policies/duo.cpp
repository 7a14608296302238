// duo: DuoAttention-style retrieval and streaming heads (POLICIES.md 16; Xiao et al., arXiv
// 2410.10819; mit-han-lab/duo-attention). Each (layer, KV head) pair is either
//   a retrieval head: reads and keeps every cached token (full attention), or
//   a streaming head: reads and keeps the first S tokens (attention sinks) and the R most recent,
//     evicting the rest after every step, as `sinks` does (allow(i, j) = j < S or i - j <= R; a
//     prefill chunk's rows read the same pattern, as DuoAttention's streaming heads do in its
//     pre-filling). Keys are rotated at their text positions (DuoAttention caches post-RoPE keys).
// Which pairs are retrieval heads: the ceil(retrieval_fraction * P) pairs (of P = layers x KV
// heads) with the highest score in the head file `heads` (policies/duo_heads.h), which
// `kvlab calibrate-heads` writes from Wu et al.'s retrieval score (arXiv 2404.15574): the
// training-free kvlab variant of DuoAttention's optimised gates. retrieval_fraction 0 (all
// streaming) and 1 (all retrieval, == full) need no file; any other value without one is an
// Error naming `heads`.
// Defaults follow the reference: S = 64, R = 256 (the README's enable_duo_attention_eval example
// and duo_attn/utils.py's --sink_size / --recent_size). retrieval_fraction -1 (auto, default):
// 0.5 with a head file, the paper's and README's setting for GQA models
// (sparsify_attention_heads(..., sparsity=0.5); kvlab's models are GQA: the bundled one, Llama 3,
// Qwen2; the paper keeps 0.25 for MHA models: set it there), and 0 without one — every head
// streaming, so that the defaults are a valid policy as every built-in's must be (kvlab policies
// --instantiate, the registry tests); the resolved value is what results files record
// (effective_params), so a run without a head file says retrieval_fraction=0.
// Budget (POLICIES.md 9, kvlab choice): with compression_ratio or budget_tokens set, the budget
// is the MEAN over the P pairs (equal memory against a uniform policy): retrieval heads keep
// their n tokens, so the S_h streaming pairs share the rest, each keeping
//   k(n) = clamp(floor((P * kept(n) - R_h * n) / S_h), sinks, n)
// (sinks first, the rest most recent; `recent` is then unused). A ratio the retrieval heads
// alone exceed (1 - compression_ratio < R_h / P) is an Error; a token budget they outgrow as n
// rises leaves the streaming heads with their sinks (achieved memory is recorded per head).
//
// Memory: evictions are per KV head (the store's holes); a layer's blocks hold all its KV heads,
// so blocks are freed as far as the layer's fullest head allows (kv_store.h) — a layer with one
// retrieval head keeps blocks for its whole length, a layer of streaming heads only S + R.
#include <cmath>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/cache_scan.h"
#include "policies/duo_heads.h"

namespace kvlab {
namespace {

class DuoPolicy final : public AttentionPolicy {
 public:
  // retrieval: [n_layers * n_kv_heads], 1 = retrieval head.
  DuoPolicy(std::vector<uint8_t> retrieval, int n_kv_heads, int64_t sinks, int64_t recent, TokenBudget budget)
      : retrieval_(std::move(retrieval)), n_kv_(n_kv_heads), sinks_(sinks), recent_(recent), budget_(budget) {
    for (uint8_t r : retrieval_) n_retrieval_ += r;
    n_pairs_ = int64_t(retrieval_.size());
  }

  void select(const LayerStep& step, KeySelection& out) override {
    select_position_ranges(step, n_kv_, out, [&](int64_t i, int h) {
      // With a budget, streaming heads read what they hold (the budget moves with n; the
      // eviction below keeps them to it).
      if (is_retrieval(step.layer, h) || budget_.limited()) {
        ranges_.assign({{0, i + 1}});
      } else {
        ranges_.assign({{0, sinks_}, {i - recent_, i + 1}});
        normalize_ranges(ranges_, i + 1);
      }
      return std::span<const PosRange>(ranges_);
    });
  }

  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    const CacheScan scan(*step.cache, n_kv_);
    const int64_t keep = streaming_keep(tokens_seen(step));
    for (int h = 0; h < n_kv_; ++h) {
      if (is_retrieval(step.layer, h)) continue;
      scan.valid_slots(h, slots_);
      const int64_t n = int64_t(slots_.size());
      if (n <= keep) continue;
      // ranks [0, S) are the sinks, [n - (keep - S), n) the most recent
      for (int64_t r = sinks_; r < n - (keep - sinks_); ++r) out.slots[h].push_back(slots_[r]);
    }
  }

  int64_t budget_tokens(int layer, int64_t n_seen) const override {
    for (int h = 0; h < n_kv_; ++h)
      if (is_retrieval(layer, h)) return -1;
    return std::min(n_seen, streaming_keep(n_seen));
  }

  void reset() override {}

  std::optional<ClaimedMask> claimed_mask() const override {
    if (budget_.limited()) return std::nullopt;  // the streaming window moves with n
    const std::vector<uint8_t> ret = retrieval_;
    const int n_kv = n_kv_;
    const int64_t s = sinks_, rr = recent_;
    return ClaimedMask{[ret, n_kv, s, rr](int layer, int h, int64_t i, int64_t j) {
      return j <= i && (ret[size_t(layer) * n_kv + h] != 0 || j < s || i - j <= rr);
    }};
  }

 private:
  bool is_retrieval(int layer, int h) const { return retrieval_[size_t(layer) * n_kv_ + h] != 0; }
  // Tokens a streaming head keeps once the sequence has seen n tokens (sinks included).
  int64_t streaming_keep(int64_t n) const {
    if (!budget_.limited()) return sinks_ + recent_;
    const int64_t n_streaming = n_pairs_ - n_retrieval_;
    if (n_streaming == 0) return n;
    // negative once the retrieval heads alone outgrow a token budget: clamped to the sinks
    const int64_t share = (n_pairs_ * budget_.kept(n) - n_retrieval_ * n) / n_streaming;
    return std::clamp<int64_t>(share, std::min(sinks_, n), std::max<int64_t>(n, 0));
  }

  std::vector<uint8_t> retrieval_;
  int n_kv_;
  int64_t sinks_, recent_;
  TokenBudget budget_;
  int64_t n_retrieval_ = 0, n_pairs_ = 0;
  std::vector<int32_t> slots_;  // scratch
  std::vector<PosRange> ranges_;  // scratch
};

// retrieval_fraction with -1 (auto) resolved; Error for any other negative value.
double resolved_fraction(const ParamValues& p) {
  const double f = p.get_float("retrieval_fraction");
  if (f == -1.0) return p.get_string("heads").empty() ? 0.0 : 0.5;
  if (f < 0)
    fail("duo: retrieval_fraction ", f, ": expected a fraction in [0, 1], or -1 (auto: 0.5 with a head "
         "file, 0 without)");
  return f;
}

std::vector<uint8_t> retrieval_heads(const ParamValues& p, const PolicyModelShape& shape) {
  const double fraction = resolved_fraction(p);
  const std::string& path = p.get_string("heads");
  const size_t n_pairs = size_t(shape.n_layers) * shape.n_kv_heads;
  if (path.empty()) {
    if (fraction == 0.0) return std::vector<uint8_t>(n_pairs, 0);
    if (fraction == 1.0) return std::vector<uint8_t>(n_pairs, 1);
    fail("duo: parameter 'heads' (a head file written by `kvlab calibrate-heads`) is required when "
         "retrieval_fraction is neither 0 nor 1 (got ", fraction, ")");
  }
  return top_fraction_heads(read_head_file(path, shape.n_layers, shape.n_kv_heads), fraction);
}

}  // namespace

std::unique_ptr<PolicyFactory> make_duo_factory() {
  ParamSpecs specs = {
      {"heads", ParamType::kString, std::string(""),
       "head file (kvlab calibrate-heads -o FILE): retrieval score per layer and KV head; "
       "not needed for retrieval_fraction 0 or 1",
       std::nullopt, std::nullopt, {}},
      {"retrieval_fraction", ParamType::kFloat, -1.0,
       "top fraction of (layer, KV head) pairs by score that keep the full cache, rounded up "
       "(DuoAttention: 0.5 GQA, 0.25 MHA); -1 = auto: 0.5 with a head file, 0 (all streaming) without",
       -1.0, 1.0, {}},
      {"sinks", ParamType::kInt, int64_t(64), "S: first tokens a streaming head keeps", 0.0, std::nullopt, {}},
      {"recent", ParamType::kInt, int64_t(256), "R: most recent tokens a streaming head keeps", 0.0,
       std::nullopt, {}},
  };
  for (ParamSpec& s : budget_param_specs()) {
    if (s.name == "budget_tokens")
      s.doc = "mean tokens kept per (layer, KV head) pair (0: use compression_ratio): streaming heads "
              "share what retrieval heads leave; replaces recent";
    specs.push_back(std::move(s));
  }
  return std::make_unique<SimplePolicyFactory>(
      "duo", "DuoAttention: retrieval heads (from a head file) keep all, streaming heads S sinks + R recent",
      std::move(specs),
      [](const ParamValues& p, const PolicyModelShape& shape) {
        const TokenBudget budget = TokenBudget::from_params(p);
        std::vector<uint8_t> retrieval = retrieval_heads(p, shape);
        int64_t n_retrieval = 0;
        for (uint8_t r : retrieval) n_retrieval += r;
        const int64_t n_pairs = int64_t(retrieval.size());
        if (budget.compression_ratio > 0 && (1.0 - budget.compression_ratio) * double(n_pairs) < double(n_retrieval))
          fail("duo: compression_ratio ", budget.compression_ratio, " keeps less of the cache than the ", n_retrieval,
               " of ", n_pairs, " (layer, KV head) pairs that are retrieval heads hold alone; with retrieval_fraction ",
               resolved_fraction(p), " compression_ratio can be at most ",
               1.0 - double(n_retrieval) / double(n_pairs));
        return std::make_unique<DuoPolicy>(std::move(retrieval), shape.n_kv_heads, p.get_int("sinks"),
                                           p.get_int("recent"), budget);
      },
      std::map<std::string, ParamValue>{{"retrieval_fraction", 1.0}},
      // Conformance suite: every head streaming (the head-file sets are made at test time, so
      // they stay in policy_testing.cpp's table).
      SimplePolicyFactory::Conformance{{.params = {{"retrieval_fraction", 0.0}, {"sinks", int64_t(2)}, {"recent", int64_t(6)}},
                                        .evicts = true, .mask_based = true, .sinks_param = "sinks"}},
      [](const ParamValues& p, const PolicyModelShape&) {
        std::map<std::string, ParamValue> out = p.all();
        out["retrieval_fraction"] = resolved_fraction(p);
        return out;
      });
}

}  // namespace kvlab
