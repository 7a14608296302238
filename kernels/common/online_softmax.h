// The online-softmax (FlashAttention) recurrence and the split-K (FlashDecoding) merge, shared
// by the CPU reference, the CPU fast path and the CUDA kernels.
//
// Per query row, over key tiles (POLICIES.md section 1):
//   s_j = tau * q.k_j  (-inf when masked);  m' = max(m, max_j s_j);  alpha = exp(m - m');
//   p_j = exp(s_j - m');  l <- alpha * l + sum_j p_j;  o <- alpha * o + sum_j p_j v_j;  m <- m'.
//   End: O = o / l, LSE = m + log l.  While the running max is -inf, 0 is used in its place so
//   no NaN appears; a row that saw no key gives O = 0, LSE = -inf.
// Merge of parts (O_s, LSE_s): M = max LSE_s; LSE = M + log sum_s exp(LSE_s - M);
//   O = sum_s exp(LSE_s - LSE) O_s; parts with LSE = -inf get weight 0.
#pragma once

#include <cmath>
#include <limits>

#include "kernels/common/host_device.h"

namespace kvlab {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Running state of one query row: max m and denominator l (the accumulator o lives with the
// caller, so the same state drives scalar, SIMD and tensor-core accumulators).
struct SoftmaxState {
  float m = kNegInf;
  float l = 0.f;
};

// Folds a new tile's maximum into the state. Returns alpha, the factor the caller multiplies
// its accumulator o (and this->l already is) by; writes the max to subtract from the tile's
// scores (never -inf: 0 is used instead, so exp(s - m) of a masked -inf score is exactly 0).
KVLAB_HD float softmax_rescale(SoftmaxState& st, float tile_max, float* shift) {
  const float m_new = st.m > tile_max ? st.m : tile_max;
  const float m_safe = m_new == kNegInf ? 0.f : m_new;
  const float alpha = st.m == kNegInf ? 0.f : expf(st.m - m_safe);
  st.l *= alpha;
  st.m = m_new;
  *shift = m_safe;
  return alpha;
}

// log-sum-exp of a finished row; -inf for a row that saw no key.
KVLAB_HD float softmax_lse(const SoftmaxState& st) {
  return st.l > 0.f ? st.m + logf(st.l) : kNegInf;
}

// Merges part b into part a (both normalised outputs of length dim with their LSEs).
KVLAB_HD void merge_partial(float* o_a, float& lse_a, const float* o_b, float lse_b, int dim) {
  if (lse_b == kNegInf) return;
  if (lse_a == kNegInf) {
    for (int i = 0; i < dim; ++i) o_a[i] = o_b[i];
    lse_a = lse_b;
    return;
  }
  const float m = lse_a > lse_b ? lse_a : lse_b;
  const float wa = expf(lse_a - m), wb = expf(lse_b - m);
  const float inv = 1.f / (wa + wb);
  for (int i = 0; i < dim; ++i) o_a[i] = (wa * o_a[i] + wb * o_b[i]) * inv;
  lse_a = m + logf(wa + wb);
}

}  // namespace kvlab
