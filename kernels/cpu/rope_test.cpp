// RoPE: frequencies (plain, linear, llama3 against values computed with Hugging Face's formula in
// Python), both pair layouts against a direct complex rotation, table == past-the-table values.
#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <random>
#include <vector>

namespace kvlab {
namespace {

TEST(Rope, Llama3FrequenciesMatchReference) {
  RopeConfig c;
  c.head_dim = 64;
  c.theta = 500000.0;
  c.scaling = RopeScalingKind::kLlama3;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position = 8192;
  const std::vector<double> f = rope_inv_freq(c);
  // Hugging Face _compute_llama3_parameters, evaluated in double (Python).
  EXPECT_NEAR(f[0], 1.0, 1e-15);
  EXPECT_NEAR(f[14] / 0.003211445994752591, 1.0, 1e-12);   // high frequency: kept
  EXPECT_NEAR(f[15] / 0.0013718935677611381, 1.0, 1e-12);  // smooth band
  EXPECT_NEAR(f[16] / 0.0005248461609929547, 1.0, 1e-12);
  EXPECT_NEAR(f[17] / 0.0001785078127679964, 1.0, 1e-12);
  EXPECT_NEAR(f[20] / 3.428102195952591e-05, 1.0, 1e-12);  // low frequency: / factor
  EXPECT_NEAR(f[31] / 3.767322690173964e-07, 1.0, 1e-12);
}

TEST(Rope, LinearScalingDividesFrequencies) {
  RopeConfig c;
  c.head_dim = 16;
  const std::vector<double> plain = rope_inv_freq(c);
  c.scaling = RopeScalingKind::kLinear;
  c.factor = 4.0;
  const std::vector<double> lin = rope_inv_freq(c);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(lin[i], plain[i] / 4.0, 1e-15);
  EXPECT_NEAR(plain[1], std::pow(10000.0, -2.0 / 16), 1e-15);
}

// Direct: pair (a, b) as the complex number a + ib, multiplied by e^{i pos inv_freq}.
std::vector<float> direct(const std::vector<float>& x, int64_t pos, const RopeConfig& c) {
  const std::vector<double> f = rope_inv_freq(c);
  const int half = c.head_dim / 2;
  std::vector<float> y(x);
  for (int i = 0; i < half; ++i) {
    const int ia = c.layout == RopeLayout::kInterleaved ? 2 * i : i;
    const int ib = c.layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
    const std::complex<double> z(x[ia], x[ib]);
    const std::complex<double> w = z * std::polar(1.0, static_cast<double>(pos) * f[i]);
    y[ia] = static_cast<float>(w.real());
    y[ib] = static_cast<float>(w.imag());
  }
  return y;
}

TEST(Rope, BothLayoutsMatchComplexRotationInAndPastTable) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kNeox}) {
    for (RopeScalingKind kind : {RopeScalingKind::kNone, RopeScalingKind::kLinear, RopeScalingKind::kLlama3}) {
      RopeConfig c;
      c.layout = layout;
      c.head_dim = 64;
      c.theta = 10000.0;
      c.scaling = kind;
      c.factor = 2.0;
      c.original_max_position = 256;
      const RopeTable table(c, 100);
      for (int64_t pos : {0, 1, 7, 99, 100, 5000}) {  // 100 and 5000: past the table
        std::vector<float> x(3 * 64);
        for (auto& v : x) v = nd(rng);
        std::vector<float> y = x;
        apply_rope(y.data(), 3, 64, pos, table);
        for (int h = 0; h < 3; ++h) {
          const std::vector<float> head(x.begin() + h * 64, x.begin() + (h + 1) * 64);
          const std::vector<float> ref = direct(head, pos, c);
          for (int d = 0; d < 64; ++d) ASSERT_NEAR(y[h * 64 + d], ref[d], 2e-5f) << "pos " << pos;
        }
      }
      // The table and the direct path give identical values.
      const RopeTable small(c, 0);
      std::vector<float> a(64), b(64);
      for (auto& v : a) v = nd(rng);
      b = a;
      table.rotate(a.data(), 57);
      small.rotate(b.data(), 57);
      EXPECT_EQ(a, b);
    }
  }
}

TEST(Rope, RejectsBadConfig) {
  RopeConfig c;
  c.head_dim = 63;
  EXPECT_THROW(RopeTable(c, 4), std::invalid_argument);
  c.head_dim = 64;
  const RopeTable t(c, 4);
  std::vector<float> x(2 * 32);
  EXPECT_THROW(apply_rope(x.data(), 2, 32, 0, t), std::invalid_argument);
}

}  // namespace
}  // namespace kvlab
