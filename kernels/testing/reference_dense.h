// The fp64 dense layer pieces the engine-level references compute with (the MLA reference forward
// in engine_mla_test.cpp, the conformance suite's dense model in policies/conformance.cpp):
// header-only, plain C++, as reference_attention.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvlab::testing {

// y[r] = sum_j w[r * cols + j] * x[j] in double, j ascending; cols = x.size().
template <class W>
std::vector<double> reference_matvec(const std::vector<W>& w, int64_t rows, const std::vector<double>& x) {
  const int64_t cols = static_cast<int64_t>(x.size());
  std::vector<double> y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const W* wr = w.data() + r * cols;
    for (int64_t j = 0; j < cols; ++j) y[r] += static_cast<double>(wr[j]) * x[j];
  }
  return y;
}

// x_i * w_i / sqrt(mean(x^2) + eps), in double.
inline std::vector<double> reference_rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

}  // namespace kvlab::testing
