// Tiled online-softmax attention over the paged KV view (contract in attention.h).
//
// Work item = (KV head g, a block of rows, a chunk of the group's query heads): its Q query
// vectors all read the same key list (with a full selection several rows share it; an explicit
// selection is per row), so each key tile is loaded once for all Q of them. Per tile of up to
// kTile candidate keys (valid, and not past the item's last query position):
//   S[q][j] = tau q_q . k_j   (-inf where position(k_j) > position(q))  -- dot4x2 / dot8, hsum8
//   online-softmax update of (m_q, l_q), O_q <- alpha O_q + sum_j p_qj v_j  -- exp8, pv4 / pv
// Queries go in register-blocked groups of 4 (the G heads of a GQA group, or rows), so a key or
// value chunk loaded once feeds 4 FMAs; a remainder of 1-3 queries uses the one-query kernels.
// and at the end O_q / l_q, LSE_q = m_q + log l_q. With key_mass, each tile's raw scores S (and
// its slots) are also kept in per-thread scratch; once the item's LSEs are known its column sums
// col_j = sum_q exp(S[q][j] - LSE_q) are formed from them, so no key is read twice. Column sums
// go into key_mass directly on one thread (items run in order), else into per-item buffers that
// are added per KV head in item order afterwards: the same sums in the same order either way.
// head_mass is formed from the same kept scores, one row per query of the window.
//
// Storage formats (kernels/common/kv_format.h): with a store in any format but f32 the walker
// decodes each candidate key's and value's row, as it enters the tile, into the tile's scratch
// rows (kTile x D floats each, in L1) and the tile runs on those: the cache is read once, in its
// stored bytes, and never copied to full precision. The decoded floats are exactly
// kv_decode_row's (the conversions are exact; int8 / fp8 multiply by the same float scale), so
// the fast path reads the same values as attention_naive.
//
// This file is compiled twice (cpu_path.h): as itself, the portable instance (plain loops, the
// build's baseline ISA; it also holds the dispatching attention()), and through
// attention_avx2.cpp with KVLAB_ATTENTION_AVX2=1, where every function below is compiled with
// target("avx2,fma") and the 8-wide helpers are used. Only the helpers and the four places
// that call them differ between the two (#if KVLAB_ATTENTION_AVX2).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/online_softmax.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/cpu_path.h"

#ifndef KVLAB_ATTENTION_AVX2
#define KVLAB_ATTENTION_AVX2 0
#endif

// Everything from here to the matching pop gets the AVX2+FMA target in the AVX2 instance (the
// headers above keep the baseline, so their inline functions are the same in both objects).
#if KVLAB_ATTENTION_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#endif

namespace kvlab {

void attention_tiled_avx2(const AttentionArgs& a, int n_threads);      // attention_avx2.cpp
void attention_tiled_portable(const AttentionArgs& a, int n_threads);  // this file

namespace {

constexpr int kTile = 32;   // keys per tile (a multiple of 8)
constexpr int kMaxQ = 32;   // query vectors per work item
static_assert(kTile % 8 == 0);

#if KVLAB_ATTENTION_AVX2
// ---- 8-wide helpers (AVX2 + FMA) --------------------------------------------------------------

// [sum(a0), sum(a1), ..., sum(a7)]: the 8 horizontal sums in one register.
inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                    __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
  const __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline float hsum(__m256 a) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline float hmax(__m256 a) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// exp(x) for x <= 0 (softmax after the max shift); exactly 0 below -87.3 (and for -inf).
// x = n ln2 + r, |r| <= ln2/2; e^r by degree-6 Taylor (rel. error < 2e-7); 2^n via the exponent.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// out[0..8) = q . k[i] for 8 key rows (D a multiple of 8).
inline __m256 dot8(const float* q, const float* const* k, int D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int d = 0; d < D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[0] + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[1] + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[2] + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[3] + d), a3);
    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[4] + d), a4);
    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[5] + d), a5);
    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[6] + d), a6);
    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[7] + d), a7);
  }
  return hsum8(a0, a1, a2, a3, a4, a5, a6, a7);
}

// o[0 .. 8*NC) = alpha * o + sum_j p[j] v[j][0 .. 8*NC), accumulators held in registers.
template <int NC>
inline void pv_chunk(float* o, float alpha, const float* p, const float* const* v, int n) {
  __m256 acc[NC];
  const __m256 a = _mm256_set1_ps(alpha);
  for (int c = 0; c < NC; ++c) acc[c] = _mm256_mul_ps(a, _mm256_loadu_ps(o + 8 * c));
  for (int j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v[j] + 8 * c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm256_storeu_ps(o + 8 * c, acc[c]);
}

// o[D] = alpha * o + sum_j p[j] v[j] (D a multiple of 8), in register passes of <= 64 dims.
void pv_accumulate(float* o, float alpha, const float* p, const float* const* v, int n, int D) {
  const float* vj[kTile];
  for (int d = 0; d < D; d += 64) {
    for (int j = 0; j < n; ++j) vj[j] = v[j] + d;
    switch (std::min(8, (D - d) / 8)) {
      case 1: pv_chunk<1>(o + d, alpha, p, vj, n); break;
      case 2: pv_chunk<2>(o + d, alpha, p, vj, n); break;
      case 3: pv_chunk<3>(o + d, alpha, p, vj, n); break;
      case 4: pv_chunk<4>(o + d, alpha, p, vj, n); break;
      case 5: pv_chunk<5>(o + d, alpha, p, vj, n); break;
      case 6: pv_chunk<6>(o + d, alpha, p, vj, n); break;
      case 7: pv_chunk<7>(o + d, alpha, p, vj, n); break;
      default: pv_chunk<8>(o + d, alpha, p, vj, n); break;
    }
  }
}

// Scores of 4 queries x 2 keys: out[2 i + k] = q_i . k_k (D a multiple of 8). Each loaded key
// chunk serves 4 queries and each query chunk 2 keys: 6 loads per 8 FMAs (dot8: 9 per 8).
inline void dot4x2(const float* q, size_t q_stride, const float* k0, const float* k1, int D,
                   float* out) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00;
  for (int d = 0; d < D; d += 8) {
    const __m256 x0 = _mm256_loadu_ps(k0 + d), x1 = _mm256_loadu_ps(k1 + d);
    __m256 qv = _mm256_loadu_ps(q + d);
    a00 = _mm256_fmadd_ps(qv, x0, a00);
    a01 = _mm256_fmadd_ps(qv, x1, a01);
    qv = _mm256_loadu_ps(q + q_stride + d);
    a10 = _mm256_fmadd_ps(qv, x0, a10);
    a11 = _mm256_fmadd_ps(qv, x1, a11);
    qv = _mm256_loadu_ps(q + 2 * q_stride + d);
    a20 = _mm256_fmadd_ps(qv, x0, a20);
    a21 = _mm256_fmadd_ps(qv, x1, a21);
    qv = _mm256_loadu_ps(q + 3 * q_stride + d);
    a30 = _mm256_fmadd_ps(qv, x0, a30);
    a31 = _mm256_fmadd_ps(qv, x1, a31);
  }
  _mm256_storeu_ps(out, hsum8(a00, a01, a10, a11, a20, a21, a30, a31));
}

// For 4 queries at once: o_i[d .. d + 8 NC) = alpha_i o_i + sum_j P_i[j] v_j; each loaded value
// chunk serves the 4 queries (NC + 4 loads per 4 NC FMAs).
template <int NC>
inline void pv4_chunk(float* const* o, const float* alpha, const float* const* P,
                      const float* const* v, int n, int d) {
  __m256 acc[4][NC];
  for (int i = 0; i < 4; ++i) {
    const __m256 a = _mm256_set1_ps(alpha[i]);
    for (int c = 0; c < NC; ++c) acc[i][c] = _mm256_mul_ps(a, _mm256_loadu_ps(o[i] + d + 8 * c));
  }
  for (int j = 0; j < n; ++j) {
    __m256 x[NC];
    for (int c = 0; c < NC; ++c) x[c] = _mm256_loadu_ps(v[j] + d + 8 * c);
    for (int i = 0; i < 4; ++i) {
      const __m256 p = _mm256_broadcast_ss(P[i] + j);
      for (int c = 0; c < NC; ++c) acc[i][c] = _mm256_fmadd_ps(p, x[c], acc[i][c]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(o[i] + d + 8 * c, acc[i][c]);
}

void pv4_accumulate(float* const* o, const float* alpha, const float* const* P,
                    const float* const* v, int n, int D) {
  int d = 0;
  for (; d + 16 <= D; d += 16) pv4_chunk<2>(o, alpha, P, v, n, d);
  if (d < D) pv4_chunk<1>(o, alpha, P, v, n, d);
}

// Row decoders of the storage formats (exact: the same floats as kv_decode_row).
inline void decode_bf16_row(const uint8_t* codes, int D, float* out) {
  for (int d = 0; d < D; d += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * d));
    _mm256_storeu_ps(out + d, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
}
__attribute__((target("avx2,fma,f16c"))) inline void decode_f16_row(const uint8_t* codes, int D, float* out) {
  for (int d = 0; d < D; d += 8)
    _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * d))));
}
inline void decode_int8_row(const uint8_t* codes, int D, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int d = 0; d < D; d += 8) {
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + d));
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), s));
  }
}
// fp8: a 256-entry table gathered 8 at a time, times the head's scale (table[c] * scale, as the
// scalar loop).
inline void decode_fp8_row(const uint8_t* codes, int D, const float* table, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int d = 0; d < D; d += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + d)));
    _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_i32gather_ps(table, idx, 4), s));
  }
}

// KIVI: 8 channels' codes (b bits each, little end first) as floats.
inline __m256 kivi_codes8(const uint8_t* codes, int d, int bits) {
  uint32_t w = 0;
  std::memcpy(&w, codes + d * bits / 8, static_cast<size_t>(bits));  // 4 bytes (int4) or 2 (int2)
  const __m256i sh = bits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                               : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                                     _mm256_set1_epi32((1 << bits) - 1));
  return _mm256_cvtepi32_ps(q);
}
// x^ = fma(s, q, z): the same single rounding as kv_kivi_value.
inline void decode_kivi_key_row(const uint8_t* codes, int D, int bits, const float* s, const float* z, float* out) {
  for (int d = 0; d < D; d += 8)
    _mm256_storeu_ps(out + d, _mm256_fmadd_ps(_mm256_loadu_ps(s + d), kivi_codes8(codes, d, bits), _mm256_loadu_ps(z + d)));
}
inline void decode_kivi_value_row(const uint8_t* codes, int D, int G, int bits, const float* sz, float* out) {
  for (int d = 0; d < D; d += 8) {
    const __m256 sv = _mm256_set1_ps(sz[2 * (d / G)]), zv = _mm256_set1_ps(sz[2 * (d / G) + 1]);
    _mm256_storeu_ps(out + d, _mm256_fmadd_ps(sv, kivi_codes8(codes, d, bits), zv));
  }
}
#endif  // KVLAB_ATTENTION_AVX2

// KIVI rows (kv_format.h): vectorised where the channels come in eights (and value groups too).
inline void decode_kivi_key(const uint8_t* codes, int D, int bits, const float* s, const float* z, float* out) {
#if KVLAB_ATTENTION_AVX2
  if (D % 8 == 0) { decode_kivi_key_row(codes, D, bits, s, z, out); return; }
#endif
  kv_kivi_decode_key(codes, D, bits, s, z, out);
}
inline void decode_kivi_value(const uint8_t* codes, int D, int G, int bits, const float* sz, float* out) {
#if KVLAB_ATTENTION_AVX2
  if (D % 8 == 0 && G % 8 == 0) { decode_kivi_value_row(codes, D, G, bits, sz, out); return; }
#endif
  kv_kivi_decode_value(codes, D, G, bits, sz, out);
}

// The 256 values of an fp8 code (kv_format.h), built once.
const float* fp8_table(KvFormat f) {
  struct Tables {
    float e4m3[256], e5m2[256];
    Tables() {
      for (int c = 0; c < 256; ++c) {
        e4m3[c] = kv_decode_e4m3(static_cast<uint8_t>(c));
        e5m2[c] = kv_decode_e5m2(static_cast<uint8_t>(c));
      }
    }
  };
  static const Tables tables;
  return f == KvFormat::kFp8E4m3 ? tables.e4m3 : tables.e5m2;
}

// out[D] = the decoded row (format != f32; scale: kv_format.h's row or head scale).
inline void decode_row(KvFormat f, const uint8_t* codes, int D, float scale, float* out) {
#if KVLAB_ATTENTION_AVX2
  if (D % 8 == 0) {
    switch (f) {
      case KvFormat::kBf16: decode_bf16_row(codes, D, out); return;
      case KvFormat::kF16: decode_f16_row(codes, D, out); return;
      case KvFormat::kInt8: decode_int8_row(codes, D, scale, out); return;
      default: break;
    }
  }
#endif
  if (f == KvFormat::kFp8E4m3 || f == KvFormat::kFp8E5m2) {
    const float* table = fp8_table(f);
#if KVLAB_ATTENTION_AVX2
    if (D % 8 == 0) { decode_fp8_row(codes, D, table, scale, out); return; }
#endif
    for (int d = 0; d < D; ++d) out[d] = table[codes[d]] * scale;
    return;
  }
  kv_decode_row(f, codes, D, scale, out);
}

// ---- work items -------------------------------------------------------------------------------

struct WorkItem {
  int kv_head;
  int row_begin, row_end;    // rows [row_begin, row_end)
  int head_begin, head_end;  // query heads [head_begin, head_end) of the group
};

// Per-thread scratch (reused across calls; sized on demand).
struct Scratch {
  std::vector<float> q;       // [kMaxQ, D] scaled queries
  std::vector<float> o;       // [kMaxQ, D] accumulators
  std::vector<float> s;       // [kMaxQ, kTile] scores, then probabilities
  std::vector<float> krot;    // [kTile, D] keys rotated at read
  std::vector<float> kdec, vdec;  // [kTile, D] the tile's decoded rows (formats other than f32)
  std::vector<float> zeros;   // [D] padding row
  // key_mass only: the item's raw scores, tile after tile ([n_tiles][n_q][kTile]), and each
  // tile's slots ([n_tiles][kTile], padded) and key count.
  std::vector<float> raw_s;
  std::vector<int32_t> raw_slot;
  std::vector<int> raw_n;
  void ensure(int D) {
    const size_t qd = static_cast<size_t>(kMaxQ) * D;
    if (q.size() < qd) { q.resize(qd); o.resize(qd); }
    s.resize(static_cast<size_t>(kMaxQ) * kTile);
    if (krot.size() < static_cast<size_t>(kTile) * D) {
      krot.resize(static_cast<size_t>(kTile) * D);
      kdec.resize(static_cast<size_t>(kTile) * D);
      vdec.resize(static_cast<size_t>(kTile) * D);
    }
    if (zeros.size() < static_cast<size_t>(D)) zeros.assign(D, 0.f);
  }
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// One tile of candidate keys for a KV head.
struct KeyTile {
  int n = 0;
  int32_t slot[kTile];
  int64_t pos[kTile];
  const float* k[kTile];
  const float* v[kTile];
};

// Walks the item's candidate slots (the selection of its row, or all slots) in order, skipping
// holes and keys past max_pos, and fills tiles of up to kTile keys. Keys are rotated into
// scratch.krot when rope-at-read is on.
class KeyWalker {
 public:
  KeyWalker(const AttentionArgs& a, const WorkItem& it, int64_t max_pos, Scratch& scratch)
      : a_(a), g_(it.kv_head), max_pos_(max_pos), scratch_(scratch),
        tile_keys_(a.head_dim > 64 ? kTile / 2 : kTile), format_(a.kv.format()),
        row_bytes_(a.kv.layout.row_bytes()), kivi_(a.kv.kivi()), bits_(kv_format_bits(a.kv.format())) {
    if (format_ != KvFormat::kF32) {
      k_scale_ = a.kv.k_head_scale ? a.kv.k_head_scale[g_] : 1.f;
      v_scale_ = a.kv.v_head_scale ? a.kv.v_head_scale[g_] : 1.f;
    }
    if (selection_is_all(a)) {
      all_ = true;
      end_ = a.kv.n_slots;
    } else {
      ranges_ = a.selection->list(a.selection_row + it.row_begin, g_);  // explicit: one row per item
      if (!ranges_.empty()) { cur_ = ranges_[0].begin; end_ = ranges_[0].end; }
    }
  }

  bool next(KeyTile& t) {
    t.n = 0;
    const LayerKv& kv = a_.kv;
    const int H = kv.view.num_kv_heads;
    while (t.n < tile_keys_) {
      if (cur_ >= end_) {
        if (all_ || ++range_idx_ >= ranges_.size()) break;
        cur_ = ranges_[range_idx_].begin;
        end_ = ranges_[range_idx_].end;
        continue;
      }
      const int s = cur_++;
      const size_t cell = static_cast<size_t>(s) * H + g_;
      if (!kv.valid[cell] || kv.positions[cell] > max_pos_) continue;
      if (s >= block_end_) enter_block(s);  // one division per block, not per key
      t.slot[t.n] = s;
      t.pos[t.n] = kv.positions[cell];
      if (format_ == KvFormat::kF32) {
        const size_t row = static_cast<size_t>(s - block_begin_) * a_.head_dim;
        if (next_k_ != nullptr) prefetch_row(next_k_ + row, next_v_ + row);
        t.k[t.n] = block_k_ + row;
        t.v[t.n] = block_v_ + row;
      } else if (kivi_) {
        const LayerKv& kv = a_.kv;
        const int e = s - block_begin_;
        const size_t row = static_cast<size_t>(e) * row_bytes_;
        if (s >= kv.kivi_q_slots) {  // the fp32 residual: read in place
          t.k[t.n] = kv.residual_key(s, g_);
          t.v[t.n] = kv.residual_value(s, g_);
        } else {
          if (next_kc_ != nullptr) prefetch_codes(next_kc_ + row, next_vc_ + row);
          float* kd = scratch_.kdec.data() + static_cast<size_t>(t.n) * a_.head_dim;
          float* vd = scratch_.vdec.data() + static_cast<size_t>(t.n) * a_.head_dim;
          const float* km = reinterpret_cast<const float*>(block_kbase_ + kv.layout.key_group_meta_offset(g_, e));
          const float* vm = reinterpret_cast<const float*>(block_vbase_ + kv.layout.value_meta_offset(g_, e));
          decode_kivi_key(block_kc_ + row, a_.head_dim, bits_, km, km + a_.head_dim, kd);
          decode_kivi_value(block_vc_ + row, a_.head_dim, kv.layout.group_size, bits_, vm, vd);
          t.k[t.n] = kd;
          t.v[t.n] = vd;
        }
      } else {
        const int e = s - block_begin_;
        const size_t row = static_cast<size_t>(e) * row_bytes_;
        if (next_kc_ != nullptr) prefetch_codes(next_kc_ + row, next_vc_ + row);
        float* kd = scratch_.kdec.data() + static_cast<size_t>(t.n) * a_.head_dim;
        float* vd = scratch_.vdec.data() + static_cast<size_t>(t.n) * a_.head_dim;
        decode_row(format_, block_kc_ + row, a_.head_dim, block_ks_ ? block_ks_[e] : k_scale_, kd);
        decode_row(format_, block_vc_ + row, a_.head_dim, block_vs_ ? block_vs_[e] : v_scale_, vd);
        t.k[t.n] = kd;
        t.v[t.n] = vd;
      }
      ++t.n;
    }
    if (a_.rope != nullptr) {
      const int D = a_.head_dim;
      for (int j = 0; j < t.n; ++j) {
        float* dst = scratch_.krot.data() + static_cast<size_t>(j) * D;
        std::memcpy(dst, t.k[j], sizeof(float) * D);
        a_.rope->rotate(dst, a_.key_rope_pos[static_cast<size_t>(t.slot[j]) * H + g_]);
        t.k[j] = dst;
      }
    }
    return t.n > 0;
  }

 private:
  // Slots only increase (ranges are sorted), so the block of the current slot is cached.
  void enter_block(int s) {
    const PagedKvView<const float>& v = a_.kv.view;
    const int b = s / v.page_size;
    block_begin_ = b * v.page_size;
    block_end_ = block_begin_ + v.page_size;
    if (format_ != KvFormat::kF32) {  // the block's codes of head g and (int8) its row scales
      const LayerKv& kv = a_.kv;
      const size_t bb = kv.layout.block_bytes();
      const size_t base = static_cast<size_t>(v.indices[v.indptr[0] + b]) * bb;
      block_kbase_ = kv.k_bytes + base;
      block_vbase_ = kv.v_bytes + base;
      block_kc_ = kv.k_bytes + base + kv.layout.row_offset(g_, 0);
      block_vc_ = kv.v_bytes + base + kv.layout.row_offset(g_, 0);
      if (format_ == KvFormat::kInt8) {
        block_ks_ = reinterpret_cast<const float*>(kv.k_bytes + base + kv.layout.meta_offset(g_, 0));
        block_vs_ = reinterpret_cast<const float*>(kv.v_bytes + base + kv.layout.meta_offset(g_, 0));
      }
      next_kc_ = next_vc_ = nullptr;
      if (v.indptr[0] + b + 2 < v.indptr[1]) {
        const size_t next = static_cast<size_t>(v.indices[v.indptr[0] + b + 2]) * bb + kv.layout.row_offset(g_, 0);
        next_kc_ = kv.k_bytes + next;
        next_vc_ = kv.v_bytes + next;
      }
      return;
    }
    const size_t off = v.offset(v.indices[v.indptr[0] + b], g_, 0, 0);
    block_k_ = v.k_data + off;
    block_v_ = v.v_data + off;
    // The next block of the table is another page: the hardware prefetcher does not follow
    // the jump, so each key also prefetches its row two blocks ahead (two measured a little
    // better than one on the cold decode benchmark).
    next_k_ = next_v_ = nullptr;
    if (v.indptr[0] + b + 2 < v.indptr[1]) {
      const size_t next = v.offset(v.indices[v.indptr[0] + b + 2], g_, 0, 0);
      next_k_ = v.k_data + next;
      next_v_ = v.v_data + next;
    }
  }
  // Every line of the row: measured ~25% faster on the cold decode benchmark than prefetching
  // only the first line of each row or of each block (the streamer restarts on each page).
  void prefetch_row(const float* k, const float* v) const {
    for (int d = 0; d < a_.head_dim; d += 16) {  // one 64-byte line per 16 floats
      _mm_prefetch(reinterpret_cast<const char*>(k + d), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v + d), _MM_HINT_T0);
    }
  }

  void prefetch_codes(const uint8_t* k, const uint8_t* v) const {
    for (size_t o = 0; o < row_bytes_; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(k + o), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v + o), _MM_HINT_T0);
    }
  }

  const AttentionArgs& a_;
  int g_;
  int block_begin_ = 0, block_end_ = 0;
  const float* block_k_ = nullptr;
  const float* block_v_ = nullptr;
  const float* next_k_ = nullptr;
  const float* next_v_ = nullptr;
  int64_t max_pos_;
  Scratch& scratch_;
  int tile_keys_;  // K and V of a tile stay within ~16 KiB of L1
  KvFormat format_;
  size_t row_bytes_;
  bool kivi_;
  int bits_;
  const uint8_t* block_kbase_ = nullptr;  // the current block's start (KIVI metadata)
  const uint8_t* block_vbase_ = nullptr;
  // Formats other than f32: the current block's codes of head g (and int8 row scales), the
  // head scales (fp8), the codes two blocks ahead (prefetch).
  const uint8_t* block_kc_ = nullptr;
  const uint8_t* block_vc_ = nullptr;
  const float* block_ks_ = nullptr;
  const float* block_vs_ = nullptr;
  float k_scale_ = 1.f, v_scale_ = 1.f;
  const uint8_t* next_kc_ = nullptr;
  const uint8_t* next_vc_ = nullptr;
  bool all_ = false;
  std::span<const SlotRange> ranges_;
  size_t range_idx_ = 0;
  int cur_ = 0, end_ = 0;
};

// The item's query vectors: q index = (row - row_begin) * n_item_heads + (head - head_begin).
struct ItemQueries {
  int n = 0;
  int64_t pos[kMaxQ];
  int64_t max_pos = -1;
  int row[kMaxQ], head[kMaxQ];
};

ItemQueries item_queries(const AttentionArgs& a, const WorkItem& it, Scratch& sc) {
  ItemQueries iq;
  const int D = a.head_dim;
  iq.max_pos = INT64_MIN;
  for (int r = it.row_begin; r < it.row_end; ++r) {
    for (int h = it.head_begin; h < it.head_end; ++h) {
      const float* src = a.q + (static_cast<size_t>(r) * a.n_heads + h) * D;
      float* dst = sc.q.data() + static_cast<size_t>(iq.n) * D;
      for (int d = 0; d < D; ++d) dst[d] = a.scale * src[d];
      iq.pos[iq.n] = a.q_positions[r];
      iq.row[iq.n] = r;
      iq.head[iq.n] = h;
      iq.max_pos = std::max(iq.max_pos, a.q_positions[r]);
      ++iq.n;
    }
  }
  return iq;
}

// S[q][0..kTile) for every query of the item: scores of the tile's keys, -inf where masked
// (causality per query, and the padding past t.n).
void tile_scores(const ItemQueries& iq, const KeyTile& t, const Scratch& sc, float* S, int D) {
  const bool simd = KVLAB_ATTENTION_AVX2 && D % 8 == 0;
  const float* kp[kTile];
  for (int j = 0; j < kTile; ++j) kp[j] = j < t.n ? t.k[j] : sc.zeros.data();
  int64_t tile_max_pos = INT64_MIN;
  for (int j = 0; j < t.n; ++j) tile_max_pos = std::max(tile_max_pos, t.pos[j]);
  int q = 0;
#if KVLAB_ATTENTION_AVX2
  const int n8 = (t.n + 7) / 8 * 8;
  if (simd) {  // groups of 4 queries share every key load
    for (; q + 4 <= iq.n; q += 4) {
      const float* qv = sc.q.data() + static_cast<size_t>(q) * D;
      float* rows = S + static_cast<size_t>(q) * kTile;
      alignas(32) float r[8];
      for (int j = 0; j < n8; j += 2) {
        dot4x2(qv, D, kp[j], kp[j + 1], D, r);
        for (int i = 0; i < 4; ++i) {
          rows[i * kTile + j] = r[2 * i];
          rows[i * kTile + j + 1] = r[2 * i + 1];
        }
      }
    }
  }
#endif
  for (; q < iq.n; ++q) {
    const float* qv = sc.q.data() + static_cast<size_t>(q) * D;
    float* row = S + static_cast<size_t>(q) * kTile;
    if (simd) {
#if KVLAB_ATTENTION_AVX2
      for (int j = 0; j < n8; j += 8) _mm256_storeu_ps(row + j, dot8(qv, kp + j, D));
#endif
    } else {
      for (int j = 0; j < t.n; ++j) {
        float acc = 0.f;
        for (int d = 0; d < D; ++d) acc += qv[d] * kp[j][d];
        row[j] = acc;
      }
    }
  }
  // Padding and causality.
  for (q = 0; q < iq.n; ++q) {
    float* row = S + static_cast<size_t>(q) * kTile;
    for (int j = t.n; j < kTile; ++j) row[j] = kNegInf;
    if (tile_max_pos > iq.pos[q])
      for (int j = 0; j < t.n; ++j)
        if (t.pos[j] > iq.pos[q]) row[j] = kNegInf;
  }
}

// Column sums of one item: where its keys go when key_mass / head_mass is set.
struct ItemMass {
  std::vector<int32_t> slot;  // [n_keys] in walk order
  std::vector<float> mass;    // [n_keys] sum over the item's queries of exp(s - LSE) (key_mass)
  std::vector<int> head;      // [n_window] query head of each window query (head_mass)
  std::vector<float> head_p;  // [n_window][n_keys] its exp(s - LSE)
};

// Adds n values at slots into dst[slot[j]].
void add_at(float* dst, const int32_t* slot, const float* x, size_t n) {
  for (size_t j = 0; j < n; ++j) dst[slot[j]] += x[j];
}

// Adds a buffered item's sums into key_mass[g, :] and head_mass[its heads, :].
void add_item_mass(const AttentionArgs& a, int g, const ItemMass& m) {
  const size_t n = m.slot.size(), n_slots = static_cast<size_t>(a.kv.n_slots);
  if (a.key_mass != nullptr) add_at(a.key_mass + g * n_slots, m.slot.data(), m.mass.data(), n);
  for (size_t w = 0; w < m.head.size(); ++w)
    add_at(a.head_mass + m.head[w] * n_slots, m.slot.data(), m.head_p.data() + w * n, n);
}

// From the scores kept in sc.raw_* during run_item: col_j = sum_q exp(S[q][j] - LSE_q), summed
// over q in order (queries with LSE = -inf saw nothing and add nothing), and for each window
// query (row >= head_mass_first_row) its own row exp(S[q][j] - LSE_q). Added to key_mass /
// head_mass directly when `direct`, else stored in `item_mass`.
void item_key_mass(const AttentionArgs& a, const WorkItem& it, const ItemQueries& iq, const float* lse,
                   Scratch& sc, bool direct, ItemMass* item_mass) {
  const int n_q = iq.n;
  const size_t n_tiles = sc.raw_n.size(), n_slots = static_cast<size_t>(a.kv.n_slots);
  int window[kMaxQ], n_window = 0;  // the window queries, in q order
  if (a.head_mass != nullptr)
    for (int q = 0; q < n_q; ++q)
      if (iq.row[q] >= a.head_mass_first_row && lse[q] != kNegInf) window[n_window++] = q;
  size_t n_keys = 0;
  for (int n : sc.raw_n) n_keys += n;
  if (!direct) {
    item_mass->slot.resize(n_keys);
    if (a.key_mass != nullptr) item_mass->mass.resize(n_keys);
    item_mass->head.resize(n_window);
    for (int w = 0; w < n_window; ++w) item_mass->head[w] = iq.head[window[w]];
    item_mass->head_p.resize(n_window * n_keys);
  }
  size_t out = 0;
  for (size_t ti = 0; ti < n_tiles; ++ti) {
    const float* S = sc.raw_s.data() + ti * static_cast<size_t>(n_q) * kTile;
    const int32_t* slot = sc.raw_slot.data() + ti * kTile;
    const int n = sc.raw_n[ti];
    alignas(32) float col[kTile] = {};
    alignas(32) float p[kTile];
    int w = 0;  // next window query
    for (int q = 0; q < n_q; ++q) {
      if (lse[q] == kNegInf) continue;
      const float* row = S + static_cast<size_t>(q) * kTile;
#if KVLAB_ATTENTION_AVX2
      const __m256 l = _mm256_set1_ps(lse[q]);
      for (int j = 0; j < kTile; j += 8) _mm256_store_ps(p + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), l)));
#else
      for (int j = 0; j < n; ++j) p[j] = std::exp(row[j] - lse[q]);
#endif
      if (a.key_mass != nullptr)
        for (int j = 0; j < n; ++j) col[j] += p[j];
      if (w < n_window && window[w] == q) {
        if (direct)
          add_at(a.head_mass + iq.head[q] * n_slots, slot, p, n);
        else
          std::copy(p, p + n, item_mass->head_p.begin() + static_cast<ptrdiff_t>(w * n_keys + out));
        ++w;
      }
    }
    if (direct) {
      if (a.key_mass != nullptr) add_at(a.key_mass + it.kv_head * n_slots, slot, col, n);
    } else {
      std::copy(slot, slot + n, item_mass->slot.begin() + static_cast<ptrdiff_t>(out));
      if (a.key_mass != nullptr) std::copy(col, col + n, item_mass->mass.begin() + static_cast<ptrdiff_t>(out));
    }
    out += n;
  }
}

// Gemma 2's soft-capping of the tile's scores (rows of kTile, the first n_keys live): s <- c tanh(s / c);
// masked entries stay -inf.
void softcap_scores(float* S, int n_queries, int n_keys, float cap) {
  for (int q = 0; q < n_queries; ++q) {
    float* row = S + static_cast<size_t>(q) * kTile;
    for (int j = 0; j < n_keys; ++j)
      if (row[j] != kNegInf) row[j] = cap * std::tanh(row[j] / cap);
  }
}

// One work item of the main pass. With key_mass / head_mass set, the sums go to them directly
// (`direct`) or into *item_mass.
void run_item(const AttentionArgs& a, const WorkItem& it, float* lse_all, bool direct,
              ItemMass* item_mass) {
  Scratch& sc = thread_scratch();
  const int D = a.head_dim;
  sc.ensure(D);
  const ItemQueries iq = item_queries(a, it, sc);
  std::fill(sc.o.begin(), sc.o.begin() + static_cast<ptrdiff_t>(iq.n) * D, 0.f);
  SoftmaxState st[kMaxQ];
  KeyWalker walker(a, it, iq.max_pos, sc);
  KeyTile t;
  float* S = sc.s.data();
  const bool simd = KVLAB_ATTENTION_AVX2 && D % 8 == 0;
  const bool mass = a.key_mass != nullptr || a.head_mass != nullptr;
  if (mass) { sc.raw_s.clear(); sc.raw_slot.clear(); sc.raw_n.clear(); }
  while (walker.next(t)) {
    tile_scores(iq, t, sc, S, D);
    if (a.softcap > 0) softcap_scores(S, iq.n, t.n, a.softcap);
    if (mass) {  // keep the raw scores for the column sums (S is overwritten by p below)
      sc.raw_s.insert(sc.raw_s.end(), S, S + static_cast<size_t>(iq.n) * kTile);
      sc.raw_slot.insert(sc.raw_slot.end(), t.slot, t.slot + t.n);
      sc.raw_slot.resize(sc.raw_slot.size() + (kTile - t.n), 0);
      sc.raw_n.push_back(t.n);
    }
    float alpha[kMaxQ];
    for (int q = 0; q < iq.n; ++q) {
      float* row = S + static_cast<size_t>(q) * kTile;
      // m' = max(m, max_j s_j); alpha = exp(m - m'); p_j = exp(s_j - m') (0 where masked; a
      // query that sees nothing in the tile gets alpha 1, or 0 while it has seen nothing).
#if KVLAB_ATTENTION_AVX2
      const int n8 = (t.n + 7) / 8 * 8;
      __m256 mx = _mm256_set1_ps(kNegInf);
      for (int j = 0; j < n8; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(row + j));
      float shift;
      alpha[q] = softmax_rescale(st[q], hmax(mx), &shift);
      __m256 lsum = _mm256_setzero_ps();
      const __m256 sh = _mm256_set1_ps(shift);
      for (int j = 0; j < n8; j += 8) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), sh));
        _mm256_storeu_ps(row + j, p);
        lsum = _mm256_add_ps(lsum, p);
      }
      st[q].l += hsum(lsum);
#else
      float mx = kNegInf;
      for (int j = 0; j < t.n; ++j) mx = std::max(mx, row[j]);
      float shift;
      alpha[q] = softmax_rescale(st[q], mx, &shift);
      float lsum = 0.f;
      for (int j = 0; j < t.n; ++j) lsum += (row[j] = std::exp(row[j] - shift));
      st[q].l += lsum;
#endif
    }
    // O_q <- alpha_q O_q + sum_j p_qj v_j
    int q = 0;
#if KVLAB_ATTENTION_AVX2
    if (simd) {
      for (; q + 4 <= iq.n; q += 4) {
        float* o4[4];
        const float* p4[4];
        for (int i = 0; i < 4; ++i) {
          o4[i] = sc.o.data() + static_cast<size_t>(q + i) * D;
          p4[i] = S + static_cast<size_t>(q + i) * kTile;
        }
        pv4_accumulate(o4, alpha + q, p4, t.v, t.n, D);
      }
    }
#endif
    for (; q < iq.n; ++q) {
      const float* row = S + static_cast<size_t>(q) * kTile;
      float* o = sc.o.data() + static_cast<size_t>(q) * D;
      if (simd) {
#if KVLAB_ATTENTION_AVX2
        pv_accumulate(o, alpha[q], row, t.v, t.n, D);
#endif
      } else {
        for (int d = 0; d < D; ++d) {
          float acc = alpha[q] * o[d];
          for (int j = 0; j < t.n; ++j) acc += row[j] * t.v[j][d];
          o[d] = acc;
        }
      }
    }
  }
  for (int q = 0; q < iq.n; ++q) {
    const size_t qh = static_cast<size_t>(iq.row[q]) * a.n_heads + iq.head[q];
    float* out = a.out + qh * D;
    const float* o = sc.o.data() + static_cast<size_t>(q) * D;
    const float inv = st[q].l > 0.f ? 1.f / st[q].l : 0.f;
    for (int d = 0; d < D; ++d) out[d] = o[d] * inv;
    if (lse_all != nullptr) lse_all[qh] = softmax_lse(st[q]);
  }
  if (mass) {
    float lse[kMaxQ];
    for (int q = 0; q < iq.n; ++q) lse[q] = softmax_lse(st[q]);
    item_key_mass(a, it, iq, lse, sc, direct, item_mass);
  }
}

// Items for the main pass. Rows share an item only under a full selection; a group wider than
// kMaxQ heads is split into head chunks.
std::vector<WorkItem> make_items(const AttentionArgs& a) {
  const int G = a.n_heads / a.n_kv_heads;
  const int heads_per_item = std::min(G, kMaxQ);
  const int rows_per_item = selection_is_all(a) ? std::max(1, kMaxQ / heads_per_item) : 1;
  std::vector<WorkItem> items;
  for (int r0 = 0; r0 < a.n_rows; r0 += rows_per_item)
    for (int g = 0; g < a.n_kv_heads; ++g)
      for (int h0 = 0; h0 < G; h0 += heads_per_item)
        items.push_back({g, r0, std::min(a.n_rows, r0 + rows_per_item), g * G + h0,
                         g * G + std::min(G, h0 + heads_per_item)});
  return items;
}

}  // namespace

#if KVLAB_ATTENTION_AVX2
void attention_tiled_avx2(const AttentionArgs& a, int n_threads) {
#else
void attention_tiled_portable(const AttentionArgs& a, int n_threads) {
#endif
  check_attention_args(a);
  if (a.n_rows == 0) return;
  n_threads = std::max(1, n_threads);
  const std::vector<WorkItem> items = make_items(a);
  const int n_items = static_cast<int>(items.size());
  const bool parallel = n_threads > 1 && n_items > 1;
  // key_mass / head_mass: one thread runs the items in order and adds as it goes; several
  // threads would race (and add in a schedule-dependent order), so each item keeps its sums and
  // they are added afterwards per KV head in item order -- the same sums in the same order (an
  // item's heads belong to its KV head).
  const bool direct = !parallel;
  std::vector<ItemMass> item_mass;
  if ((a.key_mass != nullptr || a.head_mass != nullptr) && !direct) item_mass.resize(items.size());
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (parallel)
  for (int i = 0; i < n_items; ++i)
    run_item(a, items[i], a.lse, direct, item_mass.empty() ? nullptr : &item_mass[i]);

  if (item_mass.empty()) return;
  const int Hkv = a.n_kv_heads;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (Hkv > 1)
  for (int g = 0; g < Hkv; ++g)
    for (int i = 0; i < n_items; ++i)
      if (items[i].kv_head == g) add_item_mass(a, g, item_mass[i]);
}

#if !KVLAB_ATTENTION_AVX2
void attention(const AttentionArgs& a, int n_threads, CpuPath path) {
  if (path == CpuPath::kAvx2) {
    if (!cpu_has_avx2_fma_f16c()) throw std::invalid_argument("attention: this CPU has no AVX2+FMA");
    attention_tiled_avx2(a, n_threads);
  } else {
    attention_tiled_portable(a, n_threads);
  }
}

void attention(const AttentionArgs& a, int n_threads) { attention(a, n_threads, cpu_path()); }
#endif

}  // namespace kvlab

#if KVLAB_ATTENTION_AVX2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
