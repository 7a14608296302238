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

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvlab {
namespace {

using attention_test::Outputs;
using attention_test::Tolerances;
using attention_test::expect_close;
using attention_test::paths;
using attention_test::run;
using attention_test::tolerances;

// A paged cache built directly (no KvStore: kernels depend on nothing in framework/), with its
// pages scattered through a larger pool in random order.
// n values ~ N(0, sigma^2), drawn from rng in order.
std::vector<float> random_normal(size_t n, float sigma, std::mt19937& rng) {
  std::vector<float> x(n);
  std::normal_distribution<float> nd(0.f, sigma);
  for (auto& v : x) v = nd(rng);
  return x;
}

struct FakeCache {
  int bs, H, D, n_slots;
  std::vector<float> k, v;          // [n_pages, H, bs, D]
  std::vector<int32_t> indices;     // block table
  int32_t indptr[2];
  int32_t last_len;
  std::vector<int64_t> positions;   // [n_slots, H]
  std::vector<uint8_t> valid;       // [n_slots, H]

  FakeCache(int bs_, int H_, int D_, int n, double hole_prob, std::mt19937& rng)
      : bs(bs_), H(H_), D(D_), n_slots(n) {
    const int used = (n + bs - 1) / bs;
    const int n_pages = used + 3;
    std::normal_distribution<float> nd(0.f, 1.f);
    k.resize(static_cast<size_t>(n_pages) * H * bs * D);
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    std::vector<int32_t> perm(n_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    indices.assign(perm.begin(), perm.begin() + used);
    indptr[0] = 0;
    indptr[1] = used;
    last_len = used == 0 ? 0 : n - (used - 1) * bs;
    positions.resize(static_cast<size_t>(n) * H);
    valid.resize(positions.size());
    std::uniform_real_distribution<double> u(0, 1);
    for (int h = 0; h < H; ++h) {
      int64_t p = rng() % 3;
      for (int s = 0; s < n; ++s) {
        p += 1 + (u(rng) < 0.2 ? rng() % 3 : 0);  // increasing, with gaps (earlier evictions)
        positions[static_cast<size_t>(s) * H + h] = p;
        valid[static_cast<size_t>(s) * H + h] = u(rng) >= hole_prob;
      }
    }
  }
  LayerKv layer() const {
    LayerKv kv;
    kv.view.page_size = bs;
    kv.view.num_kv_heads = H;
    kv.view.head_dim = D;
    kv.view.k_data = k.data();
    kv.view.v_data = v.data();
    kv.view.indptr = indptr;
    kv.view.indices = indices.data();
    kv.view.last_page_len = &last_len;
    kv.n_slots = n_slots;
    kv.positions = positions.data();
    kv.valid = valid.data();
    return kv;
  }
  int64_t max_position() const {
    int64_t m = 0;
    for (int64_t p : positions) m = std::max(m, p);
    return m;
  }
};

// Random sorted, disjoint ranges per (row, kv head); some lists empty.
KeySelection random_selection(int rows, int H, int n_slots, std::mt19937& rng) {
  KeySelection sel;
  sel.begin(rows, H);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < H; ++h) {
      if (rng() % 5 != 0) {
        int s = 0;
        while (s < n_slots) {
          const int gap = rng() % 9, len = 1 + rng() % 12;
          const int b = std::min(n_slots, s + gap), e = std::min(n_slots, b + len);
          sel.add(b, e);
          s = e + 1;
        }
      }
      sel.close_list();
    }
  }
  return sel;
}

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
struct CodedCache {
  KvBlockLayout layout;
  std::vector<uint8_t> k, v;     // arenas, block b at b * block_bytes()
  std::vector<float> head_scale;  // fp8: S per KV head
  int q_slots = 0;
  std::vector<float> res_k, res_v;
  FakeCache mirror;
  const FakeCache& src;

  CodedCache(const FakeCache& c, KvFormat f, int G, std::mt19937& rng)
      : layout{f, c.bs, c.H, c.D, G}, mirror(c), src(c) {
    const int n_pages = static_cast<int>(c.k.size() / (static_cast<size_t>(c.H) * c.bs * c.D));
    const size_t bb = layout.block_bytes();
    k.assign(bb * n_pages, 0);
    v.assign(bb * n_pages, 0);
    for (int h = 0; h < c.H; ++h) head_scale.push_back(0.01f * static_cast<float>(1 + h));  // |x / S| past 448: saturates
    const LayerKv src_kv = c.layer();
    if (!kv_format_is_kivi(f)) {
      for (int p = 0; p < n_pages; ++p)
        for (int h = 0; h < c.H; ++h)
          for (int e = 0; e < c.bs; ++e) {
            const size_t off = src_kv.view.offset(p, h, e, 0);
            uint8_t* kb = k.data() + p * bb;
            uint8_t* vb = v.data() + p * bb;
            float ks = 0, vs = 0;
            EXPECT_TRUE(kv_encode_row(f, c.k.data() + off, c.D, head_scale[h], kb + layout.row_offset(h, e), &ks));
            EXPECT_TRUE(kv_encode_row(f, c.v.data() + off, c.D, head_scale[h], vb + layout.row_offset(h, e), &vs));
            if (f == KvFormat::kInt8) {
              std::memcpy(kb + layout.meta_offset(h, e), &ks, 4);
              std::memcpy(vb + layout.meta_offset(h, e), &vs, 4);
            }
          }
    } else {
      const int bits = kv_format_bits(f);
      q_slots = static_cast<int>(c.n_slots / G - static_cast<int>(rng() % 2)) * G;  // 0 .. whole groups
      q_slots = std::max(0, q_slots);
      for (int g0 = 0; g0 < q_slots; g0 += G)
        for (int h = 0; h < c.H; ++h) {
          std::vector<float> rows(static_cast<size_t>(G) * c.D), s(c.D), z(c.D);
          std::vector<uint8_t> live(G);
          for (int i = 0; i < G; ++i) {
            std::memcpy(&rows[static_cast<size_t>(i) * c.D], src_kv.key(g0 + i, h), sizeof(float) * c.D);
            live[i] = src_kv.is_valid(g0 + i, h);
          }
          for (int d = 0; d < c.D; ++d)
            EXPECT_TRUE(kv_kivi_range(rows.data() + d, G, c.D, live.data(), bits, &s[d], &z[d]));
          for (int i = 0; i < G; ++i) {
            const int slot = g0 + i, e = slot % c.bs;
            const size_t base = static_cast<size_t>(c.indices[slot / c.bs]) * bb;
            kv_kivi_encode_key(&rows[static_cast<size_t>(i) * c.D], c.D, bits, s.data(), z.data(),
                               k.data() + base + layout.row_offset(h, e));
            float* meta = reinterpret_cast<float*>(k.data() + base + layout.key_group_meta_offset(h, e));
            std::copy(s.begin(), s.end(), meta);
            std::copy(z.begin(), z.end(), meta + c.D);
            EXPECT_TRUE(kv_kivi_encode_value(src_kv.value(slot, h), c.D, G, bits,
                                             reinterpret_cast<float*>(v.data() + base + layout.value_meta_offset(h, e)),
                                             v.data() + base + layout.row_offset(h, e)));
          }
        }
      for (int slot = q_slots; slot < c.n_slots; ++slot)
        for (int h = 0; h < c.H; ++h) {
          res_k.insert(res_k.end(), src_kv.key(slot, h), src_kv.key(slot, h) + c.D);
          res_v.insert(res_v.end(), src_kv.value(slot, h), src_kv.value(slot, h) + c.D);
        }
    }
    const LayerKv kv = layer();
    const LayerKv m = mirror.layer();
    for (int slot = 0; slot < c.n_slots; ++slot)
      for (int h = 0; h < c.H; ++h) {
        kv.load_key(slot, h, const_cast<float*>(m.key(slot, h)));
        kv.load_value(slot, h, const_cast<float*>(m.value(slot, h)));
      }
  }
  LayerKv layer() const {
    LayerKv kv = src.layer();
    kv.view.k_data = kv.view.v_data = nullptr;
    kv.layout = layout;
    kv.k_bytes = k.data();
    kv.v_bytes = v.data();
    if (kv_format_has_head_scale(layout.format)) kv.k_head_scale = kv.v_head_scale = head_scale.data();
    kv.kivi_q_slots = q_slots;
    kv.res_k = res_k.data();
    kv.res_v = res_v.data();
    return kv;
  }
};

// Restores the fused kernels' instruction set when a test ends.
struct FusedIsaGuard {
  FusedIsa saved = fused_isa();
  ~FusedIsaGuard() { set_fused_isa_for_tests(saved); }
};

// Every (path, fused ISA) pair this CPU runs: the portable path (scalar), the AVX2 path with
// each of the SIMD kernels the CPU has.
std::vector<std::pair<CpuPath, FusedIsa>> fused_paths() {
  std::vector<std::pair<CpuPath, FusedIsa>> p = {{CpuPath::kPortable, FusedIsa::kPortable}};
  if (cpu_has_avx2_fma_f16c())
    for (FusedIsa isa : {FusedIsa::kPortable, FusedIsa::kAvx2, FusedIsa::kAvx512})
      if (matvec_isa_supported(isa)) p.push_back({CpuPath::kAvx2, isa});
  return p;
}

// Attention over a cache in every format (the decode fused into the dot products and PV sums)
// equals the reference over the dequantised rows within tolerances() (extra_roundings 2 for
// int8 / fp8, see attention_test_util.h), on each path and fused instruction set, over awkward
// shapes: block sizes 1/3/7/16, head dims 20/32/48/64/80/128 (20 and 48: the scalar fallback of
// the 16- or 8-wide kernels), GQA 1..8, lengths not a multiple of the block, holes, explicit
// selections, key and head mass, KIVI group sizes 4..32 with a residual; 1 and 2 threads give the
// same bits. Rope at read in some cases (the decode-into-scratch path).
TEST(Attention, FusedFormatsEqualNaiveOverTheDequantisedRows) {
  FusedIsaGuard guard;
  std::mt19937 rng(1515);
  int cases = 0;
  for (KvFormat f : kAllKvFormats) {
    if (f == KvFormat::kF32) continue;
    for (int bs : {1, 3, 7, 16}) {
      for (int D : {20, 32, 48, 64, 80, 128}) {
        int G = 0;  // KIVI group: divides D, and divides or is a multiple of bs
        if (kv_format_is_kivi(f)) {
          std::vector<int> ok;
          for (int g : {4, 8, 16, 32})
            if (D % g == 0 && (bs % g == 0 || g % bs == 0)) ok.push_back(g);
          if (ok.empty()) continue;
          G = ok[rng() % ok.size()];
        }
        for (int gqa : {1, 2, 3, 4, 8}) {
          const int H = 1 + static_cast<int>(rng() % 2);
          const int n_slots = static_cast<int>(rng() % 140);
          FakeCache cache(bs, H, D, n_slots, (rng() % 2) ? 0.25 : 0.0, rng);
          for (auto& x : cache.k)
            if (rng() % 50 == 0) x *= 30.f;  // outliers: wide int8 / KIVI ranges, fp8 saturation
          CodedCache coded(cache, f, G, rng);
          if (HasFatalFailure()) return;
          const int rows = 1 + static_cast<int>(rng() % 3);
          std::vector<float> q = random_normal(static_cast<size_t>(rows) * H * gqa * D, 1.f, rng);
          std::vector<int64_t> qpos(rows);
          for (int r = 0; r < rows; ++r) qpos[r] = static_cast<int64_t>(rng() % (cache.max_position() + 2));
          const KeySelection sel = random_selection(rows, H, n_slots, rng);
          RopeConfig rc;
          rc.head_dim = D;
          const RopeTable table(rc, 64);
          std::vector<int32_t> rank(static_cast<size_t>(n_slots) * H);
          cache_rank_positions(cache.layer(), rank.data());
          for (auto& r : rank) r = std::max(r, 0);
          const bool rope = rng() % 4 == 0;
          AttentionArgs a = attention_args(q.data(), rows, H * gqa, H, D, qpos.data(), coded.layer(),
                                           1.f / std::sqrt(static_cast<float>(D)));
          a.selection = rng() % 2 ? &sel : nullptr;
          float dummy = 0;
          a.key_mass = rng() % 2 ? &dummy : nullptr;
          if (rng() % 2) {
            a.head_mass = &dummy;
            a.head_mass_first_row = static_cast<int>(rng() % (rows + 1));
          }
          if (rope) {
            a.rope = &table;
            a.key_rope_pos = rank.data();
          }
          AttentionArgs m = a;
          m.kv = coded.mirror.layer();
          const Outputs ref = run(m, false, 1);
          const bool scaled = f == KvFormat::kInt8 || kv_format_has_head_scale(f);
          const Tolerances tol = tolerances(m, ref, scaled ? 2 : 0);
          const std::string what = std::string(kv_format_name(f)) + " bs " + std::to_string(bs) + " D " +
                                   std::to_string(D) + " G " + std::to_string(gqa) + " H " + std::to_string(H) +
                                   " n " + std::to_string(n_slots) + " kivi G " + std::to_string(G) +
                                   " rope " + std::to_string(rope);
          // The naive reference reads the coded cache through load_key / load_value: the same.
          const Outputs naive = run(a, false, 1);
          ASSERT_EQ(naive.out, ref.out) << what;
          for (const auto& [path, isa] : fused_paths()) {
            set_fused_isa_for_tests(isa);
            const Outputs one = run(a, true, 1, path), two = run(a, true, 2, path);
            const std::string w = what + " path " + to_string(path) + " isa " + to_string(isa);
            ASSERT_EQ(one.out, two.out) << w;
            ASSERT_EQ(one.lse, two.lse) << w;
            ASSERT_EQ(one.mass, two.mass) << w;
            ASSERT_EQ(one.head, two.head) << w;
            expect_close(ref, one, tol, w);
            if (HasFatalFailure()) return;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 400);
}

}  // namespace
}  // namespace kvlab
