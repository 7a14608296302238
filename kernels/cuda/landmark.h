// Landmark scoring and top-k chunk selection on the device, for the HiLS-style / kvlab
// `landmark` policy (POLICIES.md section 6), and the mean landmark of closed chunks.
//
// Per request b and KV head kv, chunks c < n_eligible[b] (the closed chunks that end before the
// local window) each carry a landmark. For each query head h of the group (G heads):
//   dot landmarks:    z[h, c] = scale * q[b, h] . L[b, kv, c] + bias[b, kv, c]
//                     (mean landmark: bias 0; pooled landmark: the entropy bias b'_c)
//   bounds landmarks: z[h, c] = scale * sum_d max(q_d * Lmax[c, d], q_d * Lmin[c, d])   (Quest)
// GQA aggregation to one score per chunk:
//   kSoftmaxMax (default): max_h (z[h, c] - N_h), N_h = log(exp(local_lse[b, h]) + sum_c' exp z[h, c'])
//   kMax: max_h z[h, c];  kSum: sum_h z[h, c]
// Top-K per (request, KV head): the K highest scores, ties to the lower chunk index, written in
// ascending chunk order; all eligible chunks when K >= n_eligible. The caller turns them into
// slot ranges (chunk c = slots [c * C, (c + 1) * C)) for the attention selection.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/paged_kv.h"

namespace kvlab::cuda {

enum class LandmarkAggregation { kSoftmaxMax, kMax, kSum };

struct LandmarkSelectParams {
  const float* q = nullptr;            // [batch, num_qo_heads, head_dim] after RoPE, unscaled
  const float* landmarks = nullptr;    // [batch, num_kv_heads, max_chunks, head_dim] (or Lmax)
  const float* landmarks_min = nullptr;// bounds mode: Lmin, same shape; null = dot mode
  const float* bias = nullptr;         // optional [batch, num_kv_heads, max_chunks] (dot mode)
  const int32_t* n_eligible = nullptr; // [batch] eligible chunks, <= max_chunks
  const float* local_lse = nullptr;    // optional [batch, num_qo_heads]; null = -inf
  int batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, max_chunks = 0;
  float scale = 1.f;
  int top_k = 0;
  LandmarkAggregation aggregation = LandmarkAggregation::kSoftmaxMax;
  int32_t* selected = nullptr;         // [batch, num_kv_heads, top_k] ascending, -1 padded
  int32_t* n_selected = nullptr;       // [batch, num_kv_heads] min(top_k, n_eligible[b])
};

// Throws kvlab::Error on bad shapes (head_dim not a multiple of 32 or above 256, max_chunks
// needing more shared memory than the device has, top_k < 1).
void landmark_select(const LandmarkSelectParams& params, cudaStream_t stream = nullptr);

// Mean landmark of chunks: for item i, out[i, kv, :] = mean over the valid slots s of
// [chunk[i] * chunk_size, (chunk[i] + 1) * chunk_size) of request req[i] of K[s] (every KV head;
// kv_pos -1 marks holes, null = no holes); 0 when the chunk has no valid slot.
// out: [n_items, num_kv_heads, head_dim] fp32. T = float, __half, __nv_bfloat16.
template <class T>
void landmark_mean(const PagedKvView<const T>& kv, const int32_t* kv_pos, int chunk_size,
                   const int32_t* req, const int32_t* chunk, int n_items, float* out,
                   cudaStream_t stream = nullptr);

}  // namespace kvlab::cuda
