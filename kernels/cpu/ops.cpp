#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_path.h"

namespace kvlab {

namespace {

// Sum of squares of x[0 .. dim - dim % 8) in 8 fp32 lanes (lane l takes x[8k + l], fused
// multiply-add), added in double; the tail in double. Both versions give the same bits: the
// AVX2 one (target attribute, run where cpu_path() is kAvx2) and the portable one (std::fma).
__attribute__((target("avx2,fma"))) double sum_squares_avx2(const float* x, int dim) {
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
  return ss;
}

double sum_squares_portable(const float* x, int dim) {
  float lanes[8] = {};
  int i = 0;
  for (; i + 8 <= dim; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(x[i + l], x[i + l], lanes[l]);
  double ss = 0;
  for (float l : lanes) ss += l;
  for (; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

}  // namespace

void rms_norm(const float* x, const float* weight, int dim, float eps, float* y) {
  const double ss = cpu_path() == CpuPath::kAvx2 ? sum_squares_avx2(x, dim) : sum_squares_portable(x, dim);
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
