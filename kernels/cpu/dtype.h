// Weight dtypes and their conversions to and from float32.
//
//   F16  : IEEE-754 binary16 (1 sign, 5 exponent, 10 mantissa bits); subnormals, inf and NaN kept.
//   BF16 : the top 16 bits of a float32; fp32 -> bf16 rounds to nearest even, NaN stays NaN.
//   Q8_0 : blocks of 32 values: one fp16 scale d and 32 int8 q, value = d * q. Quantization as in
//          ggml's reference: d = max|x| / 127, q = round_half_away_from_zero(x * (1/d)), where
//          1/d is computed from the float32 d before d is stored as fp16.
//   Q4_0 ... Q6_K: GGML's block types, see kernels/cpu/quant_blocks.h (to_float dequantises as
//          gguf-py does; from_float quantises where quantize_blocks can).
// All conversions of a finite value are exact or correctly rounded; tested in dtype_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvlab {

enum class DType {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  // GGML's block-quantised weight types (kernels/cpu/quant_blocks.h): weights only.
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

constexpr int64_t kQ8_0BlockSize = 32;
struct BlockQ8_0 {
  uint16_t d;                  // fp16 scale
  int8_t qs[kQ8_0BlockSize];   // quants
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 blocks are 34 bytes (ggml layout)");

const char* dtype_name(DType dtype);          // "f32" | "f16" | "bf16" | "q8_0" | "q4_0" ... "q6_k"
DType parse_dtype(std::string_view name);     // accepts the names above (any case); else throws
// Bytes of n elements (Q8_0: n must be a multiple of 32; 34 bytes per 32 elements; the block
// types of quant_blocks.h: a multiple of their block, 32 or 256 values).
size_t dtype_bytes(DType dtype, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);   // round to nearest even; overflow -> inf
float bf16_to_fp32(uint16_t b);
uint16_t fp32_to_bf16(float f);   // round to nearest even

// x[n] -> blocks[n / 32]; n must be a multiple of 32 (checked: throws kvlab::Error).
void quantize_q8_0(const float* x, BlockQ8_0* blocks, int64_t n);
void dequantize_q8_0(const BlockQ8_0* blocks, float* y, int64_t n);

// Converts n elements stored as `dtype` at src into float32 at dst (a row of a WeightView).
void to_float(DType dtype, const void* src, float* dst, int64_t n);
// Encodes n float32 values as `dtype` at dst (dtype_bytes(dtype, n) bytes).
void from_float(DType dtype, const float* src, void* dst, int64_t n);

// A weight matrix as stored: row-major [rows, cols] (rows = output features), any DType; data
// points into an mmap or an owned buffer held by the Model. Rows are contiguous: row r starts at
// data + r * dtype_bytes(dtype, cols) (Q8_0: cols is a multiple of 32). The dense-layer kernels
// (kernels/cpu/linear.h) take it as is.
struct WeightView {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  size_t row_bytes() const { return dtype_bytes(dtype, cols); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes();
  }
};

}  // namespace kvlab
