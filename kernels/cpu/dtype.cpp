#include "kernels/cpu/dtype.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define KVLAB_DTYPE_F16C 1
#endif

#include "kernels/common/error.h"
#include "kernels/cpu/quant_blocks.h"

namespace kvlab {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
    case DType::kQ5_0: return "q5_0";
    case DType::kQ5_1: return "q5_1";
    case DType::kQ2_K: return "q2_k";
    case DType::kQ3_K: return "q3_k";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ5_K: return "q5_k";
    case DType::kQ6_K: return "q6_k";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "f32" || lower == "float32") return DType::kF32;
  if (lower == "f16" || lower == "float16") return DType::kF16;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "q8_0") return DType::kQ8_0;
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K})
    if (lower == dtype_name(t)) return t;
  fail("unknown dtype '", name, "' (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, "
       "q4_k, q5_k or q6_k)");
}

size_t dtype_bytes(DType dtype, int64_t n) {
  const auto count = static_cast<size_t>(n);
  switch (dtype) {
    case DType::kF32: return count * 4;
    case DType::kF16: case DType::kBF16: return count * 2;
    case DType::kQ8_0:
      if (n % kQ8_0BlockSize != 0) fail("q8_0 needs a multiple of 32 elements, got ", n);
      return count / kQ8_0BlockSize * sizeof(BlockQ8_0);
    default:
      if (n % quant_block_values(dtype) != 0)
        fail(dtype_name(dtype), " needs a multiple of ", quant_block_values(dtype), " elements, got ", n);
      return count / static_cast<size_t>(quant_block_values(dtype)) * quant_block_bytes(dtype);
  }
}

// binary16: value = (-1)^s * 2^(e-15) * 1.m for 0 < e < 31; 2^-14 * 0.m for e == 0.
float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {
    // subnormal: normalise the mantissa
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return sign | 0x7C00 | (abs > 0x7F800000u ? 0x200 | ((abs >> 13) & 0x3FF) : 0);
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // result is subnormal (or zero) in fp16: value / 2^-24 rounded to nearest even
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - exp;  // 113 - exp + 13
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // normal: rebias exponent, round the 13 dropped mantissa bits to nearest even
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // carry may bump the exponent: correct
  return sign | static_cast<uint16_t>(h);
}

float bf16_to_fp32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

void quantize_q8_0(const float* x, BlockQ8_0* blocks, int64_t n) {
  if (n % kQ8_0BlockSize != 0) fail("q8_0 quantization needs a multiple of 32 values, got ", n);
  for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    float amax = 0;
    for (int64_t i = 0; i < kQ8_0BlockSize; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    blocks[b].d = fp32_to_fp16(d);
    for (int64_t i = 0; i < kQ8_0BlockSize; ++i) {
      blocks[b].qs[i] = static_cast<int8_t>(std::round(xb[i] * id));  // half away from zero
    }
  }
}

void dequantize_q8_0(const BlockQ8_0* blocks, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    for (int64_t i = 0; i < kQ8_0BlockSize; ++i) y[b * kQ8_0BlockSize + i] = d * blocks[b].qs[i];
  }
}

void to_float(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if KVLAB_DTYPE_F16C
      // Hardware conversion: exact, identical to fp16_to_fp32 (dtype_test checks all patterns).
      for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
      }
#endif
      for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case DType::kBF16: {
      // bf16_to_fp32 written out, so the loop vectorises (the out-of-line call per value was 23%
      // of a bf16 prefill: perf, 512 tokens, 1 thread); the same bits.
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    }
    case DType::kQ8_0:
      if (n % kQ8_0BlockSize != 0) fail("q8_0 needs a multiple of 32 values, got ", n);
      dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, n);
      return;
    default:
      dequantize_blocks(dtype, src, dst, n);
      return;
  }
}

void from_float(DType dtype, const float* src, void* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      auto* h = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if KVLAB_DTYPE_F16C
      // Round to nearest even, as fp32_to_fp16 (checked in dtype_test).
      for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
      }
#endif
      for (; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::kQ8_0:
      quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    default:
      quantize_blocks(dtype, src, dst, n);
      return;
  }
}

}  // namespace kvlab
