// quest: query-aware page selection (Quest, arXiv 2406.10774; POLICIES.md 15). A selecting
// policy: it never evicts (every token stays resident) and each decode step reads a few pages.
//
// Pages are the KV store's blocks (LayerCacheView::page_size()). Per page p and KV head the store
// keeps the elementwise max M_p and min m_p of the page's keys (PolicyNeeds::page_stats). Per
// query head q, the page's score is the upper bound of q.k over the page's keys
//   u_p = sum_d max(q_d M_{p,d}, q_d m_{p,d})
// (unscaled: 1/sqrt(d) does not change the order). At a decode step of a layer >= dense_layers,
// with B = TokenBudget::kept(n) for the n tokens seen (policies/budget.h; here a budget on the
// tokens READ per step, not on those resident), the step reads P = max(1, floor(B / page_size))
// pages: the current (last) page always, plus the top P - 1 of the other pages by score; all
// pages when there are at most P, or when B covers every token seen (B = n, which the floor would
// miss when the current page is partial). Reads stay <= B whenever B >= page_size.
// The conversion follows mit-han-lab/Quest: page_budget = token_budget // page_size counts the
// last page, which is always read, and the top-k runs over the other pages
// (quest/utils/controller.py, InferenceController.begin_forward: "Exclude the last page").
// Pages holding no valid key of the head are never chosen; ties go to the lower page.
//
// GQA (kvlab choice, POLICIES.md 15; selection is per KV head):
//   gqa=max (default): the KV head's score of a page is the max of u_p over its G query heads,
//     one top-(P-1) per KV head, so a step reads <= B tokens and compares at equal budget;
//   gqa=union: each query head takes its own top P-1 pages (Quest's per-head selection on the
//     MHA models it was evaluated on) and the KV head reads their union: up to G(P-1)+1 pages,
//     G times the budget at worst (the engine's "attended" counts report what was read).
// The first dense_layers layers (default 2) and every prefill chunk read everything, as in the
// reference (evaluation/quest_attention.py: `if q_len > 1 or self.layer_id < 2` runs dense).
// budget_tokens() is -1 (resident = everything seen); the reads of each decode step are what
// the engine reports as attended (set = achieved = the explicit selection).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "framework/core/error.h"
#include "framework/policy/simple_factory.h"
#include "policies/budget.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

enum class QuestGqa { kMax, kUnion };

struct QuestConfig {
  TokenBudget budget;
  int64_t dense_layers = 2;
  QuestGqa gqa = QuestGqa::kMax;
};

class QuestPolicy final : public AttentionPolicy {
 public:
  explicit QuestPolicy(const QuestConfig& c) : c_(c) {}

  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.queries = true;     // page scores are q . bounds
    n.page_stats = true;  // the store's per-page key max / min
    return n;
  }

  void select(const LayerStep& step, KeySelection& out) override {
    if (step.is_prefill || step.n_new != 1 || step.layer < c_.dense_layers || !c_.budget.limited()) return;
    const LayerCacheView& cache = *step.cache;
    const int n_kv = step.shape.n_kv_heads, d = step.shape.head_dim;
    const int group = step.shape.n_heads / n_kv;
    if (step.queries.size() < size_t(step.shape.n_heads) * d)
      fail("quest: the step carries no queries (PolicyNeeds::queries)");
    const int ps = cache.page_size(), n_pages = cache.n_pages(), n_slots = cache.n_slots();
    const int64_t n_seen = step.positions[0] + 1, budget = c_.budget.kept(n_seen);
    const int64_t pages_read = budget >= n_seen ? n_pages : std::max<int64_t>(1, budget / ps);
    const int last = n_pages - 1;                               // the current page: always read
    const int64_t top = std::min<int64_t>(pages_read - 1, last);  // chosen among pages [0, last)
    if (top > 0 && top < last) score_pages(cache, step.queries, n_kv * group, group, d, last);
    out.begin(1, n_kv);
    for (int h = 0; h < n_kv; ++h) {
      chosen_.assign(size_t(n_pages), 0);
      chosen_[last] = 1;
      if (top == last) {
        std::fill(chosen_.begin(), chosen_.end(), 1);
      } else if (top > 0) {
        const float* head_scores = scores_.data() + size_t(h) * group * last;
        if (c_.gqa == QuestGqa::kMax) {
          agg_.assign(size_t(last), -std::numeric_limits<float>::infinity());
          for (int g = 0; g < group; ++g)
            for (int p = 0; p < last; ++p) agg_[p] = std::max(agg_[p], head_scores[size_t(g) * last + p]);
          choose_top(agg_.data(), last, top);
        } else {
          for (int g = 0; g < group; ++g) choose_top(head_scores + size_t(g) * last, last, top);
        }
      }
      for (int p = 0; p < n_pages; ++p)
        if (chosen_[p]) out.add(p * ps, std::min(n_slots, (p + 1) * ps));
      out.close_list();
    }
  }

  void reset() override {}

 private:
  // scores_[hq * n + p] = u_p of query head hq (KV head hq / G) for pages p < n; -inf for a page
  // without a valid key of the KV head (its bounds are -inf / +inf) and for a NaN score. Pages
  // outer, heads inner: the store's bounds are laid out [page, kv_head, feat], so this sweeps them
  // in memory order.
  // max(q_d M_d, q_d m_d) = q+_d M_d + q-_d m_d with q+ = max(q, 0), q- = min(q, 0) (M >= m), so
  // u_p is two dot products, summed in 8 independent partial sums (one SIMD register).
  void score_pages(const LayerCacheView& cache, std::span<const float> q_all, int n_heads, int group,
                   int d, int n) {
    scores_.assign(size_t(n_heads) * n, -std::numeric_limits<float>::infinity());
    q_pos_.resize(size_t(n_heads) * d);
    q_neg_.resize(size_t(n_heads) * d);
    for (size_t i = 0; i < size_t(n_heads) * d; ++i) {
      q_pos_[i] = std::max(q_all[i], 0.f);
      q_neg_[i] = std::min(q_all[i], 0.f);
    }
    for (int p = 0; p < n; ++p)
      for (int h = 0; h < n_heads / group; ++h) {
        const float* mx = cache.page_key_max(p, h);
        const float* mn = cache.page_key_min(p, h);
        if (!mx || !mn) fail("quest: the cache keeps no page statistics (PolicyNeeds::page_stats)");
        if (!(mx[0] >= mn[0])) continue;  // no valid key of this head in the page
        for (int hq = h * group; hq < (h + 1) * group; ++hq) {
          const float* qp = q_pos_.data() + size_t(hq) * d;
          const float* qn = q_neg_.data() + size_t(hq) * d;
          float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          int f = 0;
          for (; f + 8 <= d; f += 8)
            for (int l = 0; l < 8; ++l) acc[l] += qp[f + l] * mx[f + l] + qn[f + l] * mn[f + l];
          float u = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
          for (; f < d; ++f) u += qp[f] * mx[f] + qn[f] * mn[f];
          if (!std::isnan(u)) scores_[size_t(hq) * n + p] = u;
        }
      }
  }
  // Marks in chosen_ the k best of score[0, n) (higher first, then the lower page), skipping
  // pages that cannot be read (-inf).
  void choose_top(const float* score, int n, int64_t k) {
    order_.resize(size_t(n));
    std::iota(order_.begin(), order_.end(), 0);
    auto better = [&](int32_t a, int32_t b) { return score[a] != score[b] ? score[a] > score[b] : a < b; };
    std::nth_element(order_.begin(), order_.begin() + k, order_.end(), better);
    for (int64_t i = 0; i < k; ++i)
      if (score[order_[i]] > -std::numeric_limits<float>::infinity()) chosen_[order_[i]] = 1;
  }

  QuestConfig c_;
  // Scratch (overwritten every call).
  std::vector<float> scores_, agg_, q_pos_, q_neg_;
  std::vector<int32_t> order_;
  std::vector<uint8_t> chosen_;
};

}  // namespace

std::unique_ptr<PolicyFactory> make_quest_factory() {
  ParamSpecs specs = {
      {"dense_layers", ParamType::kInt, int64_t(2), "first layers that read everything (Quest: 2)",
       0.0, std::nullopt, {}},
      {"gqa", ParamType::kString, std::string("max"),
       "KV head's pages: max score over its query heads (reads within budget) or the union of "
       "their own top pages (up to G x budget)",
       std::nullopt, std::nullopt, {"max", "union"}},
  };
  for (ParamSpec& s : budget_param_specs(0.0)) {
    s.doc = "reads per decode step: " + s.doc;
    specs.push_back(std::move(s));
  }
  return std::make_unique<SimplePolicyFactory>(
      "quest", "Quest: per decode step read the current page + the top pages by q.min/max key bound",
      std::move(specs),
      [](const ParamValues& p, const PolicyModelShape&) {
        QuestConfig c;
        c.budget = TokenBudget::from_params(p);
        c.dense_layers = p.get_int("dense_layers");
        c.gqa = p.get_string("gqa") == "union" ? QuestGqa::kUnion : QuestGqa::kMax;
        return std::make_unique<QuestPolicy>(c);
      },
      // A budget above any context: every page read, through the explicit page lists, in every
      // layer (so the conformance suites exercise the selection path against `full`).
      std::map<std::string, ParamValue>{{"budget_tokens", int64_t(1) << 40}, {"dense_layers", int64_t(0)}},
      SimplePolicyFactory::Conformance{  // conformance suite: acting parameter sets (selects, never evicts)
          {.params = {{"budget_tokens", int64_t(12)}, {"dense_layers", int64_t(1)}}},
          {.params = {{"compression_ratio", 0.6}, {"dense_layers", int64_t(0)}, {"gqa", std::string("union")}}}});
}

}  // namespace kvlab
