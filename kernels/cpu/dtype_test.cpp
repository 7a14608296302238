// dtype conversions against independent references: the compiler's _Float16 (correctly rounded
// IEEE conversion; where the compiler has none, the CPU's F16C instructions), a naive bf16
// rounding written with double arithmetic, and a plain-loop Q8_0.
#include "kernels/cpu/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/error.h"

// clang 14 has _Float16 on x86-64 only with AVX512-FP16, so a KVLAB_NATIVE=OFF clang build
// takes the F16C conversions (IEEE, round to nearest even; through a target attribute, run only
// where the CPU has F16C) as the reference instead.
#if defined(__clang__) && __clang_major__ < 15 && !defined(__AVX512FP16__)
#include <cpuid.h>
#include <immintrin.h>
#define KVLAB_F16_REFERENCE_F16C 1
#endif

namespace kvlab {
namespace {

#ifdef KVLAB_F16_REFERENCE_F16C
__attribute__((target("f16c"))) float ref_half_to_float(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t ref_float_to_half(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
bool have_f16_reference() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#else
float ref_half_to_float(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
uint16_t ref_float_to_half(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
bool have_f16_reference() { return true; }
#endif

TEST(DType, Fp16ToFp32IsExactForAll65536Patterns) {
  if (!have_f16_reference()) GTEST_SKIP() << "no _Float16 and no F16C on this CPU: no reference";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = fp16_to_fp32(static_cast<uint16_t>(h));
    const float ref = ref_half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(ours)) << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(ref)) << "pattern " << h;
    ASSERT_EQ(fp32_to_fp16(ours), h) << "round trip of pattern " << h;
  }
}

TEST(DType, Fp32ToFp16RoundsLikeTheCompiler) {
  if (!have_f16_reference()) GTEST_SKIP() << "no _Float16 and no F16C on this CPU: no reference";
  std::mt19937 rng(7);
  std::vector<float> values = {0.f, -0.f, 1.f, 65504.f, 65519.f, 65520.f, 1e6f, -1e6f,
                               5.96e-8f, 2.98e-8f, 2.9802322e-8f, 6.1e-5f, 1e-10f,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::denorm_min()};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) values.push_back(std::bit_cast<float>(bits(rng)));
  std::uniform_real_distribution<float> small(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) values.push_back(small(rng) * std::pow(2.f, -float(i % 40)));
  for (float f : values) {
    const uint16_t ref = ref_float_to_half(f);
    const uint16_t ours = fp32_to_fp16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(ours)));
      continue;
    }
    ASSERT_EQ(ours, ref) << "f=" << f << " bits=" << std::bit_cast<uint32_t>(f);
  }
}

// Naive reference: pick the nearer of the two bf16 neighbours, ties to the even one.
uint16_t bf16_reference(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t lo = static_cast<uint16_t>(bits >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double dl = std::fabs(double(f) - double(bf16_to_fp32(lo)));
  const double dh = std::fabs(double(f) - double(bf16_to_fp32(hi)));
  if (std::isinf(bf16_to_fp32(hi)) && !std::isinf(f)) {
    // overflow: round to inf when at or beyond the halfway point to 2^128
    const double halfway = std::fabs(double(bf16_to_fp32(lo))) + std::ldexp(1.0, 127 - 8);
    return std::fabs(double(f)) >= halfway ? hi : lo;
  }
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(DType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 300000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(f))));
      continue;
    }
    if (std::isinf(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), bf16_reference(f)) << "bits=" << std::bit_cast<uint32_t>(f);
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), b);
  }
}

// to_float's bf16 loop (written out to vectorise) against bf16_to_fp32, every pattern, in an
// odd-length run so the vector body and its tail both run.
TEST(DType, Bf16ToFloatEqualsTheScalarConversionForEveryPattern) {
  std::vector<uint16_t> h(65536 + 7);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> got(h.size());
  to_float(DType::kBF16, h.data(), got.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    const float want = bf16_to_fp32(h[i]);
    ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "pattern " << h[i];
  }
}

TEST(DType, Q8_0MatchesPlainLoopAndErrorBound) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int64_t n = 32 * 37;
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng) * 3.f;
  for (int i = 64; i < 96; ++i) x[i] = 0.f;  // an all-zero block: d = 0, q = 0
  x[200] = 1e4f;                             // one outlier
  std::vector<BlockQ8_0> q(n / 32);
  quantize_q8_0(x.data(), q.data(), n);
  std::vector<float> y(n);
  dequantize_q8_0(q.data(), y.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = fp16_to_fp32(q[b].d);
    EXPECT_NEAR(d, amax / 127.f, amax / 127.f * 1e-3f + 1e-12f);
    for (int i = 0; i < 32; ++i) {
      const float xi = x[b * 32 + i];
      const float expected_q = std::round(xi * (amax > 0 ? 127.f / amax : 0.f));
      EXPECT_LE(std::fabs(q[b].qs[i] - expected_q), 1.f);  // 1/d vs 127/amax rounding
      // |q d16 - x| <= d/2 (rounding) + 127 |d16 - d| (fp16 scale, rel. error 2^-11)
      EXPECT_LE(std::fabs(y[b * 32 + i] - xi), 0.57f * d + 1e-6f) << b << "," << i;
    }
  }
  EXPECT_EQ(y[70], 0.f);
  std::vector<float> z(n);
  to_float(DType::kQ8_0, q.data(), z.data(), n);
  EXPECT_EQ(z, y);
  EXPECT_THROW(quantize_q8_0(x.data(), q.data(), 33), Error);
}

// to_float / from_float may take a vector path: they must agree with the scalar conversions on
// every value, including NaN payloads aside, subnormals, infinities and odd lengths.
TEST(DType, RowConversionsMatchScalarOnes) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int64_t n : {1, 7, 8, 9, 31, 1000}) {
    std::vector<uint16_t> h(n);
    std::vector<float> f(n);
    for (int64_t i = 0; i < n; ++i) {
      h[i] = static_cast<uint16_t>(bits(rng));
      f[i] = std::bit_cast<float>(bits(rng));
      if (i % 3 == 0) f[i] = std::ldexp(static_cast<float>(bits(rng) % 2000) - 1000.f, -int(i % 30));
      if ((h[i] & 0x7C00) == 0x7C00 && (h[i] & 0x3FF)) h[i] = 0x7C00;  // no NaN: payloads may differ
      if (std::isnan(f[i])) f[i] = 1.f;
    }
    std::vector<float> out(n);
    to_float(DType::kF16, h.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(fp16_to_fp32(h[i]))) << i;
    }
    std::vector<uint16_t> back(n);
    from_float(DType::kF16, f.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], fp32_to_fp16(f[i])) << f[i];
  }
}

TEST(DType, GenericRowConversionsRoundTrip) {
  std::vector<float> x = {0.1f, -2.5f, 3.75f, 1e-3f, 1000.f};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<std::byte> buf(dtype_bytes(t, x.size()));
    from_float(t, x.data(), buf.data(), x.size());
    std::vector<float> y(x.size());
    to_float(t, buf.data(), y.data(), y.size());
    const float tol = t == DType::kF32 ? 0.f : t == DType::kF16 ? 1e-3f : 8e-3f;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * tol) << dtype_name(t);
    }
  }
  EXPECT_EQ(dtype_bytes(DType::kQ8_0, 64), 68u);
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("q8_0"), DType::kQ8_0);
  EXPECT_THROW(parse_dtype("q4"), Error);
}

}  // namespace
}  // namespace kvlab
