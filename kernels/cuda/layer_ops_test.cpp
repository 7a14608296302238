// Layer kernels, GEMM and the device KV store against plain loops on the CPU. Skips without a GPU.
#include "kernels/cuda/layer_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_kv_store.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rope_table.h"
#include "kernels/cuda/test_util.h"

namespace kvlab::cuda {
namespace {

using testing::random_normal;

class LayerOpsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = no_device_reason();
    if (!why.empty()) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  }
};

TEST_F(LayerOpsGpu, RmsNorm) {
  std::mt19937 rng(1);
  for (int dim : {1, 7, 64, 4096, 5000}) {
    const int n = 3;
    const auto x = random_normal(rng, size_t(n) * dim, 2.f), w = random_normal(rng, dim);
    DeviceBuffer<float> dx(x), dw(w), dy(x.size());
    DeviceBuffer<__nv_bfloat16> dyb(x.size());
    rms_norm<float>(dx.data(), dw.data(), 1e-5f, n, dim, dy.data());
    rms_norm<__nv_bfloat16>(dx.data(), dw.data(), 1e-5f, n, dim, dyb.data());
    const auto y = dy.download();
    const auto yb = dyb.download();
    for (int t = 0; t < n; ++t) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(x[t * dim + i]) * x[t * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) {
        const double want = x[t * dim + i] * inv * w[i];
        ASSERT_NEAR(y[t * dim + i], want, 1e-4 * (1 + std::abs(want))) << dim << " " << i;
        ASSERT_NEAR(testing::to_host_float(yb[t * dim + i]), want, 1e-2 * (1 + std::abs(want)));
      }
    }
  }
}

TEST_F(LayerOpsGpu, RopeBothPairings) {
  std::mt19937 rng(2);
  const int n = 5, heads = 3, d = 64;
  const std::vector<int32_t> pos{0, 1, 17, 1000, 40000};
  const std::vector<double> inv = rope_inv_freq(500000.0, d);
  for (RopePairs pairs : {RopePairs::kInterleaved, RopePairs::kNeox}) {
    const auto x = random_normal(rng, size_t(n) * heads * d);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<double> dinv(inv);
    DeviceBuffer<int32_t> dpos(pos);
    rope(dx.data(), dpos.data(), dinv.data(), n, heads, d, pairs);
    const auto y = dx.download();
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < d / 2; ++i) {
          const int ia = pairs == RopePairs::kInterleaved ? 2 * i : i;
          const int ib = pairs == RopePairs::kInterleaved ? 2 * i + 1 : i + d / 2;
          // The CPU's recipe: angle in double, cos/sin rounded to float, rotation in float.
          const double ang = double(pos[t]) * inv[i];
          const float c = float(std::cos(ang)), s = float(std::sin(ang));
          const size_t base = (size_t(t) * heads + h) * d;
          const float a = x[base + ia], b = x[base + ib];
          ASSERT_NEAR(y[base + ia], a * c - b * s, 1e-6f * (1 + std::abs(a) + std::abs(b)));
          ASSERT_NEAR(y[base + ib], a * s + b * c, 1e-6f * (1 + std::abs(a) + std::abs(b)));
        }
      }
    }
  }
}

TEST_F(LayerOpsGpu, SwigluEmbeddingAdd) {
  std::mt19937 rng(3);
  const int64_t n = 10007;
  const auto g = random_normal(rng, n, 3.f), u = random_normal(rng, n);
  DeviceBuffer<float> dg(g), du(u), dout(n);
  swiglu<float>(dg.data(), du.data(), n, dout.data());
  const auto out = dout.download();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5 * (1 + std::abs(g[i] * u[i])));
  add_inplace(dout.data(), du.data(), n);
  const auto sum = dout.download();
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(sum[i], out[i] + u[i]);

  const int vocab = 11, dim = 300;
  const auto table = random_normal(rng, size_t(vocab) * dim);
  DeviceBuffer<__nv_bfloat16> dtable(testing::to_storage_vec<__nv_bfloat16>(table));
  const std::vector<int32_t> tokens{3, 0, 10, 3, 42 /* invalid -> zeros */};
  DeviceBuffer<int32_t> dtok(tokens);
  DeviceBuffer<float> demb(tokens.size() * dim);
  embedding_gather<__nv_bfloat16>(dtable.data(), vocab, dim, dtok.data(), 5, demb.data());
  const auto emb = demb.download();
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int i = 0; i < dim; ++i) {
      const float want = tokens[t] < vocab ? testing::round_to<__nv_bfloat16>(table[tokens[t] * dim + i]) : 0.f;
      ASSERT_EQ(emb[t * dim + i], want);
    }
}

TEST_F(LayerOpsGpu, GemmBf16MatchesLoops) {
  std::mt19937 rng(4);
  for (auto [n, in, out] : {std::tuple{1, 64, 96}, {7, 100, 33}, {64, 512, 256}}) {
    auto x = random_normal(rng, size_t(n) * in), w = random_normal(rng, size_t(out) * in);
    for (auto& v : x) v = testing::round_to<__nv_bfloat16>(v);
    for (auto& v : w) v = testing::round_to<__nv_bfloat16>(v);
    DeviceBuffer<__nv_bfloat16> dx(testing::to_storage_vec<__nv_bfloat16>(x)),
        dw(testing::to_storage_vec<__nv_bfloat16>(w));
    DeviceBuffer<float> dy(size_t(n) * out);
    Gemm gemm;
    gemm.linear(dx.data(), dw.data(), dy.data(), n, in, out);
    gemm.linear(dx.data(), dw.data(), dy.data(), n, in, out, nullptr, /*accumulate=*/true);
    const auto y = dy.download();
    for (int t = 0; t < n; ++t)
      for (int o = 0; o < out; ++o) {
        double acc = 0;
        for (int i = 0; i < in; ++i) acc += double(x[t * in + i]) * w[o * in + i];
        ASSERT_NEAR(y[t * out + o], 2 * acc, 1e-3 * (1 + std::abs(acc))) << n << "x" << in << "x" << out;
      }
  }
}

TEST_F(LayerOpsGpu, KvStoreAppendWritesTheHostLayout) {
  std::mt19937 rng(5);
  for (int page_size : {1, 7, 16}) {
    DeviceKvConfig cfg;
    cfg.n_layers = 2;
    cfg.num_kv_heads = 3;
    cfg.head_dim = 64;
    cfg.page_size = page_size;
    cfg.num_pages = 40;
    cfg.dtype = KvDType::kBF16;
    DeviceKvPool pool(cfg);
    // Two requests of 9 and 20 tokens on shuffled pages.
    const std::vector<int32_t> lengths{9, 20};
    const auto host = testing::random_paged_kv<__nv_bfloat16>(rng, lengths, page_size, 3, 64);
    DeviceBlockTable table;
    table.upload(host.indptr, host.indices, host.last_page_len);
    auto view = pool.layer<__nv_bfloat16>(1, table);
    EXPECT_THROW(pool.layer<float>(1, table), Error);
    // Append every token: k/v from the host cache's values, positions 100 + slot.
    std::vector<float> k, v;
    std::vector<int32_t> bidx, sidx, pos;
    const auto hv = host.view();
    for (int b = 0; b < 2; ++b)
      for (int s = 0; s < lengths[b]; ++s) {
        for (int h = 0; h < 3; ++h)
          for (int f = 0; f < 64; ++f) {
            k.push_back(host.k[hv.slot_offset(b, s, h) + f]);
            v.push_back(host.v[hv.slot_offset(b, s, h) + f]);
          }
        bidx.push_back(b);
        sidx.push_back(s);
        pos.push_back(100 + s);
      }
    DeviceBuffer<float> dk(k), dv(v);
    DeviceBuffer<int32_t> db(bidx), ds(sidx), dp(pos);
    append_kv<__nv_bfloat16>(view, pool.positions(1), dk.data(), dv.data(), db.data(), ds.data(),
                             dp.data(), static_cast<int>(bidx.size()));
    KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const size_t layer_elems = size_t(cfg.num_pages) * 3 * page_size * 64;
    std::vector<__nv_bfloat16> kd(layer_elems), vd(layer_elems);
    std::vector<int32_t> pd(size_t(cfg.num_pages) * 3 * page_size);
    KVLAB_CUDA_CHECK(cudaMemcpy(kd.data(), view.k_data, layer_elems * 2, cudaMemcpyDeviceToHost));
    KVLAB_CUDA_CHECK(cudaMemcpy(vd.data(), view.v_data, layer_elems * 2, cudaMemcpyDeviceToHost));
    KVLAB_CUDA_CHECK(cudaMemcpy(pd.data(), pool.positions(1), pd.size() * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < 2; ++b)
      for (int s = 0; s < lengths[b]; ++s)
        for (int h = 0; h < 3; ++h) {
          ASSERT_EQ(pd[hv.slot_meta_offset(b, s, h)], 100 + s);
          for (int f = 0; f < 64; ++f) {
            ASSERT_EQ(testing::to_host_float(kd[hv.slot_offset(b, s, h) + f]), host.k[hv.slot_offset(b, s, h) + f]);
            ASSERT_EQ(testing::to_host_float(vd[hv.slot_offset(b, s, h) + f]), host.v[hv.slot_offset(b, s, h) + f]);
          }
        }
    // Layer 0 untouched: positions stay -1.
    std::vector<int32_t> p0(pd.size());
    KVLAB_CUDA_CHECK(cudaMemcpy(p0.data(), pool.positions(0), p0.size() * 4, cudaMemcpyDeviceToHost));
    for (int32_t x : p0) ASSERT_EQ(x, -1);
  }
}

TEST_F(LayerOpsGpu, DeviceSelectionUploadsRangesAndOffsets) {
  DeviceSelection sel;
  const std::vector<int32_t> indptr{0, 2, 2, 3};
  const std::vector<KeyRange> ranges{{0, 4}, {10, 13}, {5, 6}};
  const KeySelectionView v = sel.upload(indptr, ranges, {20, 5, 6});
  EXPECT_EQ(sel.max_count(), 7);
  std::vector<int32_t> offsets(3);
  KVLAB_CUDA_CHECK(cudaMemcpy(offsets.data(), v.key_offset, 12, cudaMemcpyDeviceToHost));
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 4, 0}));
  EXPECT_THROW(sel.upload({0, 1}, {{3, 9}}, {8}), Error);          // past the list's slots
  EXPECT_THROW(sel.upload({0, 2}, {{3, 5}, {4, 6}}, {8}), Error);  // overlapping
}

TEST(DeviceKvPool, RejectsBadConfigWithoutTouchingTheDevice) {
  DeviceKvConfig cfg;
  cfg.num_pages = 0;
  EXPECT_THROW(DeviceKvPool pool(cfg), Error);
}

}  // namespace
}  // namespace kvlab::cuda
