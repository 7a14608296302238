// Layer kernels, GEMM and the device KV store against plain loops on the CPU. Skips without a GPU.
#include "kernels/cuda/layer_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_test.h"
#include "kernels/cuda/device_kv_store.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rope_table.h"
#include "kernels/cuda/test_util.h"

namespace kvlab::cuda {
namespace {

using testing::random_normal;

using LayerOpsGpu = testing::GpuTest;  // skipped without a CUDA GPU

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

// x [pos.size(), heads, d] rotated by the rope kernel.
std::vector<float> rope_on_device(const std::vector<float>& x, const std::vector<int32_t>& pos,
                                  const std::vector<double>& inv_freq, int heads, int d, RopePairs pairs) {
  DeviceBuffer<float> dx(x);
  DeviceBuffer<double> dinv(inv_freq);
  DeviceBuffer<int32_t> dpos(pos);
  rope(dx.data(), dpos.data(), dinv.data(), static_cast<int>(pos.size()), heads, d, pairs);
  return dx.download();
}

// The device twin against the one host RoPE (kernels/cpu/rope.h), with llama3 scaling and with
// per-pair frequency factors: the device takes the host's inv_freq, computes the angle in double
// and cos/sin rounded to float like the host, so the rotations agree to a float rounding or two
// of |a| + |b| (the device may fuse the multiply-add).
TEST_F(LayerOpsGpu, RopeBothPairingsMatchTheHostRope) {
  std::mt19937 rng(2);
  const int n = 5, heads = 3, d = 64;
  const std::vector<int32_t> pos{0, 1, 17, 1000, 40000};
  for (const bool factors : {false, true}) {
    for (RopePairs pairs : {RopePairs::kInterleaved, RopePairs::kNeox}) {
      RopeConfig rc;
      rc.layout = pairs == RopePairs::kNeox ? RopeLayout::kNeox : RopeLayout::kInterleaved;
      rc.head_dim = d;
      rc.theta = 500000.0;
      if (factors) {
        for (int i = 0; i < d / 2; ++i) rc.freq_factors.push_back(1.0 + 0.25 * i);
      } else {
        rc.scaling = RopeScalingKind::kLlama3;
        rc.factor = 8.0;
        rc.original_max_position = 8192;
      }
      const RopeTable host(rc, 0);  // no table: the formula at every position
      const auto x = random_normal(rng, size_t(n) * heads * d);
      const auto y = rope_on_device(x, pos, host.inv_freq(), heads, d, pairs);
      std::vector<float> want = x;
      for (int t = 0; t < n; ++t) apply_rope(want.data() + size_t(t) * heads * d, heads, d, pos[t], host);
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < heads; ++h) {
          for (int i = 0; i < d / 2; ++i) {
            const int ia = pairs == RopePairs::kInterleaved ? 2 * i : i;
            const int ib = pairs == RopePairs::kInterleaved ? 2 * i + 1 : i + d / 2;
            const size_t base = (size_t(t) * heads + h) * d;
            const float a = x[base + ia], b = x[base + ib];
            ASSERT_NEAR(y[base + ia], want[base + ia], 1e-6f * (1 + std::abs(a) + std::abs(b)));
            ASSERT_NEAR(y[base + ib], want[base + ib], 1e-6f * (1 + std::abs(a) + std::abs(b)));
          }
        }
      }
    }
  }
}

TEST_F(LayerOpsGpu, RopeNegativePositionLeavesTheRowUnchanged) {
  std::mt19937 rng(12);
  const int heads = 3, d = 80;
  const std::vector<int32_t> pos{-1, 5, -7, 0, std::numeric_limits<int32_t>::min(), 123};
  const int n = static_cast<int>(pos.size());
  const std::vector<double> inv = testing::host_rope(d, false, 0).inv_freq();
  for (RopePairs pairs : {RopePairs::kInterleaved, RopePairs::kNeox}) {
    const auto x = random_normal(rng, size_t(n) * heads * d);
    const auto y = rope_on_device(x, pos, inv, heads, d, pairs);
    for (int t = 0; t < n; ++t) {
      const size_t row = size_t(t) * heads * d;
      bool changed = false;
      for (size_t e = row; e < row + size_t(heads) * d; ++e) {
        if (pos[t] < 0) {
          ASSERT_EQ(y[e], x[e]) << "token " << t << " at position " << pos[t];
        }
        changed = changed || y[e] != x[e];
      }
      // Rows at positions > 0 really rotate (position 0 is the identity rotation).
      if (pos[t] > 0) {
        EXPECT_TRUE(changed) << "token " << t;
      }
    }
  }
}

TEST_F(LayerOpsGpu, AddBiasAddsPerColumn) {
  std::mt19937 rng(13);
  for (auto [rows, cols] : {std::tuple{0, 5}, {1, 1}, {5, 7}, {3, 300}, {129, 1001}}) {
    const auto y = random_normal(rng, size_t(rows) * cols), bias = random_normal(rng, cols);
    DeviceBuffer<float> dy(y), dbias(bias);
    add_bias(dy.data(), dbias.data(), rows, cols);
    const auto got = dy.download();
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(got[size_t(r) * cols + c], y[size_t(r) * cols + c] + bias[c])
            << rows << "x" << cols << " at " << r << "," << c;
  }
  EXPECT_THROW(add_bias(nullptr, nullptr, -1, 4), Error);
}

template <class T>
uint16_t bits16(T x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return b;
}

// convert<OutT> against the host's round-to-nearest-even conversion (bit for bit), plus ties
// and specials that pin the rounding mode independently of the host library.
template <class OutT>
void check_convert(std::mt19937& rng) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{10007}}) {
    auto x = random_normal(rng, size_t(n), 100.f);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<OutT> dout(static_cast<size_t>(n));
    convert<OutT>(dx.data(), n, dout.data());
    const auto out = dout.download();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<OutT, float>) {
        ASSERT_EQ(out[i], x[i]);
      } else {
        ASSERT_EQ(bits16(out[i]), bits16(testing::to_storage<OutT>(x[i])))
            << testing::type_name<OutT>() << " " << x[i];
      }
    }
  }
  if constexpr (!std::is_same_v<OutT, float>) {
    // Mantissa bits kept: 10 (fp16), 7 (bf16). 1 + ulp/2 ties down to 1 (even); 1 + 3 ulp/2
    // ties up to 1 + 2 ulp (even); just above the tie rounds up.
    const int mant = std::is_same_v<OutT, __half> ? 10 : 7;
    const float ulp = std::ldexp(1.f, -mant);
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x{1.f + ulp / 2, 1.f + 3 * ulp / 2, 1.f + ulp / 2 + ulp / 64, -(1.f + ulp / 2),
                               inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.f, -0.f};
    const std::vector<float> want{1.f, 1.f + 2 * ulp, 1.f + ulp, -1.f, inf, -inf, 0.f /* NaN */, 0.f, -0.f};
    DeviceBuffer<float> dx(x);
    DeviceBuffer<OutT> dout(x.size());
    convert<OutT>(dx.data(), int64_t(x.size()), dout.data());
    const auto out = dout.download();
    for (size_t i = 0; i < x.size(); ++i) {
      const float got = testing::to_host_float(out[i]);
      if (std::isnan(x[i])) {
        ASSERT_TRUE(std::isnan(got));
      } else {
        ASSERT_EQ(got, want[i]) << testing::type_name<OutT>() << " case " << i;
        ASSERT_EQ(std::signbit(got), std::signbit(want[i])) << testing::type_name<OutT>() << " case " << i;
      }
    }
  }
}

TEST_F(LayerOpsGpu, ConvertRoundsToNearestEven) {
  std::mt19937 rng(14);
  check_convert<float>(rng);
  check_convert<__half>(rng);
  check_convert<__nv_bfloat16>(rng);
  // fp16 overflows to infinity; to_bf16 is convert<__nv_bfloat16>.
  const std::vector<float> big{70000.f, -1e9f};
  DeviceBuffer<float> dbig(big);
  DeviceBuffer<__half> dh(2);
  convert<__half>(dbig.data(), 2, dh.data());
  const auto h = dh.download();
  EXPECT_EQ(testing::to_host_float(h[0]), std::numeric_limits<float>::infinity());
  EXPECT_EQ(testing::to_host_float(h[1]), -std::numeric_limits<float>::infinity());
  const auto x = random_normal(rng, 333);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<__nv_bfloat16> a(x.size()), b(x.size());
  to_bf16(dx.data(), int64_t(x.size()), a.data());
  convert<__nv_bfloat16>(dx.data(), int64_t(x.size()), b.data());
  const auto av = a.download(), bv = b.download();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits16(av[i]), bits16(bv[i]));
}

TEST_F(LayerOpsGpu, SumRowsAddsRowsInOrder) {
  std::mt19937 rng(15);
  for (auto [rows, elems] : {std::tuple{1, int64_t{1}}, {3, int64_t{1000}}, {17, int64_t{4099}},
                             {64, int64_t{33}}}) {
    // Wide dynamic range so that a different summation order would change the fp32 result.
    auto x = random_normal(rng, size_t(rows) * elems);
    for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e6f;
    DeviceBuffer<float> dx(x), dout(static_cast<size_t>(elems));
    sum_rows(dx.data(), rows, elems, dout.data());
    const auto out = dout.download();
    for (int64_t j = 0; j < elems; ++j) {
      float acc = 0.f;
      for (int r = 0; r < rows; ++r) acc += x[size_t(r) * elems + j];
      ASSERT_EQ(out[j], acc) << rows << "x" << elems << " column " << j;
    }
  }
  // No rows: zeros.
  DeviceBuffer<float> dout(std::vector<float>(5, 7.f));
  sum_rows(nullptr, 0, 5, dout.data());
  for (float v : dout.download()) ASSERT_EQ(v, 0.f);
  EXPECT_THROW(sum_rows(nullptr, -2, 5, dout.data()), Error);
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

TEST_F(LayerOpsGpu, GemmF32ExactToFp32) {
  std::mt19937 rng(16);
  Gemm gemm;
  for (auto [n, in, out] : {std::tuple{1, 1, 1}, {3, 7, 5}, {17, 333, 129}, {64, 1024, 96}}) {
    const auto x = random_normal(rng, size_t(n) * in), w = random_normal(rng, size_t(out) * in);
    const auto y0 = random_normal(rng, size_t(n) * out);
    DeviceBuffer<float> dx(x), dw(w), dy(size_t(n) * out), dacc(y0);
    gemm.linear(dx.data(), dw.data(), dy.data(), n, in, out);
    gemm.linear(dx.data(), dw.data(), dacc.data(), n, in, out, nullptr, /*accumulate=*/true);
    const auto y = dy.download(), acc_y = dacc.download();
    for (int t = 0; t < n; ++t)
      for (int o = 0; o < out; ++o) {
        // rtol 1e-5 of sum_i |x_i w_i| (the scale of fp32 rounding error in a dot product).
        // TF32 (inputs cut to 10 mantissa bits, ~5e-4 relative) misses it on the larger shapes.
        double acc = 0, mag = 0;
        for (int i = 0; i < in; ++i) {
          acc += double(x[t * in + i]) * w[o * in + i];
          mag += std::abs(double(x[t * in + i]) * w[o * in + i]);
        }
        const size_t k = size_t(t) * out + o;
        ASSERT_NEAR(y[k], acc, 1e-5 * mag) << n << "x" << in << "x" << out << " at " << t << "," << o;
        ASSERT_NEAR(acc_y[k], y0[k] + acc, 1e-5 * (mag + std::abs(y0[k])))
            << n << "x" << in << "x" << out << " at " << t << "," << o;
      }
  }
}

template <class Dst>
void check_scatter_pages(std::mt19937& rng, KvDType dtype) {
  const DeviceKvConfig cfg{2, 3, 80, 7, 10, dtype};  // layers, KV heads, head_dim, page, pages
  DeviceKvPool pool(cfg);
  const size_t page_elems = size_t(cfg.num_kv_heads) * cfg.page_size * cfg.head_dim;
  const size_t meta_elems = size_t(cfg.num_kv_heads) * cfg.page_size;
  const size_t layer_elems = page_elems * cfg.num_pages;
  // Pages out of order, one negative id (skipped).
  const std::vector<int32_t> ids{7, 2, -1, 9, 0};
  const int n_pages = static_cast<int>(ids.size());
  const auto k = random_normal(rng, n_pages * page_elems), v = random_normal(rng, n_pages * page_elems);
  std::vector<int32_t> pos(n_pages * meta_elems);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = (i % 5 == 0) ? -1 : int32_t(i);
  DeviceBuffer<float> dk(k), dv(v);
  DeviceBuffer<int32_t> dids(ids), dpos(pos);
  const int layer = 1;
  scatter_pages<float, Dst>(dk.data(), dids.data(), n_pages, page_elems, pool.k_data<Dst>(layer));
  scatter_pages<float, Dst>(dv.data(), dids.data(), n_pages, page_elems, pool.v_data<Dst>(layer));
  scatter_pages<int32_t, int32_t>(dpos.data(), dids.data(), n_pages, meta_elems, pool.positions(layer));
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());

  // The arenas are the ones the attention kernels read.
  DeviceBlockTable table;
  table.upload({0, 1}, {7}, {cfg.page_size});
  const auto view = pool.layer<Dst>(layer, table);
  EXPECT_EQ(view.k_data, pool.k_data<Dst>(layer));
  EXPECT_EQ(view.v_data, pool.v_data<Dst>(layer));

  std::vector<Dst> kd(layer_elems), vd(layer_elems);
  std::vector<int32_t> pd(meta_elems * cfg.num_pages), p0(pd.size());
  KVLAB_CUDA_CHECK(cudaMemcpy(kd.data(), pool.k_data<Dst>(layer), layer_elems * sizeof(Dst), cudaMemcpyDeviceToHost));
  KVLAB_CUDA_CHECK(cudaMemcpy(vd.data(), pool.v_data<Dst>(layer), layer_elems * sizeof(Dst), cudaMemcpyDeviceToHost));
  KVLAB_CUDA_CHECK(cudaMemcpy(pd.data(), pool.positions(layer), pd.size() * 4, cudaMemcpyDeviceToHost));
  KVLAB_CUDA_CHECK(cudaMemcpy(p0.data(), pool.positions(0), p0.size() * 4, cudaMemcpyDeviceToHost));
  for (int page = 0; page < cfg.num_pages; ++page) {
    int src = -1;  // which staged page landed here, if any
    for (int i = 0; i < n_pages; ++i)
      if (ids[i] == page) src = i;
    for (size_t e = 0; e < page_elems; ++e) {
      const float want_k = src < 0 ? 0.f : testing::round_to<Dst>(k[src * page_elems + e]);
      const float want_v = src < 0 ? 0.f : testing::round_to<Dst>(v[src * page_elems + e]);
      ASSERT_EQ(testing::to_host_float(kd[page * page_elems + e]), want_k)
          << testing::type_name<Dst>() << " page " << page << " elem " << e;
      ASSERT_EQ(testing::to_host_float(vd[page * page_elems + e]), want_v)
          << testing::type_name<Dst>() << " page " << page << " elem " << e;
    }
    for (size_t e = 0; e < meta_elems; ++e) {
      ASSERT_EQ(pd[page * meta_elems + e], src < 0 ? -1 : pos[src * meta_elems + e]) << "page " << page;
      ASSERT_EQ(p0[page * meta_elems + e], -1);  // layer 0 untouched
    }
  }
  // Layer 0's K arena untouched (zeros).
  std::vector<Dst> k0(layer_elems);
  KVLAB_CUDA_CHECK(cudaMemcpy(k0.data(), pool.k_data<Dst>(0), layer_elems * sizeof(Dst), cudaMemcpyDeviceToHost));
  for (const Dst& x : k0) ASSERT_EQ(testing::to_host_float(x), 0.f);
}

TEST_F(LayerOpsGpu, ScatterPagesUploadsStagedPages) {
  std::mt19937 rng(17);
  check_scatter_pages<float>(rng, KvDType::kF32);
  check_scatter_pages<__half>(rng, KvDType::kF16);
  check_scatter_pages<__nv_bfloat16>(rng, KvDType::kBF16);
}

TEST_F(LayerOpsGpu, PoolArenaAccessorsCheckDtypeAndLayer) {
  DeviceKvConfig cfg;
  cfg.n_layers = 2;
  cfg.num_pages = 4;
  cfg.dtype = KvDType::kF16;
  DeviceKvPool pool(cfg);
  const size_t layer_elems = size_t(cfg.num_pages) * cfg.num_kv_heads * cfg.page_size * cfg.head_dim;
  EXPECT_EQ(pool.v_data<__half>(0), pool.k_data<__half>(0) + layer_elems);
  EXPECT_EQ(pool.k_data<__half>(1), pool.v_data<__half>(0) + layer_elems);
  EXPECT_THROW(pool.k_data<float>(0), Error);
  EXPECT_THROW(pool.v_data<__nv_bfloat16>(0), Error);
  EXPECT_THROW(pool.k_data<__half>(2), Error);
  EXPECT_THROW(pool.v_data<__half>(-1), Error);
}

TEST_F(LayerOpsGpu, KvStoreAppendWritesTheHostLayout) {
  std::mt19937 rng(5);
  for (int page_size : {1, 7, 16}) {
    const DeviceKvConfig cfg{2, 3, 64, page_size, 40, KvDType::kBF16};  // layers, KV heads, d, page, pages
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
  const std::vector<SlotRange> ranges{{0, 4}, {10, 13}, {5, 6}};
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
