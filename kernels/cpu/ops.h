// Elementwise and row-wise pieces of the Llama block, fp32 (AVX2 where it matters).
#pragma once

#include <cstdint>

namespace kvlab {

// RMSNorm of one row: y = x / sqrt(mean(x^2) + eps) * weight.  x, y, weight: [dim]; y may be x.
void rms_norm(const float* x, const float* weight, int dim, float eps, float* y);

// SwiGLU in place: gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).  [n]
void swiglu(float* gate, const float* up, int64_t n);

// y[i] += x[i]  [n]
void add_inplace(float* y, const float* x, int64_t n);

// log(sum_i exp(x[i])) computed stably. [n]
double log_sum_exp(const float* x, int64_t n);

}  // namespace kvlab
