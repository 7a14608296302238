// The fused decode-and-attend kernels of attention_fused.h: the scalar one here, the 8-wide
// (AVX2 + FMA + F16C) and 16-wide (AVX-512 F/BW/VL/DQ) ones from attention_fused_simd.inc, each
// under its target pragma (so this file adds nothing a baseline x86-64 CPU cannot run unless
// the dispatch picks it).
#include "kernels/cpu/attention_fused.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/simd_target.h"
#include "kernels/cpu/linear.h"

namespace kvlab {
namespace {

// ---- scalar: one element at a time, each code converted once per tile ------------------------

// Element d of key (key = true) or value row j, decoded as kv_format.h does (int8 / fp8 with
// their scale).
float elem(const FusedRows& r, bool key, int j, int d) {
  const uint8_t* c = key ? r.k_codes[j] : r.v_codes[j];
  switch (r.format) {
    case KvFormat::kBf16: { uint16_t b; std::memcpy(&b, c + 2 * d, 2); return kv_decode_bf16(b); }
    case KvFormat::kF16: { uint16_t h; std::memcpy(&h, c + 2 * d, 2); return kv_decode_f16(h); }
    case KvFormat::kInt8: return static_cast<float>(static_cast<int8_t>(c[d])) * (key ? r.k_scale : r.v_scale)[j];
    case KvFormat::kFp8E4m3:
    case KvFormat::kFp8E5m2: return r.fp8_table[c[d]] * (key ? r.k_scale : r.v_scale)[j];
    case KvFormat::kInt4:
    case KvFormat::kInt2: {
      const uint32_t q = kv_kivi_get(c, d, kv_format_bits(r.format));
      if (key) return kv_kivi_value(q, r.k_meta[j][d], r.k_meta[j][r.head_dim + d]);
      const float* sz = r.v_meta[j] + 2 * (d / r.group_size);
      return kv_kivi_value(q, sz[0], sz[1]);
    }
    case KvFormat::kF32: break;
  }
  return 0.f;
}

void scores_scalar(const FusedRows& r, const float* q, int n_q, float* S, int ld) {
  const int D = r.head_dim;
  float acc[kFusedMaxQ];
  for (int j = 0; j < r.n; ++j) {
    std::fill(acc, acc + n_q, 0.f);
    for (int d = 0; d < D; ++d) {
      const float x = elem(r, true, j, d);
      for (int i = 0; i < n_q; ++i) acc[i] += q[static_cast<size_t>(i) * D + d] * x;
    }
    for (int i = 0; i < n_q; ++i) S[static_cast<size_t>(i) * ld + j] = acc[i];
  }
}

void pv_scalar(const FusedRows& r, float* o, const float* alpha, const float* P, int ld, int n_q) {
  const int D = r.head_dim;
  for (int i = 0; i < n_q; ++i)
    for (int d = 0; d < D; ++d) o[static_cast<size_t>(i) * D + d] *= alpha[i];
  for (int j = 0; j < r.n; ++j)
    for (int d = 0; d < D; ++d) {
      const float x = elem(r, false, j, d);
      for (int i = 0; i < n_q; ++i) o[static_cast<size_t>(i) * D + d] += P[static_cast<size_t>(i) * ld + j] * x;
    }
}

}  // namespace

// ---- SIMD instances ------------------------------------------------------------------------------

namespace fused_avx2 {
KVLAB_TARGET_BEGIN("avx2,fma,f16c")
#define KVLAB_FW 8
#include "kernels/cpu/attention_fused_simd.inc"  // NOLINT(bugprone-suspicious-include)
#undef KVLAB_FW
KVLAB_TARGET_END
}  // namespace fused_avx2

namespace fused_avx512 {
KVLAB_TARGET_AVX512_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#define KVLAB_FW 16
#include "kernels/cpu/attention_fused_simd.inc"  // NOLINT(bugprone-suspicious-include)
#undef KVLAB_FW
KVLAB_TARGET_AVX512_END
}  // namespace fused_avx512

// ---- dispatch ------------------------------------------------------------------------------------

namespace {
std::atomic<int> g_forced{-1};
}  // namespace

FusedIsa fused_isa() {
  static const FusedIsa best = matvec_isa_supported(FusedIsa::kAvx512) ? FusedIsa::kAvx512
                               : matvec_isa_supported(FusedIsa::kAvx2)  ? FusedIsa::kAvx2
                                                                        : FusedIsa::kPortable;
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced < 0 ? best : static_cast<FusedIsa>(forced);
}

void set_fused_isa_for_tests(FusedIsa isa) {
  if (!matvec_isa_supported(isa)) throw std::invalid_argument(std::string("fused attention: this CPU lacks ") + to_string(isa));
  g_forced.store(static_cast<int>(isa), std::memory_order_relaxed);
}

void fused_scores(FusedIsa isa, const FusedRows& r, const float* q, int n_q, float* S, int ld) {
  if (isa == FusedIsa::kAvx512 && fused_avx512::scores(r, q, n_q, S, ld)) return;
  if (isa == FusedIsa::kAvx2 && fused_avx2::scores(r, q, n_q, S, ld)) return;
  scores_scalar(r, q, n_q, S, ld);
}

void fused_pv(FusedIsa isa, const FusedRows& r, float* o, const float* alpha, const float* P, int ld, int n_q) {
  if (isa == FusedIsa::kAvx512 && fused_avx512::pv(r, o, alpha, P, ld, n_q)) return;
  if (isa == FusedIsa::kAvx2 && fused_avx2::pv(r, o, alpha, P, ld, n_q)) return;
  pv_scalar(r, o, alpha, P, ld, n_q);
}

}  // namespace kvlab
