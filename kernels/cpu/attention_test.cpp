// attention() (tiled online softmax) equals attention_naive() (materialised score rows) within
// the rounding bounds of tolerances() below, on each instruction-set path this CPU has (the
// portable one always, AVX2+FMA where present: cpu_path.h), over awkward shapes: block sizes
// 1/3/7/16, head dims 32/64/80/128 (and 20, the scalar loops), GQA 1..8, lengths not a multiple
// of the block, holes, explicit selections with empty lists, key mass, rope at read; fully
// masked rows give zeros and LSE -inf, never NaN.
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/attention_stats.h"
#include "kernels/cpu/attention_test_util.h"
#include "kernels/testing/reference_attention.h"
#include "kernels/cpu/attention_test_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvlab {
namespace {

using namespace attention_test;  // the harness (attention_test_util.h) and the random caches (attention_test_cache.h)

TEST(Attention, TiledEqualsNaiveSweep) {
  std::mt19937 rng(1234);
  int cases = 0;
  for (int bs : {1, 3, 7, 16}) {
    for (int D : {32, 64, 80, 128, 20}) {
      for (int G : {1, 2, 3, 4, 5, 6, 7, 8, 36}) {  // 36 > 32 query vectors: split head chunks
        const int H = G > 8 ? 1 : 1 + static_cast<int>(rng() % 3);
        const int n_slots = static_cast<int>(rng() % 150);  // includes 0 and non-multiples of bs
        const double holes = (rng() % 2) ? 0.25 : 0.0;
        FakeCache cache(bs, H, D, n_slots, holes, rng);
        const int rows = 1 + static_cast<int>(rng() % 6);
        std::vector<float> q = random_normal(static_cast<size_t>(rows) * H * G * D, 1.f, rng);
        std::vector<int64_t> qpos(rows);
        const int64_t maxp = cache.max_position();
        for (int r = 0; r < rows; ++r) qpos[r] = (rng() % 4 == 0) ? -1 : static_cast<int64_t>(rng() % (maxp + 2));
        const KeySelection sel = random_selection(rows, H, n_slots, rng);
        // Rope at read in some cases (odd D has no RoPE: D = 20 is even, fine), ranks as positions,
        // with a table shorter than the ranks so both table and direct paths run.
        RopeConfig rc;
        rc.layout = (rng() % 2) ? RopeLayout::kNeox : RopeLayout::kInterleaved;
        rc.head_dim = D;
        const RopeTable table(rc, 50);
        std::vector<int32_t> rank(static_cast<size_t>(n_slots) * H);
        cache_rank_positions(cache.layer(), rank.data());
        const bool rope_at_read = rng() % 3 == 0;
        for (int mode = 0; mode < 2; ++mode) {
          AttentionArgs a = attention_args(q.data(), rows, H * G, H, D, qpos.data(),
                                           cache.layer(), 1.f / std::sqrt(static_cast<float>(D)));
          a.selection = mode == 0 ? nullptr : &sel;
          float dummy = 0;
          a.key_mass = (rng() % 2) ? &dummy : nullptr;  // run() substitutes a real buffer
          if (rng() % 2) {  // the observation window: the last rows (all, some, or none)
            a.head_mass = &dummy;
            a.head_mass_first_row = static_cast<int>(rng() % (rows + 1));
          }
          if (rope_at_read) {
            a.rope = &table;
            a.key_rope_pos = rank.data();
          }
          const Outputs ref = run(a, false, 1);
          const Tolerances tol = tolerances(a, ref);
          for (CpuPath path : paths()) {
            Outputs first;
            for (int threads : {1, 2}) {
              const Outputs got = run(a, true, threads, path);
              if (threads == 1) first = got;
              // The thread count changes who computes an item, never how: bitwise equal.
              if (threads == 2) {
                ASSERT_EQ(first.out, got.out);
                ASSERT_EQ(first.mass, got.mass);
                ASSERT_EQ(first.head, got.head);
              }
              expect_close(ref, got, tol, "bs " + std::to_string(bs) + " D " + std::to_string(D) + " G " +
                                              std::to_string(G) + " H " + std::to_string(H) + " n " +
                                              std::to_string(n_slots) + " mode " + std::to_string(mode) +
                                              " rope " + std::to_string(rope_at_read) +
                                              " threads " + std::to_string(threads) + " path " + to_string(path));
              if (HasFatalFailure()) return;
            }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 5 * 9 * 2);
}

TEST(Attention, FullyMaskedRowsGiveZerosNotNaN) {
  std::mt19937 rng(5);
  FakeCache cache(16, 2, 64, 40, 0.0, rng);
  std::vector<float> q(2 * 4 * 64, 1.f);
  std::vector<int64_t> qpos = {-5, -1};  // before every key
  AttentionArgs a = attention_args(q.data(), 2, 4, 2, 64, qpos.data(),
                                   cache.layer(), 0.125f);
  for (CpuPath path : paths()) {
    for (bool fast : {false, true}) {
      const Outputs o = run(a, fast, 2, path);
      for (float x : o.out) ASSERT_EQ(x, 0.f);
      for (float x : o.lse) ASSERT_TRUE(std::isinf(x) && x < 0);
    }
  }
}

TEST(Attention, KeyMassSumsToRowsTimesGroup) {
  // Every row with at least one key spreads total probability 1 per query head.
  std::mt19937 rng(9);
  FakeCache cache(7, 2, 32, 61, 0.1, rng);
  const int rows = 3, G = 4;
  std::vector<float> q = random_normal(static_cast<size_t>(rows) * 2 * G * 32, 2.f, rng);
  std::vector<int64_t> qpos(rows, cache.max_position());
  AttentionArgs a = attention_args(q.data(), rows, 2 * G, 2, 32, qpos.data(),
                                   cache.layer(), 1.f / std::sqrt(32.f));
  float dummy = 0;
  a.key_mass = &dummy;  // run() substitutes a real buffer (starting at 0.5 per slot)
  const Outputs ref = run(a, false, 1);
  const Tolerances tol = tolerances(a, ref);
  for (CpuPath path : paths()) {
    const Outputs got = run(a, true, 2, path);
    for (int g = 0; g < 2; ++g) {
      // The exact column sums add up to rows * G (+ 0.5 per slot from the initial buffer);
      // the computed ones within the sum of their bounds.
      double total = 0, bound = 0;
      for (int s = 0; s < 61; ++s) {
        total += got.mass[g * 61 + s] - 0.5;
        bound += tol.mass[g * 61 + s];
        if (!cache.valid[s * 2 + g]) {
          EXPECT_EQ(got.mass[g * 61 + s], 0.5f);
        }
      }
      EXPECT_NEAR(total, rows * G, bound) << to_string(path);
    }
  }
}

TEST(Attention, KeyMassChangesNothingElseAndIsThreadIndependent) {
  // key_mass (and head_mass) come from scores kept during the main pass: asking for it leaves out and lse
  // bitwise unchanged, and with many items per KV head (prefill-like: 40 rows, full selection
  // and explicit) the per-item buffers added in item order give the one-thread sums exactly.
  std::mt19937 rng(21);
  FakeCache cache(16, 2, 64, 300, 0.1, rng);
  const int rows = 40, G = 2;
  std::vector<float> q = random_normal(static_cast<size_t>(rows) * 2 * G * 64, 1.5f, rng);
  std::vector<int64_t> qpos(rows);
  for (int r = 0; r < rows; ++r) qpos[r] = cache.max_position() - 5 * (rows - 1 - r);
  const KeySelection sel = random_selection(rows, 2, 300, rng);
  for (int mode = 0; mode < 2; ++mode) {
    AttentionArgs a = attention_args(q.data(), rows, 2 * G, 2, 64, qpos.data(),
                                     cache.layer(), 0.125f);
    a.selection = mode == 0 ? nullptr : &sel;
    for (CpuPath path : paths()) {
      const std::string what = "mode " + std::to_string(mode) + " path " + to_string(path);
      a.key_mass = nullptr;
      const Outputs plain = run(a, true, 1, path);
      float dummy = 0;
      a.key_mass = &dummy;  // run() substitutes a real buffer
      const Outputs ref = run(a, false, 1);
      const Outputs one = run(a, true, 1, path);
      ASSERT_EQ(plain.out, one.out) << what;
      ASSERT_EQ(plain.lse, one.lse) << what;
      expect_close(a, ref, one, what);
      for (int threads : {2, 3}) {
        const Outputs got = run(a, true, threads, path);
        ASSERT_EQ(one.out, got.out) << what << " threads " << threads;
        ASSERT_EQ(one.lse, got.lse) << what << " threads " << threads;
        ASSERT_EQ(one.mass, got.mass) << what << " threads " << threads;
      }
      // The observation window's head mass (the last 7 rows) as well: out, lse and key_mass
      // stay bitwise; the head mass is thread-independent too and equals the reference's.
      AttentionArgs w = a;
      w.head_mass = &dummy;
      w.head_mass_first_row = rows - 7;
      const Outputs wref = run(w, false, 1);
      const Outputs wone = run(w, true, 1, path);
      ASSERT_EQ(one.out, wone.out) << what;
      ASSERT_EQ(one.lse, wone.lse) << what;
      ASSERT_EQ(one.mass, wone.mass) << what;
      expect_close(w, wref, wone, what + " head_mass");
      for (int threads : {2, 3}) ASSERT_EQ(wone.head, run(w, true, threads, path).head) << what << " threads " << threads;
    }
  }
}

TEST(Attention, RopeAtReadEqualsPreRotatedKeys) {
  std::mt19937 rng(77);
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kNeox}) {
    for (int bs : {3, 16}) {
      const int H = 2, G = 2, D = 64;
      FakeCache raw(bs, H, D, 53, 0.3, rng);
      RopeConfig rc;
      rc.layout = layout;
      rc.head_dim = D;
      const RopeTable table(rc, 20);  // ranks go past the table's end: both paths agree
      std::vector<int32_t> rank(static_cast<size_t>(raw.n_slots) * H);
      cache_rank_positions(raw.layer(), rank.data());
      // The same cache with every valid key rotated to its rank once.
      FakeCache rotated = raw;
      const LayerKv kv = rotated.layer();
      for (int s = 0; s < raw.n_slots; ++s) {
        for (int g = 0; g < H; ++g) {
          if (raw.valid[s * H + g]) table.rotate(const_cast<float*>(kv.key(s, g)), rank[s * H + g]);
        }
      }
      const int rows = 2;
      std::vector<float> q = random_normal(static_cast<size_t>(rows) * H * G * D, 1.f, rng);
      std::vector<int64_t> qpos = {raw.max_position(), raw.max_position() / 2};
      AttentionArgs a = attention_args(q.data(), rows, H * G, H, D, qpos.data(), rotated.layer(), 0.125f);
      float dummy;
      a.key_mass = &dummy;
      const Outputs ref = run(a, false, 1);
      a.kv = raw.layer();
      a.rope = &table;
      a.key_rope_pos = rank.data();
      expect_close(a, ref, run(a, false, 1), "naive rope at read");
      for (CpuPath path : paths())
        expect_close(a, ref, run(a, true, 2, path), std::string("fast rope at read, path ") + to_string(path));
    }
  }
}

TEST(Attention, RejectsOutOfRangeSelection) {
  std::mt19937 rng(3);
  FakeCache cache(16, 1, 32, 10, 0.0, rng);
  std::vector<float> q(32), out(32);
  std::vector<int64_t> qpos = {100};
  KeySelection sel;
  sel.begin(1, 1);
  sel.add(5, 11);
  sel.close_list();
  AttentionArgs a = attention_args(q.data(), 1, 1, 1, 32, qpos.data(), cache.layer(), 1.f);
  a.selection = &sel;
  a.out = out.data();
  for (CpuPath path : paths()) EXPECT_THROW(attention(a, 1, path), std::invalid_argument);
  EXPECT_THROW(attention_naive(a), std::invalid_argument);
}

// window_attention: per query head, the window rows' probabilities, (1) summed over the group
// and every row equal to attention_naive's key mass (an independent path through the kernels),
// (2) per head equal to the fp64 reference row over the same candidates. Tolerance: each value
// is a sum of <= rows probabilities computed in double and rounded once to float (2^-24
// relative) then accumulated in float over <= rows * G terms of magnitude <= 1 (both sides), so
// rows * G * 2^-23 bounds the difference; against the fp64 reference, w * 2^-22.
TEST(Attention, WindowAttentionIsPerHeadProbability) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 24; ++trial) {
    const int bs = std::vector<int>{1, 3, 7, 16}[trial % 4];
    const int Hkv = 1 + trial % 3, G = std::vector<int>{1, 2, 3, 8}[trial % 4];
    const int H = Hkv * G, D = std::vector<int>{20, 32, 33}[trial % 3];
    const int n = 5 + int(rng() % 60), rows = 1 + int(rng() % 40);
    FakeCache cache(bs, Hkv, D, n, trial % 2 ? 0.2 : 0.0, rng);
    const LayerKv kv = cache.layer();
    const std::vector<float> q = random_normal(size_t(rows) * H * D, 1.f, rng);
    std::vector<int64_t> qpos(rows);
    for (int r = 0; r < rows; ++r) qpos[r] = cache.max_position() - (rows - 1 - r) * 2 + int(rng() % 2);
    const KeySelection sel = random_selection(rows, Hkv, n, rng);
    AttentionArgs a = attention_args(q.data(), rows, H, Hkv, D, qpos.data(), kv, 1.f / std::sqrt(float(D)));
    if (trial % 3 == 0) a.selection = &sel;
    std::vector<float> out(size_t(rows) * H * D), mass(size_t(Hkv) * n, 0.f);
    a.out = out.data();
    a.key_mass = mass.data();
    attention_naive(a);
    const double tol = rows * G * std::ldexp(1.0, -23);
    // (1) every row, group-summed == key mass
    std::vector<float> win(size_t(H) * n, 0.f);
    window_attention(a, 0, win.data());
    for (int g = 0; g < Hkv; ++g)
      for (int s = 0; s < n; ++s) {
        double sum = 0;
        for (int h = g * G; h < (g + 1) * G; ++h) sum += win[size_t(h) * n + s];
        ASSERT_NEAR(sum, mass[size_t(g) * n + s], tol) << "trial " << trial << " g " << g << " s " << s;
      }
    // (2) the last w rows, per head == the reference rows' probabilities
    const int w = 1 + int(rng() % rows);
    std::fill(win.begin(), win.end(), 0.f);
    window_attention(a, rows - w, win.data());
    std::vector<double> expect(size_t(H) * n, 0.0);
    for (int r = rows - w; r < rows; ++r)
      for (int h = 0; h < H; ++h) {
        const int g = h / G;
        auto allowed = [&](int64_t s) {
          if (!kv.is_valid(int(s), g) || kv.position(int(s), g) > qpos[r]) return false;
          if (a.selection == nullptr) return true;
          for (const SlotRange& range : sel.list(r, g))
            if (s >= range.begin && s < range.end) return true;
          return false;
        };
        const testing::ReferenceRow ref = testing::reference_attention_row(
            q.data() + (size_t(r) * H + h) * D, D, n, 1.0 / std::sqrt(double(D)),
            [&](int64_t s) { return kv.key(int(s), g); }, [&](int64_t s) { return kv.value(int(s), g); },
            allowed);
        for (int s = 0; s < n; ++s) expect[size_t(h) * n + s] += ref.p[s];
      }
    for (size_t i = 0; i < expect.size(); ++i)
      ASSERT_NEAR(win[i], expect[i], w * std::ldexp(1.0, -22)) << "trial " << trial << " i " << i;
  }
}

TEST(Attention, CacheRankPositionsSkipHoles) {
  std::mt19937 rng(1);
  FakeCache cache(4, 2, 8, 6, 0.0, rng);
  cache.valid = {1, 1, 0, 1, 1, 0, 1, 1, 0, 0, 1, 1};
  std::vector<int32_t> rank(12);
  cache_rank_positions(cache.layer(), rank.data());
  EXPECT_EQ(rank, (std::vector<int32_t>{0, 0, -1, 1, 1, -1, 2, 2, -1, -1, 3, 3}));
}


// ---- storage formats: the fused decode (attention_fused.h) -------------------------------------

// A FakeCache's rows stored in a KV format as the store lays them out (kv_format.h), in the
// same scattered pages, plus `mirror`: the f32 cache of the rows as they decode (the reference
// reads those). KIVI: slots [0, q_slots) quantised in key groups of G slots (each group's range
// over its live tokens, its metadata in every block it covers), the rest the fp32 residual.
}  // namespace
}  // namespace kvlab
