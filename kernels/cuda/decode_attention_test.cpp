// Decode attention on the GPU against the fp64 dense reference over the same paged cache, swept
// over awkward shapes: page sizes 1/7/16, head dims 64/128, GQA 1/4/8, lengths not a multiple
// of the page, holes, window/sink masks, empty / full / random selections, 1 or many splits,
// bf16 / fp16 / fp32 storage, with and without the key-mass statistics. Skips without a GPU.
#include "kernels/cuda/decode_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/online_softmax.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_test.h"
#include "kernels/cuda/test_util.h"
#include "kernels/testing/reference_attention.h"

namespace kvlab::cuda {
namespace {

using testing::DevicePagedKv;
using testing::HostPagedKv;

using testing::HostSelection;

struct Reference {
  std::vector<float> out, lse, mass;
};

// The fp64 dense reference (kernels/testing) over each list's selected keys, holes and masked
// keys excluded. rope: 0 keys used as stored, 1 interleaved / 2 neox rotation at read to rope_pos
// by the host RoPE.
Reference reference_decode(const HostPagedKv& kv, const std::vector<float>& q, int num_qo_heads,
                           const std::vector<int32_t>& q_pos, const HostSelection& sel,
                           const WindowSinkMask& mask, float scale, int mass_stride, int rope = 0,
                           const std::vector<int32_t>& rope_pos = {}, const RopeTable* host_rope = nullptr) {
  const auto view = kv.view();
  const int batch = static_cast<int>(kv.lengths.size()), hkv = kv.num_kv_heads,
            d = kv.head_dim, group = num_qo_heads / hkv;
  const KeySelectionView sv = sel.view();
  Reference r;
  r.out.assign(size_t(batch) * num_qo_heads * d, 0.f);
  r.lse.assign(size_t(batch) * num_qo_heads, kNegInf);
  r.mass.assign(size_t(batch) * hkv * mass_stride, 0.f);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < num_qo_heads; ++h) {
      const int kvh = h / group, list = b * hkv + kvh;
      const int count = sv.count(list, kv.lengths[b]);
      std::vector<float> rotated;  // the key being read, rotated (used before the next key_of)
      const ::kvlab::testing::ReferenceRow row = testing::reference_list_row(
          kv, sv, b, kvh, q.data() + (size_t(b) * num_qo_heads + h) * d, scale,
          [&](int slot) {
            const float* k = kv.k.data() + view.slot_offset(b, slot, kvh);
            if (rope == 0) return k;
            rotated = testing::rotate_key(k, d, rope_pos[view.slot_meta_offset(b, slot, kvh)], *host_rope);
            return static_cast<const float*>(rotated.data());
          },
          [&](int slot) {
            const int pos = kv.kv_pos[view.slot_meta_offset(b, slot, kvh)];
            return pos >= 0 && mask(q_pos[b], pos);
          });
      if (std::isinf(row.lse)) continue;
      for (int f = 0; f < d; ++f) r.out[(size_t(b) * num_qo_heads + h) * d + f] = float(row.out[f]);
      for (int n = 0; n < count; ++n)
        if (row.p[n] != 0) r.mass[size_t(list) * mass_stride + sv.slot_of(list, n)] += float(row.p[n]);
      r.lse[size_t(b) * num_qo_heads + h] = float(row.lse);
    }
  }
  return r;
}

enum class SelKind { kAll, kEmpty, kFullExplicit, kRandomPages, kRandomRanges };

HostSelection make_selection(std::mt19937& rng, SelKind kind, const std::vector<int32_t>& lengths,
                             int hkv, int page_size) {
  HostSelection sel;
  if (kind == SelKind::kAll) return sel;
  sel.all = false;
  sel.indptr.push_back(0);
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int h = 0; h < hkv; ++h) {
      const int len = lengths[b];
      if (kind == SelKind::kFullExplicit && len > 0) {
        sel.ranges.push_back({0, len});
      } else if (kind == SelKind::kRandomPages) {
        for (int p0 = 0; p0 < len; p0 += page_size)  // ~25% of the pages, always the last
          if (rng() % 4 == 0 || p0 + page_size >= len) sel.ranges.push_back({p0, std::min(len, p0 + page_size)});
      } else if (kind == SelKind::kRandomRanges) {
        int pos = 0;
        while (pos < len) {
          const int skip = rng() % 9, take = 1 + rng() % 13;
          const int b0 = std::min(len, pos + skip), e0 = std::min(len, b0 + take);
          if (b0 < e0) sel.ranges.push_back({b0, e0});
          pos = e0 + 1;
        }
      }
      sel.indptr.push_back(static_cast<int32_t>(sel.ranges.size()));
    }
  }
  sel.offsets = build_key_offsets(sel.indptr, sel.ranges);
  return sel;
}

struct Case {
  int page_size, head_dim, hkv, group;
  std::vector<int32_t> lengths;
  SelKind sel;
  WindowSinkMask mask;
  float hole_fraction;
  bool key_mass;
  int keys_per_split;  // 0 = plan_decode's choice
  int rope = 0;        // rope at read: 0 off, 1 interleaved, 2 neox
};

template <class T>
void run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const HostPagedKv kv = testing::random_paged_kv<T>(rng, c.lengths, c.page_size, c.hkv,
                                                     c.head_dim, c.hole_fraction);
  const int batch = static_cast<int>(c.lengths.size()), hq = c.hkv * c.group;
  const std::vector<float> q = testing::random_normal(rng, size_t(batch) * hq * c.head_dim, 1.5f);
  std::vector<int32_t> q_pos(batch);
  for (int b = 0; b < batch; ++b) q_pos[b] = std::max(0, c.lengths[b] - 1);
  const HostSelection sel = make_selection(rng, c.sel, c.lengths, c.hkv, c.page_size);
  const float scale = 1.f / std::sqrt(float(c.head_dim));
  int max_len = 1, max_keys = 0;
  for (int b = 0; b < batch; ++b) {
    max_len = std::max(max_len, c.lengths[b]);
    for (int h = 0; h < c.hkv; ++h) max_keys = std::max(max_keys, sel.view().count(b * c.hkv + h, c.lengths[b]));
  }
  const std::vector<int32_t> rope_pos = testing::cache_rank_positions(kv);
  const RopeTable host_rope = testing::host_rope(c.head_dim, c.rope == 2, max_len);
  const std::vector<float> table = rope_cos_sin_table(host_rope.inv_freq(), max_len);
  const Reference ref = reference_decode(kv, q, hq, q_pos, sel, c.mask, scale, max_len, c.rope,
                                         rope_pos, &host_rope);
  DeviceBuffer<int32_t> drope_pos(rope_pos);
  DeviceBuffer<float> dtable(table);

  DevicePagedKv<T> dkv(kv);
  DeviceBuffer<float> dq(q), dout(size_t(batch) * hq * c.head_dim), dlse(size_t(batch) * hq);
  DeviceBuffer<int32_t> dqpos(q_pos), dsel_indptr(sel.indptr), dsel_offsets(sel.offsets);
  DeviceBuffer<SlotRange> dsel_ranges(sel.ranges);
  DeviceBuffer<float> dmass(size_t(batch) * c.hkv * max_len);
  dmass.zero();
  dout.zero();
  DecodeParams<T> p;
  p.kv = dkv.view;
  p.q = dq.data();
  p.batch = batch;
  p.num_qo_heads = hq;
  p.q_pos = dqpos.data();
  p.kv_pos = dkv.kv_pos.data();
  if (!sel.all) p.sel = {dsel_indptr.data(), dsel_ranges.data(), dsel_offsets.data()};
  p.mask = c.mask;
  p.scale = scale;
  p.out = dout.data();
  p.lse = dlse.data();
  if (c.key_mass) {
    p.key_mass = dmass.data();
    p.key_mass_stride = max_len;
  }
  if (c.rope != 0) {
    p.key_rope_pos = drope_pos.data();
    p.rope.cos_sin = reinterpret_cast<const float2*>(dtable.data());
    p.rope.n_positions = max_len;
    p.rope.half = c.head_dim / 2;
    p.rope.neox = c.rope == 2;
  }
  DecodePlan plan = plan_decode(batch, c.hkv, max_keys);
  if (c.keys_per_split > 0) {
    plan.keys_per_split = c.keys_per_split;
    plan.num_splits = num_splits_for(max_keys, c.keys_per_split);
  }
  DecodeWorkspace ws;
  decode_attention<T>(p, plan, ws);
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> out = dout.download(), lse = dlse.download(), mass = dmass.download();

  const float tol = 2e-3f;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "element " << i;
    ASSERT_NEAR(out[i], ref.out[i], tol) << "element " << i << " splits " << plan.num_splits;
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_EQ(std::isinf(lse[i]), std::isinf(ref.lse[i])) << "row " << i;
    if (!std::isinf(ref.lse[i])) {
      ASSERT_NEAR(lse[i], ref.lse[i], 1e-3f) << "row " << i;
    }
  }
  if (c.key_mass) {
    for (size_t i = 0; i < mass.size(); ++i) ASSERT_NEAR(mass[i], ref.mass[i], 1e-4f) << "slot " << i;
  }
}

using DecodeAttentionGpu = testing::GpuTest;  // skipped without a CUDA GPU

// The awkward-shape sweep, every storage type.
template <class T>
void sweep(uint32_t seed0) {
  uint32_t seed = seed0;
  const WindowSinkMask causal{}, window{37, 4, false};
  for (int page_size : {1, 7, 16}) {
    for (int head_dim : {64, 128}) {
      for (int group : {1, 4, 8}) {
        for (SelKind sel : {SelKind::kAll, SelKind::kEmpty, SelKind::kFullExplicit,
                            SelKind::kRandomPages, SelKind::kRandomRanges}) {
          const int hkv = group == 8 ? 1 : 2;
          Case c{page_size, head_dim, hkv, group, {1, 45, 300, 0, 129}, sel,
                 (seed % 3 == 0) ? window : causal, (seed % 2 == 0) ? 0.1f : 0.f,
                 seed % 2 == 1, (seed % 4 == 0) ? 32 : 0, static_cast<int>(seed % 5 % 3)};
          SCOPED_TRACE(::testing::Message() << testing::type_name<T>() << " page " << page_size
                                            << " d " << head_dim << " G " << group << " sel "
                                            << int(sel) << " seed " << seed);
          run_case<T>(c, seed++);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(DecodeAttentionGpu, SweepBf16) { sweep<__nv_bfloat16>(100); }
TEST_F(DecodeAttentionGpu, SweepF16) { sweep<__half>(200); }
TEST_F(DecodeAttentionGpu, SweepF32) { sweep<float>(300); }

// A long context cut into many splits equals one split (merge by LSE is exact).
TEST_F(DecodeAttentionGpu, ManySplitsLongContext) {
  for (int kps : {32, 256, 0}) {
    Case c{16, 128, 8, 4, {5000, 3333}, SelKind::kAll, WindowSinkMask{}, 0.f, true, kps};
    run_case<__nv_bfloat16>(c, 7 + kps);
    if (HasFatalFailure()) return;
  }
  Case c{16, 128, 8, 4, {4100}, SelKind::kRandomPages, WindowSinkMask{1000, 4, true}, 0.05f, true, 64};
  run_case<__nv_bfloat16>(c, 11);
}

TEST(DecodeAttention, RejectsUnsupportedShapes) {
  if (!no_device_reason().empty()) GTEST_SKIP() << "needs a CUDA GPU: " << no_device_reason();
  DecodeParams<float> p;
  p.kv.num_kv_heads = 2;
  p.kv.head_dim = 96;
  p.kv.page_size = 16;
  p.num_qo_heads = 4;
  p.batch = 1;
  DecodeWorkspace ws;
  EXPECT_THROW(decode_attention<float>(p, DecodePlan{}, ws), Error);
  p.kv.head_dim = 64;
  p.num_qo_heads = 3;
  EXPECT_THROW(decode_attention<float>(p, DecodePlan{}, ws), Error);
}

}  // namespace
}  // namespace kvlab::cuda
