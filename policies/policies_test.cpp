// Pure-logic tests of each built-in policy and the scorer base, on the fake cache (no engine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "framework/policy/simple_factory.h"
#include "policies/builtin.h"
#include "policies/policy_testing.h"
#include "policies/scorer.h"

namespace kvlab {
namespace {

using testing::FakeLayerCache;
using testing::PolicySimulator;
using testing::SimOptions;

std::unique_ptr<AttentionPolicy> make(const std::string& name,
                                      const std::map<std::string, ParamValue>& params,
                                      const PolicyModelShape& shape) {
  static const PolicyRegistry registry = make_builtin_registry();
  return registry.create(name, params, shape);
}

// Positions of the valid slots of (layer, kv head) in the simulator's cache.
std::vector<int64_t> resident_positions(const PolicySimulator& sim, int layer, int h) {
  std::vector<int64_t> out;
  const FakeLayerCache& c = sim.cache(layer);
  for (int s = 0; s < c.n_slots(); ++s)
    if (c.slot_valid(s, h)) out.push_back(c.slot_position(s, h));
  return out;
}

// The text positions row r / head h reads under `sel` (valid, causal), from a fresh step.
std::vector<int64_t> read_positions(const KeySelection& sel, const LayerCacheView& cache, int r,
                                    int h, int64_t i) {
  std::vector<int64_t> out;
  auto take = [&](int s) {
    if (cache.slot_valid(s, h) && cache.slot_position(s, h) <= i) out.push_back(cache.slot_position(s, h));
  };
  if (sel.all) {
    for (int s = 0; s < cache.n_slots(); ++s) take(s);
  } else {
    for (const SlotRange& rg : sel.list(r, h))
      for (int s = rg.begin; s < rg.end; ++s) take(s);
  }
  return out;
}

// A one-layer step over a fake cache holding positions [0, n) with given keys.
struct Fixture {
  SimOptions o;
  FakeLayerCache cache;
  std::vector<float> queries;
  std::vector<int64_t> positions;
  explicit Fixture(const SimOptions& opt, bool flat = true)
      : o(opt), cache(opt.n_kv_heads, opt.head_dim, flat) {}
  void fill(int64_t n, uint64_t seed = 7) {
    std::vector<float> k(size_t(o.n_kv_heads) * o.head_dim), v(k.size());
    for (int64_t p = 0; p < n; ++p) {
      testing::generate(o, seed, 0, p, 1, k.data());
      testing::generate(o, seed, 0, p, 2, v.data());
      cache.append(p, k.data(), v.data());
    }
  }
  LayerStep step(std::vector<int64_t> pos, uint64_t seed = 7) {
    positions = std::move(pos);
    queries.assign(positions.size() * o.n_heads * o.head_dim, 0.f);
    for (size_t r = 0; r < positions.size(); ++r)
      testing::generate(o, seed, 0, positions[r], 0, queries.data() + r * o.n_heads * o.head_dim);
    const int n = int(positions.size());
    return LayerStep{.layer = 0, .is_prefill = n > 1, .n_new = n, .positions = positions,
                     .queries = queries, .cache = &cache,
                     .shape = {1, o.n_heads, o.n_kv_heads, o.head_dim, o.max_seq_len}};
  }
};

TEST(SlidingWindow, ReadsExactlyWKeysIncludingCurrent) {
  for (bool plus_one : {false, true})
    for (std::string mode : {"evict", "mask"}) {
      SCOPED_TRACE(mode + (plus_one ? " plus_one" : ""));
      SimOptions o;
      PolicySimulator sim(o, 3);
      auto p = make("sliding_window", {{"window", int64_t(5)}, {"plus_one", plus_one}, {"mode", mode}},
                    sim.shape());
      sim.step(*p, 3);  // prefill 0..2
      for (int t = 0; t < 20; ++t) {
        const int64_t i = sim.n_seen();
        Fixture dummy(o);
        auto st = sim.step(*p, 1);
        ASSERT_TRUE(st.violations.empty()) << st.violations[0];
        const int64_t w = plus_one ? 6 : 5;
        // What the next query can read is exactly the window; evict mode keeps nothing else.
        auto res = resident_positions(sim, 0, 1);
        if (mode == "evict") {
          ASSERT_EQ(int64_t(res.size()), std::min<int64_t>(i + 1, w - 1));
          EXPECT_EQ(res.front(), std::max<int64_t>(0, i + 2 - w));
        } else {
          EXPECT_EQ(int64_t(res.size()), i + 1);
        }
      }
    }
}

TEST(SlidingWindow, PrefillRowsAreMasked) {
  SimOptions o;
  Fixture f(o);
  f.fill(10);
  auto p = make("sliding_window", {{"window", int64_t(3)}}, f.step({0}).shape);
  LayerStep s = f.step({7, 8, 9});
  KeySelection sel;
  sel.select_all();
  p->select(s, sel);
  EXPECT_EQ(read_positions(sel, f.cache, 0, 0, 7), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(read_positions(sel, f.cache, 2, 1, 9), (std::vector<int64_t>{7, 8, 9}));
}

TEST(Sinks, KeepsSinksAndRecentAfterEachStep) {
  SimOptions o;
  PolicySimulator sim(o, 5);
  auto p = make("sinks", {{"sinks", int64_t(3)}, {"recent", int64_t(6)}}, sim.shape());
  EXPECT_TRUE(p->needs().rope_at_cache_position);
  EXPECT_FALSE(p->claimed_mask().has_value());
  sim.step(*p, 4);
  for (int t = 0; t < 30; ++t) {
    auto st = sim.step(*p, 1);
    ASSERT_TRUE(st.violations.empty()) << st.violations[0];
    const int64_t n = sim.n_seen();
    std::vector<int64_t> want;
    for (int64_t j = 0; j < n; ++j)
      if (j < 3 || j >= n - 6) want.push_back(j);
    for (int h = 0; h < o.n_kv_heads; ++h) EXPECT_EQ(resident_positions(sim, 1, h), want);
  }
  auto orig = make("sinks", {{"rope_positions", std::string("original")}}, sim.shape());
  EXPECT_FALSE(orig->needs().rope_at_cache_position);
  EXPECT_TRUE(orig->claimed_mask().has_value());
}

// A scorer whose score is the position modulo `modulus`: keeps the latest candidates (with a
// small modulus, the latest of each residue class: ties on purpose).
class PositionScorer : public ScorerPolicy {
 public:
  PositionScorer(const ScorerBudget& budget, int64_t modulus)
      : ScorerPolicy(budget), modulus_(modulus) {}
 protected:
  void score(const LayerStep&, const StepStats&, int, std::span<const ScoredSlot> c,
             std::span<float> s) override {
    for (size_t k = 0; k < c.size(); ++k) s[k] = float(c[k].position % modulus_);
  }
 private:
  int64_t modulus_;
};

TEST(Scorer, SinksRecentAndTopKWithTiesToLowerPosition) {
  ScorerBudget b;
  b.sinks = 2, b.recent = 3, b.keep = 4;
  PositionScorer p(b, 7);
  SimOptions o;
  PolicySimulator sim(o, 1);
  sim.step(p, 30);  // one prefill step, then one reduction
  // Candidates: positions 2..26, score = pos % 7; best 4: score 6 at 6, 13, 20 then score 5 at 5
  // (the lowest position among the 5s: 5, 12, 19, 26).
  EXPECT_EQ(resident_positions(sim, 0, 0), (std::vector<int64_t>{0, 1, 5, 6, 13, 20, 27, 28, 29}));
  EXPECT_EQ(p.budget_tokens(0, 30), 9);
  ScorerBudget r;
  r.ratio = true, r.recent = 0.1, r.keep = 0.25;
  EXPECT_EQ(r.total_tokens(100), 35);
  // Ratios round up: a stream's first tokens are not all evicted (sinks would be lost).
  EXPECT_EQ(r.recent_tokens(1), 1);
  EXPECT_EQ(r.keep_tokens(3), 1);
  EXPECT_EQ(r.total_tokens(10), 1 + 3);
}

// Per-layer budgets: layer 1 keeps half of layer 0's.
class PyramidScorer final : public PositionScorer {
 public:
  // score = position (no position in these tests reaches the modulus)
  explicit PyramidScorer(const ScorerBudget& budget) : PositionScorer(budget, int64_t{1} << 40) {}
 protected:
  double layer_budget_scale(int layer) const override { return layer == 0 ? 1.0 : 0.5; }
};

TEST(Scorer, PerLayerBudgets) {
  ScorerBudget b;
  b.recent = 4, b.keep = 8;
  PyramidScorer p(b);
  SimOptions o;
  PolicySimulator sim(o, 1);
  for (int t = 0; t < 40; ++t) {
    auto st = sim.step(p, 1);
    ASSERT_TRUE(st.violations.empty());
    EXPECT_LE(st.resident[0][0], p.budget_tokens(0, sim.n_seen()));
    EXPECT_LE(st.resident[1][1], p.budget_tokens(1, sim.n_seen()));
  }
  EXPECT_EQ(sim.cache(0).resident(0), 12);
  EXPECT_EQ(sim.cache(1).resident(0), 6);
}

TEST(H2o, PrefillReducedInOneStepByGqaSummedMass) {
  SimOptions o;
  o.n_heads = 4, o.n_kv_heads = 2;  // G = 2
  Fixture f(o);
  f.fill(12);
  auto p = make("h2o", {{"units", std::string("tokens")}, {"heavy", 3.0}, {"recent", 2.0}},
                f.step({0}).shape);
  EXPECT_TRUE(p->needs().key_attention_mass);
  LayerStep s = f.step({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  // Key mass as the kernel reports it (already summed over the group's query heads).
  std::vector<float> mass(2 * 12, 0.f);
  for (int j = 0; j < 12; ++j) mass[j] = 0.1f, mass[12 + j] = 0.1f;
  mass[3] = 2.f, mass[7] = 1.5f, mass[5] = 1.f, mass[4] = 1.f;  // head 0: 3, 7, then tie 4 < 5
  mass[12 + 0] = 3.f, mass[12 + 9] = 2.f, mass[12 + 1] = 1.f;     // head 1: 0, 9, 1
  StepStats st;
  st.key_mass = mass;
  st.n_slots = 12;
  Evictions ev;
  ev.clear(2);
  p->after_attention(s, st, ev);
  f.cache.evict(ev);
  auto res = [&](int h) {
    std::vector<int64_t> out;
    for (int sl = 0; sl < f.cache.n_slots(); ++sl)
      if (f.cache.slot_valid(sl, h)) out.push_back(f.cache.slot_position(sl, h));
    return out;
  };
  EXPECT_EQ(res(0), (std::vector<int64_t>{3, 4, 7, 10, 11}));
  EXPECT_EQ(res(1), (std::vector<int64_t>{0, 1, 9, 10, 11}));
}

TEST(H2o, ScoresAccumulateAcrossSteps) {
  SimOptions o;
  o.n_heads = 2, o.n_kv_heads = 1;
  Fixture f(o);
  auto p = make("h2o", {{"units", std::string("tokens")}, {"heavy", 1.0}, {"recent", 1.0}},
                f.step({0}).shape);
  std::vector<float> k(o.head_dim, 0.f), v(o.head_dim, 0.f);
  auto run = [&](int64_t pos, std::vector<float> mass) {
    f.cache.append(pos, k.data(), v.data());
    LayerStep s = f.step({pos});
    StepStats st;
    st.key_mass = mass;
    st.n_slots = f.cache.n_slots();
    Evictions ev;
    ev.clear(1);
    p->after_attention(s, st, ev);
    f.cache.evict(ev);
    return ev.slots[0];
  };
  EXPECT_TRUE(run(0, {1.f}).empty());
  // Step at 1 (2 resident <= budget 2): no eviction. Mass favours 0: 0 -> 1.9, 1 -> 0.1.
  EXPECT_TRUE(run(1, {0.9f, 0.1f}).empty());
  // Step at 2: candidates {0, 1}: accumulated 0 -> 1.9 + 0.1 = 2.0, 1 -> 0.1 + 0.8 = 0.9: keep 0.
  EXPECT_EQ(run(2, {0.1f, 0.8f, 0.1f}), (std::vector<int32_t>{1}));
  // Step at 3: candidates {0, 2}: 0 -> 2.0 + 0.0, 2 -> 0.1 + 2.5 = 2.6: evict slot of 0 (slot 0).
  EXPECT_EQ(run(3, {0.0f, 0.f, 2.5f, 0.5f}), (std::vector<int32_t>{0}));
}

TEST(Landmark, TopKAtLeastChunksIsFullSelection) {
  SimOptions o;
  o.max_seq_len = 4096;
  for (std::string lm : {"pooled", "mean", "bounds"}) {
    Fixture f(o);
    f.fill(100);
    auto p = make("landmark", {{"chunk_size", int64_t(8)}, {"top_k", int64_t(12)},
                               {"window", int64_t(5)}, {"landmark", lm}, {"prefill", std::string("select")}},
                  f.step({0}).shape);
    // Prefill-select over 0..99 closes the 12 chunks and reads everything on every row.
    std::vector<int64_t> pos(100);
    for (int i = 0; i < 100; ++i) pos[i] = i;
    LayerStep s = f.step(pos);
    KeySelection sel;
    sel.select_all();
    p->select(s, sel);
    ASSERT_FALSE(sel.all);
    EXPECT_EQ(testing::check_selection(sel, s), "");
    for (int r : {0, 13, 50, 99})
      for (int h = 0; h < o.n_kv_heads; ++h)
        EXPECT_EQ(read_positions(sel, f.cache, r, h, r).size(), size_t(r + 1)) << lm << " row " << r;
  }
}

TEST(Landmark, SelectsSinksWindowAndTopKChunks) {
  SimOptions o;
  o.n_heads = 2, o.n_kv_heads = 1, o.head_dim = 8;
  Fixture f(o);
  f.fill(80);
  // Plant: keys of chunk 3 (positions 24..31) aligned with the query at position 79.
  LayerStep s = f.step({79});
  for (std::string lm : {"pooled", "mean", "bounds"})
    for (std::string local : {"extend", "exact"}) {
      SCOPED_TRACE(lm + " " + local);
      Fixture g(o);
      std::vector<float> k(o.head_dim), v(o.head_dim);
      for (int64_t p = 0; p < 80; ++p) {
        testing::generate(o, 7, 0, p, 1, k.data());
        testing::generate(o, 7, 0, p, 2, v.data());
        if (p >= 24 && p < 32)
          for (int d = 0; d < o.head_dim; ++d) k[d] = 2.f * s.queries[d];  // query head 0
        g.cache.append(p, k.data(), v.data());
      }
      auto pol = make("landmark", {{"chunk_size", int64_t(8)}, {"top_k", int64_t(1)},
                                   {"window", int64_t(10)}, {"sinks", int64_t(2)},
                                   {"landmark", lm}, {"local", local}},
                      s.shape);
      // Close the chunks with a dense prefill of 0..78, then decode 79.
      std::vector<int64_t> pre(79);
      for (int i = 0; i < 79; ++i) pre[i] = i;
      KeySelection sel;
      sel.select_all();
      pol->select(g.step(pre), sel);
      EXPECT_TRUE(sel.all);  // prefill dense by default
      LayerStep d = g.step({79});
      sel.select_all();
      pol->select(d, sel);
      // eligible chunks end at <= 79 - 10 = 69: chunks 0..7 (E = floor(70 / 8) = 8).
      std::vector<int64_t> want = {0, 1};
      for (int64_t j = 24; j < 32; ++j) want.push_back(j);
      for (int64_t j = local == "extend" ? 64 : 70; j <= 79; ++j) want.push_back(j);
      EXPECT_EQ(read_positions(sel, g.cache, 0, 0, 79), want);
    }
}

// gqa=per_head: each query head picks its own top-K by its own logits; the KV head reads the
// union. Chunk 3 is planted for query head 0, chunk 6 for query head 1, K = 1.
TEST(Landmark, PerHeadReadsTheUnionOfEachQueryHeadsChoice) {
  SimOptions o;
  o.n_heads = 2, o.n_kv_heads = 1, o.head_dim = 8;
  Fixture f(o);
  const LayerStep s = f.step({79});
  const std::vector<float> q(s.queries.begin(), s.queries.end());  // [2 heads, 8]
  for (std::string lm : {"mean", "bounds"}) {
    SCOPED_TRACE(lm);
    Fixture g(o);
    std::vector<float> k(o.head_dim), v(o.head_dim);
    for (int64_t p = 0; p < 80; ++p) {
      testing::generate(o, 7, 0, p, 1, k.data());
      testing::generate(o, 7, 0, p, 2, v.data());
      const int head = p >= 24 && p < 32 ? 0 : p >= 48 && p < 56 ? 1 : -1;
      if (head >= 0)
        for (int d = 0; d < o.head_dim; ++d) k[d] = 4.f * q[size_t(head) * o.head_dim + d];
      g.cache.append(p, k.data(), v.data());
    }
    auto reads = [&](const std::string& gqa, const std::map<std::string, ParamValue>& extra) {
      std::map<std::string, ParamValue> params = {{"chunk_size", int64_t(8)}, {"window", int64_t(10)},
                                                  {"sinks", int64_t(2)}, {"landmark", lm}, {"gqa", gqa}};
      for (const auto& [key, value] : extra) params[key] = value;
      auto pol = make("landmark", params, s.shape);
      std::vector<int64_t> pre(79);
      std::iota(pre.begin(), pre.end(), 0);
      KeySelection sel;
      sel.select_all();
      pol->select(g.step(pre), sel);
      LayerStep d = g.step({79});
      sel.select_all();
      pol->select(d, sel);
      return read_positions(sel, g.cache, 0, 0, 79);
    };
    auto with_chunks = [](std::vector<int64_t> chunks) {
      std::vector<int64_t> want = {0, 1};
      for (int64_t c : chunks)
        for (int64_t j = c * 8; j < (c + 1) * 8; ++j) want.push_back(j);
      for (int64_t j = 64; j <= 79; ++j) want.push_back(j);  // local: extend to eligible chunk 7's end
      return want;
    };
    EXPECT_EQ(reads("per_head", {{"top_k", int64_t(1)}}), with_chunks({3, 6}));
    // One chunk for the group under the aggregating modes.
    for (std::string gqa : {"softmax_max", "max", "sum"}) {
      const auto got = reads(gqa, {{"top_k", int64_t(1)}});
      EXPECT_TRUE(got == with_chunks({3}) || got == with_chunks({6})) << gqa;
    }
    // A budget (sinks and local region inside) with room for one chunk: query head 0's best
    // (heads take turns rank by rank); two chunks: both heads' picks. b = 2 + 16 + 8 (+ 8).
    EXPECT_EQ(reads("per_head", {{"budget_tokens", int64_t(26)}}), with_chunks({3}));
    EXPECT_EQ(reads("per_head", {{"budget_tokens", int64_t(34)}}), with_chunks({3, 6}));
  }
}

TEST(Landmark, TiesGoToLowerChunks) {
  SimOptions o;
  o.n_heads = 2, o.n_kv_heads = 1;
  Fixture f(o);
  std::vector<float> k(o.head_dim, 0.5f), v(o.head_dim, 1.f);
  for (int64_t p = 0; p < 64; ++p) f.cache.append(p, k.data(), v.data());  // identical keys
  for (std::string gqa : {"softmax_max", "max", "sum", "per_head"}) {
    auto pol = make("landmark", {{"chunk_size", int64_t(8)}, {"top_k", int64_t(2)},
                                 {"window", int64_t(8)}, {"sinks", int64_t(0)}, {"gqa", gqa},
                                 {"landmark", std::string("mean")}},
                    f.step({0}).shape);
    std::vector<int64_t> pre(63);
    for (int i = 0; i < 63; ++i) pre[i] = i;
    KeySelection sel;
    pol->select(f.step(pre), sel);
    LayerStep d = f.step({63});
    sel.select_all();
    pol->select(d, sel);
    auto got = read_positions(sel, f.cache, 0, 0, 63);
    // chunks 0, 1 (ties -> lowest), local region from the end of eligible chunk 6: [56, 63].
    std::vector<int64_t> want;
    for (int64_t j = 0; j < 16; ++j) want.push_back(j);
    for (int64_t j = 56; j < 64; ++j) want.push_back(j);
    EXPECT_EQ(got, want) << gqa;
  }
}

TEST(Landmark, AutoDefaultsScaleWithContext) {
  auto reads = [](int max_seq_len) {
    SimOptions o;
    o.max_seq_len = max_seq_len;
    PolicySimulator sim(o, 1);
    auto p = make("landmark", {}, sim.shape());
    return p != nullptr;
  };
  EXPECT_TRUE(reads(256));
  EXPECT_TRUE(reads(32768));
}

TEST(Strided, FixedEvictionKeepsSummariesAndGlobals) {
  SimOptions o;
  PolicySimulator sim(o, 2);
  auto p = make("strided", {{"pattern", std::string("fixed")}, {"stride", int64_t(8)},
                            {"summary", int64_t(2)}, {"global", int64_t(1)}, {"evict", true}},
                sim.shape());
  for (int t = 0; t < 30; ++t) ASSERT_TRUE(sim.step(*p, 1).violations.empty());
  // n = 30: closed blocks 0..2 keep 0 (global) and summaries 6,7 14,15 22,23; open block 24..29.
  EXPECT_EQ(resident_positions(sim, 0, 0),
            (std::vector<int64_t>{0, 6, 7, 14, 15, 22, 23, 24, 25, 26, 27, 28, 29}));
}

TEST(CacheScan, FlatAndVirtualPathsAgreeAcrossCompaction) {
  for (bool flat : {true, false}) {
    SimOptions o;
    o.flat_view = flat;
    PolicySimulator sim(o, 9);
    auto p = make("h2o", {{"units", std::string("tokens")}, {"heavy", 5.0}, {"recent", 3.0}}, sim.shape());
    sim.step(*p, 20);
    for (int t = 0; t < 40; ++t) ASSERT_TRUE(sim.step(*p, 1).violations.empty());
    EXPECT_GT(sim.cache(0).compactions(), 0);
    EXPECT_EQ(sim.cache(0).resident(0), 8);
  }
}

}  // namespace
}  // namespace kvlab
