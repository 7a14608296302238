// Matvec for block-quantised weights (quant_blocks.h, and Q8_0) against int8-quantised
// activations, with integer dot products (the scheme of llama.cpp's q8_0 x q8_0, q4_0 x q8_0 and
// q4_K x q8_K paths; the code is kvlab's own).
//
//   Activations x[n, cols] are quantised per block of the weight type's block size B (32 or 256):
//     da = max|x_b| / 127 (fp32),  a_i = round(x_i / da) in [-127, 127],  s16[g] = sum of a over
//     each 16-value group.
//   Per weight block b (UnpackedBlock: value_i = (d sc_g) q_i - dmin m_g, g = i / 16), the
//   integer sums (int32, exact) are split into 8 lanes, the lanes one 32-byte register holds:
//     L_k = sum over the block's 32-value chunks c of sum_{j<4} sc_g q_i a_i,  i = 32c + 4k + j
//     S2  = sum_g m_g * s16[g]
//   (lane k is what vpmaddubsw + vpmaddwd, or vpdpbusd, leave in int32 lane k), then in fp32
//     acc_k <- fma(d * da, float(L_k), acc_k)      k = 0..7, blocks in order, acc_k = 0 at first
//     acc_m <- fma(dmin * da, float(S2), acc_m)    (+0 throughout for types without a min)
//   and y[t, r] = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)) - acc_m.
//   This is the order 8-wide SIMD does naturally (one vector accumulator, one fused multiply-add
//   per block, one horizontal sum per output), so no path reduces horizontally per block.
// Every ISA path computes the L_k and S2 exactly and then performs those float operations in that
// order (fma is fused, everything else rounds once; the files are compiled with -ffp-contract=off
// so the compiler fuses nothing else), so every path returns the same bits as the scalar
// reference (tested in quant_matvec_test.cpp).
//
// Error against the exact product with the fp32-dequantised weights: |x_i - da a_i| <= da / 2,
// so |y_r - sum_i w_ri x_i| <= sum_b (da_b / 2) sum_{i in b} |w_ri|  plus the fp32 rounding:
// d * da rounds once, each lane adds n_blocks terms, then 3 tree additions and the subtraction,
// so to first order <= (n_blocks + 5) u sum_b (sum_k |d da L_k| + |dmin da S2|), u = 2^-24
// (float(L_k) is exact: |L_k| <= 8 chunks * 4 * 32 * 127 * 128 < 2^24 for Q6_K, less for the rest).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/quant_blocks.h"

namespace kvlab {

// The 8 fp32 lanes of the contract above, and their final sum in its tree order.
constexpr int kQuantLanes = 8;
inline float quant_lane_tree(const float* acc) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

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
  std::vector<int32_t> s4;    // [n, cols / 4]: sums over 4 values (the contract's lanes' share)
  std::vector<int16_t> s2;    // [n, cols / 2]: sums over value pairs (vpmaddubsw's share)
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
