// The fp64 dense masked reference attention every kernel, policy and engine test checks against
// (and the engine's probe, which is this reference by definition: dense attention over every
// token seen). Header-only and plain C++, so the CPU, emulator and CUDA tests (kernels/cuda
// builds standalone with only CUDA, cuBLAS and GoogleTest) all link the same one:
// CMake target kvlab_kernels_testing.
//
// One query vector q[head_dim] against candidate keys j in [0, n_keys), reading only those with
// allow(j):
//   s_j = scale * sum_f q_f k_{j,f}          (in double)
//   s_j <- softcap * tanh(s_j / softcap)      when softcap > 0 (Gemma 2's attention soft-capping)
//   m = max_j s_j;  e_j = exp(s_j - m);  z = sum_j e_j  (j ascending);  p_j = e_j / z
//   out = sum_j p_j v_j  (j ascending, in double);  lse = m + log z
// A row that may read no key gives p = 0, out = 0 and lse = -inf (never NaN).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvlab::testing {

struct ReferenceRow {
  std::vector<double> p;    // [n_keys] probability of each key (0 where not allowed)
  std::vector<double> out;  // [head_dim]
  double lse = -std::numeric_limits<double>::infinity();
};

// q: head_dim values (float or double); key(j), value(j): pointers to the head_dim features of
// candidate j (float or double); allow(j): bool. key and value are called once per allowed j,
// in ascending j, key before value.
template <class Q, class KeyFn, class ValueFn, class AllowFn>
ReferenceRow reference_attention_row(const Q* q, int head_dim, int64_t n_keys, double scale,
                                     KeyFn&& key, ValueFn&& value, AllowFn&& allow,
                                     double softcap = 0) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  ReferenceRow r;
  r.p.assign(static_cast<size_t>(n_keys), 0.0);
  r.out.assign(static_cast<size_t>(head_dim), 0.0);
  std::vector<char> allowed(static_cast<size_t>(n_keys), 0);
  double m = kNegInf;
  for (int64_t j = 0; j < n_keys; ++j) {
    if (!allow(j)) continue;
    allowed[j] = 1;
    const auto* k = key(j);
    double dot = 0;
    for (int f = 0; f < head_dim; ++f) dot += static_cast<double>(q[f]) * static_cast<double>(k[f]);
    r.p[j] = dot * scale;
    if (softcap > 0) r.p[j] = softcap * std::tanh(r.p[j] / softcap);
    if (r.p[j] > m) m = r.p[j];
  }
  if (m == kNegInf) {
    r.p.assign(r.p.size(), 0.0);
    return r;
  }
  double z = 0;
  for (int64_t j = 0; j < n_keys; ++j) z += allowed[j] ? (r.p[j] = std::exp(r.p[j] - m)) : 0.0;
  for (int64_t j = 0; j < n_keys; ++j) {
    if (!allowed[j]) continue;
    r.p[j] /= z;
    const auto* v = value(j);
    for (int f = 0; f < head_dim; ++f) r.out[f] += r.p[j] * static_cast<double>(v[f]);
  }
  r.lse = m + std::log(z);
  return r;
}

}  // namespace kvlab::testing
