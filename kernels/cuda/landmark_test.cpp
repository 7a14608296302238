// Landmark scoring + top-k and mean landmarks on the GPU against plain loops. Skips without a GPU.
#include "kernels/cuda/landmark.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_test.h"
#include "kernels/cuda/test_util.h"

namespace kvlab::cuda {
namespace {

using LandmarkGpu = testing::GpuTest;  // skipped without a CUDA GPU

// Reference scores per chunk for one (request, KV head), in double. Not the shared dense
// reference (kernels/testing/reference_attention.h): a chunk's score is a bound over its
// landmark box, max(q.lmax, q.lmin) per feature, plus a bias, aggregated over the query group
// (sum, max, or the largest log-softmax over the chunks merged with the local window's lse) --
// not a softmax over key dot products weighting values, which is what that reference computes.
std::vector<double> reference_scores(const LandmarkSelectParams& p, const std::vector<float>& q,
                                     const std::vector<float>& lmax, const std::vector<float>& lmin,
                                     const std::vector<float>& bias, const std::vector<float>& local_lse,
                                     int b, int kv, int n) {
  const int group = p.num_qo_heads / p.num_kv_heads, d = p.head_dim;
  std::vector<std::vector<double>> z(group, std::vector<double>(n));
  for (int g = 0; g < group; ++g)
    for (int c = 0; c < n; ++c) {
      const size_t row = ((size_t(b) * p.num_kv_heads + kv) * p.max_chunks + c) * d;
      double acc = 0;
      for (int f = 0; f < d; ++f) {
        const double qd = double(q[(size_t(b) * p.num_qo_heads + kv * group + g) * d + f]) * p.scale;
        acc += lmin.empty() ? qd * lmax[row + f] : std::max(qd * lmax[row + f], qd * lmin[row + f]);
      }
      if (lmin.empty() && !bias.empty()) acc += bias[(size_t(b) * p.num_kv_heads + kv) * p.max_chunks + c];
      z[g][c] = acc;
    }
  std::vector<double> score(n);
  for (int c = 0; c < n; ++c) {
    double s = p.aggregation == LandmarkAggregation::kSum ? 0 : -INFINITY;
    for (int g = 0; g < group; ++g) {
      if (p.aggregation == LandmarkAggregation::kSum) {
        s += z[g][c];
      } else if (p.aggregation == LandmarkAggregation::kMax) {
        s = std::max(s, z[g][c]);
      } else {
        double m = local_lse.empty() ? -INFINITY : local_lse[size_t(b) * p.num_qo_heads + kv * group + g];
        for (double x : z[g]) m = std::max(m, x);
        double sum = local_lse.empty() ? 0 : std::exp(local_lse[size_t(b) * p.num_qo_heads + kv * group + g] - m);
        for (double x : z[g]) sum += std::exp(x - m);
        s = std::max(s, z[g][c] - (m + std::log(sum)));
      }
    }
    score[c] = s;
  }
  return score;
}

TEST_F(LandmarkGpu, TopKMatchesReference) {
  std::mt19937 rng(9);
  int trial = 0;
  for (int d : {64, 128}) {
    for (int group : {1, 4, 8}) {
      for (auto agg : {LandmarkAggregation::kSoftmaxMax, LandmarkAggregation::kMax, LandmarkAggregation::kSum}) {
        for (int bounds = 0; bounds < 2; ++bounds) {
          ++trial;
          LandmarkSelectParams p;
          p.batch = 3;
          p.num_kv_heads = 2;
          p.num_qo_heads = 2 * group;
          p.head_dim = d;
          p.max_chunks = 300;
          p.scale = 1.f / std::sqrt(float(d));
          p.top_k = trial % 3 == 0 ? 400 : 1 + trial % 40;  // sometimes more than the chunks
          p.aggregation = agg;
          const std::vector<int32_t> n_eligible{0, 7, 300};
          auto q = testing::random_normal(rng, size_t(p.batch) * p.num_qo_heads * d);
          auto lmax = testing::random_normal(rng, size_t(p.batch) * p.num_kv_heads * p.max_chunks * d);
          std::vector<float> lmin, bias, local_lse;
          if (bounds) {
            lmin = lmax;
            for (auto& x : lmin) x -= std::abs(testing::random_normal(rng, 1)[0]);
          } else {
            bias = testing::random_normal(rng, size_t(p.batch) * p.num_kv_heads * p.max_chunks);
          }
          if (trial % 2 == 0) local_lse = testing::random_normal(rng, size_t(p.batch) * p.num_qo_heads, 2.f);
          // A duplicated chunk: equal scores must go to the lower index.
          std::copy_n(lmax.begin() + size_t(2 * p.num_kv_heads * p.max_chunks + 5) * d, d,
                      lmax.begin() + size_t(2 * p.num_kv_heads * p.max_chunks + 9) * d);
          if (!bias.empty()) bias[2 * p.num_kv_heads * p.max_chunks + 9] = bias[2 * p.num_kv_heads * p.max_chunks + 5];
          if (!lmin.empty())
            std::copy_n(lmin.begin() + size_t(2 * p.num_kv_heads * p.max_chunks + 5) * d, d,
                        lmin.begin() + size_t(2 * p.num_kv_heads * p.max_chunks + 9) * d);

          DeviceBuffer<float> dq(q), dlmax(lmax), dlmin(lmin), dbias(bias), dlse(local_lse);
          DeviceBuffer<int32_t> dn(n_eligible), dsel(size_t(p.batch) * p.num_kv_heads * p.top_k),
              dnsel(size_t(p.batch) * p.num_kv_heads);
          p.q = dq.data();
          p.landmarks = dlmax.data();
          p.landmarks_min = bounds ? dlmin.data() : nullptr;
          p.bias = bias.empty() ? nullptr : dbias.data();
          p.local_lse = local_lse.empty() ? nullptr : dlse.data();
          p.n_eligible = dn.data();
          p.selected = dsel.data();
          p.n_selected = dnsel.data();
          landmark_select(p);
          KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
          const auto sel = dsel.download();
          const auto nsel = dnsel.download();
          for (int b = 0; b < p.batch; ++b)
            for (int kv = 0; kv < p.num_kv_heads; ++kv) {
              const int n = n_eligible[b];
              const auto score = reference_scores(p, q, lmax, lmin, bias, local_lse, b, kv, n);
              std::vector<int> order(n);
              std::iota(order.begin(), order.end(), 0);
              std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return score[a] > score[c]; });
              const int k = std::min(p.top_k, n);
              const size_t list = size_t(b) * p.num_kv_heads + kv;
              ASSERT_EQ(nsel[list], k) << "trial " << trial;
              std::vector<int> got(sel.begin() + list * p.top_k, sel.begin() + list * p.top_k + k);
              ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
              for (int i = k; i < p.top_k; ++i) ASSERT_EQ(sel[list * p.top_k + i], -1);
              // Same set as the reference, up to float rounding at the k-th place: every chosen
              // chunk scores at least the reference k-th score minus a small tolerance.
              if (b == 2 && std::count(got.begin(), got.end(), 9) == 1) {
                ASSERT_EQ(std::count(got.begin(), got.end(), 5), 1) << "tie must go to the lower chunk";
              }
              if (k > 0 && k < n) {
                const double kth = score[order[k - 1]];
                for (int c : got) ASSERT_GE(score[c], kth - 1e-4) << "trial " << trial << " chunk " << c;
              }
            }
        }
      }
    }
  }
}

TEST_F(LandmarkGpu, MeanLandmarkSkipsHoles) {
  std::mt19937 rng(10);
  for (int page : {1, 7, 16}) {
    const std::vector<int32_t> lengths{130, 64};
    const auto kv = testing::random_paged_kv<__nv_bfloat16>(rng, lengths, page, 2, 64, 0.2f);
    testing::DevicePagedKv<__nv_bfloat16> dkv(kv);
    const int chunk_size = 64;
    const std::vector<int32_t> req{0, 0, 0, 1}, chunk{0, 1, 2, 0};  // chunk 2 of request 0 is partial
    DeviceBuffer<int32_t> dreq(req), dchunk(chunk);
    DeviceBuffer<float> dout(req.size() * 2 * 64);
    landmark_mean<__nv_bfloat16>(dkv.view, dkv.kv_pos.data(), chunk_size, dreq.data(), dchunk.data(),
                                 static_cast<int>(req.size()), dout.data());
    const auto out = dout.download();
    const auto view = kv.view();
    for (size_t i = 0; i < req.size(); ++i)
      for (int h = 0; h < 2; ++h)
        for (int f = 0; f < 64; ++f) {
          double sum = 0;
          int valid = 0;
          for (int s = chunk[i] * chunk_size; s < std::min(lengths[req[i]], (chunk[i] + 1) * chunk_size); ++s) {
            if (kv.kv_pos[view.slot_meta_offset(req[i], s, h)] < 0) continue;
            sum += kv.k[view.slot_offset(req[i], s, h) + f];
            ++valid;
          }
          ASSERT_NEAR(out[(i * 2 + h) * 64 + f], valid ? sum / valid : 0.0, 1e-5);
        }
  }
}

TEST(Landmark, RejectsBadShapes) {
  LandmarkSelectParams p;
  p.batch = 1;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 80;
  p.top_k = 4;
  EXPECT_THROW(landmark_select(p), Error);  // head_dim not a multiple of 32
  p.head_dim = 64;
  p.top_k = 0;
  EXPECT_THROW(landmark_select(p), Error);
}

}  // namespace
}  // namespace kvlab::cuda
