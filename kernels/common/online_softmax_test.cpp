// The online-softmax recurrence and the split merge equal a naive softmax, whatever the tile
// size or split count; fully masked rows give O = 0, LSE = -inf, never NaN.
#include "kernels/common/online_softmax.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/common/masks.h"

namespace kvlab {
namespace {

struct Row {
  std::vector<float> o;
  float lse;
};

// Naive: softmax over all scores (masked = -inf), then weighted sum of values.
Row naive(const std::vector<float>& s, const std::vector<float>& v, int dim) {
  float m = kNegInf;
  for (float x : s) m = std::max(m, x);
  Row r{std::vector<float>(dim, 0.f), kNegInf};
  if (m == kNegInf) return r;
  double l = 0;
  for (float x : s) l += std::exp(double(x) - m);
  for (size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(double(s[j]) - m) / l;
    for (int d = 0; d < dim; ++d) r.o[d] += float(p * v[j * dim + d]);
  }
  r.lse = float(m + std::log(l));
  return r;
}

// Tiled online softmax over keys [begin, end).
Row tiled(const std::vector<float>& s, const std::vector<float>& v, int dim, int begin, int end,
          int tile) {
  SoftmaxState st;
  std::vector<float> o(dim, 0.f);
  for (int t0 = begin; t0 < end; t0 += tile) {
    const int t1 = std::min(end, t0 + tile);
    float tmax = kNegInf;
    for (int j = t0; j < t1; ++j) tmax = std::max(tmax, s[j]);
    float shift;
    const float alpha = softmax_rescale(st, tmax, &shift);
    for (float& x : o) x *= alpha;
    for (int j = t0; j < t1; ++j) {
      const float p = std::exp(s[j] - shift);
      st.l += p;
      for (int d = 0; d < dim; ++d) o[d] += p * v[j * dim + d];
    }
  }
  Row r{o, softmax_lse(st)};
  if (st.l > 0) {
    for (float& x : r.o) x /= st.l;
  }
  return r;
}

TEST(OnlineSoftmax, TiledAndSplitEqualNaive) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + rng() % 97, dim = 1 + rng() % 40;
    std::vector<float> s(n), v(size_t(n) * dim);
    for (auto& x : s) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    // Mask a random subset, sometimes everything.
    const int mask_mode = rng() % 4;
    for (int j = 0; j < n; ++j)
      if (mask_mode == 0 || (mask_mode == 1 && rng() % 3 == 0)) s[j] = kNegInf;
    const Row ref = naive(s, v, dim);
    for (int tile : {1, 3, 16, 64}) {
      const Row t = tiled(s, v, dim, 0, n, tile);
      ASSERT_EQ(std::isinf(ref.lse), std::isinf(t.lse));
      if (!std::isinf(ref.lse)) ASSERT_NEAR(ref.lse, t.lse, 1e-4f);
      for (int d = 0; d < dim; ++d) ASSERT_NEAR(ref.o[d], t.o[d], 1e-4f) << "tile " << tile;
    }
    // Split into parts and merge.
    const int parts = 1 + rng() % 5;
    Row acc{std::vector<float>(dim, 0.f), kNegInf};
    for (int p = 0; p < parts; ++p) {
      const int b = n * p / parts, e = n * (p + 1) / parts;
      const Row part = tiled(s, v, dim, b, e, 8);
      merge_partial(acc.o.data(), acc.lse, part.o.data(), part.lse, dim);
    }
    for (int d = 0; d < dim; ++d) {
      ASSERT_FALSE(std::isnan(acc.o[d]));
      ASSERT_NEAR(ref.o[d], acc.o[d], 1e-4f) << "parts " << parts;
    }
  }
}

TEST(Masks, WindowCountsAndStrided) {
  SlidingWindowMask w{4, false};
  int count = 0;
  for (int j = 0; j <= 10; ++j) count += w(10, j);
  EXPECT_EQ(count, 4);
  SlidingWindowMask w1{4, true};
  count = 0;
  for (int j = 0; j <= 10; ++j) count += w1(10, j);
  EXPECT_EQ(count, 5);
  StridedMask st{4, 0};
  EXPECT_TRUE(st(10, 10));
  EXPECT_TRUE(st(10, 7));
  EXPECT_FALSE(st(10, 5));
  EXPECT_TRUE(st(10, 2));
  EXPECT_FALSE(st(10, 11));
  FixedMask f{4, 1, 0};
  EXPECT_TRUE(f(9, 8));   // same block
  EXPECT_TRUE(f(9, 3));   // summary column (3 mod 4 == 3)
  EXPECT_FALSE(f(9, 2));
}

}  // namespace
}  // namespace kvlab
