// Shared by the attention tests (kernels/cpu/attention_test.cpp and attention_fused_test.cpp,
// framework/kv/kv_format_test.cpp):
// run attention() or attention_naive() into fresh buffers, and the per-element fp32 rounding
// bounds of the tiled kernel against the reference (tolerances()). Test-only, header-only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"

namespace kvlab::attention_test {

struct Outputs {
  std::vector<float> out, lse, mass, head;  // head: head_mass
};

// The paths attention() can take on this CPU.
inline std::vector<CpuPath> paths() {
  std::vector<CpuPath> p = {CpuPath::kPortable};
  if (cpu_has_avx2_fma_f16c()) p.push_back(CpuPath::kAvx2);
  return p;
}

inline Outputs run(const AttentionArgs& base, bool fast, int threads, CpuPath path = cpu_path()) {
  Outputs o;
  o.out.assign(static_cast<size_t>(base.n_rows) * base.n_heads * base.head_dim, 123.f);
  o.lse.assign(static_cast<size_t>(base.n_rows) * base.n_heads, 123.f);
  AttentionArgs a = base;
  a.out = o.out.data();
  a.lse = o.lse.data();
  if (base.key_mass != nullptr) {
    o.mass.assign(static_cast<size_t>(base.n_kv_heads) * base.kv.n_slots, 0.5f);  // accumulates
    a.key_mass = o.mass.data();
  }
  if (base.head_mass != nullptr) {
    o.head.assign(static_cast<size_t>(base.n_heads) * base.kv.n_slots, 0.25f);  // accumulates
    a.head_mass = o.head.data();
  }
  if (fast) {
    attention(a, threads, path);
  } else {
    attention_naive(a);
  }
  return o;
}

// Per-element bounds on |attention() - attention_naive()|: the fp32 rounding of the tiled kernel
// (any summation order, tile size or SIMD width) to first order in u = 2^-24, with
// gamma(n) = n u / (1 - n u) bounding a sum of n terms (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., 3.1); the reference accumulates in double (negligible) and
// rounds once to float (u).
//  - score s_j = tau q . k_j: D products in any order, q pre-scaled by tau, k rotated at read (at
//    most 4 roundings per feature), then the running max subtracted: by Cauchy-Schwarz
//      |ds| <= ds_max = (gamma(D + 5) + 2u) tau |q|max |k|max      (largest norms in the case)
//  - p_j = exp(s_j - m) / l: exp8 has relative error < 2e-7 < 4u, std::exp < 2u; l sums n <= n_slots
//    terms, rescaled once per tile (< n tiles): |dp_j| <= p_j (2 ds_max + gamma(2n) + 6u)
//  - out_d = sum_j p_j v_jd, n terms rescaled once per tile, then times 1/l:
//      |d out_d| <= A_d (2 ds_max + 2 gamma(2n) + 8u),  A_d = sum_j p_j |v_jd|
//    (A is the reference run on |v|; it is >= |out_d|, where cancellation can make out_d tiny)
//  - LSE = m + log l: |d LSE| <= 2 ds_max + gamma(2n) + 6u + u |LSE|
//  - key_mass_j = initial + sum over the Q = rows * G queries of p_j, formed as exp(s_j - LSE):
//      |d mass_j| <= mass_j (3 ds_max + gamma(2n) + 10u + u max|LSE| + gamma(Q + 1))
//  - head_mass_j: the same with Q = the window's rows (one head's probabilities)
// The fused kernels of a quantised store (attention_fused.h) are checked against the reference
// over an f32 cache of the dequantised rows (`a` is that cache): they decode bf16 / f16 / KIVI
// exactly and sum in their own order (covered above); int8 / fp8 apply their scale once per dot
// product (S = s (q . c) against sum_d q_d fl(c_d s): within gamma(D + 2) sum_d |q_d k_d|, inside
// ds_max) and fold it into each probability (fl(p s) c against p fl(c s): 2u more per PV term):
// `extra_roundings` adds that many u per term to the out bound.
struct Tolerances {
  std::vector<float> out, lse, mass, head;
};

inline double gamma_n(double n) {
  constexpr double kU = 0x1p-24;
  return n * kU / (1 - n * kU);
}

inline double norm2(const float* x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

inline Tolerances tolerances(const AttentionArgs& a, const Outputs& ref, int extra_roundings = 0) {
  constexpr double kU = 0x1p-24;
  const int D = a.head_dim, H = a.n_kv_heads, n = a.kv.n_slots;
  double q_max = 0, k_max = 0;
  for (size_t i = 0; i < static_cast<size_t>(a.n_rows) * a.n_heads; ++i) q_max = std::max(q_max, norm2(a.q + i * D, D));
  for (int s = 0; s < n; ++s)
    for (int g = 0; g < H; ++g) k_max = std::max(k_max, norm2(a.kv.key(s, g), D));
  const double ds = (gamma_n(D + 5) + 2 * kU) * a.scale * q_max * k_max;
  // A = the reference with every value replaced by its magnitude (pages up to the last one used).
  int32_t pages = 0;
  for (int32_t i = a.kv.view.indptr[0]; i < a.kv.view.indptr[1]; ++i) pages = std::max(pages, a.kv.view.indices[i] + 1);
  std::vector<float> abs_v(a.kv.view.offset(pages, 0, 0, 0));
  for (size_t i = 0; i < abs_v.size(); ++i) abs_v[i] = std::fabs(a.kv.view.v_data[i]);
  AttentionArgs m = a;
  m.kv.view.v_data = abs_v.data();
  m.key_mass = nullptr;
  m.head_mass = nullptr;
  const Outputs mag = run(m, false, 1);
  Tolerances t;
  const double f_out = 2 * ds + 2 * gamma_n(2.0 * n) + (8 + extra_roundings) * kU;
  for (float x : mag.out) t.out.push_back(static_cast<float>(x * f_out));
  double lse_max = 0;
  for (float x : ref.lse) {
    if (!std::isinf(x)) lse_max = std::max(lse_max, double(std::fabs(x)));
    t.lse.push_back(static_cast<float>(2 * ds + gamma_n(2.0 * n) + 6 * kU + kU * std::fabs(x)));
  }
  const double f_mass = 3 * ds + gamma_n(2.0 * n) + 10 * kU + kU * lse_max + gamma_n(a.n_rows * (a.n_heads / H) + 1.0);
  for (float x : ref.mass) t.mass.push_back(static_cast<float>(x * f_mass));
  const double f_head = 3 * ds + gamma_n(2.0 * n) + 10 * kU + kU * lse_max +
                        gamma_n(a.n_rows - a.head_mass_first_row + 1.0);
  for (float x : ref.head) t.head.push_back(static_cast<float>(x * f_head));
  return t;
}

inline void expect_close(const Outputs& ref, const Outputs& got, const Tolerances& tol, const std::string& what) {
  for (size_t i = 0; i < ref.out.size(); ++i) {
    ASSERT_FALSE(std::isnan(got.out[i])) << what;
    ASSERT_NEAR(ref.out[i], got.out[i], tol.out[i]) << what << " out[" << i << "]";
  }
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      ASSERT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << what << " lse[" << i << "]";
    } else {
      ASSERT_NEAR(ref.lse[i], got.lse[i], tol.lse[i]) << what << " lse[" << i << "]";
    }
  }
  for (size_t i = 0; i < ref.mass.size(); ++i)
    ASSERT_NEAR(ref.mass[i], got.mass[i], tol.mass[i]) << what << " mass[" << i << "]";
  ASSERT_EQ(ref.head.size(), got.head.size()) << what;
  for (size_t i = 0; i < ref.head.size(); ++i)
    ASSERT_NEAR(ref.head[i], got.head[i], tol.head[i]) << what << " head_mass[" << i << "]";
}

inline void expect_close(const AttentionArgs& a, const Outputs& ref, const Outputs& got, const std::string& what) {
  expect_close(ref, got, tolerances(a, ref), what);
}

}  // namespace kvlab::attention_test
