// attention() over a KV cache stored in each compact format (kernels/common/kv_format.h) equals the
// reference over the dequantised rows (see the test's comment below).
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
