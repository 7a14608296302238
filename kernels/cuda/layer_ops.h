// The per-layer elementwise and normalisation kernels of the Llama forward pass on the GPU.
// Activations are fp32 [n_tokens, ...] row-major; outputs that feed a cuBLAS GEMM may be bf16.
// All asynchronous on `stream`; pointers are device pointers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace kvlab::cuda {

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w   (x [n_tokens, dim], w [dim]).
// OutT = float or __nv_bfloat16.
template <class OutT>
void rms_norm(const float* x, const float* w, float eps, int n_tokens, int dim, OutT* y,
              cudaStream_t stream = nullptr);

// Rotary embedding in place on x [n_tokens, n_heads, head_dim] at positions pos [n_tokens]:
// each pair (a, b) rotates by angle pos * inv_freq[i]:  (a cos - b sin, a sin + b cos).
// Pairs: interleaved (2i, 2i + 1) (GGUF llama, llama2.c) or neox (i, i + head_dim / 2) (HF).
// inv_freq [head_dim / 2] (double) carries theta and any scaling (rope_table.h's rope_inv_freq,
// or kernels/cpu's for scaled configs); angles in double and cos/sin rounded to float, as on
// the CPU, so both paths rotate identically.
enum class RopePairs { kInterleaved, kNeox };
void rope(float* x, const int32_t* pos, const double* inv_freq, int n_tokens, int n_heads,
          int head_dim, RopePairs pairs, cudaStream_t stream = nullptr);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); n elements. OutT float or bf16.
template <class OutT>
void swiglu(const float* gate, const float* up, int64_t n, OutT* out, cudaStream_t stream = nullptr);

// out[t, :] = table[tokens[t], :] as fp32; table [vocab, dim] in T (float, __half, bf16).
// Token ids outside [0, vocab) give a zero row (the host validates ids before the step).
template <class T>
void embedding_gather(const T* table, int vocab, int dim, const int32_t* tokens, int n_tokens,
                      float* out, cudaStream_t stream = nullptr);

// x[i] += y[i] (the residual connection), n elements.
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream = nullptr);

// out[i] = bf16(x[i]), n elements (activations into a bf16 GEMM).
void to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream = nullptr);

}  // namespace kvlab::cuda
