// The fast matvec (on each instruction-set path this CPU has) and the sgemm path against plain
// loops, for every weight type, over awkward shapes (rows not a multiple of 4, cols not a
// multiple of 8 or 16), and fused multi-job calls. q8_0's matvec multiplies with int8
// activations (quant_matvec.h; its ISA paths are checked bit for bit in quant_matvec_test.cpp):
// here it gets that header's activation-rounding bound on top of the fp32 tolerance.
#include "kernels/cpu/linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "kernels/common/error.h"
#include "kernels/cpu/thread_pool.h"

namespace kvlab {
namespace {

struct Stored {
  std::vector<uint8_t> bytes;
  WeightView m;
};

// Random weights stored in `type` (the reference then reads the same stored values).
Stored make_matrix(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> f(rows * cols);
  for (float& v : f) v = nd(rng);
  Stored s;
  switch (type) {
    case DType::kF32:
      s.bytes.resize(f.size() * 4);
      std::memcpy(s.bytes.data(), f.data(), s.bytes.size());
      break;
    case DType::kF16:
    case DType::kBF16: {
      s.bytes.resize(f.size() * 2);
      auto* h = reinterpret_cast<uint16_t*>(s.bytes.data());
      for (size_t i = 0; i < f.size(); ++i) h[i] = type == DType::kF16 ? fp32_to_fp16(f[i]) : fp32_to_bf16(f[i]);
      break;
    }
    case DType::kQ8_0:
      s.bytes.resize(dtype_bytes(type, rows * cols));
      quantize_q8_0(f.data(), reinterpret_cast<BlockQ8_0*>(s.bytes.data()), rows * cols);
      break;
    default:  // block-quantised types: quant_matvec_test.cpp
      s.bytes.resize(dtype_bytes(type, rows * cols));
      from_float(type, f.data(), s.bytes.data(), rows * cols);
      break;
  }
  s.m = WeightView{type, rows, cols, s.bytes.data()};
  return s;
}

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// Per output y[t, r] of a matvec on int8 activations (q8_0 and the block types; zeros for the
// others): quant_matvec.h's bound for the rounding of x, |x_i - da a_i| <= da_b / 2, so
// |dy| <= sum_b (da_b / 2) sum_{i in b} |w_ri|.
std::vector<float> activation_bound(const WeightView& w, const float* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * w.rows), 0.f);
  if (!quant_matvec_supports(w.dtype)) return out;
  const int64_t bv = quant_block_values(w.dtype), nb = w.cols / bv;
  QuantActivations a;
  quantize_activations(x, n, w.cols, bv, a);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    to_float(w.dtype, w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < n; ++t) {
      double b = 0;
      for (int64_t k = 0; k < nb; ++k) {
        double wabs = 0;
        for (int64_t i = 0; i < bv; ++i) wabs += std::fabs(row[k * bv + i]);
        b += a.d[t * nb + k] / 2.0 * wabs;
      }
      out[t * w.rows + r] = static_cast<float>(b);
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t cols,
                  const std::vector<float>& extra = {}) {
  ASSERT_EQ(got.size(), want.size());
  // fp32 accumulation over `cols` unit-variance products: error ~ sqrt(cols) * 1e-7 * |terms|
  const float tol = 2e-5f * std::sqrt(static_cast<float>(cols)) * 4;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << i;
    ASSERT_NEAR(got[i], want[i], tol + (extra.empty() ? 0.f : extra[i])) << "index " << i;
  }
}

class LinearTypes : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTypes, MatvecMatchesReferenceOnAwkwardShapes) {
  const DType type = GetParam();
  std::mt19937 rng(7);
  const int64_t shapes[][2] = {{1, 32}, {3, 64}, {5, 96}, {13, 160}, {64, 288}, {37, 768}};
  const int64_t odd_cols[] = {1, 7, 9, 15, 17, 31, 33, 47, 100};
  std::vector<std::array<int64_t, 2>> all;
  for (auto& s : shapes) all.push_back({s[0], s[1]});
  if (type != DType::kQ8_0)
    for (int64_t c : odd_cols) all.push_back({11, c});
  for (auto [rows, cols] : all) {
    for (int64_t n : {1, 3}) {
      Stored w = make_matrix(type, rows, cols, rng);
      auto x = random_vec(n * cols, rng);
      std::vector<float> want(n * rows), got(n * rows, NAN);
      linear_reference(w.m, x.data(), n, want.data(), 0, rows);
      const auto extra = activation_bound(w.m, x.data(), n);
      // Every path this CPU can run (cpu_path.h): the portable loop always, AVX2 where present.
      std::vector<CpuPath> paths = {CpuPath::kPortable};
      if (cpu_has_avx2_fma_f16c()) paths.push_back(CpuPath::kAvx2);
      for (CpuPath path : paths) {
        std::fill(got.begin(), got.end(), NAN);
        matvec_rows(w.m, x.data(), n, got.data(), 0, rows, path);
        SCOPED_TRACE(testing::Message() << "rows " << rows << " cols " << cols << " n " << n << " path "
                                        << to_string(path));
        expect_close(got, want, cols, extra);
      }
      // ... and every instruction set of matvec_isa() this CPU has (AVX-512 where present)
      for (MatvecIsa isa : {MatvecIsa::kPortable, MatvecIsa::kAvx2, MatvecIsa::kAvx512}) {
        if (!matvec_isa_supported(isa)) continue;
        std::fill(got.begin(), got.end(), NAN);
        matvec_rows(w.m, x.data(), n, got.data(), 0, rows, isa);
        SCOPED_TRACE(testing::Message() << "rows " << rows << " cols " << cols << " n " << n << " isa "
                                        << to_string(isa));
        expect_close(got, want, cols, extra);
      }
    }
  }
}

TEST_P(LinearTypes, FusedJobsMatchReferenceForMatvecAndGemm) {
  const DType type = GetParam();
  std::mt19937 rng(11);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, kGemmMinTokens - 1, kGemmMinTokens, 37}) {
      const int64_t cols = 128;
      // a and b are small; c is big enough (> kMinParallelBytes in every dtype) to be split
      // across the pool's threads
      Stored a = make_matrix(type, 23, cols, rng), b = make_matrix(type, 9, cols, rng);
      Stored c = make_matrix(type, 1203, cols, rng);
      auto bias = random_vec(9, rng);
      auto x = random_vec(n * cols, rng);
      std::vector<float> ya(n * 23, NAN), yb(n * 9, NAN), yc(n * 1203, NAN), wa(n * 23), wb(n * 9), wc(n * 1203);
      LinearScratch scratch;
      linear_reference(a.m, x.data(), n, wa.data(), 0, 23);
      linear_reference(b.m, x.data(), n, wb.data(), 0, 9);
      linear_reference(c.m, x.data(), n, wc.data(), 0, 1203);
      for (int64_t t = 0; t < n; ++t)
        for (int r = 0; r < 9; ++r) wb[t * 9 + r] += bias[r];
      SCOPED_TRACE(testing::Message() << "threads " << threads << " n " << n);
      // the integer matvec's bound for n < kGemmMinTokens; sgemm on dequantised panels beyond
      const bool matvec = n < kGemmMinTokens;
      const std::vector<float> none;
      const auto ea = matvec ? activation_bound(a.m, x.data(), n) : none;
      const auto eb = matvec ? activation_bound(b.m, x.data(), n) : none;
      const auto ec = matvec ? activation_bound(c.m, x.data(), n) : none;
      linear(pool, x.data(), n, {{a.m, ya.data(), nullptr}, {b.m, yb.data(), bias.data()}}, scratch);
      expect_close(ya, wa, cols, ea);
      expect_close(yb, wb, cols, eb);
      std::fill(ya.begin(), ya.end(), NAN);
      std::fill(yb.begin(), yb.end(), NAN);
      linear(pool, x.data(), n, {{a.m, ya.data(), nullptr}, {c.m, yc.data(), nullptr}, {b.m, yb.data(), bias.data()}},
             scratch);
      expect_close(ya, wa, cols, ea);
      expect_close(yc, wc, cols, ec);
      expect_close(yb, wb, cols, eb);
      if (matvec && quant_matvec_supports(type)) {  // the pre-quantised x gives matvec_rows's bits
        std::vector<float> direct(yc.size());
        matvec_rows(c.m, x.data(), n, direct.data(), 0, 1203);
        EXPECT_EQ(yc, direct);
      }
    }
  }
}

std::string type_name(const ::testing::TestParamInfo<DType>& info) {
  static const char* const kNames[] = {"F32", "F16", "BF16", "Q8_0"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(AllTypes, LinearTypes,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16,
                                           DType::kQ8_0),
                         type_name);

TEST(Linear, EachIsaIsReportedAndTheDetectedOneIsSupported) {
  // Which paths ran above is printed here, so a CI log shows what this machine covered.
  for (MatvecIsa isa : {MatvecIsa::kPortable, MatvecIsa::kAvx2, MatvecIsa::kAvx512})
    std::printf("matvec isa %s: %s\n", to_string(isa), matvec_isa_supported(isa) ? "tested" : "not on this CPU");
  EXPECT_TRUE(matvec_isa_supported(matvec_isa()));
  EXPECT_TRUE(matvec_isa_supported(MatvecIsa::kPortable));
}

// linear.cpp replaces OpenBLAS's fallback for CPUs it does not know (the SSE3 Prescott kernels)
// with the kernels of the instruction set the CPU has, unless the user chose a core.
TEST(Linear, OpenblasDoesNotRunItsSse3FallbackOnAnAvx2OrAvx512Cpu) {
  std::printf("OpenBLAS core: %s\n", blas_core_name());
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set by the environment";
  if (!cpu_has_avx2_fma_f16c()) GTEST_SKIP() << "no AVX2: OpenBLAS keeps its own choice";
  EXPECT_STRCASENE(blas_core_name(), "Prescott");
}

TEST(Linear, Q8RejectsColsNotMultipleOf32) {
  ThreadPool pool(1);
  std::vector<uint8_t> bytes(64);
  std::vector<float> x(40), y(1);
  LinearScratch scratch;
  EXPECT_THROW(linear(pool, x.data(), 1, {{WeightView{DType::kQ8_0, 1, 40, bytes.data()}, y.data(), nullptr}}, scratch),
               Error);
}

}  // namespace
}  // namespace kvlab
