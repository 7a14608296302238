// KV storage formats of the host paged store (POLICIES.md section 17): how one row (one token's
// head_dim features of one KV head, a key or a value) is encoded in a block, and decoded back.
// Header-only and host-only plain C++: the store (framework/kv) encodes, the CPU attention kernels
// and every key reader decode, the NumPy reference (tests/reference/kv_format_ref.py) re-derives
// the same codes bit for bit.
//
//   f32       the row as is (4 bytes a feature; the exact reference and the default).
//   bf16      the top 16 bits of the float, round to nearest even.
//   f16       IEEE binary16, round to nearest even, overflow to inf, subnormals kept.
//   int8      symmetric, one scale per (token, KV head) row: s = max|x| / 127 (float32),
//             q = clamp(rint(x / s), -127, 127), x^ = q * s  (s = 0 for an all-zero row: q = 0).
//   fp8_e4m3  x / S encoded as OCP E4M3FN (bias 7, no inf, max 448), x^ = S * e4m3(q), with S
//             the scale of the (layer, KV head) (vLLM's default S = 1.0); saturating: |x / S| past
//             the largest finite value takes it (vLLM's kv-cache cast clamps the same way).
//   fp8_e5m2  likewise with E5M2 (bias 15, max 57344, saturating; inf is never produced).
//   int4/int2 KIVI (arXiv 2402.02750; jy-yuan/KIVI), asymmetric with b bits, L = 2^b - 1:
//             keys per channel over a group of G slots (s_d = (max_d - min_d) / L, z_d = min_d
//             over the group's live tokens), values per token over groups of G channels;
//             q = clamp(rint((x - z) / s), 0, L) (q = 0 where s = 0), x^ = fma(s, q, z) (one
//             rounding). The R most recent slots stay fp32 in the store's residual (KvStore:
//             a key group is quantised once all its slots are older than the R newest).
//             Codes packed little-end first: channel d at bits b * (d mod 8/b) of byte d*b/8.
// Rounding everywhere is to nearest, ties to even (rint / nearbyint in the default mode).
// NaN is refused (encode_row returns false; the store turns it into an Error naming the layer):
// a NaN would poison a row scale and it means the model already diverged. An infinite feature
// is refused by the scaled formats (int8, fp8: its scale would be inf) and kept by bf16 / f16.
//
// Block layout of one arena (K or V) of a block with P = page_size slots and H KV heads:
//   codes[H][P][row_bytes]            row (head h, entry e) at (h * P + e) * row_bytes
//   row_scale[H][P] float32           int8 only, at meta_begin + (h * P + e) * 4 (data_bytes
//                                     rounded up to 4)
//   int4 / int2 K arena: key_meta[H][n_key_groups][2][D] float32 (s then z of each channel) at
//             meta_begin, n_key_groups = max(1, P / G) (G > P: each block of a group keeps a copy);
//   int4 / int2 V arena: value_meta[H][P][D / G][2] float32 (s, z of each channel group).
// so the per-row metadata lives beside the block's data and is copied with it (copy-on-write,
// compaction move a row's codes and its scale together: bit-exact). f32 blocks are exactly the
// fp32 layout of kernels/common/paged_kv.h. Both arenas have block_bytes() per block (the larger
// of the two layouts; equal when P = G).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvlab {

enum class KvFormat : uint8_t { kF32, kBf16, kF16, kInt8, kFp8E4m3, kFp8E5m2, kInt4, kInt2 };

inline constexpr KvFormat kAllKvFormats[] = {KvFormat::kF32,     KvFormat::kBf16,     KvFormat::kF16,
                                            KvFormat::kInt8,    KvFormat::kFp8E4m3, KvFormat::kFp8E5m2,
                                            KvFormat::kInt4,    KvFormat::kInt2};
// The formats whose rows are encoded one at a time (all but KIVI's int4 / int2).
inline constexpr KvFormat kRowKvFormats[] = {KvFormat::kF32,  KvFormat::kBf16,     KvFormat::kF16,
                                            KvFormat::kInt8, KvFormat::kFp8E4m3, KvFormat::kFp8E5m2};
inline bool kv_format_is_kivi(KvFormat f) { return f == KvFormat::kInt4 || f == KvFormat::kInt2; }
inline int kv_format_bits(KvFormat f) { return f == KvFormat::kInt4 ? 4 : f == KvFormat::kInt2 ? 2 : 0; }

inline const char* kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::kF32: return "f32";
    case KvFormat::kBf16: return "bf16";
    case KvFormat::kF16: return "f16";
    case KvFormat::kInt8: return "int8";
    case KvFormat::kFp8E4m3: return "fp8_e4m3";
    case KvFormat::kFp8E5m2: return "fp8_e5m2";
    case KvFormat::kInt4: return "int4";
    case KvFormat::kInt2: return "int2";
  }
  return "?";
}

// The largest finite value of an fp8 format (E4M3FN 448, E5M2 57344); 0 for the others.
constexpr float kv_fp8_max(KvFormat f) {
  return f == KvFormat::kFp8E4m3 ? 448.f : f == KvFormat::kFp8E5m2 ? 57344.f : 0.f;
}

// "f32, bf16, f16, int8, fp8_e4m3, fp8_e5m2, int4, int2" (for error messages).
inline std::string kv_format_names() {
  std::string s;
  for (KvFormat f : kAllKvFormats) s += (s.empty() ? "" : ", ") + std::string(kv_format_name(f));
  return s;
}

// False when `name` is none of kv_format_names() (exact, lower case).
inline bool parse_kv_format(std::string_view name, KvFormat* out) {
  for (KvFormat f : kAllKvFormats)
    if (name == kv_format_name(f)) { *out = f; return true; }
  return false;
}

inline int kv_format_elem_bytes(KvFormat f) {
  switch (f) {
    case KvFormat::kF32: return 4;
    case KvFormat::kBf16:
    case KvFormat::kF16: return 2;
    default: return 1;
  }
}
inline int kv_format_row_meta_bytes(KvFormat f) { return f == KvFormat::kInt8 ? 4 : 0; }
inline bool kv_format_has_head_scale(KvFormat f) {
  return f == KvFormat::kFp8E4m3 || f == KvFormat::kFp8E5m2;
}

// One arena (K or V) of one block: where a row's codes and metadata are (layout above).
struct KvBlockLayout {
  KvFormat format = KvFormat::kF32;
  int page_size = 0, num_kv_heads = 0, head_dim = 0;
  int group_size = 32;  // KIVI's G (int4 / int2 only)

  size_t row_bytes() const {
    return kv_format_is_kivi(format) ? static_cast<size_t>(head_dim) * kv_format_bits(format) / 8
                                     : static_cast<size_t>(head_dim) * kv_format_elem_bytes(format);
  }
  size_t rows() const { return static_cast<size_t>(num_kv_heads) * page_size; }
  size_t data_bytes() const { return rows() * row_bytes(); }
  size_t meta_begin() const { return (data_bytes() + 3) / 4 * 4; }  // float-aligned
  int key_groups_per_block() const { return page_size >= group_size ? page_size / group_size : 1; }
  size_t key_meta_bytes() const {
    if (kv_format_is_kivi(format)) return static_cast<size_t>(num_kv_heads) * key_groups_per_block() * 2 * head_dim * 4;
    return rows() * kv_format_row_meta_bytes(format);
  }
  size_t value_meta_bytes() const {
    if (kv_format_is_kivi(format)) return rows() * (head_dim / group_size) * 2 * 4;
    return rows() * kv_format_row_meta_bytes(format);
  }
  // The bytes per block of each arena: data, then metadata; non-f32 blocks are padded to 64
  // bytes so every block starts on a cache line (f32 keeps today's exact size).
  size_t block_bytes() const {
    const size_t b = meta_begin() + std::max(key_meta_bytes(), value_meta_bytes());
    return format == KvFormat::kF32 ? b : (b + 63) / 64 * 64;
  }
  // KIVI: s[D] then z[D] of the key group holding entry e of head h; a value row's (s, z) pairs.
  size_t key_group_meta_offset(int head_idx, int entry_idx) const {
    const int grp = page_size >= group_size ? entry_idx / group_size : 0;
    return meta_begin() + (static_cast<size_t>(head_idx) * key_groups_per_block() + grp) * 2 * head_dim * 4;
  }
  size_t value_meta_offset(int head_idx, int entry_idx) const {
    return meta_begin() + (static_cast<size_t>(head_idx) * page_size + entry_idx) * (head_dim / group_size) * 2 * 4;
  }
  size_t row_offset(int head_idx, int entry_idx) const {
    return (static_cast<size_t>(head_idx) * page_size + entry_idx) * row_bytes();
  }
  size_t meta_offset(int head_idx, int entry_idx) const {
    return meta_begin() + (static_cast<size_t>(head_idx) * page_size + entry_idx) * 4;
  }
};

// ---- scalar conversions (the definitions the tests and the NumPy reference check) ------------

inline uint32_t kv_float_bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float kv_bits_float(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

inline uint16_t kv_encode_bf16(float x) {  // round to nearest even (x not NaN)
  const uint32_t u = kv_float_bits(x);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float kv_decode_bf16(uint16_t b) { return kv_bits_float(static_cast<uint32_t>(b) << 16); }

// A sign-magnitude minifloat with `e_bits` exponent and `m_bits` mantissa bits, bias
// 2^(e_bits-1) - 1, subnormals, and largest finite code `max_code` (magnitude bits): codes are
// contiguous in magnitude, so rounding the scaled mantissa up into the next binade needs no
// special case. Saturates at max_code. Used for f16 (5, 10, 0x7BFF; overflow to inf is
// handled by the caller), e4m3 (4, 3, 0x7E) and e5m2 (5, 2, 0x7B).
inline uint32_t kv_encode_minifloat(float x, int e_bits, int m_bits, uint32_t max_code) {
  const uint32_t sign = std::signbit(x) ? 1u << (e_bits + m_bits) : 0u;
  const double a = std::fabs(static_cast<double>(x));
  const int bias = (1 << (e_bits - 1)) - 1;
  uint32_t mag;
  if (a == 0) {
    mag = 0;
  } else if (a < std::ldexp(1.0, 1 - bias)) {  // subnormal: multiples of 2^(1 - bias - m_bits)
    mag = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, bias - 1 + m_bits)));
  } else {
    int e;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    e -= 1;
    if (e + bias >= (1 << e_bits)) {
      mag = max_code;  // far past the range (also inf)
    } else {
      const double r = std::nearbyint(std::ldexp(a, m_bits - e));  // in [2^m, 2^(m+1)]
      mag = (static_cast<uint32_t>(e + bias) << m_bits) + static_cast<uint32_t>(r) - (1u << m_bits);
    }
  }
  if (mag > max_code) mag = max_code;
  return sign | mag;
}
inline float kv_decode_minifloat(uint32_t code, int e_bits, int m_bits) {
  const int bias = (1 << (e_bits - 1)) - 1;
  const uint32_t mag = code & ((1u << (e_bits + m_bits)) - 1);
  const int e = static_cast<int>(mag >> m_bits);
  const uint32_t m = mag & ((1u << m_bits) - 1);
  const double v = e == 0 ? std::ldexp(static_cast<double>(m), 1 - bias - m_bits)
                          : std::ldexp(static_cast<double>((1u << m_bits) + m), e - bias - m_bits);
  return static_cast<float>((code >> (e_bits + m_bits)) & 1u ? -v : v);
}

inline uint16_t kv_encode_f16(float x) {  // IEEE binary16, round to nearest even (x not NaN)
  // Past the largest finite half (65504) by at least half an ulp (65520) rounds to inf.
  if (std::fabs(x) >= 65520.f) return std::signbit(x) ? 0xFC00 : 0x7C00;
  return static_cast<uint16_t>(kv_encode_minifloat(x, 5, 10, 0x7BFF));
}
inline float kv_decode_f16(uint16_t h) {
  if ((h & 0x7C00) == 0x7C00)  // inf (NaN is never stored)
    return (h & 0x8000) ? -INFINITY : INFINITY;
  return kv_decode_minifloat(h, 5, 10);
}
inline uint8_t kv_encode_e4m3(float x) { return static_cast<uint8_t>(kv_encode_minifloat(x, 4, 3, 0x7E)); }
inline float kv_decode_e4m3(uint8_t c) { return kv_decode_minifloat(c, 4, 3); }
inline uint8_t kv_encode_e5m2(float x) { return static_cast<uint8_t>(kv_encode_minifloat(x, 5, 2, 0x7B)); }
inline float kv_decode_e5m2(uint8_t c) { return kv_decode_minifloat(c, 5, 2); }

// ---- rows ---------------------------------------------------------------------------------------

// False when x holds a NaN, or an infinity for a scaled format (int8, fp8, int4, int2).
inline bool kv_row_storable(KvFormat format, const float* x, int head_dim) {
  const bool scaled = format == KvFormat::kInt8 || kv_format_has_head_scale(format) || kv_format_is_kivi(format);
  for (int d = 0; d < head_dim; ++d) {
    if (std::isnan(x[d])) return false;
    if (std::isinf(x[d]) && scaled) return false;
  }
  return true;
}

// Encodes x[head_dim] as `format` into codes (row_bytes) and, for int8, *row_scale. head_scale:
// fp8's S of this (layer, KV head). Returns false (writing nothing meaningful) when x holds a
// NaN, or an infinity for int8 / fp8.
inline bool kv_encode_row(KvFormat format, const float* x, int head_dim, float head_scale,
                          uint8_t* codes, float* row_scale) {
  if (!kv_row_storable(format, x, head_dim)) return false;
  switch (format) {
    case KvFormat::kF32:
      std::memcpy(codes, x, sizeof(float) * head_dim);
      return true;
    case KvFormat::kBf16:
      for (int d = 0; d < head_dim; ++d) {
        const uint16_t b = kv_encode_bf16(x[d]);
        std::memcpy(codes + 2 * d, &b, 2);
      }
      return true;
    case KvFormat::kF16:
      for (int d = 0; d < head_dim; ++d) {
        const uint16_t h = kv_encode_f16(x[d]);
        std::memcpy(codes + 2 * d, &h, 2);
      }
      return true;
    case KvFormat::kInt8: {
      float amax = 0.f;
      for (int d = 0; d < head_dim; ++d) amax = std::fmax(amax, std::fabs(x[d]));
      const float s = amax / 127.f;
      *row_scale = s;
      for (int d = 0; d < head_dim; ++d) {
        float q = s > 0.f ? std::nearbyint(x[d] / s) : 0.f;
        q = std::fmin(127.f, std::fmax(-127.f, q));  // s subnormal: x / s may overshoot 127
        codes[d] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
      return true;
    }
    case KvFormat::kFp8E4m3:
    case KvFormat::kFp8E5m2:
      for (int d = 0; d < head_dim; ++d) {
        const float y = x[d] / head_scale;
        codes[d] = format == KvFormat::kFp8E4m3 ? kv_encode_e4m3(y) : kv_encode_e5m2(y);
      }
      return true;
    case KvFormat::kInt4:
    case KvFormat::kInt2:
      return false;  // KIVI: groups, not rows (kv_kivi_* below)
  }
  return false;
}

// Scale a decoded code is multiplied by: int8 the row's, fp8 the head's, else 1.
inline void kv_decode_row(KvFormat format, const uint8_t* codes, int head_dim, float scale, float* out) {
  switch (format) {
    case KvFormat::kF32:
      std::memcpy(out, codes, sizeof(float) * head_dim);
      return;
    case KvFormat::kBf16:
      for (int d = 0; d < head_dim; ++d) {
        uint16_t b;
        std::memcpy(&b, codes + 2 * d, 2);
        out[d] = kv_decode_bf16(b);
      }
      return;
    case KvFormat::kF16:
      for (int d = 0; d < head_dim; ++d) {
        uint16_t h;
        std::memcpy(&h, codes + 2 * d, 2);
        out[d] = kv_decode_f16(h);
      }
      return;
    case KvFormat::kInt8:
      for (int d = 0; d < head_dim; ++d) out[d] = static_cast<float>(static_cast<int8_t>(codes[d])) * scale;
      return;
    case KvFormat::kFp8E4m3:
      for (int d = 0; d < head_dim; ++d) out[d] = kv_decode_e4m3(codes[d]) * scale;
      return;
    case KvFormat::kFp8E5m2:
      for (int d = 0; d < head_dim; ++d) out[d] = kv_decode_e5m2(codes[d]) * scale;
      return;
    case KvFormat::kInt4:
    case KvFormat::kInt2:
      return;  // KIVI: kv_kivi_decode_key / _value
  }
}

// ---- KIVI (int4 / int2) ------------------------------------------------------------------------

// Range of n values (x[i * stride], those with live[i] when live is given): s = (max - min) / L,
// z = min, in float32; (s, z) = (0, 0) when nothing is live. Returns false when s overflows
// (|x| near FLT_MAX). A zero max or min is taken as +0: fmax/fmin may return either zero of
// -0 and +0 (C's fmin; GCC -march=native and clang -march=x86-64 builds chose differently),
// so the stored s and z would otherwise depend on the compiler.
inline bool kv_kivi_range(const float* x, int n, size_t stride, const uint8_t* live, int bits, float* s, float* z) {
  float mx = -INFINITY, mn = INFINITY;
  for (int i = 0; i < n; ++i) {
    if (live != nullptr && !live[i]) continue;
    mx = std::fmax(mx, x[i * stride]);
    mn = std::fmin(mn, x[i * stride]);
  }
  if (mx < mn) { *s = 0.f; *z = 0.f; return true; }
  if (mx == 0.f) mx = 0.f;
  if (mn == 0.f) mn = 0.f;
  *s = (mx - mn) / static_cast<float>((1 << bits) - 1);
  *z = mn;
  return std::isfinite(*s);
}
inline uint32_t kv_kivi_code(float x, float s, float z, int bits) {
  if (!(s > 0.f)) return 0;
  const float q = std::nearbyint((x - z) / s);
  return static_cast<uint32_t>(std::fmin(static_cast<float>((1 << bits) - 1), std::fmax(0.f, q)));
}
inline float kv_kivi_value(uint32_t q, float s, float z) { return std::fma(s, static_cast<float>(q), z); }
inline void kv_kivi_put(uint8_t* codes, int d, int bits, uint32_t q) {
  const int per = 8 / bits, sh = bits * (d % per);
  codes[d / per] = static_cast<uint8_t>((codes[d / per] & ~(((1u << bits) - 1) << sh)) | (q << sh));
}
inline uint32_t kv_kivi_get(const uint8_t* codes, int d, int bits) {
  const int per = 8 / bits;
  return (codes[d / per] >> (bits * (d % per))) & ((1u << bits) - 1);
}
// A key row with its group's per-channel s[D], z[D]; a value row with its (s, z) pairs per
// group of G channels ([D / G][2]).
inline void kv_kivi_encode_key(const float* x, int D, int bits, const float* s, const float* z, uint8_t* codes) {
  for (int d = 0; d < D; ++d) kv_kivi_put(codes, d, bits, kv_kivi_code(x[d], s[d], z[d], bits));
}
inline void kv_kivi_decode_key(const uint8_t* codes, int D, int bits, const float* s, const float* z, float* out) {
  for (int d = 0; d < D; ++d) out[d] = kv_kivi_value(kv_kivi_get(codes, d, bits), s[d], z[d]);
}
inline bool kv_kivi_encode_value(const float* x, int D, int G, int bits, float* sz, uint8_t* codes) {
  for (int g = 0; g < D / G; ++g) {
    if (!kv_kivi_range(x + g * G, G, 1, nullptr, bits, &sz[2 * g], &sz[2 * g + 1])) return false;
    for (int d = g * G; d < (g + 1) * G; ++d) kv_kivi_put(codes, d, bits, kv_kivi_code(x[d], sz[2 * g], sz[2 * g + 1], bits));
  }
  return true;
}
inline void kv_kivi_decode_value(const uint8_t* codes, int D, int G, int bits, const float* sz, float* out) {
  for (int d = 0; d < D; ++d) out[d] = kv_kivi_value(kv_kivi_get(codes, d, bits), sz[2 * (d / G)], sz[2 * (d / G) + 1]);
}

}  // namespace kvlab
