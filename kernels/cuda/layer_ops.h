// The per-layer elementwise and normalisation kernels of the Llama forward pass on the GPU.
// Activations are fp32 [n_tokens, ...] row-major; outputs that feed a cuBLAS GEMM may be bf16.
// All asynchronous on `stream`; pointers are device pointers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
// inv_freq [head_dim / 2] (double) carries theta, any scaling and the per-pair frequency factors
// (the host RoPE's, kernels/cpu/rope.h RopeTable::inv_freq()); angles in double and cos/sin
// rounded to float, as on the CPU, so both paths rotate identically (layer_ops_test). A negative pos[t] leaves token t's row unchanged
// (no rotation at all, not a rotation by a negative angle): padding rows or tokens whose
// position the host has not assigned pass through untouched.
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

// out[i] = bf16(x[i]), n elements (activations into a bf16 GEMM). Same as convert<__nv_bfloat16>.
void to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream = nullptr);

// y[r, c] += bias[c]   (y [n_rows, cols] fp32, bias [cols]): the bias of a linear layer (models with
// q/k/v biases), added after the GEMM.
void add_bias(float* y, const float* bias, int n_rows, int cols, cudaStream_t stream = nullptr);

// out[i] = OutT(x[i]), n elements; OutT = float (a copy), __half or __nv_bfloat16, rounded to
// nearest, ties to even (overflow to +-inf in fp16; NaN stays NaN).
template <class OutT>
void convert(const float* x, int64_t n, OutT* out, cudaStream_t stream = nullptr);

// out[j] = sum_{r = 0}^{n_rows - 1} x[r * row_elems + j]   (x [n_rows, row_elems], out [row_elems])
// in fp32, the rows added one after another in order r = 0, 1, ... (so the result equals a plain
// CPU loop bit for bit; e.g. summing per-split partial results, or H2O key mass over heads).
// n_rows = 0 gives zeros.
void sum_rows(const float* x, int n_rows, int64_t row_elems, float* out,
              cudaStream_t stream = nullptr);

}  // namespace kvlab::cuda
