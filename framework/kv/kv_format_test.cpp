// KV storage formats in the paged store (kv_format.h): attention over the store equals a dense
// fp64 reference over the stored (dequantised) rows; attention over a store in any format
// equals attention over an f32 store of the dequantised rows, bit for bit; NaN refused naming the
// layer; bytes per token and fp8 scales; KIVI int4 / int2 rows bit-exact under random operations,
// and KIVI's shape errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "framework/core/error.h"
#include "framework/kv/kv_store.h"
#include "framework/kv/kv_store_test_util.h"
#include "framework/policy/layer_kv_cache_view.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_stats.h"
#include "kernels/cpu/attention_test_util.h"
#include "kernels/testing/reference_attention.h"

namespace kvlab {
namespace {

using kv_test::Fixture;
using kv_test::Token;
using kv_test::RandomStoreWalk;
using kv_test::referenced_blocks;

TEST(KvStore, AttentionOverStoreMatchesDenseReference) {
  for (KvFormat format : kRowKvFormats) {
  SCOPED_TRACE(kv_format_name(format));
  // The kernels read the store's LayerKv directly; compare with a dense softmax over the model
  // (the dequantised rows for a format other than f32).
  Fixture f(1, 2, 32, 7, 200, format);
  KvStore store(f.cfg);
  auto model = f.empty_model();
  const SeqId s = f.filled_sequence(store, 50, model);
  if (HasFatalFailure()) return;
  Evictions ev;
  ev.clear(2);
  ev.slots[0] = {3, 4, 20};
  ev.slots[1] = {0, 30, 31};
  store.evict(s, 0, ev);
  for (int h = 0; h < 2; ++h) {
    std::vector<Token> kept;
    for (int i = 0; i < 50; ++i)
      if (std::find(ev.slots[h].begin(), ev.slots[h].end(), i) == ev.slots[h].end())
        kept.push_back(model[0][h][i]);
    model[0][h] = kept;
  }
  const int G = 2, D = 32;
  std::vector<float> q(2 * G * D), out(q.size());
  for (auto& x : q) x = f.nd(f.rng);
  const int64_t qpos = 40;
  AttentionArgs a =
      attention_args(q.data(), 1, 2 * G, 2, D, &qpos, store.layer(s, 0), 1.f / std::sqrt(static_cast<float>(D)));
  a.out = out.data();
  attention(a, 2);
  for (int h = 0; h < 2 * G; ++h) {
    const auto& toks = model[0][h / G];
    const testing::ReferenceRow ref = testing::reference_attention_row(
        q.data() + h * D, D, static_cast<int64_t>(toks.size()), a.scale,
        [&](int64_t j) { return toks[j].k.data(); }, [&](int64_t j) { return toks[j].v.data(); },
        [&](int64_t j) { return toks[j].pos <= qpos; });
    for (int d = 0; d < D; ++d) ASSERT_NEAR(out[h * D + d], ref.out[d], 1e-5);
  }
  }
}

// Attention over a store in any format equals attention over an f32 store holding the
// dequantised rows: bit for bit where the kernel decodes each row exactly and then does the f32
// arithmetic in the same order (the naive reference, window_attention, and the tiled kernels with
// rope at read, which decode into the tile's scratch: out, LSE, key_mass), so the f32 kernels'
// tolerances against the fp64 reference (kernels/cpu/attention_test.cpp) carry over unchanged;
// within those tolerances (attention_test_util.h) where the tiled kernels fuse the decode into
// their products (no rope at read: tiled AVX2 and portable, 1 and 2 threads). Awkward sizes,
// holes from per-head eviction (compaction), rope at read, an explicit selection.
TEST(KvFormat, AttentionEqualsF32AttentionOverTheDequantisedRows) {
  std::mt19937 rng(15);
  std::normal_distribution<float> nd(0.f, 1.f);
  int cases = 0;
  for (KvFormat format : kAllKvFormats) {
    for (int bs : {1, 3, 7, 16}) {
      for (int D : {32, 64, 80, 20}) {
        for (int G : {1, 4}) {
          const int H = 2, n = 5 + static_cast<int>(rng() % 120);
          SCOPED_TRACE(std::string(kv_format_name(format)) + " bs " + std::to_string(bs) + " D " +
                       std::to_string(D) + " G " + std::to_string(G) + " n " + std::to_string(n));
          KvStoreConfig c{1, H, D, bs, 0, format, 0.125f};
          const bool kivi = kv_format_is_kivi(format);
          c.budget_bytes = 0;  // set below, once the KIVI group is known
          // G must divide D and divide (or be a multiple of) bs: 4 with bs 1 (groups span blocks),
          // 8 (or 4 for D = 20) with bs 16; no G in 4 | D fits bs 3 or 7.
          c.group_size = bs == 16 && D % 8 == 0 ? 8 : 4;
          if (kivi && bs % c.group_size != 0 && c.group_size % bs != 0) continue;
          c.residual = 2 * c.group_size;
          c.budget_bytes = size_t(n / bs + 2) * 2 * KvBlockLayout{format, bs, H, D, c.group_size}.block_bytes();
          KvStoreConfig cm = c;
          cm.format = KvFormat::kF32;
          cm.budget_bytes = size_t(n / bs + 2) * 2 * KvBlockLayout{KvFormat::kF32, bs, H, D}.block_bytes();
          KvStore q_store(c), m_store(cm);
          const SeqId qs = q_store.create_sequence(), ms = m_store.create_sequence();
          ASSERT_EQ(q_store.reserve(qs, n), AllocStatus::kOk);
          ASSERT_EQ(m_store.reserve(ms, n), AllocStatus::kOk);
          std::vector<float> k(H * D), v(H * D), dk(H * D), dv(H * D);
          for (int t = 0; t < n; ++t) {
            for (auto& x : k) x = nd(rng) * (t % 9 == 0 ? 20.f : 1.f);  // some outlier tokens
            for (auto& x : v) x = nd(rng);
            q_store.append(qs, 0, t, k.data(), v.data());
          }
          // The mirror holds the rows as they read now (KIVI quantises groups after later
          // appends, and never again: rows keep their values through eviction).
          for (int t = 0; t < n; ++t) {
            const LayerKv kv = q_store.layer(qs, 0);
            for (int h = 0; h < H; ++h) {
              kv.load_key(t, h, dk.data() + h * D);
              kv.load_value(t, h, dv.data() + h * D);
            }
            m_store.append(ms, 0, t, dk.data(), dv.data());
          }
          Evictions ev;  // per head, about a third: holes and (often) a compaction
          ev.clear(H);
          for (int h = 0; h < H; ++h)
            for (int s = 0; s < n; ++s)
              if (rng() % 3 == 0) ev.slots[h].push_back(s);
          q_store.evict(qs, 0, ev);
          m_store.evict(ms, 0, ev);
          const LayerKv qkv = q_store.layer(qs, 0), mkv = m_store.layer(ms, 0);
          if (!kivi) {  // KIVI does not compact: other slot numbers
            ASSERT_EQ(qkv.n_slots, mkv.n_slots);
          }
          const int rows = 1 + static_cast<int>(rng() % 3), nh = H * G;
          std::vector<float> q(size_t(rows) * nh * D);
          for (auto& x : q) x = nd(rng);
          std::vector<int64_t> qpos(rows);
          for (int r = 0; r < rows; ++r) qpos[r] = n - rows + r;
          const bool rope = rng() % 2 == 0;
          RopeConfig rc;
          rc.head_dim = D;
          RopeTable table(rc, 64);
          const bool explicit_sel = !kivi && rng() % 2 == 0;  // (slot ranges: same slot numbers only)
          // The arguments over kv (rank and sel hold what they point to).
          auto make_args = [&](const LayerKv& kv, std::vector<int32_t>& rank, KeySelection& sel) {
            rank.resize(size_t(kv.n_slots) * H);
            cache_rank_positions(kv, rank.data());
            for (auto& r : rank) r = std::max(r, 0);
            if (explicit_sel) {
              sel.begin(rows, H);
              for (int r = 0; r < rows; ++r)
                for (int h = 0; h < H; ++h) {
                  sel.add(0, kv.n_slots / 2);
                  sel.add(kv.n_slots / 2 + 1, kv.n_slots);
                  sel.close_list();
                }
            }
            AttentionArgs a = attention_args(q.data(), rows, nh, H, D, qpos.data(), kv, 1.f / std::sqrt(float(D)));
            if (rope) {
              a.rope = &table;
              a.key_rope_pos = rank.data();
            }
            if (explicit_sel) a.selection = &sel;
            return a;
          };
          auto run = [&](const LayerKv& kv, int which) {
            std::vector<int32_t> rank;
            KeySelection sel;
            AttentionArgs a = make_args(kv, rank, sel);
            std::vector<float> out(q.size()), lse(size_t(rows) * nh), mass(size_t(H) * kv.n_slots, 0.f);
            a.out = out.data(), a.lse = lse.data(), a.key_mass = mass.data();
            if (which == 0) attention_naive(a);
            if (which == 1) attention(a, 1, CpuPath::kPortable);
            if (which == 2) attention(a, 2, CpuPath::kPortable);
            if (which == 3) attention(a, 1, CpuPath::kAvx2);
            if (which == 4) attention(a, 2, CpuPath::kAvx2);
            std::vector<float> w(size_t(nh) * kv.n_slots, 0.f);
            if (which == 5) {
              std::fill(out.begin(), out.end(), 0.f);
              window_attention(a, 0, w.data());
            }
            out.insert(out.end(), lse.begin(), lse.end());
            // Per-slot outputs in text-position order (slot numbers differ without compaction).
            for (int h = 0; h < nh; ++h)
              for (int s = 0; s < kv.n_slots; ++s)
                if (kv.is_valid(s, h / G)) out.push_back(w[size_t(h) * kv.n_slots + s]);
            for (int g = 0; g < H; ++g)
              for (int s = 0; s < kv.n_slots; ++s)
                if (kv.is_valid(s, g)) out.push_back(mass[size_t(g) * kv.n_slots + s]);
            return out;
          };
          for (int which = 0; which < 6; ++which) {
            if (which >= 3 && which <= 4 && !cpu_has_avx2_fma_f16c()) continue;
            if (which >= 1 && which <= 4 && !rope && format != KvFormat::kF32) continue;  // fused: below
            const std::vector<float> got = run(qkv, which), want = run(mkv, which);
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << "kernel " << which << " element " << i << ": " << got[i] << " vs " << want[i];
          }
          if (!rope && format != KvFormat::kF32) {
            // The tiled kernels without rope at read run the fused decode (attention_fused.h):
            // the reference over the dequantised rows within attention_test_util.h's bounds
            // (computed on the f32 mirror; extra_roundings 2 for int8 / fp8), key mass per valid
            // slot in slot order (= position order in both stores).
            std::vector<int32_t> rq, rm;
            KeySelection sq, sm;
            float dummy = 0;
            AttentionArgs aq = make_args(qkv, rq, sq), am = make_args(mkv, rm, sm);
            aq.key_mass = am.key_mass = &dummy;  // attention_test::run substitutes a buffer
            const attention_test::Outputs ref = attention_test::run(am, false, 1);
            const bool scaled = format == KvFormat::kInt8 || kv_format_has_head_scale(format);
            const attention_test::Tolerances tol = attention_test::tolerances(am, ref, scaled ? 2 : 0);
            auto live = [&](const LayerKv& kv, const std::vector<float>& mass) {
              std::vector<float> x;
              for (int g = 0; g < H; ++g)
                for (int s = 0; s < kv.n_slots; ++s)
                  if (kv.is_valid(s, g)) x.push_back(mass[size_t(g) * kv.n_slots + s]);
              return x;
            };
            const std::vector<float> ref_mass = live(mkv, ref.mass), tol_mass = live(mkv, tol.mass);
            for (CpuPath path : attention_test::paths())
              for (int threads : {1, 2}) {
                attention_test::Outputs got = attention_test::run(aq, true, threads, path);
                got.mass = live(qkv, got.mass);
                attention_test::Outputs want = ref;
                want.mass = ref_mass;
                attention_test::Tolerances t = tol;
                t.mass = tol_mass;
                attention_test::expect_close(want, got, t, std::string("fused, path ") + to_string(path) +
                                                               " threads " + std::to_string(threads));
                if (HasFatalFailure()) return;
              }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 6 * 4 * 4 * 2 + 2 * 2 * 4 * 2);  // KIVI: block sizes 1 and 16 only
}

// Formats: bad input is refused before anything changes, bytes per token are measured.
TEST(KvFormat, NanRefusedNamingTheLayerAndNothingChanges) {
  for (KvFormat format : kAllKvFormats) {
    if (format == KvFormat::kF32) continue;
    Fixture f(2, 2, 8, 4, 16, format);
    f.cfg.group_size = 4;
    KvStore store(f.cfg);
    const SeqId s = store.create_sequence();
    ASSERT_EQ(store.reserve(s, 2), AllocStatus::kOk);
    std::vector<float> k(16, 1.f), v(16, 1.f);
    v[11] = NAN;  // head 1
    try {
      store.append(s, 1, 0, k.data(), v.data());
      FAIL() << kv_format_name(format) << ": NaN accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layer 1 kv_head 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
    }
    EXPECT_EQ(store.n_slots(s, 1), 0);
    v[11] = INFINITY;
    const bool scaled = format == KvFormat::kInt8 || kv_format_has_head_scale(format) || kv_format_is_kivi(format);
    if (scaled) {
      EXPECT_THROW(store.append(s, 1, 0, k.data(), v.data()), Error);
    } else {
      EXPECT_EQ(store.append(s, 1, 0, k.data(), v.data()), 0);  // bf16 / f16 keep inf
      std::vector<float> row(8);
      store.layer(s, 1).load_value(0, 1, row.data());
      EXPECT_TRUE(std::isinf(row[3]));
    }
  }
}

TEST(KvFormat, BytesPerTokenAndFp8Scales) {
  // D = 64, 4 KV heads, 2 layers, blocks of 16: f32 2*2*4*64*4 = 4096 bytes a token.
  for (KvFormat format : kRowKvFormats) {
    KvStoreConfig c{2, 4, 64, 16, size_t(1) << 20, format, 1.f};
    const double want = format == KvFormat::kF32 ? 4096 : format == KvFormat::kBf16 || format == KvFormat::kF16 ? 2048
                        : format == KvFormat::kInt8 ? 2 * 2 * 4 * (64 + 4) : 1024;
    EXPECT_EQ(kv_bytes_per_token(c), want) << kv_format_name(format);
    KvStore store(c);
    EXPECT_EQ(store.block_bytes(), size_t(want * 16 / 2)) << kv_format_name(format);
  }
  KvStoreConfig c{1, 2, 8, 4, 4096, KvFormat::kFp8E4m3, 1.f};
  KvStore store(c);
  const float ks[2] = {0.5f, 2.f}, vs[2] = {1.f, 4.f}, bad[2] = {0.f, 1.f};
  EXPECT_THROW(store.set_fp8_scales(0, bad, vs), Error);
  store.set_fp8_scales(0, ks, vs);
  const SeqId s = store.create_sequence();
  ASSERT_EQ(store.reserve(s, 1), AllocStatus::kOk);
  std::vector<float> k(16, 3.f), v(16, 3.f);
  store.append(s, 0, 0, k.data(), v.data());
  const LayerKv kv = store.layer(s, 0);
  EXPECT_EQ(kv.key_scale(0, 1), 2.f);
  EXPECT_EQ(kv.value_scale(0, 1), 4.f);
  EXPECT_EQ(kv.key_codes(0, 1)[0], kv_encode_e4m3(1.5f));
  EXPECT_THROW(store.set_fp8_scales(0, ks, vs), Error);  // rows already stored
  KvStoreConfig c8 = c;
  c8.format = KvFormat::kInt8;
  KvStore s8(c8);
  EXPECT_THROW(s8.set_fp8_scales(0, ks, vs), Error);
  c.fp8_scale = -1.f;
  EXPECT_THROW(KvStore{c}, Error);
}

TEST(KvFormat, Fp8ScalesPerSequence) {
  // Two sequences of one store with their own scales; each decodes its rows with its own, a
  // fork inherits its parent's, and a sequence holding rows refuses new ones.
  KvStoreConfig c{2, 2, 8, 4, 1 << 16, KvFormat::kFp8E4m3, 1.f};
  KvStore store(c);
  const SeqId a = store.create_sequence(), b = store.create_sequence();
  const float ka[2] = {0.25f, 0.5f}, va[2] = {2.f, 4.f}, kb[2] = {8.f, 16.f}, vb[2] = {0.125f, 1.f};
  store.set_sequence_fp8_scales(a, 1, ka, va);
  store.set_sequence_fp8_scales(b, 1, kb, vb);
  std::vector<float> k(16), v(16);
  for (int i = 0; i < 16; ++i) k[i] = v[i] = 0.37f * float(i - 7);
  for (SeqId s : {a, b}) {
    ASSERT_EQ(store.reserve(s, 1), AllocStatus::kOk);
    for (int l = 0; l < 2; ++l) store.append(s, l, 0, k.data(), v.data());
  }
  EXPECT_THROW(store.set_sequence_fp8_scales(a, 1, kb, vb), Error);  // rows already stored
  EXPECT_THROW(store.set_sequence_fp8_scales(a, 2, kb, vb), Error);  // no such layer
  const float zero[2] = {0.f, 1.f};
  EXPECT_THROW(store.set_sequence_fp8_scales(b, 0, zero, vb), Error);
  const SeqId child = store.fork(b);
  for (auto [s, ks, vs] : {std::tuple{a, ka, va}, std::tuple{b, kb, vb}, std::tuple{child, kb, vb}}) {
    for (int h = 0; h < 2; ++h) {
      SCOPED_TRACE("sequence " + std::to_string(s) + " head " + std::to_string(h));
      const LayerKv kv = store.layer(s, 1);
      EXPECT_EQ(kv.key_scale(0, h), ks[h]);
      EXPECT_EQ(kv.value_scale(0, h), vs[h]);
      std::vector<float> row(8);
      kv.load_key(0, h, row.data());
      for (int d = 0; d < 8; ++d) EXPECT_EQ(row[d], kv_decode_e4m3(kv_encode_e4m3(k[h * 8 + d] / ks[h])) * ks[h]);
      EXPECT_EQ(store.layer(s, 0).key_scale(0, h), 1.f);  // layer 0 keeps the store's
    }
  }
}

// KIVI (int4 / int2) under random create / fork / free / append / per-head evict: every live row
// reads as its input while it is in the residual (slot >= q), and once its group is quantised it
// reads the same bits forever after, through forks (copy-on-write), evictions and block removals;
// the R newest slots always stay exact; the quantised values are the group quantisation of
// kv_format.h (checked against an independent recomputation from the inputs of the group's live
// cells at the moment it was quantised); accounting: every block in use is referenced.
TEST(KvFormat, KiviRandomOperationsKeepRowsBitExact) {
  struct Row {
    int64_t pos;
    std::vector<float> k, v;      // input
    std::vector<float> qk, qv;    // as read once quantised (empty before)
  };
  for (KvFormat format : {KvFormat::kInt4, KvFormat::kInt2})
    for (int bs : {1, 4, 8}) {
      for (int G : {2, 4}) {
        for (int R : {0, 4}) {
          if (bs % G != 0 && G % bs != 0) continue;
          SCOPED_TRACE(std::string(kv_format_name(format)) + " bs " + std::to_string(bs) + " G " +
                       std::to_string(G) + " R " + std::to_string(R));
          const int L = 2, H = 2, D = 8;
          KvStoreConfig c{L, H, D, bs, 0, format, 1.f, G, R};
          c.budget_bytes = size_t(120 / bs + 8) * 2 * KvBlockLayout{format, bs, H, D, G}.block_bytes();
          KvStore store(c);
          using Model = std::vector<std::vector<std::vector<Row>>>;  // [layer][head][live rows]
          std::mt19937 rng(bs * 100 + G * 10 + R);
          std::normal_distribution<float> nd(0.f, 1.f);
          int quantised_seen = 0;
          float max_abs = 0.f;  // over every key input
          RandomStoreWalk<Model> walk(300, 5, 7, 6);
          auto& models = walk.models;
          auto append = [&](SeqId s, int64_t pos) {
            for (int l = 0; l < L; ++l) {
              std::vector<float> k(H * D), v(H * D);
              for (auto& x : k) max_abs = std::max(max_abs, std::fabs(x = nd(rng) * (rng() % 7 == 0 ? 10.f : 1.f)));
              for (auto& x : v) x = nd(rng);
              store.append(s, l, pos, k.data(), v.data());
              for (int h = 0; h < H; ++h)
                models[s][l][h].push_back({pos, {k.begin() + h * D, k.begin() + (h + 1) * D},
                                           {v.begin() + h * D, v.begin() + (h + 1) * D}, {}, {}});
            }
          };
          auto evict = [&](SeqId s) {
            for (int l = 0; l < L; ++l) {
              const LayerKv kv = store.layer(s, l);
              Evictions ev;
              ev.clear(H);
              for (int h = 0; h < H; ++h) {
                std::vector<Row> kept;
                size_t i = 0;
                for (int slot = 0; slot < kv.n_slots; ++slot) {
                  if (!kv.is_valid(slot, h)) continue;
                  if (rng() % 3 == 0) ev.slots[h].push_back(slot); else kept.push_back(models[s][l][h][i]);
                  ++i;
                }
                models[s][l][h] = kept;
              }
              store.evict(s, l, ev);
            }
          };
          // One row of the model against what the store reads back at its slot.
          auto check_row = [&](const LayerKv& kv, int slot, int h, Row& row, int64_t next) {
            std::vector<float> key(D), val(D);
            ASSERT_EQ(kv.position(slot, h), row.pos);
            kv.load_key(slot, h, key.data());
            kv.load_value(slot, h, val.data());
            // The R most recent tokens (positions = append order) are never quantised.
            if (slot < kv.kivi_q_slots) {
              ASSERT_LT(row.pos, next - R) << "slot " << slot;
            }
            if (slot >= kv.kivi_q_slots) {
              ASSERT_TRUE(row.qk.empty()) << "a quantised row went back to the residual";
              ASSERT_EQ(key, row.k) << "residual slot " << slot;
              ASSERT_EQ(val, row.v);
            } else if (row.qk.empty()) {
              row.qk = key;
              row.qv = val;
              ++quantised_seen;
              // Values per token: exactly kv_format.h's group quantisation of the input.
              std::vector<uint8_t> codes(D);
              std::vector<float> sz(2 * (D / G)), want(D);
              ASSERT_TRUE(kv_kivi_encode_value(row.v.data(), D, G, kv_format_bits(format), sz.data(), codes.data()));
              kv_kivi_decode_value(codes.data(), D, G, kv_format_bits(format), sz.data(), want.data());
              ASSERT_EQ(val, want) << "slot " << slot;
              // Keys per channel: within half a step s_d / 2 of the input; s_d = range / L
              // <= 2 max|x| / L (plus a few float roundings: x 1.001).
              for (int d = 0; d < D; ++d)
                ASSERT_LE(std::fabs(key[d] - row.k[d]), 1.001f * max_abs / ((1 << kv_format_bits(format)) - 1)) << d;
            } else {
              ASSERT_EQ(key, row.qk) << "a quantised key changed: slot " << slot;
              ASSERT_EQ(val, row.qv);
            }
          };
          auto check = [&](int op, int, SeqId) {
            for (auto& [id, model] : models) {
              for (int l = 0; l < L; ++l) {
                const LayerKv kv = store.layer(id, l);
                ASSERT_EQ(kv.kivi_q_slots % std::min(G, bs) == 0 || kv.kivi_q_slots % bs == 0, true);
                for (int h = 0; h < H; ++h) {
                  size_t i = 0;
                  for (int slot = 0; slot < kv.n_slots; ++slot) {
                    if (!kv.is_valid(slot, h)) continue;
                    ASSERT_LT(i, model[l][h].size());
                    check_row(kv, slot, h, model[l][h][i++], walk.next_pos[id]);
                    if (HasFatalFailure()) return;
                  }
                  ASSERT_EQ(i, model[l][h].size());
                }
              }
            }
            ASSERT_EQ(store.stats().blocks_in_use, referenced_blocks(store, models)) << "op " << op;
          };
          walk.run(store, rng, [&] { return Model(L, std::vector<std::vector<Row>>(H)); }, append, evict, check);
          if (HasFatalFailure()) return;
          EXPECT_GT(quantised_seen, 50);
          for (const auto& [id, m] : models) store.free_sequence(id);
          EXPECT_EQ(store.stats().blocks_in_use, 0);
        }
      }
    }
}

TEST(KvFormat, KiviShapeErrorsAndBytes) {
  KvStoreConfig c{1, 2, 64, 16, 1 << 20, KvFormat::kInt4, 1.f, 32, 128};
  EXPECT_NO_THROW(KvStore{c});
  // int4, G 32, D 64, blocks of 16: codes 32 bytes a row; key (s, z) of the group in each
  // block: 2 * 64 * 4 per head; values 2 groups x (s, z) a row. Arena = max(16*32 + 512,
  // 16*32 + 16*16) = 1024 per head.
  EXPECT_EQ(KvBlockLayout(KvBlockLayout{KvFormat::kInt4, 16, 2, 64, 32}).block_bytes(), size_t(2 * 1024));
  EXPECT_EQ(kv_bytes_per_token(c), 2.0 * 2 * 1024 / 16);
  auto expect_error = [&](KvStoreConfig bad, const std::string& what) {
    try {
      KvStore s(bad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KvStoreConfig b = c;
  b.group_size = 48;
  expect_error(b, "group_size 48 must divide head_dim 64");
  b = c;
  b.residual = 100;
  expect_error(b, "residual 100 must be a non-negative multiple of group_size 32");
  b = c;
  b.block_size_tokens = 24;
  expect_error(b, "must divide or be a multiple of block_size 24");
}

}  // namespace
}  // namespace kvlab
