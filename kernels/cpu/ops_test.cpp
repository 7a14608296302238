// RMSNorm, SwiGLU, sampling and the thread pool against plain definitions.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampler.h"
#include "kernels/cpu/thread_pool.h"

namespace kvlab {
namespace {

TEST(Ops, RmsNormMatchesDefinition) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int dim : {1, 7, 8, 9, 64, 288, 301}) {
    std::vector<float> x(dim), w(dim), y(dim);
    for (int i = 0; i < dim; ++i) x[i] = nd(rng), w[i] = nd(rng);
    rms_norm(x.data(), w.data(), dim, 1e-5f, y.data());
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) ASSERT_NEAR(y[i], x[i] * inv * w[i], 1e-5 * (1 + std::fabs(y[i])));
    rms_norm(x.data(), w.data(), dim, 1e-5f, x.data());  // in place
    for (int i = 0; i < dim; ++i) ASSERT_FLOAT_EQ(x[i], y[i]);
  }
}

TEST(Ops, SwigluMatchesDefinition) {
  std::vector<float> g = {-20.f, -1.f, 0.f, 0.5f, 3.f, 30.f}, u = {1.f, 2.f, 3.f, -4.f, 5.f, 0.5f};
  auto want = g;
  for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] / (1 + std::exp(-double(g[i]))) * u[i];
  swiglu(g.data(), u.data(), static_cast<int64_t>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], 1e-6 * (1 + std::fabs(want[i])));
}

TEST(Ops, LogSumExpIsStable) {
  std::vector<float> x = {1000.f, 1000.f};
  EXPECT_NEAR(log_sum_exp(x.data(), 2), 1000.0 + std::log(2.0), 1e-9);
}

TEST(Sampler, GreedyPicksLowestIdAmongMaxima) {
  Sampler s({});
  std::vector<float> l = {0.f, 5.f, 5.f, 1.f};
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, TopKOneIsGreedyAndSeedIsReproducible) {
  std::vector<float> l = {0.1f, 0.4f, 2.f, 0.3f};
  Sampler k1({1.f, 1, 1.f, 5});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(l), 2);
  Sampler a({1.f, 0, 1.f, 42}), b({1.f, 0, 1.f, 42});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(l), b.sample(l));
}

TEST(Sampler, TopPKeepsTheNucleusAndFrequenciesFollowSoftmax) {
  // probs ~ {0.643, 0.237, 0.087, 0.032}: top_p 0.8 keeps ids 0 and 1.
  std::vector<float> l = {3.f, 2.f, 1.f, 0.f};
  Sampler s({1.f, 0, 0.8f, 9});
  int counts[4] = {};
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(l)];
  EXPECT_EQ(counts[2] + counts[3], 0);
  const double p0 = std::exp(3.0) / (std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(counts[0] / double(n), p0, 0.02);
}

TEST(ThreadPool, ParallelForCoversEveryTaskOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      for (int rep = 0; rep < 3; ++rep)
        pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
          ASSERT_LT(t, threads);
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 3) << i;
    }
  }
}

TEST(ThreadPool, RunCallsEachThreadOnceManyTimes) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  for (int rep = 0; rep < 300; ++rep) pool.run([&](int t) { total += t + 1; });
  EXPECT_EQ(total.load(), 300 * 6);
}

}  // namespace
}  // namespace kvlab
