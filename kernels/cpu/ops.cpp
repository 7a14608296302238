#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace kvlab {

void rms_norm(const float* x, const float* weight, int dim, float eps, float* y) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  double ss = 0;
  for (float l : lanes) ss += l;
  for (; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.f / std::sqrt(static_cast<float>(ss / dim) + eps);
  for (int j = 0; j < dim; ++j) y[j] = x[j] * inv * weight[j];
}

void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

double log_sum_exp(const float* x, int64_t n) {
  if (n <= 0) return -INFINITY;
  const float m = *std::max_element(x, x + n);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  return m + std::log(s);
}

}  // namespace kvlab
