// Element types of the device KV store (bf16, fp16, fp32) and their conversions, for kernels
// templated on the storage type T. Device-only (included by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kvlab::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements of T in one 16-byte vector (the unit of every global load: 8 bf16/fp16, 4 fp32).
template <class T>
inline constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// Converts the kVec16<T> elements of a 16-byte value to floats.
template <class T>
__device__ __forceinline__ void vec16_to_float(const uint4& raw, float* out) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec16<T>; ++i) out[i] = to_float(e[i]);
}

// Two consecutive elements as floats (the PV loop's unit: a feature pair).
__device__ __forceinline__ float2 pair_to_float2(const float* p) { return make_float2(p[0], p[1]); }
__device__ __forceinline__ float2 pair_to_float2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ float2 pair_to_float2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// cp.async of 16 bytes global -> shared; src_bytes = 0 fills the destination with zeros
// (rows past the end or masked keys must read as 0, never as stale NaN bit patterns).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
// cp.async of 4 bytes (per-slot metadata such as positions); zero-filled when !fill.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = fill ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace kvlab::cuda
