// Prefill attention (tensor cores) against plain loops over the same paged cache: page sizes
// 1/7/16, head dims 64/128, GQA 1/4/8, chunks of 1..130 rows after a cached prefix not a
// multiple of the page, holes, window + sinks, empty / full / random block-sparse selections,
// bf16 and fp16. Skips without a GPU.
#include "kernels/cuda/prefill_attention.h"

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

using testing::HostPagedKv;

using HostSel = testing::HostSelection;

// 0 all, 1 empty, 2 random whole pages (block-sparse), 3 sinks + recent range.
HostSel make_sel(std::mt19937& rng, int kind, const std::vector<int32_t>& lengths, int hkv, int page) {
  HostSel sel;
  if (kind == 0) return sel;
  sel.all = false;
  sel.indptr.push_back(0);
  for (int32_t len : lengths) {
    for (int h = 0; h < hkv; ++h) {
      if (kind == 2) {
        for (int p0 = 0; p0 < len; p0 += page)
          if (rng() % 3 == 0) sel.ranges.push_back({p0, std::min(len, p0 + page)});
      } else if (kind == 3 && len > 0) {
        const int sinks = std::min(len, 3), recent = std::max(sinks, len - 40 - int(rng() % 20));
        sel.ranges.push_back({0, sinks});
        if (recent < len) sel.ranges.push_back({recent == sinks ? sinks : recent, len});
      }
      sel.indptr.push_back(static_cast<int32_t>(sel.ranges.size()));
    }
  }
  // Merge the two ranges of kind 3 when adjacent (ranges must be disjoint; adjacency is allowed).
  sel.offsets = build_key_offsets(sel.indptr, sel.ranges);
  return sel;
}

template <class T>
void run_case(int page_size, int head_dim, int hkv, int group, const std::vector<int>& rows,
              int sel_kind, WindowSinkMask mask, bool holes, bool explicit_q_pos, uint32_t seed,
              int rope = 0 /* rope at read: 0 off, 1 interleaved, 2 neox */) {
  std::mt19937 rng(seed);
  const int batch = static_cast<int>(rows.size()), hq = hkv * group;
  std::vector<int32_t> lengths(batch), qo_indptr{0};
  int max_rows = 0;
  for (int b = 0; b < batch; ++b) {
    lengths[b] = rows[b] + static_cast<int>(rng() % 50);  // cached prefix + the chunk
    qo_indptr.push_back(qo_indptr.back() + rows[b]);
    max_rows = std::max(max_rows, rows[b]);
  }
  const HostPagedKv kv =
      testing::random_paged_kv<T>(rng, lengths, page_size, hkv, head_dim, holes ? 0.1f : 0.f);
  const int total_rows = qo_indptr.back();
  std::vector<float> q = testing::random_normal(rng, size_t(total_rows) * hq * head_dim, 1.5f);
  for (auto& x : q) x = testing::round_to<T>(x);
  std::vector<int32_t> q_pos(total_rows);
  for (int b = 0; b < batch; ++b)
    for (int r = 0; r < rows[b]; ++r) q_pos[qo_indptr[b] + r] = lengths[b] - rows[b] + r;
  const HostSel sel = make_sel(rng, sel_kind, lengths, hkv, page_size);
  const float scale = 1.f / std::sqrt(float(head_dim));
  int max_len = 1;
  for (int32_t len : lengths) max_len = std::max(max_len, len);
  const std::vector<int32_t> rope_pos = testing::cache_rank_positions(kv);
  const RopeTable host_rope = testing::host_rope(head_dim, rope == 2, max_len);
  const std::vector<float> table = rope_cos_sin_table(host_rope.inv_freq(), max_len);

  // Reference: the fp64 dense one (kernels/testing) over each list's selected keys.
  const auto view = kv.view();
  const KeySelectionView sv = sel.view();
  std::vector<float> ref(size_t(total_rows) * hq * head_dim, 0.f), ref_lse(size_t(total_rows) * hq, kNegInf);
  for (int b = 0; b < batch; ++b)
    for (int r = 0; r < rows[b]; ++r)
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / group, row = qo_indptr[b] + r;
        std::vector<float> rotated;  // the key being read, rotated (used before the next key_of)
        const ::kvlab::testing::ReferenceRow ref_row = testing::reference_list_row(
            kv, sv, b, kvh, q.data() + (size_t(row) * hq + h) * head_dim, scale,
            [&](int slot) {
              const float* k = kv.k.data() + view.slot_offset(b, slot, kvh);
              if (rope == 0) return k;
              // rotated in fp32, then rounded to T for the tensor cores
              rotated = testing::rotate_key(k, head_dim, rope_pos[view.slot_meta_offset(b, slot, kvh)], host_rope);
              for (auto& x : rotated) x = testing::round_to<T>(x);
              return static_cast<const float*>(rotated.data());
            },
            [&](int slot) {
              const int pos = holes ? kv.kv_pos[view.slot_meta_offset(b, slot, kvh)] : slot;
              return pos >= 0 && mask(q_pos[row], pos);
            });
        if (std::isinf(ref_row.lse)) continue;
        for (int f = 0; f < head_dim; ++f) ref[(size_t(row) * hq + h) * head_dim + f] = float(ref_row.out[f]);
        ref_lse[size_t(row) * hq + h] = float(ref_row.lse);
      }

  testing::DevicePagedKv<T> dkv(kv);
  DeviceBuffer<T> dq(testing::to_storage_vec<T>(q));
  DeviceBuffer<int32_t> dindptr(qo_indptr), dqpos(q_pos), dsel_indptr(sel.indptr), dsel_off(sel.offsets);
  DeviceBuffer<SlotRange> dsel_ranges(sel.ranges);
  DeviceBuffer<float> dout(ref.size()), dlse(ref_lse.size());
  dout.zero();
  PrefillParams<T> p;
  p.kv = dkv.view;
  p.q = dq.data();
  p.qo_indptr = dindptr.data();
  p.batch = batch;
  p.num_qo_heads = hq;
  p.max_rows = max_rows;
  p.q_pos = explicit_q_pos ? dqpos.data() : nullptr;
  p.kv_pos = holes ? dkv.kv_pos.data() : nullptr;
  if (!sel.all) p.sel = {dsel_indptr.data(), dsel_ranges.data(), dsel_off.data()};
  p.mask = mask;
  p.scale = scale;
  p.out = dout.data();
  p.lse = dlse.data();
  DeviceBuffer<int32_t> drope_pos(rope_pos);
  DeviceBuffer<float> dtable(table);
  if (rope != 0) {
    p.key_rope_pos = drope_pos.data();
    p.rope.cos_sin = reinterpret_cast<const float2*>(dtable.data());
    p.rope.n_positions = max_len;
    p.rope.half = head_dim / 2;
    p.rope.neox = rope == 2;
  }
  prefill_attention<T>(p);
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = dout.download(), lse = dlse.download();
  // P is rounded to 16 bits before the P V product (as in FlashAttention): bf16 keeps 8 bits.
  const float tol = std::is_same_v<T, __nv_bfloat16> ? 1.5e-2f : 4e-3f;
  double err_sum = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "element " << i;
    ASSERT_NEAR(out[i], ref[i], tol) << "element " << i;
    err_sum += std::abs(out[i] - ref[i]);
  }
  if (!out.empty()) {
    EXPECT_LT(err_sum / out.size(), tol / 5) << "mean error";
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_EQ(std::isinf(lse[i]), std::isinf(ref_lse[i])) << "row " << i;
    if (!std::isinf(ref_lse[i])) {
      ASSERT_NEAR(lse[i], ref_lse[i], 2e-3f) << "row " << i;
    }
  }
}

using PrefillAttentionGpu = testing::GpuTest;  // skipped without a CUDA GPU

template <class T>
void sweep(uint32_t seed) {
  const WindowSinkMask causal{}, window{45, 4, false};
  for (int page_size : {1, 7, 16}) {
    for (int head_dim : {64, 128}) {
      for (int group : {1, 4, 8}) {
        for (int sel_kind = 0; sel_kind < 4; ++sel_kind) {
          const int hkv = group == 8 ? 1 : 2;
          const bool holes = seed % 2 == 0, explicit_pos = seed % 3 != 0;
          const WindowSinkMask mask = seed % 4 == 1 ? window : causal;
          SCOPED_TRACE(::testing::Message() << testing::type_name<T>() << " page " << page_size
                                            << " d " << head_dim << " G " << group << " sel "
                                            << sel_kind << " seed " << seed);
          const int rope = static_cast<int>(seed % 5 % 3);
          run_case<T>(page_size, head_dim, hkv, group, {1, 130, 0, 65, 64}, sel_kind, mask,
                      holes, explicit_pos, seed, rope);
          ++seed;
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(PrefillAttentionGpu, SweepBf16) { sweep<__nv_bfloat16>(1000); }
TEST_F(PrefillAttentionGpu, SweepF16) { sweep<__half>(2000); }

// A long causal chunk, no cached prefix beyond the chunk: the dense fast path (no per-element
// mask below the diagonal) against the reference.
TEST_F(PrefillAttentionGpu, LongCausalDense) {
  run_case<__nv_bfloat16>(16, 128, 2, 4, {700}, 0, WindowSinkMask{}, false, false, 5);
}

}  // namespace
}  // namespace kvlab::cuda
