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
  if (pos[token] < 0) return;  // the header's contract: the row stays as it is
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

template <class OutT>
__global__ void convert_kernel(const float* __restrict__ x, int64_t n, OutT* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<OutT>(x[i]);  // __float2half_rn / __float2bfloat16_rn: nearest, ties even
}

// Element i of y [n_rows, cols] is (r, c) = (i / cols, i % cols).
__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                int64_t n, int cols) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

// One thread per column j (grid-stride); it walks the rows in order, so the fp32 sum is the
// same as the CPU's loop (x[0][j] + x[1][j]) + x[2][j] + ...
__global__ void sum_rows_kernel(const float* __restrict__ x, int n_rows, int64_t row_elems,
                                float* __restrict__ out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < row_elems;
       j += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < n_rows; ++r) acc += x[r * row_elems + j];
    out[j] = acc;
  }
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
  convert<__nv_bfloat16>(x, n, out, stream);
}

void add_bias(float* y, const float* bias, int n_rows, int cols, cudaStream_t stream) {
  if (n_rows < 0 || cols < 0) fail("add_bias: negative shape [", n_rows, ", ", cols, "]");
  const int64_t n = int64_t(n_rows) * cols;
  if (n == 0) return;
  add_bias_kernel<<<elementwise_blocks(n), 256, 0, stream>>>(y, bias, n, cols);
  KVLAB_CUDA_CHECK_LAUNCH();
}

template <class OutT>
void convert(const float* x, int64_t n, OutT* out, cudaStream_t stream) {
  if (n <= 0) return;
  convert_kernel<OutT><<<elementwise_blocks(n), 256, 0, stream>>>(x, n, out);
  KVLAB_CUDA_CHECK_LAUNCH();
}
template void convert<float>(const float*, int64_t, float*, cudaStream_t);
template void convert<__half>(const float*, int64_t, __half*, cudaStream_t);
template void convert<__nv_bfloat16>(const float*, int64_t, __nv_bfloat16*, cudaStream_t);

void sum_rows(const float* x, int n_rows, int64_t row_elems, float* out, cudaStream_t stream) {
  if (n_rows < 0 || row_elems < 0)
    fail("sum_rows: negative shape [", n_rows, ", ", row_elems, "]");
  if (row_elems == 0) return;
  sum_rows_kernel<<<elementwise_blocks(row_elems), 256, 0, stream>>>(x, n_rows, row_elems, out);
  KVLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace kvlab::cuda
