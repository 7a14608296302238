// The KV storage formats' decode fused into the tiled attention kernel's two inner products
// (internal to kernels/cpu; attention.cpp calls it for every format but f32 when keys are not
// rotated at read). For one tile of up to kTile keys given as their stored codes:
//   scores: S[q * ld + j] = q_q . k^_j        (q_q: the item's scaled queries, [n_q][D])
//   pv:     o_q <- alpha_q o_q + sum_j P[q * ld + j] v^_j
// where k^, v^ are the dequantised rows of kv_format.h (kv_decode_row / kv_kivi_decode_*). The
// codes are read once per tile and converted in registers: no row is decoded into memory. Every
// loaded key or value chunk serves up to 4 query vectors at once (the G heads of a GQA group,
// or several rows under a full selection); the 8-wide (AVX2) and 16-wide (AVX-512) kernels are
// chosen at run time from cpuid (fused_isa()), the scalar one is the portable path's (and the
// SIMD paths' fallback for a head dim that is not a multiple of their width, or a KIVI value
// group narrower than it).
//
// Arithmetic against the dequantised rows (the reference, attention_naive): bf16, f16 and KIVI
// rows are decoded exactly as kv_format.h does (KIVI: the same single-rounding fma(s, q, z)),
// so only the summation order differs from f32 attention over the dequantised rows. int8 and fp8
// apply their scale once per dot product (S = scale * (q . codes)) and fold it into the
// probability in the PV sum (p' = p * scale): each term carries at most two more roundings than
// with the decoded row (2u relative, u = 2^-24); attention_test_util.h's tolerances account for it.
#pragma once

#include <cstdint>

#include "kernels/common/kv_format.h"
#include "kernels/cpu/linear.h"

namespace kvlab {

// The instruction sets are the dense layers' (linear.h: kPortable = the scalar kernel here, kAvx2,
// kAvx512), detected by the same cpuid checks (matvec_isa_supported, to_string).
using FusedIsa = MatvecIsa;

inline constexpr int kFusedMaxKeys = 32;  // keys per tile (attention.cpp's kTile at most)
inline constexpr int kFusedMaxQ = 32;     // query vectors per call (its kMaxQ at most)

// One tile's coded rows (pointers into the KeyTile's arrays).
struct FusedRows {
  KvFormat format = KvFormat::kF32;
  int n = 0;           // keys in the tile
  int head_dim = 0;
  int group_size = 0;  // KIVI's G
  const uint8_t* const* k_codes = nullptr;  // [n] each row's codes
  const uint8_t* const* v_codes = nullptr;
  const float* k_scale = nullptr;  // [n] int8: the row's scale; fp8: the head's (else unused)
  const float* v_scale = nullptr;
  const float* const* k_meta = nullptr;  // [n] KIVI: the key group's s[D], z[D]
  const float* const* v_meta = nullptr;  // [n] KIVI: the value row's (s, z) per channel group
  const float* fp8_table = nullptr;      // fp8: the 256 decoded codes (kv_decode_e4m3 / e5m2)
};

void fused_scores(FusedIsa isa, const FusedRows& r, const float* q, int n_q, float* S, int ld);
void fused_pv(FusedIsa isa, const FusedRows& r, float* o, const float* alpha, const float* P, int ld, int n_q);

// The ISA the AVX2 instance of attention() uses: the best matvec_isa_supported() one, or the one
// a test set.
FusedIsa fused_isa();
// Tests only: force an ISA for the AVX2 instance (one the CPU supports; std::invalid_argument
// otherwise); kept until the next call. Not thread-safe against concurrent attention() calls.
void set_fused_isa_for_tests(FusedIsa isa);

}  // namespace kvlab
