// Test support: a bound on the rounding error of the engine's fp32 logits, derived from the
// model's shapes and weights (not from any machine's output), for golden and conformance tests
// that compare logits with a reference or with another differently rounded pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "framework/model/model.h"

namespace kvlab {

// Bound on |fp32 engine logit - exact logit| for one forward pass over n_tokens.
//
// Each logit is a D-term dot product of an lm_head row w_v with the final hidden state
// h = g * xn, xn = x / rms(x) (g the final norm weight), so by Cauchy-Schwarz its terms obey
//   sum_d |w_vd g_d xn_d| <= M = max_v |w_v * g|_2 * sqrt(D)       (|xn|_2 = sqrt(D))
// and an error dxn gives |d logit_v| <= |w_v * g|_2 |dxn|_2 <= M * |dxn|_2 / |xn|_2.
// Rounding: fp32, u = 2^-24. A sum of K products in any order (BLAS kernels, SIMD widths, tile
// sizes: this is what differs between machines) has error <= lambda sqrt(K) u sum|terms| with
// probability >= 1 - 2 exp(-lambda^2 / 2) under the probabilistic model of Higham & Mary (SIAM
// J. Sci. Comput. 41, 2019); lambda = 6 (failure probability ~1e-8 per sum, over <= 1e5 logits).
// The relative errors of the stages one logit depends on add up (they are independent roundings;
// RMSNorm removes the residual stream's scale, so a relative error passes through a layer and
// the layer adds its own); the accumulation lengths along that path are, per layer,
//   D (Q/K/V projections) + head_dim (scores) + n_tokens (softmax sum, P.V) + n_heads*head_dim
//   (output projection) + D (gate/up) + hidden (down),  and D once more for the lm_head,
// so |dxn|_2 / |xn|_2 <= 2 lambda u sqrt(N) (the 2: x / rms(x) carries the relative error of x
// and that of rms(x)), N the sum of those lengths. Hence
//   |d logit| <= 2 lambda u sqrt(N) M.
// Two fp32 passes that round differently (decode vs prefill, permuted Q/K) differ by up to twice
// this. The reference (numpy float64) rounds negligibly (2^-53).
inline double logit_bound(const Model& m, size_t n_tokens) {
  const ModelConfig& c = m.config;
  double wg_norm = 0;  // max_v |w_v * g|_2
  std::vector<float> row(c.dim);
  for (int64_t v = 0; v < c.vocab_size; ++v) {
    weight_row_to_float(m.lm_head, v, row.data());
    double s = 0;
    for (int d = 0; d < c.dim; ++d) s += std::pow(double(row[d]) * m.final_norm[d], 2);
    wg_norm = std::max(wg_norm, std::sqrt(s));
  }
  const double M = wg_norm * std::sqrt(double(c.dim));
  double per_layer = 2.0 * c.dim + c.head_dim + double(n_tokens) +
                     double(c.n_heads) * c.head_dim + c.hidden_dim;
  // Gemma: the post-attention and post-FFN RMSNorms (a D-term sum of squares each, their (1 + w)
  // multipliers rounded once more) and the per-head q/k norms (head_dim terms each); soft-capping
  // (|d tanh| <= 1) and GELU-tanh (|gelu'| < 1.13, as silu's < 1.1) amplify nothing.
  if (c.sandwich_norms) per_layer += 2.0 * c.dim + 2.0 * c.head_dim;
  // MLA (absorbed): the lengths along the path are D (W_qa or W_q, and W_kva) + q_lora (W_qb) +
  // q_lora + r (the q_a and kv_a RMSNorms' sums of squares) + nope (W_UK^T q_nope) + r + rope
  // (scores: head_dim) + n_tokens (softmax, P C) + r (W_UV) + n_heads * v_head_dim (Wo) + D + hidden.
  if (c.mla())
    per_layer = 2.0 * c.dim + 2.0 * c.q_lora_rank + 2.0 * c.kv_lora_rank + c.qk_nope_head_dim + c.head_dim +
                double(n_tokens) + double(c.n_heads) * c.v_head_dim + c.hidden_dim;
  const double N = c.n_layers * per_layer + c.dim;
  constexpr double kU = 0x1p-24, kLambda = 6;
  return 2 * kLambda * kU * std::sqrt(N) * M;
}

// Decode on int8-quantised activations (q8_0 and the block types, kernels/cpu/quant_matvec.h)
// against the same model with fp32-dequantised weights, logit v (deq: the dequantised model; block:
// the largest activation block among its matrices, 32 or 256; with fp32-stored weights w_v g is the
// same). A quantised input x of a projection (blocks of B values, a_i = round(x_i / da), da =
// max|x_b| / 127) carries an error e_i uniform on [-da/2, da/2], rms da / sqrt(12) <= |x_b|_2 /
// (127 sqrt(12)) per value, so |e|_2 / |x|_2 <= eps_B = sqrt(B / 12) / 127 (B = 256: 0.036; B = 32:
// 0.013). Per layer four inputs are quantised (x_norm for Q/K/V, the attention output for wo,
// x_norm for gate/up, silu(g)*u for down), and the final hidden state for the lm_head: S = 4
// n_layers + 1 independent relative errors, which add in quadrature and pass through the layers as
// logit_bound's model above has it (RMSNorm removes the scale), so |dxn|_2 / |xn|_2 <= sqrt(S)
// eps_B. A logit is w_v g . xn; an error direction independent of w_v g gives |d logit_v| <= lambda
// |w_v g|_2 |dxn|_2 / sqrt(D) = lambda |w_v g|_2 sqrt(S) eps_B (|xn|_2 = sqrt(D)), lambda = 6 as
// above. Plus the fp32 rounding of both passes.
// (This is a model of the error, not a worst case: the worst case, Cauchy-Schwarz without the
// independence, is sqrt(D) times larger and would pass a broken kernel.)
inline double activation_quant_logit_bound(const Model& deq, int64_t block, int64_t v,
                                           size_t n_tokens) {
  const ModelConfig& c = deq.config;
  std::vector<float> row(c.dim);
  weight_row_to_float(deq.lm_head, v, row.data());
  double wg = 0;
  for (int d = 0; d < c.dim; ++d) wg += std::pow(double(row[d]) * deq.final_norm[d], 2);
  const double eps = std::sqrt(block / 12.0) / 127, S = 4.0 * c.n_layers + 1;
  return 6 * std::sqrt(wg) * std::sqrt(S) * eps + 2 * logit_bound(deq, n_tokens);
}

}  // namespace kvlab
