// The dense part of the Llama forward pass on the CPU (kernels/cpu: linear, RMSNorm, SwiGLU),
// shared by the CPU backend and the emulated device, over row-major activations:
//   embed:       x[r] = tok_embeddings[tokens[r]]  (Gemma: * sqrt(dim))         [n, dim]
//   qkv:         h = RMSNorm(x) * attn_norm;  q = Wq h (+bq), k = Wk h (+bk), v = Wv h (+bv)
//                (qk_norm: each head of q, k RMS-normalised with q_norm / k_norm)
//   out_ffn:     x += Wo att;  h = RMSNorm(x) * ffn_norm;  x += W_down (silu(W_gate h) * (W_up h))
//                (Gemma: x += RMSNorm(Wo att) * post_attn_norm, GELU-tanh for silu and
//                 x += RMSNorm(W_down ...) * post_ffn_norm)
//                (kFfnRows rows at a time, bounding the [rows, hidden] buffers)
//   MLA (ModelConfig::mla(), absorbed; r = kv_lora_rank, W_UK_h / W_UV_h head h's rows of wkv_b):
//     qkv:       q_full = W_qb (RMSNorm(W_qa h) * q_a_norm) (or W_q h)            [n, H, nope + rope]
//                k = [RMSNorm(c_raw) * kv_a_norm ; k_rope] from W_kva h           [n, 1, r + rope]
//                q per head = [W_UK_h^T q_nope_h ; q_rope_h]                      [n, H, r + rope]
//                (v is not written: the value rows are the key rows)
//     out_ffn:   the attention output's first r features per head, sum_j p_j c_j, become
//                W_UV_h (sum_j p_j c_j) [n, H, v_head_dim] before Wo
//   logits:      logits[i] = lm_head RMSNorm(x[rows[i]]) * final_norm            [m, vocab]
//                (final_softcap c > 0: c tanh(logits / c))
// The dense layers read the weights once per call for all rows: matvec kernels for a few rows
// (decode), OpenBLAS sgemm for many (prefill). Weights stay in their stored dtype.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "framework/model/model.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/thread_pool.h"

namespace kvlab::engine_detail {

// Rows of a prefill chunk pushed through the feed-forward block at once.
inline constexpr int kFfnRows = 128;

class DenseLayers {
 public:
  DenseLayers(const Model& model, ThreadPool& pool);

  void embed(std::span<const int32_t> tokens, float* x) const;
  // q [n, n_heads * hd], k and v [n, n_kv_heads * hd] (MLA: v untouched; see above).
  void qkv(int layer, const float* x, int n, float* q, float* k, float* v);
  // att [n, n_heads * hd] -> x [n, dim] updated in place.
  void out_ffn(int layer, const float* att, int n, float* x);
  void logits(const float* x, std::span<const int> rows, float* out);

 private:
  void ensure(int rows);
  void mla_qkv(int layer, int n, float* q, float* k);
  const float* mla_out(int layer, const float* att, int n);  // -> [n, H * v_head_dim]
  const Model& m_;
  const ModelConfig& c_;
  ThreadPool& pool_;
  std::vector<float> h_, tmp_, gate_, up_;
  // MLA: per layer W_UK_h^T of every head, fp32 [H, r, nope] (the transposes absorbed into the
  // query); scratch rows.
  std::vector<std::vector<float>> mla_uk_t_;
  std::vector<float> mla_qa_, mla_q_, mla_kva_, mla_in_, mla_res_, mla_o_;
  LinearScratch linear_;
};

}  // namespace kvlab::engine_detail
