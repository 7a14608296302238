// The one budget convention (POLICIES.md 9, policies/budget.h) in sliding_window, sinks and
// landmark: with compression_ratio or budget_tokens set, what each query reads and what stays
// resident is within kept(n) at every step of the simulator; the budgeted forms equal the
// plain policies they reduce to; the conflicting settings are one error each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "framework/core/error_testing.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

using testing::PolicySimulator;
using testing::SimOptions;
using P = std::map<std::string, ParamValue>;

const PolicyRegistry& registry() {
  static const PolicyRegistry r = make_builtin_registry();
  return r;
}

// kept(n) written out from POLICIES.md 9 (not through TokenBudget): n - floor(r n), at least 1;
// min(n, B) for a token budget.
int64_t kept(const P& budget, int64_t n) {
  if (auto it = budget.find("budget_tokens"); it != budget.end())
    return std::min<int64_t>(n, std::get<int64_t>(it->second));
  const double r = std::get<double>(budget.at("compression_ratio"));
  return std::max<int64_t>(1, n - int64_t(std::floor(r * double(n))));
}

P merged(P a, const P& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

// Prefill chunks between runs of decode steps (rows of a chunk are checked one by one).
const std::vector<int> kSchedule = [] {
  std::vector<int> s = {5};
  for (int t = 0; t < 25; ++t) s.push_back(1);
  s.push_back(9);
  for (int t = 0; t < 30; ++t) s.push_back(1);
  s.push_back(3);
  for (int t = 0; t < 15; ++t) s.push_back(1);
  return s;
}();

struct Case {
  std::string policy;
  P params;
  int64_t sinks;      // S: the read floor is min(i + 1, S + 1), the resident floor min(n, S)
  bool evicts;        // resident is bounded too (else only reads)
  int64_t slack;      // reads >= kept - slack (the budget is used, not just respected)
};

std::vector<Case> cases() {
  const P lm = {{"chunk_size", int64_t(4)}, {"window", int64_t(6)}, {"sinks", int64_t(2)},
                {"prefill", std::string("select")}};
  // landmark's slack (see landmark.cpp), C = 4, S = 2: while chunks are left unread,
  // K_i = floor(left / C) leaves < C of the budget unused and chunk 0, which holds the sinks,
  // adds S fewer new keys than it is charged: < C + S. Once every eligible chunk is read, only
  // the keys between the last eligible chunk and the local region (< C) go unread.
  const int64_t lm_slack = 4 + 2;
  return {
      {"sliding_window", {}, 0, true, 0},
      {"sliding_window", {{"mode", std::string("mask")}}, 0, false, 0},
      {"sinks", {{"sinks", int64_t(2)}}, 2, true, 0},
      {"sinks", {{"sinks", int64_t(4)}, {"rope_positions", std::string("original")}}, 4, true, 0},
      {"landmark", lm, 2, false, lm_slack},
      {"landmark", merged(lm, {{"local", std::string("exact")}, {"landmark", std::string("bounds")}}), 2, false, lm_slack},
      {"landmark", merged(lm, {{"gqa", std::string("per_head")}}), 2, false, lm_slack},
      {"landmark", merged(lm, {{"gqa", std::string("sum")}, {"landmark", std::string("mean")}}), 2, false, lm_slack},
  };
}

const std::vector<P> kBudgets = {{{"compression_ratio", 0.5}}, {{"compression_ratio", 0.75}},
                                 {{"budget_tokens", int64_t(12)}}, {{"budget_tokens", int64_t(30)}}};

TEST(BudgetConvention, ReadsAndResidentWithinKeptEveryStep) {
  SimOptions o;  // 2 layers, 4 query heads over 2 KV heads
  for (const Case& c : cases())
    for (const P& budget : kBudgets) {
      const P params = merged(c.params, budget);
      SCOPED_TRACE(testing::describe({c.policy, params}));
      PolicySimulator sim(o, 9);
      auto p = registry().create(c.policy, params, sim.shape());
      for (int n : kSchedule) {
        const int64_t first = sim.n_seen();
        auto st = sim.step(*p, n);
        ASSERT_TRUE(st.violations.empty()) << st.violations[0];
        const int64_t n_seen = sim.n_seen();
        for (int layer = 0; layer < o.n_layers; ++layer)
          for (int h = 0; h < o.n_kv_heads; ++h) {
            for (int r = 0; r < n; ++r) {
              const int64_t i = first + r;
              const int64_t limit = std::max(kept(budget, i + 1), std::min(i + 1, c.sinks + 1));
              const int64_t got = st.reads[layer][size_t(r) * o.n_kv_heads + h];
              ASSERT_LE(got, limit) << "layer " << layer << " head " << h << " query " << i;
              ASSERT_GE(got, std::min(i + 1, kept(budget, i + 1)) - c.slack)
                  << "layer " << layer << " head " << h << " query " << i;
            }
            if (c.evicts) {
              const int64_t limit = std::max(kept(budget, n_seen), std::min(n_seen, c.sinks));
              EXPECT_LE(p->budget_tokens(layer, n_seen), limit);
              ASSERT_LE(st.resident[layer][h], p->budget_tokens(layer, n_seen)) << "n_seen " << n_seen;
            } else {
              EXPECT_EQ(p->budget_tokens(layer, n_seen), -1);
            }
          }
      }
    }
}

// Step outputs of two policies over the same simulated sequence, bit for bit.
void expect_same_outputs(const std::string& a, const P& pa, const std::string& b, const P& pb) {
  SimOptions o;
  PolicySimulator sa(o, 4), sb(o, 4);
  auto x = registry().create(a, pa, sa.shape());
  auto y = registry().create(b, pb, sb.shape());
  for (int n : kSchedule) {
    auto ta = sa.step(*x, n), tb = sb.step(*y, n);
    ASSERT_EQ(ta.out, tb.out) << "n_seen " << sa.n_seen();
    ASSERT_EQ(ta.resident, tb.resident) << "n_seen " << sa.n_seen();
  }
}

TEST(BudgetConvention, TokenBudgetEqualsThePlainSizes) {
  // sliding_window: budget_tokens B is window B.
  expect_same_outputs("sliding_window", {{"budget_tokens", int64_t(11)}}, "sliding_window", {{"window", int64_t(11)}});
  // sinks: B = S sinks + R recent + the query itself, i.e. recent R = B - S - 1.
  expect_same_outputs("sinks", {{"sinks", int64_t(3)}, {"budget_tokens", int64_t(14)}},
                      "sinks", {{"sinks", int64_t(3)}, {"recent", int64_t(10)}});
  // landmark: a budget no sequence reaches reads everything (selection, not dense prefill).
  expect_same_outputs("landmark", {{"chunk_size", int64_t(4)}, {"window", int64_t(6)}, {"prefill", std::string("select")},
                                   {"budget_tokens", int64_t(1000)}},
                      "full", {});
}

// A ratio window: query i reads exactly its kept(i + 1) most recent keys, against the dense
// reference under that mask straight from the generator.
TEST(BudgetConvention, RatioWindowEqualsDenseReference) {
  SimOptions o;
  const P budget = {{"compression_ratio", 0.75}};
  for (const std::string mode : {"evict", "mask"}) {
    PolicySimulator sim(o, 13);
    auto p = registry().create("sliding_window", merged(budget, {{"mode", mode}}), sim.shape());
    for (int n : kSchedule) {
      const int64_t first = sim.n_seen();
      auto st = sim.step(*p, n);
      for (int layer = 0; layer < o.n_layers; ++layer)
        for (int r = 0; r < n; ++r) {
          const int64_t i = first + r;
          auto ref = testing::dense_reference(o, 13, layer, i, [&](int, int64_t j) { return i - j < kept(budget, i + 1); });
          std::vector<float> got(st.out[layer].begin() + size_t(r) * o.n_heads * o.head_dim,
                                 st.out[layer].begin() + size_t(r + 1) * o.n_heads * o.head_dim);
          // The bound of the conformance suite's same comparison (MaskPoliciesEqualDenseMaskedReference).
          ASSERT_LE(testing::max_abs_diff(got, ref), 2e-5f) << mode << " layer " << layer << " query " << i;
        }
    }
  }
}

TEST(BudgetConvention, ConflictingSizesAreOneErrorEach) {
  const PolicyModelShape shape{2, 4, 2, 8, 512};
  auto message = [&](const std::string& policy, const P& params) {
    return kvlab::testing::error_of([&] { registry().create(policy, params, shape, "policies[0].params"); });
  };
  struct Bad {
    std::string policy;
    P params;
    std::string expect;
  };
  const std::vector<Bad> bad = {
      {"sliding_window", {{"window", int64_t(128)}, {"compression_ratio", 0.5}},
       "policies[0].params: policy 'sliding_window': compression_ratio / budget_tokens give the window's size"},
      {"sliding_window", {{"plus_one", true}, {"budget_tokens", int64_t(64)}}, "plus_one false"},
      {"sinks", {{"recent", int64_t(124)}, {"budget_tokens", int64_t(128)}},
       "policies[0].params: policy 'sinks': compression_ratio / budget_tokens give the recent part's size"},
      {"sinks", {{"sinks", int64_t(4)}, {"budget_tokens", int64_t(4)}},
       "policies[0].params: policy 'sinks': budget_tokens (4) must exceed sinks (4)"},
      {"landmark", {{"top_k", int64_t(2)}, {"compression_ratio", 0.75}},
       "policies[0].params: policy 'landmark': compression_ratio / budget_tokens give the number of chunks read"},
      {"landmark", {{"sinks", int64_t(8)}, {"budget_tokens", int64_t(8)}},
       "policies[0].params: policy 'landmark': budget_tokens (8) must exceed sinks (8)"},
      {"landmark", {{"budget_tokens", int64_t(64)}, {"compression_ratio", 0.75}},
       "policies[0].params: policy 'landmark': compression_ratio (0.75) and budget_tokens (64) are two ways"},
      {"sinks", {{"compression_ratio", 1.0}}, "policies[0].params.compression_ratio: policy 'sinks' expects a value in [0, "},
  };
  for (const Bad& b : bad) {
    const std::string e = message(b.policy, b.params);
    EXPECT_NE(e.find(b.expect), std::string::npos) << e;
  }
  // A size left at its default beside a budget is no conflict; the window and sinks of landmark
  // are inside the budget and may be set.
  EXPECT_NE(registry().create("sliding_window", {{"window", int64_t(4096)}, {"compression_ratio", 0.5}}, shape), nullptr);
  EXPECT_NE(registry().create("landmark", {{"window", int64_t(64)}, {"sinks", int64_t(8)}, {"budget_tokens", int64_t(256)}}, shape),
            nullptr);
}

}  // namespace
}  // namespace kvlab
