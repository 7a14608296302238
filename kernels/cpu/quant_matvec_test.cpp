// The block-quantised matvec (quant_matvec.h):
//   - every ISA path this CPU supports returns the scalar reference's bits (integer sums are
//     exact, the float scaling runs in one fixed order), over every type, awkward row counts and
//     token counts, random and adversarial blocks (zero scales, all-max / all-min codes);
//   - the scalar reference is within the derived activation-quantisation bound of the float64
//     product with the fp32-dequantised weights;
//   - linear.h's matvec_rows (both CpuPaths) and linear_reference agree on block types;
//   - kvlab's quantisers write blocks that dequantise close to their input.
// Blocks are random bytes (any byte pattern is a valid block, except a non-finite fp16 scale: the
// scales are drawn as finite fp16 values) and adversarial patterns; the dequantiser is checked
// bit for bit against gguf-py in tests/reference/quants_ref_test.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant_matvec.h"

namespace kvlab {
namespace {

const DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                        DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Byte offsets of the fp16 scales of a block.
std::vector<size_t> scale_offsets(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ5_0: case DType::kQ8_0: return {0};
    case DType::kQ4_1: case DType::kQ5_1: case DType::kQ4_K: case DType::kQ5_K: return {0, 2};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108};
    case DType::kQ6_K: return {208};
    default: return {};
  }
}

enum class Pattern { kRandom, kZeroScale, kAllOnes, kAllZeros };

// rows x cols matrix of type t, blocks filled per pattern (scales finite, |d| <= 2^-4 * 2^e).
std::vector<uint8_t> make_matrix(DType t, int64_t rows, int64_t cols, Pattern pat, std::mt19937& rng) {
  const size_t bb = quant_block_bytes(t);
  const int64_t nb = rows * cols / quant_block_values(t);
  std::vector<uint8_t> m(static_cast<size_t>(nb) * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = m.data() + b * bb;
    // all-ones: every code at its maximum (q8_0: -128, the code whose |q| does not fit int8)
    const uint8_t ones = t == DType::kQ8_0 ? 0x80 : 0xFF;
    for (size_t i = 0; i < bb; ++i)
      p[i] = pat == Pattern::kAllOnes ? ones : pat == Pattern::kAllZeros ? 0 : static_cast<uint8_t>(byte(rng));
    for (size_t off : scale_offsets(t)) {
      const uint16_t h = pat == Pattern::kZeroScale ? 0 : fp32_to_fp16(scale(rng));
      std::memcpy(p + off, &h, 2);
    }
  }
  return m;
}

std::vector<float> random_x(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = nd(rng);
  if (cols >= 64) std::fill(x.begin(), x.begin() + 32, 0.f);  // an all-zero activation block
  x[static_cast<size_t>(cols / 2)] = 40.f;                     // an outlier
  return x;
}

struct Case {
  DType t;
  int64_t rows, blocks;
  int64_t n;
  Pattern pat;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : kTypes)
    for (Pattern pat : {Pattern::kRandom, Pattern::kZeroScale, Pattern::kAllOnes, Pattern::kAllZeros})
      for (auto [rows, blocks, n] : {std::tuple{1, 1, 1}, std::tuple{7, 3, 2}, std::tuple{13, 8, 3}, std::tuple{5, 9, 7}})
        if (pat == Pattern::kRandom || rows == 7) out.push_back({t, rows, blocks, n, pat});
  return out;
}

TEST(QuantMatvec, EveryIsaEqualsTheScalarReference) {
  std::mt19937 rng(1);
  int checked_paths = 0;
  for (const Case& c : cases()) {
    const int64_t cols = c.blocks * quant_block_values(c.t);
    const auto m = make_matrix(c.t, c.rows, cols, c.pat, rng);
    const auto x = random_x(c.n, cols, rng);
    const WeightView w{c.t, c.rows, cols, m.data()};
    std::vector<float> want(static_cast<size_t>(c.n * c.rows)), got(want.size());
    quant_matvec_rows(w, x.data(), c.n, want.data(), 0, c.rows, QuantIsa::kScalar);
    for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
      if (!quant_isa_supported(isa)) continue;
      ++checked_paths;
      std::fill(got.begin(), got.end(), -1.f);
      quant_matvec_rows(w, x.data(), c.n, got.data(), 0, c.rows, isa);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
          << dtype_name(c.t) << " " << quant_isa_name(isa) << " rows " << c.rows << " blocks " << c.blocks
          << " n " << c.n << " pattern " << static_cast<int>(c.pat) << ": first " << got[0] << " vs " << want[0];
    }
  }
  if (checked_paths == 0) GTEST_SKIP() << "this CPU has no AVX2: only the scalar path exists";
  std::printf("checked %s%s against the scalar reference\n", quant_isa_supported(QuantIsa::kAvx2) ? "avx2 " : "",
              quant_isa_supported(QuantIsa::kAvx512Vnni) ? "avx512vnni" : "");
}

// Random shapes: odd row counts (the 4-row loop's remainders), column counts that are not a
// multiple of 256 (32-value types) or of 4 blocks, 1..8 tokens, row ranges that start mid-matrix.
TEST(QuantMatvec, EveryIsaEqualsTheScalarReferenceOnRandomShapes) {
  if (!quant_isa_supported(QuantIsa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2: only the scalar path exists";
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> rows_d(1, 41), blocks32(1, 45), blocks256(1, 6), tokens(1, 8);
  for (DType t : kTypes)
    for (int rep = 0; rep < 12; ++rep) {
      const int64_t bv = quant_block_values(t), rows = rows_d(rng), n = tokens(rng);
      const int64_t cols = bv * (bv == 32 ? blocks32(rng) : blocks256(rng));
      const auto m = make_matrix(t, rows, cols, Pattern::kRandom, rng);
      const auto x = random_x(n, cols, rng);
      const WeightView w{t, rows, cols, m.data()};
      const int64_t r0 = std::uniform_int_distribution<int64_t>(0, rows - 1)(rng);
      std::vector<float> want(static_cast<size_t>(n * rows), -1.f), got(want.size());
      quant_matvec_rows(w, x.data(), n, want.data(), r0, rows, QuantIsa::kScalar);
      for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
        if (!quant_isa_supported(isa)) continue;
        std::fill(got.begin(), got.end(), -1.f);
        quant_matvec_rows(w, x.data(), n, got.data(), r0, rows, isa);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << dtype_name(t) << " " << quant_isa_name(isa) << " rows " << r0 << ".." << rows << " cols " << cols
            << " n " << n;
      }
    }
}

// |y - sum_i w_i x_i| (w the fp32-dequantised weights) against quant_matvec.h's bound:
//   sum_b (da_b / 2) sum_{i in b} |w_i|                       (activation rounding, |x - da a| <= da/2)
// + sum_b (nb + 8) u (sum_k |d da L_bk| + |dmin da S2_b|)     (fp32: d*da rounds once, each lane's
//                                                              nb-term fma chain, the 3-level tree and
//                                                              the final subtraction: nb + 5 roundings
//                                                              to first order; L_bk the contract's lanes)
// + 2 u sum_i |w_i x_i|                                        (the dequantised w_i itself rounds twice)
TEST(QuantMatvec, ScalarIsWithinTheDerivedBoundOfTheFp32Product) {
  std::mt19937 rng(2);
  constexpr double kU = 0x1p-24;
  for (const Case& c : cases()) {
    const int64_t bv = quant_block_values(c.t), cols = c.blocks * bv;
    const auto m = make_matrix(c.t, c.rows, cols, c.pat, rng);
    const auto x = random_x(c.n, cols, rng);
    const WeightView w{c.t, c.rows, cols, m.data()};
    std::vector<float> y(static_cast<size_t>(c.n * c.rows));
    QuantActivations a;
    quantize_activations(x.data(), c.n, cols, bv, a);
    quant_matvec_rows(w, a, y.data(), 0, c.rows, QuantIsa::kScalar);
    std::vector<float> wf(static_cast<size_t>(cols));
    for (int64_t r = 0; r < c.rows; ++r) {
      to_float(c.t, w.row(r), wf.data(), cols);
      for (int64_t t = 0; t < c.n; ++t) {
        double exact = 0, bound = 0, abs_terms = 0;
        for (int64_t b = 0; b < c.blocks; ++b) {
          UnpackedBlock u;
          unpack_block(c.t, w.row(r) + b * quant_block_bytes(c.t), u);
          const double da = a.d[t * c.blocks + b];
          double lanes[kQuantLanes] = {}, s2 = 0, wabs = 0;
          for (int64_t i = 0; i < bv; ++i) {
            const int64_t col = b * bv + i;
            exact += double(wf[col]) * x[t * cols + col];
            abs_terms += std::fabs(double(wf[col]) * x[t * cols + col]);
            wabs += std::fabs(wf[col]);
            lanes[(i % 32) / 4] += double(u.sc[i / 16]) * u.q[i] * a.q[t * cols + col];
            if (i % 16 == 0) s2 += double(u.m[i / 16]) * a.s16[(t * cols + col) / 16];
          }
          double lane_abs = 0;
          for (double l : lanes) lane_abs += std::fabs(l);
          bound += da / 2 * wabs + (c.blocks + 8) * kU * (std::fabs(u.d * da) * lane_abs + std::fabs(u.dmin * da * s2));
        }
        bound += 2 * kU * abs_terms;
        const double got = y[t * c.rows + r];
        ASSERT_LE(std::fabs(got - exact), bound * (1 + 1e-9) + 1e-30)
            << dtype_name(c.t) << " row " << r << " token " << t << " pattern " << static_cast<int>(c.pat);
      }
    }
  }
}

TEST(QuantMatvec, LinearDispatchAndReference) {
  std::mt19937 rng(3);
  for (DType t : kTypes) {
    const int64_t rows = 9, cols = 2 * quant_block_values(t), n = 2;
    const auto m = make_matrix(t, rows, cols, Pattern::kRandom, rng);
    const auto x = random_x(n, cols, rng);
    const WeightView w{t, rows, cols, m.data()};
    std::vector<float> fast(n * rows), portable(n * rows), direct(n * rows), ref(n * rows);
    matvec_rows(w, x.data(), n, fast.data(), 0, rows);
    matvec_rows(w, x.data(), n, portable.data(), 0, rows, CpuPath::kPortable);
    quant_matvec_rows(w, x.data(), n, direct.data(), 0, rows, QuantIsa::kScalar);
    linear_reference(w, x.data(), n, ref.data(), 0, rows);
    EXPECT_EQ(portable, direct) << dtype_name(t);
    EXPECT_EQ(fast, direct) << dtype_name(t) << " (every ISA equals the scalar path)";
    for (int64_t i = 0; i < n * rows; ++i) {
      // the activation-rounding bound above, coarsely: |w|_1 * max|x| / 254 * 2 with max|x| <= 40
      double wabs = 0;
      std::vector<float> wf(cols);
      to_float(t, w.row(i % rows), wf.data(), cols);
      for (float v : wf) wabs += std::fabs(v);
      EXPECT_LE(std::fabs(double(direct[i]) - ref[i]), wabs * 40.0 / 127 + 1e-6) << dtype_name(t);
    }
  }
}

TEST(QuantMatvec, ColumnsNotAMultipleOfTheBlockAreRejected) {
  std::vector<uint8_t> m(1024);
  std::vector<float> x(300), y(1);
  const WeightView w{DType::kQ4_K, 1, 300, m.data()};
  QuantActivations a;
  EXPECT_THROW(quantize_activations(x.data(), 1, 300, 256, a), std::exception);
  quantize_activations(x.data(), 1, 256, 256, a);
  EXPECT_THROW(quant_matvec_rows(w, a, y.data(), 0, 1, QuantIsa::kScalar), std::exception);
}

TEST(QuantMatvec, NonFiniteActivationsGiveNaN) {
  std::mt19937 rng(4);
  const auto m = make_matrix(DType::kQ4_0, 2, 64, Pattern::kRandom, rng);
  std::vector<float> x(64, 1.f), y(2);
  x[40] = std::numeric_limits<float>::infinity();
  quant_matvec_rows(WeightView{DType::kQ4_0, 2, 64, m.data()}, x.data(), 1, y.data(), 0, 2, QuantIsa::kScalar);
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
}

// kvlab's quantisers: every value within one quantisation step of its block's grid, where the
// step is (max - min) / (levels - 1) of the value's sub-block, widened by the 6- or 8-bit
// rounding of the sub-block scales (a scale rounded down by half a unit of d clips the range:
// at most (levels - 1) * d / 2 more). Exactness against gguf-py: quants_ref_test.py.
TEST(QuantBlocks, QuantiseRoundTrip) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const int64_t n = 4 * 256;
    std::vector<float> x(n), y(n);
    for (float& v : x) v = nd(rng);
    std::vector<uint8_t> q(dtype_bytes(t, n));
    from_float(t, x.data(), q.data(), n);
    to_float(t, q.data(), y.data(), n);
    double err2 = 0, x2 = 0;
    for (int64_t i = 0; i < n; ++i) err2 += std::pow(double(x[i]) - y[i], 2), x2 += double(x[i]) * x[i];
    const double levels = (t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ4_K) ? 16 : t == DType::kQ6_K ? 64 : 32;
    // uniform rounding error of a step s = range/(levels-1) has rms s/sqrt(12); the range of a
    // 16..32-value group of N(0,1) draws is below 8; twice that for the scale rounding
    const double rms_bound = 2 * 8.0 / (levels - 1) / std::sqrt(12.0);
    EXPECT_LE(std::sqrt(err2 / n), rms_bound) << dtype_name(t);
    EXPECT_GT(std::sqrt(x2 / n), 0.5);
  }
  std::vector<float> bad(256, 1.f);
  bad[3] = NAN;
  std::vector<uint8_t> q(210);
  EXPECT_THROW(from_float(DType::kQ6_K, bad.data(), q.data(), 256), std::exception);
  EXPECT_THROW(from_float(DType::kQ2_K, bad.data(), q.data(), 256), std::exception);
}

}  // namespace
}  // namespace kvlab
