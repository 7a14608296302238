// Kernels of layer_ops.h. One block per token row for the row reductions; grid-stride loops for
// the elementwise ones.
#include "kernels/cuda/layer_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>


#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/numeric.cuh"

namespace kvlab::cuda {
namespace {

constexpr int kRowThreads = 256;

int elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

template <class OutT>
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                float eps, int dim, OutT* __restrict__ y) {
  __shared__ float warp_sums[kRowThreads / 32];
  const float* row = x + size_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(row[i], row[i], ss);
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < kRowThreads / 32; ++i) total += warp_sums[i];
  const float inv = rsqrtf(total / dim + eps);
  OutT* out = y + size_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[i] = from_float<OutT>(row[i] * inv * w[i]);
}

__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos,
                            const double* __restrict__ inv_freq, int n_heads, int head_dim,
                            RopePairs pairs) {
  const int token = blockIdx.x;
  const int half = head_dim / 2;
  const double p = static_cast<double>(pos[token]);
  for (int e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
    const int head = e / half, i = e % half;
    float* h = x + (size_t(token) * n_heads + head) * head_dim;
    const int ia = pairs == RopePairs::kInterleaved ? 2 * i : i;
    const int ib = pairs == RopePairs::kInterleaved ? 2 * i + 1 : i + half;
    double sd, cd;
    sincos(p * inv_freq[i], &sd, &cd);
    const float s = static_cast<float>(sd), c = static_cast<float>(cd);
    const float a = h[ia], b = h[ib];
    h[ia] = a * c - b * s;
    h[ib] = a * s + b * c;
  }
}

template <class OutT>
__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              int64_t n, OutT* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = from_float<OutT>(g / (1.f + __expf(-g)) * up[i]);
  }
}

template <class T>
__global__ void embedding_kernel(const T* __restrict__ table, int vocab, int dim,
                                 const int32_t* __restrict__ tokens, float* __restrict__ out) {
  const int t = blockIdx.x;
  const int id = tokens[t];
  float* row = out + size_t(t) * dim;
  const bool ok = id >= 0 && id < vocab;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    row[i] = ok ? to_float(table[size_t(id) * dim + i]) : 0.f;
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

template <class OutT>
void rms_norm(const float* x, const float* w, float eps, int n_tokens, int dim, OutT* y,
              cudaStream_t stream) {
  if (n_tokens <= 0) return;
  rms_norm_kernel<OutT><<<n_tokens, kRowThreads, 0, stream>>>(x, w, eps, dim, y);
  KVLAB_CUDA_CHECK_LAUNCH();
}
template void rms_norm<float>(const float*, const float*, float, int, int, float*, cudaStream_t);
template void rms_norm<__nv_bfloat16>(const float*, const float*, float, int, int, __nv_bfloat16*,
                                      cudaStream_t);

void rope(float* x, const int32_t* pos, const double* inv_freq, int n_tokens, int n_heads,
          int head_dim, RopePairs pairs, cudaStream_t stream) {
  if (head_dim % 2 != 0) fail("rope: head_dim ", head_dim, " must be even");
  if (n_tokens <= 0) return;
  rope_kernel<<<n_tokens, kRowThreads, 0, stream>>>(x, pos, inv_freq, n_heads, head_dim, pairs);
  KVLAB_CUDA_CHECK_LAUNCH();
}

template <class OutT>
void swiglu(const float* gate, const float* up, int64_t n, OutT* out, cudaStream_t stream) {
  if (n <= 0) return;
  swiglu_kernel<OutT><<<elementwise_blocks(n), 256, 0, stream>>>(gate, up, n, out);
  KVLAB_CUDA_CHECK_LAUNCH();
}
template void swiglu<float>(const float*, const float*, int64_t, float*, cudaStream_t);
template void swiglu<__nv_bfloat16>(const float*, const float*, int64_t, __nv_bfloat16*, cudaStream_t);

template <class T>
void embedding_gather(const T* table, int vocab, int dim, const int32_t* tokens, int n_tokens,
                      float* out, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  embedding_kernel<T><<<n_tokens, kRowThreads, 0, stream>>>(table, vocab, dim, tokens, out);
  KVLAB_CUDA_CHECK_LAUNCH();
}
template void embedding_gather<float>(const float*, int, int, const int32_t*, int, float*, cudaStream_t);
template void embedding_gather<__half>(const __half*, int, int, const int32_t*, int, float*, cudaStream_t);
template void embedding_gather<__nv_bfloat16>(const __nv_bfloat16*, int, int, const int32_t*, int,
                                              float*, cudaStream_t);

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<elementwise_blocks(n), 256, 0, stream>>>(x, y, n);
  KVLAB_CUDA_CHECK_LAUNCH();
}

void to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream) {
  if (n <= 0) return;
  to_bf16_kernel<<<elementwise_blocks(n), 256, 0, stream>>>(x, n, out);
  KVLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvlab::cuda
