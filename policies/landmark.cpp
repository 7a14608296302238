// landmark: training-free, HiLS-style chunk selection (POLICIES.md 6).
//
// Per layer and KV head, the text is cut into chunks of C positions, chunk c = [cC, (c+1)C).
// When a chunk closes (its last token is appended) it gets a landmark, computed once:
//   mean    k'_c = mean_j k_j, bias 0;  logit(q) = tau q.k'_c
//   bounds  (Quest) M_c = max_j k_j, m_c = min_j k_j elementwise; logit(q) = tau sum_d max(q_d M_d, q_d m_d)
//   pooled  proxy query q' = the chunk's last token's query (mean over the KV head's G query
//           heads), p = softmax(tau q'.K_c), k'_c = sum_j p_j k_j, bias b_c = -sum_j p_j log p_j
//           (entropy_bias), so tau q.k'_c + b_c ~ log sum_j exp(tau q.k_j); logit = tau q.k'_c + b_c
// Query i (row r) then reads S sinks u the local region u the top-K eligible chunks, with exact
// softmax over that union (the kernels merge it). Eligible = closed chunks ending before the
// window (i-W, i]: c < E = floor((i - W + 1) / C). local=extend (default): the local region is
// [E*C, i] (W .. W+C-1 keys), so no key is unreadable and top_k >= E is exactly full attention;
// local=exact: (i-W, i].
// GQA (a KeySelection is per KV head: all G query heads of a group read the same keys):
//   gqa=softmax_max (default): per query head p_c = exp(logit_c - logsumexp(local LSE, all chunk
//     logits)) with the local LSE over sinks u local region; the chunk's score is the max of p_c
//     over the group (HiLS's aggregation, POLICIES.md 6).
//   gqa=max: max of the raw logits over the group.
//   gqa=sum: sum of the same p_c over the group. (kvlab choice) It adds probabilities where
//     InfLLM (arXiv 2402.04617, one selection summed over heads) adds the raw scores: p_c is the
//     share of a head's attention the chunk would get, so the sum is the group's expected
//     attention on the chunk, comparable across heads whose logits differ in scale or offset
//     (a raw-score sum lets the head with the largest logits decide alone); it is the sum
//     counterpart of softmax_max. With G = 1 every aggregation ranks by the raw logits.
//   gqa=per_head: every query head ranks the chunks by its own logits and picks its own top-K
//     (Quest's per-head selection). Since the selection is per KV head, the KV head reads the
//     union of its query heads' picks (at most G*K chunks; with a budget, see below, the union
//     is filled rank by rank, head 0 first, up to the budget's chunk count): each query head
//     reads every chunk it chose, plus the chunks its group mates chose (more keys, never
//     fewer). Exactly one chunk set per query head would need per-query-head selection lists in
//     kernels/common/selection.h (not done). With G = 1 it equals the other aggregations.
// Ties go to the lower chunk index. Prefill is dense by default (prefill=select applies the
// selection to every row of a chunk). Nothing is evicted; original RoPE positions.
// The budget convention (POLICIES.md 9, policies/budget.h): with compression_ratio or
// budget_tokens set, b = kept(i + 1) is query i's whole read budget, sinks and local region
// inside: the window shrinks to W_i = clamp(b - S, 1, W) when the budget is small, the local
// region (extension included) holds at most max(1, b - S) keys, and top-K becomes
// K_i = floor((b - sink keys outside the local region - local keys) / C) (a chunk holding sinks
// is charged in full), so a row reads at most max(b, S + 1) keys (S + 1: the sinks and the query
// itself, the floor); b >= i + 1 reads every eligible chunk (with local=extend: everything).
// top_k is then derived: setting it too is an error, and so is budget_tokens <= S. Dense
// prefill rows (the default) still read everything.
//
// Defaults C=64, K=32, W=512, S=4; 0 = auto, scaled to the model's training context L when
// L < 8192: C = clamp(pow2_floor(L/128), 8, 64), W = clamp(L/16, 2C, 512), K = clamp(L/(4C), 2, 32).
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/cache_scan.h"

namespace kvlab {
namespace {

enum class Landmark { kMean, kBounds, kPooled };
enum class Gqa { kSoftmaxMax, kMax, kSum, kPerHead };

struct LandmarkConfig {
  int64_t chunk = 64, top_k = 32, window = 512, sinks = 4;
  Landmark landmark = Landmark::kPooled;
  Gqa gqa = Gqa::kSoftmaxMax;
  bool extend_local = true;
  bool dense_prefill = true;
  bool entropy_bias = true;
  TokenBudget budget;  // unlimited: top_k and window as given
};

// a . b with 8 independent partial sums (so the compiler can keep it in one SIMD register).
float dot(const float* a, const float* b, int n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  float s = 0.f;
  for (; k < n; ++k) s += a[k] * b[k];
  return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float log_sum_exp(std::span<const float> x) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : x) m = std::max(m, v);
  if (m == -std::numeric_limits<float>::infinity()) return m;
  double s = 0;
  for (float v : x) s += std::exp(double(v - m));
  return m + float(std::log(s));
}

class LandmarkPolicy final : public AttentionPolicy {
 public:
  explicit LandmarkPolicy(const LandmarkConfig& c) : c_(c) {}

  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.queries = true;  // chunk scores are query . landmark
    return n;
  }

  void select(const LayerStep& step, KeySelection& out) override {
    const int n_kv = step.shape.n_kv_heads, d = step.shape.head_dim;
    const int group = step.shape.n_heads / n_kv;
    const float tau = 1.f / std::sqrt(float(d));
    const CacheScan scan(*step.cache, n_kv);
    close_chunks(step, scan, tau);
    if (step.is_prefill && c_.dense_prefill) return;  // stays select_all
    const LayerState& st = layers_[step.layer];
    out.begin(step.n_new, n_kv);
    for (int r = 0; r < step.n_new; ++r) {
      const int64_t i = step.positions[r];
      const RowPlan plan = plan_row(i, st.n_closed);
      const int64_t n_elig = plan.n_elig, local_begin = plan.local_begin, top_k = plan.top_k;
      for (int h = 0; h < n_kv; ++h) {
        ranges_.clear();
        ranges_.push_back({0, c_.sinks});
        ranges_.push_back({local_begin, i + 1});
        if (n_elig <= top_k) {
          ranges_.push_back({0, n_elig * c_.chunk});
        } else if (top_k == 0) {
          // (a budget with no room for a chunk)
        } else if (c_.gqa == Gqa::kPerHead && group > 1) {
          per_head_chunks(step, st.heads[h], r, h, group, n_elig, top_k, tau);
          for (int32_t c : chosen_) ranges_.push_back({c * c_.chunk, (c + 1) * c_.chunk});
        } else {
          score_chunks(step, scan, st.heads[h], r, h, group, n_elig, tau, i, local_begin);
          order_.resize(size_t(n_elig));
          std::iota(order_.begin(), order_.end(), 0);
          auto better = [&](int32_t a, int32_t b) {
            return agg_[a] != agg_[b] ? agg_[a] > agg_[b] : a < b;
          };
          std::nth_element(order_.begin(), order_.begin() + top_k, order_.end(), better);
          for (int64_t k = 0; k < top_k; ++k)
            ranges_.push_back({order_[k] * c_.chunk, (order_[k] + 1) * c_.chunk});
        }
        normalize_ranges(ranges_, i + 1);
        add_position_ranges(scan, h, ranges_, out);
        out.close_list();
      }
    }
  }

  void reset() override { layers_.clear(); }

 private:
  struct HeadChunks {
    std::vector<float> keys;  // [n_closed, d] (mean, pooled) or [n_closed, 2, d] (bounds: max, min)
    std::vector<float> bias;  // [n_closed]
  };
  struct LayerState {
    int64_t n_closed = 0;
    std::vector<HeadChunks> heads;  // [n_kv_heads]
  };

  // What query i reads besides its chunks: n_elig eligible chunks, the local region
  // [local_begin, i], and how many chunks it may take (see the header).
  struct RowPlan {
    int64_t n_elig, local_begin, top_k;
  };
  RowPlan plan_row(int64_t i, int64_t n_closed) const {
    const int64_t C = c_.chunk;
    const int64_t b = c_.budget.limited() ? c_.budget.kept(i + 1) : -1;
    if (b < 0 || b >= i + 1) {  // no budget, or one that keeps every key: every eligible chunk
      const int64_t n_elig = std::min<int64_t>(std::max<int64_t>(0, (i - c_.window + 1) / C), n_closed);
      return {n_elig, c_.extend_local ? n_elig * C : i - c_.window + 1, b < 0 ? c_.top_k : n_elig};
    }
    const int64_t local_max = std::max<int64_t>(1, b - c_.sinks);  // local keys the budget allows
    const int64_t window = std::min(c_.window, local_max);
    const int64_t n_elig = std::min<int64_t>(std::max<int64_t>(0, (i - window + 1) / C), n_closed);
    const int64_t local_begin =
        std::max(c_.extend_local ? n_elig * C : i - window + 1, i + 1 - local_max);
    const int64_t sink_keys = std::min(c_.sinks, local_begin);  // sinks outside the local region
    const int64_t left = b - sink_keys - (i + 1 - local_begin);
    return {n_elig, local_begin, std::max<int64_t>(0, left) / C};
  }

  // logits_[c], c < n_elig: query head q's chunk logits (landmarks of hc).
  void chunk_logits(const float* q, const HeadChunks& hc, int64_t n_elig, float tau, int d) {
    logits_.resize(size_t(n_elig));
    for (int64_t c = 0; c < n_elig; ++c) {
      if (c_.landmark == Landmark::kBounds) {
        const float* mx = hc.keys.data() + size_t(c) * 2 * d;
        const float* mn = mx + d;
        float s = 0.f;
        for (int k = 0; k < d; ++k) s += std::max(q[k] * mx[k], q[k] * mn[k]);
        logits_[c] = tau * s;
      } else {
        logits_[c] = tau * dot(q, hc.keys.data() + size_t(c) * d, d) + hc.bias[c];
      }
    }
  }

  // gqa=per_head: chosen_ = the union of each query head's top_k chunks by its own logits
  // (ties to the lower index), taken rank by rank (every head's best, then every head's second,
  // ...; head order within a rank), at most top_k chunks when a budget is set.
  void per_head_chunks(const LayerStep& step, const HeadChunks& hc, int r, int h, int group,
                       int64_t n_elig, int64_t top_k, float tau) {
    const int d = step.shape.head_dim;
    ranked_.assign(size_t(group) * top_k, 0);  // [group, top_k]: each head's picks, best first
    for (int g = 0; g < group; ++g) {
      chunk_logits(step.queries.data() + (size_t(r) * step.shape.n_heads + h * group + g) * d, hc, n_elig, tau, d);
      order_.resize(size_t(n_elig));
      std::iota(order_.begin(), order_.end(), 0);
      auto better = [&](int32_t a, int32_t b) { return logits_[a] != logits_[b] ? logits_[a] > logits_[b] : a < b; };
      std::partial_sort(order_.begin(), order_.begin() + top_k, order_.end(), better);
      std::copy(order_.begin(), order_.begin() + top_k, ranked_.begin() + size_t(g) * top_k);
    }
    const int64_t cap = c_.budget.limited() ? top_k : int64_t(group) * top_k;
    chosen_.clear();
    taken_.assign(size_t(n_elig), 0);
    for (int64_t k = 0; k < top_k && int64_t(chosen_.size()) < cap; ++k)
      for (int g = 0; g < group && int64_t(chosen_.size()) < cap; ++g) {
        const int32_t c = ranked_[size_t(g) * top_k + k];
        if (!taken_[c]) taken_[c] = 1, chosen_.push_back(c);
      }
  }

  // Landmarks for every chunk whose last position is now cached.
  void close_chunks(const LayerStep& step, const CacheScan& scan, float tau) {
    const int n_kv = step.shape.n_kv_heads, d = step.shape.head_dim;
    const int group = step.shape.n_heads / n_kv;
    if (int(layers_.size()) <= step.layer) layers_.resize(step.layer + 1);
    LayerState& st = layers_[step.layer];
    st.heads.resize(n_kv);
    const int64_t target = tokens_seen(step) / c_.chunk;
    for (int64_t c = st.n_closed; c < target; ++c) {
      // The row of the chunk's last token in this step (for the pooled proxy query), or -1.
      int proxy_row = -1;
      for (int r = 0; r < step.n_new; ++r)
        if (step.positions[r] == (c + 1) * c_.chunk - 1) proxy_row = r;
      for (int h = 0; h < n_kv; ++h) {
        const int b = scan.first_slot_at_or_after(h, c * c_.chunk);
        const int e = scan.first_slot_at_or_after(h, (c + 1) * c_.chunk);
        keys_.clear();
        for (int s = b; s < e; ++s) {
          if (!scan.valid(s, h)) continue;
          keys_.resize(keys_.size() + d);
          scan.view().load_key(s, h, keys_.data() + keys_.size() - d);
        }
        const int n = int(keys_.size() / d);
        HeadChunks& hc = st.heads[h];
        if (c_.landmark == Landmark::kBounds) {
          std::vector<float> mx(d, -std::numeric_limits<float>::infinity()), mn(d, std::numeric_limits<float>::infinity());
          for (int j = 0; j < n; ++j)
            for (int k = 0; k < d; ++k) {
              mx[k] = std::max(mx[k], keys_[size_t(j) * d + k]);
              mn[k] = std::min(mn[k], keys_[size_t(j) * d + k]);
            }
          if (n == 0) std::fill(mx.begin(), mx.end(), 0.f), std::fill(mn.begin(), mn.end(), 0.f);
          hc.keys.insert(hc.keys.end(), mx.begin(), mx.end());
          hc.keys.insert(hc.keys.end(), mn.begin(), mn.end());
          hc.bias.push_back(0.f);
          continue;
        }
        std::vector<float> w(n, n ? 1.f / n : 0.f);  // mean weights
        float bias = 0.f;
        if (c_.landmark == Landmark::kPooled && proxy_row >= 0 && n > 0) {
          std::vector<float> q(d, 0.f);
          for (int g = 0; g < group; ++g) {
            const float* qh = step.queries.data() + (size_t(proxy_row) * step.shape.n_heads + h * group + g) * d;
            for (int k = 0; k < d; ++k) q[k] += qh[k] / group;
          }
          for (int j = 0; j < n; ++j) w[j] = tau * dot(q.data(), keys_.data() + size_t(j) * d, d);
          const float lse = log_sum_exp(w);
          for (int j = 0; j < n; ++j) {
            const float logp = w[j] - lse;
            w[j] = std::exp(logp);
            if (c_.entropy_bias && w[j] > 0.f) bias -= w[j] * logp;
          }
        }
        const size_t off = hc.keys.size();
        hc.keys.resize(off + d, 0.f);
        for (int j = 0; j < n; ++j)
          for (int k = 0; k < d; ++k) hc.keys[off + k] += w[j] * keys_[size_t(j) * d + k];
        hc.bias.push_back(bias);
      }
      st.n_closed = c + 1;
    }
  }

  // agg_[c] for c < n_elig: the chunk scores of KV head h for row r (see the header).
  void score_chunks(const LayerStep& step, const CacheScan& scan, const HeadChunks& hc, int r,
                    int h, int group, int64_t n_elig, float tau, int64_t i, int64_t local_begin) {
    const int d = step.shape.head_dim;
    // With one query head per KV head every aggregation ranks chunks like the raw logits (the
    // softmax normaliser is shared by all chunks), so the local LSE is skipped.
    const bool probs = c_.gqa != Gqa::kMax && group > 1;
    agg_.assign(size_t(n_elig), probs && c_.gqa == Gqa::kSum ? 0.f : -std::numeric_limits<float>::infinity());
    if (probs) {  // keys of sinks u local region, for the local LSE
      keys_.clear();
      local_ranges_ = {{0, c_.sinks}, {local_begin, i + 1}};
      normalize_ranges(local_ranges_, i + 1);
      for (const PosRange& pr : local_ranges_)
        for (int s = scan.first_slot_at_or_after(h, pr.begin), e = scan.first_slot_at_or_after(h, pr.end); s < e; ++s)
          if (scan.valid(s, h)) {
            keys_.resize(keys_.size() + d);
            scan.view().load_key(s, h, keys_.data() + keys_.size() - d);
          }
    }
    for (int g = 0; g < group; ++g) {
      const float* q = step.queries.data() + (size_t(r) * step.shape.n_heads + h * group + g) * d;
      chunk_logits(q, hc, n_elig, tau, d);
      if (!probs) {
        for (int64_t c = 0; c < n_elig; ++c) agg_[c] = std::max(agg_[c], logits_[c]);
        continue;
      }
      local_.clear();
      for (size_t j = 0; j < keys_.size() / d; ++j) local_.push_back(tau * dot(q, keys_.data() + j * d, d));
      const float local_lse = log_sum_exp(local_);
      float z = log_sum_exp(logits_);
      const float m = std::max(z, local_lse);
      z = m == -std::numeric_limits<float>::infinity()
              ? m : m + std::log(std::exp(z - m) + std::exp(local_lse - m));
      for (int64_t c = 0; c < n_elig; ++c) {
        const float p = std::exp(logits_[c] - z);
        agg_[c] = c_.gqa == Gqa::kSum ? agg_[c] + p : std::max(agg_[c], p);
      }
    }
  }

  LandmarkConfig c_;
  std::vector<LayerState> layers_;  // [layer]: the per-sequence state
  // Scratch (overwritten every call).
  std::vector<PosRange> ranges_, local_ranges_;
  std::vector<float> keys_, agg_, logits_, local_;
  std::vector<int32_t> order_, ranked_, chosen_;
  std::vector<uint8_t> taken_;
};

int64_t pow2_floor(int64_t x) { return x < 1 ? 1 : int64_t(std::bit_floor(uint64_t(x))); }

// C, W, K with 0 = auto resolved for the model's training context L (see the header).
struct ResolvedSizes {
  int64_t chunk, window, top_k;
};
ResolvedSizes resolve_sizes(const ParamValues& p, const PolicyModelShape& shape) {
  const int64_t L = shape.max_seq_len;
  const bool small = L > 0 && L < 8192;
  ResolvedSizes z{p.get_int("chunk_size"), p.get_int("window"), p.get_int("top_k")};
  if (z.chunk == 0) z.chunk = small ? std::clamp<int64_t>(pow2_floor(L / 128), 8, 64) : 64;
  if (z.window == 0) z.window = small ? std::clamp<int64_t>(L / 16, 2 * z.chunk, 512) : 512;
  if (z.top_k == 0) z.top_k = small ? std::clamp<int64_t>(L / (4 * z.chunk), 2, 32) : 32;
  return z;
}

}  // namespace

std::unique_ptr<PolicyFactory> make_landmark_factory() {
  ParamSpecs specs = {
      {"chunk_size", ParamType::kInt, int64_t(0), "C: tokens per chunk (0 = auto: 64, scaled down for small models)", 0.0, std::nullopt, {}},
      {"top_k", ParamType::kInt, int64_t(0), "K: chunks read per KV head (0 = auto: 32, scaled down)", 0.0, std::nullopt, {}},
      {"window", ParamType::kInt, int64_t(0), "W: local window (0 = auto: 512, scaled down)", 0.0, std::nullopt, {}},
      {"sinks", ParamType::kInt, int64_t(4), "S: first positions always read", 0.0, std::nullopt, {}},
      {"landmark", ParamType::kString, std::string("pooled"),
       "chunk summary: mean key, Quest min/max bounds, or attention-pooled key (last query)",
       std::nullopt, std::nullopt, {"pooled", "mean", "bounds"}},
      {"entropy_bias", ParamType::kBool, true, "pooled: add the entropy bias -sum p log p", std::nullopt, std::nullopt, {}},
      {"gqa", ParamType::kString, std::string("softmax_max"),
       "chunk scores over a KV head's query heads: max / sum of softmax probabilities, max of "
       "logits, or per_head (each query head's own top-K; the KV head reads their union)",
       std::nullopt, std::nullopt, {"softmax_max", "max", "sum", "per_head"}},
      {"local", ParamType::kString, std::string("extend"),
       "extend: local region reaches back to the last eligible chunk; exact: W keys", std::nullopt,
       std::nullopt, {"extend", "exact"}},
      {"prefill", ParamType::kString, std::string("dense"),
       "dense: prefill chunks read everything; select: select per row", std::nullopt,
       std::nullopt, {"dense", "select"}},
  };
  return std::make_unique<SimplePolicyFactory>(
      "landmark", "HiLS-style chunk selection: sinks + local window + top-K chunks by landmark",
      with_budget_params(std::move(specs)),
      [](const ParamValues& p, const PolicyModelShape& shape) {
        const ResolvedSizes z = resolve_sizes(p, shape);
        LandmarkConfig c;
        c.chunk = z.chunk;
        c.window = z.window;
        c.top_k = z.top_k;
        c.sinks = p.get_int("sinks");
        const std::string& lm = p.get_string("landmark");
        c.landmark = lm == "mean" ? Landmark::kMean : lm == "bounds" ? Landmark::kBounds : Landmark::kPooled;
        c.entropy_bias = p.get_bool("entropy_bias");
        const std::string& g = p.get_string("gqa");
        c.gqa = g == "max" ? Gqa::kMax : g == "sum" ? Gqa::kSum : g == "per_head" ? Gqa::kPerHead : Gqa::kSoftmaxMax;
        c.budget = TokenBudget::from_params(p);
        if (c.budget.limited() && p.get_int("top_k") != 0)
          fail("compression_ratio / budget_tokens give the number of chunks read (what the budget "
               "leaves after sinks and local region): leave top_k at 0 (auto) or set no budget; "
               "got top_k = ", p.get_int("top_k"));
        if (c.budget.budget_tokens > 0 && c.budget.budget_tokens <= c.sinks)
          fail("budget_tokens (", c.budget.budget_tokens, ") must exceed sinks (", c.sinks,
               "): the sinks count inside the budget, and each query also reads itself");
        c.extend_local = p.get_string("local") == "extend";
        c.dense_prefill = p.get_string("prefill") == "dense";
        if (c.window < 1) fail("landmark: window must be >= 1");
        return std::make_unique<LandmarkPolicy>(c);
      },
      std::map<std::string, ParamValue>{{"top_k", int64_t(1) << 40}, {"prefill", std::string("select")}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets (selects, never evicts)
          {.params = {{"chunk_size", int64_t(8)}, {"top_k", int64_t(2)}, {"window", int64_t(12)}}},
          {.params = {{"chunk_size", int64_t(4)}, {"top_k", int64_t(3)}, {"window", int64_t(6)},
                      {"landmark", std::string("bounds")}, {"prefill", std::string("select")}}},
          {.params = {{"chunk_size", int64_t(4)}, {"top_k", int64_t(3)}, {"window", int64_t(6)},
                      {"landmark", std::string("bounds")}, {"gqa", std::string("max")}, {"prefill", std::string("select")}}},
          {.params = {{"chunk_size", int64_t(8)}, {"top_k", int64_t(2)}, {"window", int64_t(9)},
                      {"landmark", std::string("mean")}, {"gqa", std::string("sum")}, {"local", std::string("exact")},
                      {"prefill", std::string("select")}}},
          {.params = {{"chunk_size", int64_t(8)}, {"top_k", int64_t(2)}, {"window", int64_t(12)},
                      {"gqa", std::string("per_head")}}},
          {.params = {{"chunk_size", int64_t(4)}, {"window", int64_t(6)}, {"compression_ratio", 0.5},
                      {"gqa", std::string("per_head")}, {"prefill", std::string("select")}}}},
      [](const ParamValues& p, const PolicyModelShape& shape) {
        const ResolvedSizes z = resolve_sizes(p, shape);
        std::map<std::string, ParamValue> out = p.all();
        out["chunk_size"] = z.chunk;
        out["window"] = z.window;
        // With a budget the chunk count is derived per query (0 recorded: not a fixed K).
        out["top_k"] = TokenBudget::from_params(p).limited() ? int64_t(0) : z.top_k;
        return out;
      });
}

}  // namespace kvlab
