// Matvec for block-quantised weights (quant_blocks.h, and Q8_0) against int8-quantised
// activations, with integer dot products (the scheme of llama.cpp's q8_0 x q8_0, q4_0 x q8_0 and
// q4_K x q8_K paths; the code is kvlab's own).
//
//   Activations x[n, cols] are quantised per block of the weight type's block size B (32 or 256):
//     da = max|x_b| / 127 (fp32),  a_i = round(x_i / da) in [-127, 127],  s16[g] = sum of a over
//     each 16-value group.
//   Per weight block (UnpackedBlock: value_i = (d sc_g) q_i - dmin m_g):
//     S1 = sum_g sc_g * sum_{i in g} q_i a_i     S2 = sum_g m_g * s16[g]     (int32, exact)
//     c  = (d * da) * float(S1) - (dmin * da) * float(S2)
//   and y[t, r] = ((c_0 + c_1) + c_2) + ...  in block order, one fp32 accumulator per output.
// Every ISA path computes S1 and S2 exactly and then performs those float operations in that
// order (the files are compiled with -ffp-contract=off), so every path returns the same bits as
// the scalar reference (tested in quant_matvec_test.cpp).
//
// Error against the exact product with the fp32-dequantised weights: |x_i - da a_i| <= da / 2,
// so |y_r - sum_i w_ri x_i| <= sum_b (da_b / 2) sum_{i in b} |w_ri|  plus the fp32 rounding of
// the block sums (<= (n_blocks + 3) u sum_i |w_ri x_i| to first order, u = 2^-24).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/quant_blocks.h"

namespace kvlab {

// The instruction sets of the integer kernels, chosen at run time from cpuid.
//   kScalar      plain loops (the reference)
//   kAvx2        AVX2: vpmaddubsw / vpmaddwd
//   kAvx512Vnni  AVX-512 VNNI on 256-bit registers (avx512vnni + avx512vl): vpdpbusd
enum class QuantIsa { kScalar, kAvx2, kAvx512Vnni };
const char* quant_isa_name(QuantIsa isa);
bool quant_isa_supported(QuantIsa isa);  // this CPU (and OS) can run it
QuantIsa quant_isa_best();               // the fastest supported one (detected once)

// The weight types these kernels run: is_block_quant(t) or Q8_0.
bool quant_matvec_supports(DType t);

// x[n, cols] quantised in blocks of `block` values (cols a multiple of block).
struct QuantActivations {
  int64_t block = 0, cols = 0, n = 0;
  std::vector<float> d;       // [n, cols / block]
  std::vector<int8_t> q;      // [n, cols]
  std::vector<int32_t> s16;   // [n, cols / 16]
  std::vector<int16_t> s32;   // [n, cols / 32]: sums over 32 values (|s| <= 32 * 127)
};
// Non-finite inputs give a block with d = that value (inf/NaN) and a = 0, so the outputs that
// use it are NaN, as the fp32 kernels' would be.
void quantize_activations(const float* x, int64_t n, int64_t cols, int64_t block, QuantActivations& out);

// y[t, r] (row stride w.rows) for r in [row_begin, row_end), t < a.n; quant_matvec_supports(w.dtype),
// a.block == quant_block_values(w.dtype). Throws on an unsupported ISA.
void quant_matvec_rows(const WeightView& w, const QuantActivations& a, float* y, int64_t row_begin,
                       int64_t row_end, QuantIsa isa);
// The same, quantising x[n, w.cols] first (into a per-thread buffer).
void quant_matvec_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t row_begin,
                       int64_t row_end, QuantIsa isa);

namespace detail {
// The SIMD paths (quant_matvec_avx2.cpp), compiled with target attributes.
void quant_matvec_rows_avx2(const WeightView& w, const QuantActivations& a, float* y, int64_t r0, int64_t r1);
void quant_matvec_rows_vnni(const WeightView& w, const QuantActivations& a, float* y, int64_t r0, int64_t r1);
}  // namespace detail

}  // namespace kvlab
