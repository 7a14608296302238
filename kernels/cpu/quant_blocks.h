// GGML's block-quantised weight types (the GGUF tensor types Q4_0 ... Q6_K) in kvlab: the block
// layouts, dequantisation, a simple quantiser, and the integer form the matvec kernels use.
//
// Layouts (ggml-common.h of llama.cpp; every scale is IEEE fp16, little-endian):
//   Q4_0  32 values, 18 B: d, qs[16]               v = d * (nib - 8)
//   Q4_1  32 values, 20 B: d, m, qs[16]            v = d * nib + m
//   Q5_0  32 values, 22 B: d, qh[4], qs[16]        v = d * ((nib | hbit << 4) - 16)
//   Q5_1  32 values, 24 B: d, m, qh[4], qs[16]     v = d * (nib | hbit << 4) + m
//     nib of value i: qs[i] & 15 for i < 16, qs[i - 16] >> 4 otherwise; hbit: bit i of qh (u32 LE)
//   Q2_K 256 values, 84 B: scales[16], qs[64], d, dmin       16 sub-blocks of 16
//     v = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4); q (2 bits) of value 128h + 32s + l
//     is (qs[32h + l] >> 2s) & 3
//   Q3_K 256 values, 110 B: hmask[32], qs[64], scales[12], d  16 sub-blocks of 16
//     v = d * (sc6[j] - 32) * (q2 - (hbit ? 0 : 4)); q2 as Q2_K, hbit of value 32k + l is bit k
//     of hmask[l]; sc6: 6-bit scales, low 4 bits in scales[0..7] (nibbles), high 2 in scales[8..11]
//   Q4_K 256 values, 144 B: d, dmin, scales[12], qs[128]     8 sub-blocks of 32
//     v = d * sc[j] * nib - dmin * m[j]; sc, m 6-bit (packed as ggml's get_scale_min_k4);
//     nib of value 64c + l: qs[32c + l] & 15, of value 64c + 32 + l: qs[32c + l] >> 4
//   Q5_K 256 values, 176 B: d, dmin, scales[12], qh[32], qs[128]   as Q4_K plus bit j of qh[l]
//     as bit 4 of value 32j + l
//   Q6_K 256 values, 210 B: ql[128], qh[64], scales[16] (int8), d   16 sub-blocks of 16
//     v = d * scales[j] * (q6 - 32); for half h and l < 32: value 128h + 32s + l has low nibble
//     from ql[64h + l + 32 (s & 1)] (>> 4 when s >= 2) and 2 high bits (qh[32h + l] >> 2s) & 3
//
// Every type is expressed as one integer form (UnpackedBlock): integer codes q[i], per 16-value
// group an integer scale sc and min m, and two floats d, dmin:
//     value_i = (d * sc[g]) * q[i] - (dmin * m[g])         g = i / 16
// (Q4_1 / Q5_1: sc = m = 1, dmin = -m_block; types without a min: dmin = 0, m = 0). Dequantising
// in exactly that float order gives the same bits as gguf-py's gguf/quants.py (tested by
// tests/reference/quants_ref_test.py), and the matvec kernels (quant_matvec.h) multiply q with
// int8 activations in integers and apply d, dmin once per block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/dtype.h"

namespace kvlab {

struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24, "ggml's 32-value block sizes");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "ggml's 256-value block sizes");

// True for the types above. Q8_0 (dtype.h: 32 values, 34 B: d, int8 qs[32], v = d * q) is not
// among them for conversion and the tools (dtype.h quantises and dequantises it), but it has the
// same integer form (sc = 1, m = 0, dmin = 0, q = qs) and the integer matvec runs it:
// quant_block_values / quant_block_bytes / unpack_scales / unpack_block accept it too.
bool is_block_quant(DType t);
int64_t quant_block_values(DType t);  // 32 or 256 (block quant types and Q8_0)
size_t quant_block_bytes(DType t);

// One block in integer form (see the header comment). Groups of 16 values; a 32-value block
// uses groups 0 and 1.
struct alignas(32) UnpackedBlock {
  int8_t q[256];
  int16_t sc[16];
  int16_t m[16];
  float d = 0, dmin = 0;
};
// Scales only (sc, m, d, dmin) of a block of type T: shared by the scalar and SIMD paths.
template <DType T>
inline void unpack_scales_of(const uint8_t* p, UnpackedBlock& out);

// Plain-loop decode of one block (the reference the SIMD decoders are tested against).
void unpack_block(DType t, const uint8_t* block, UnpackedBlock& out);
// Scales only (sc, m, d, dmin), for decoders that unpack q themselves.
void unpack_scales(DType t, const uint8_t* block, UnpackedBlock& out);

// n values (a multiple of the block) of type t at src -> fp32, bit for bit as gguf-py.
void dequantize_blocks(DType t, const void* src, float* dst, int64_t n);
// fp32 -> blocks: Q4_0/Q4_1/Q5_0/Q5_1 as gguf-py's quantize_blocks (bit for bit, tested);
// Q4_K/Q5_K/Q6_K with a simple per-sub-block min/max quantiser of kvlab's own (valid blocks,
// not llama.cpp's search); Q2_K/Q3_K are not supported (throws). n a multiple of the block.
void quantize_blocks(DType t, const float* src, void* dst, int64_t n);
bool has_quantiser(DType t);  // quantize_blocks supports t

// ---- implementation of unpack_scales_of --------------------------------------------------

namespace quant_detail {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Q4_K / Q5_K: 8 six-bit scales and mins packed into 12 bytes (ggml's get_scale_min_k4):
// j < 4: sc = s[j] & 63, m = s[j + 4] & 63;
// j >= 4: sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4, m = (s[j + 4] >> 4) | (s[j] >> 6) << 4.
inline void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K: 16 six-bit scales (minus 32): low nibbles in bytes 0..7 (j < 8: low, j >= 8: high
// nibble of byte j - 8), the 2 high bits of scale 4k + b at bits 2k of byte 8 + b.
inline int scale_q3k(const uint8_t* s, int j) {
  const int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | hi << 4) - 32;
}

}  // namespace quant_detail

template <DType T>
inline void unpack_scales_of(const uint8_t* p, UnpackedBlock& out) {
  using quant_detail::half_at;
  if constexpr (T == DType::kQ4_0 || T == DType::kQ5_0 || T == DType::kQ8_0) {
    out.d = half_at(p);
    out.dmin = 0;
    out.sc[0] = out.sc[1] = 1;
    out.m[0] = out.m[1] = 0;
  } else if constexpr (T == DType::kQ4_1 || T == DType::kQ5_1) {
    // v = d * q + m_block, written as (d * 1) * q - (-m_block * 1): exact, the same bits.
    out.d = half_at(p);
    out.dmin = -half_at(p + 2);
    out.sc[0] = out.sc[1] = 1;
    out.m[0] = out.m[1] = 1;
  } else if constexpr (T == DType::kQ2_K) {
    const auto* b = reinterpret_cast<const BlockQ2_K*>(p);
    out.d = half_at(p + offsetof(BlockQ2_K, d));
    out.dmin = half_at(p + offsetof(BlockQ2_K, dmin));
    for (int j = 0; j < 16; ++j) out.sc[j] = b->scales[j] & 15, out.m[j] = b->scales[j] >> 4;
  } else if constexpr (T == DType::kQ3_K) {
    const auto* b = reinterpret_cast<const BlockQ3_K*>(p);
    out.d = half_at(p + offsetof(BlockQ3_K, d));
    out.dmin = 0;
    for (int j = 0; j < 16; ++j) out.sc[j] = static_cast<int16_t>(quant_detail::scale_q3k(b->scales, j)), out.m[j] = 0;
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    out.d = half_at(p);
    out.dmin = half_at(p + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      quant_detail::scale_min_k4(p + 4, j, sc, m);
      out.sc[2 * j] = out.sc[2 * j + 1] = static_cast<int16_t>(sc);
      out.m[2 * j] = out.m[2 * j + 1] = static_cast<int16_t>(m);
    }
  } else if constexpr (T == DType::kQ6_K) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(p);
    out.d = half_at(p + offsetof(BlockQ6_K, d));
    out.dmin = 0;
    for (int j = 0; j < 16; ++j) out.sc[j] = b->scales[j], out.m[j] = 0;
  }
}

}  // namespace kvlab
