// The CPU dense layers (dense_layers.h).
#include "framework/engine/dense_layers.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"

namespace kvlab::engine_detail {

DenseLayers::DenseLayers(const Model& model, ThreadPool& pool) : m_(model), c_(model.config), pool_(pool) {
  use_single_threaded_blas();  // BLAS runs inside the pool's jobs (linear.h)
  if (!c_.mla()) return;
  const int H = c_.n_heads, nope = c_.qk_nope_head_dim, vh = c_.v_head_dim, r = c_.kv_lora_rank;
  std::vector<float> row(r);
  for (const LayerWeights& w : m_.layers) {
    std::vector<float>& t = mla_uk_t_.emplace_back(static_cast<size_t>(H) * r * nope);
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < nope; ++i) {  // W_UK_h row i = wkv_b row h (nope + v) + i
        weight_row_to_float(w.wkv_b, int64_t{hh} * (nope + vh) + i, row.data());
        for (int j = 0; j < r; ++j) t[(static_cast<size_t>(hh) * r + j) * nope + i] = row[j];
      }
  }
}

void DenseLayers::ensure(int rows) {
  const size_t r = static_cast<size_t>(rows);
  if (h_.size() >= r * c_.dim) return;
  h_.resize(r * c_.dim), tmp_.resize(r * c_.dim);
  const size_t ffn_rows = std::min<size_t>(r, kFfnRows);
  gate_.resize(ffn_rows * c_.hidden_dim), up_.resize(ffn_rows * c_.hidden_dim);
  if (c_.mla()) {
    const size_t H = c_.n_heads, qk = c_.qk_nope_head_dim + c_.qk_rope_head_dim;
    mla_qa_.resize(r * c_.q_lora_rank), mla_q_.resize(r * H * qk);
    mla_kva_.resize(r * (c_.kv_lora_rank + c_.qk_rope_head_dim));
    const size_t widest = std::max({c_.qk_nope_head_dim, c_.kv_lora_rank, c_.v_head_dim});
    mla_in_.resize(r * widest), mla_res_.resize(r * widest), mla_o_.resize(r * H * c_.v_head_dim);
  }
}

namespace {

// GeGLU with GELU's tanh form (PyTorch gelu(approximate="tanh"), HF gelu_pytorch_tanh):
// gate <- 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up.
void geglu_tanh(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

}  // namespace

void DenseLayers::embed(std::span<const int32_t> tokens, float* x) const {
  for (size_t r = 0; r < tokens.size(); ++r)
    to_float(m_.tok_embeddings.dtype, m_.tok_embeddings.row(tokens[r]), x + r * c_.dim, c_.dim);
  if (c_.embed_scale) {  // Gemma: x * sqrt(dim), the factor rounded to float32 as HF's normaliser
    const float scale = static_cast<float>(std::sqrt(static_cast<double>(c_.dim)));
    for (size_t i = 0; i < tokens.size() * c_.dim; ++i) x[i] *= scale;
  }
}

void DenseLayers::qkv(int layer, const float* x, int n, float* q, float* k, float* v) {
  ensure(n);
  const LayerWeights& w = m_.layers[layer];
  const int dim = c_.dim;
  float* h = h_.data();
  for (int r = 0; r < n; ++r) rms_norm(x + r * dim, w.attn_norm.data(), dim, c_.rms_eps, h + r * dim);
  if (c_.mla()) return mla_qkv(layer, n, q, k);
  linear(pool_, h, n,
         {{w.wq, q, w.bq.empty() ? nullptr : w.bq.data()},
          {w.wk, k, w.bk.empty() ? nullptr : w.bk.data()},
          {w.wv, v, w.bv.empty() ? nullptr : w.bv.data()}},
         linear_);
  if (c_.qk_norm) {  // Qwen3, Gemma 3: every head of q and k RMS-normalised over head_dim, before RoPE
    const int hd = c_.head_dim;
    for (int64_t i = 0; i < static_cast<int64_t>(n) * c_.n_heads; ++i)
      rms_norm(q + i * hd, w.q_norm.data(), hd, c_.rms_eps, q + i * hd);
    for (int64_t i = 0; i < static_cast<int64_t>(n) * c_.n_kv_heads; ++i)
      rms_norm(k + i * hd, w.k_norm.data(), hd, c_.rms_eps, k + i * hd);
  }
}

// MLA, absorbed (dense_layers.h). h_ holds RMSNorm(x) * attn_norm.
void DenseLayers::mla_qkv(int layer, int n, float* q, float* k) {
  const LayerWeights& w = m_.layers[layer];
  const int H = c_.n_heads, nope = c_.qk_nope_head_dim, rope = c_.qk_rope_head_dim, r = c_.kv_lora_rank;
  const int qk = nope + rope, D = c_.head_dim, ql = c_.q_lora_rank;
  const float* h = h_.data();
  float* qf = mla_q_.data();  // [n, H, nope + rope]
  if (ql > 0) {
    linear(pool_, h, n, {{w.wq_a, mla_qa_.data(), nullptr}, {w.wkv_a, mla_kva_.data(), nullptr}}, linear_);
    for (int i = 0; i < n; ++i)
      rms_norm(mla_qa_.data() + size_t(i) * ql, w.q_a_norm.data(), ql, c_.rms_eps, mla_qa_.data() + size_t(i) * ql);
    linear(pool_, mla_qa_.data(), n, {{w.wq_b, qf, nullptr}}, linear_);
  } else {
    linear(pool_, h, n, {{w.wq, qf, nullptr}, {w.wkv_a, mla_kva_.data(), nullptr}}, linear_);
  }
  for (int i = 0; i < n; ++i) {  // the cache row [RMSNorm(c_raw) * kv_a_norm ; k_rope] (D = r + rope)
    const float* kva = mla_kva_.data() + size_t(i) * D;
    rms_norm(kva, w.kv_a_norm.data(), r, c_.rms_eps, k + size_t(i) * D);
    std::copy(kva + r, kva + D, k + size_t(i) * D + r);
  }
  const std::vector<float>& uk_t = mla_uk_t_[layer];
  for (int hh = 0; hh < H; ++hh) {  // q_h = [W_UK_h^T q_nope_h ; q_rope_h]
    for (int i = 0; i < n; ++i) {
      const float* src = qf + (size_t(i) * H + hh) * qk;
      std::copy(src, src + nope, mla_in_.data() + size_t(i) * nope);
      std::copy(src + nope, src + qk, q + (size_t(i) * H + hh) * D + r);
    }
    const WeightView w_uk_t{DType::kF32, r, nope, uk_t.data() + size_t(hh) * r * nope};
    linear(pool_, mla_in_.data(), n, {{w_uk_t, mla_res_.data(), nullptr}}, linear_);
    for (int i = 0; i < n; ++i)
      std::copy(mla_res_.data() + size_t(i) * r, mla_res_.data() + size_t(i + 1) * r, q + (size_t(i) * H + hh) * D);
  }
}

// att [n, H, D]: per head the first r features are sum_j p_j c_j; o_h = W_UV_h of them.
const float* DenseLayers::mla_out(int layer, const float* att, int n) {
  const LayerWeights& w = m_.layers[layer];
  const int H = c_.n_heads, nope = c_.qk_nope_head_dim, vh = c_.v_head_dim, r = c_.kv_lora_rank, D = c_.head_dim;
  for (int hh = 0; hh < H; ++hh) {
    for (int i = 0; i < n; ++i) {
      const float* src = att + (size_t(i) * H + hh) * D;
      std::copy(src, src + r, mla_in_.data() + size_t(i) * r);
    }
    // W_UV_h: rows h (nope + v) + nope ... + v of wkv_b, in its stored dtype
    const WeightView w_uv{w.wkv_b.dtype, vh, r, w.wkv_b.row(int64_t{hh} * (nope + vh) + nope)};
    linear(pool_, mla_in_.data(), n, {{w_uv, mla_res_.data(), nullptr}}, linear_);
    for (int i = 0; i < n; ++i)
      std::copy(mla_res_.data() + size_t(i) * vh, mla_res_.data() + size_t(i + 1) * vh,
                mla_o_.data() + (size_t(i) * H + hh) * vh);
  }
  return mla_o_.data();
}

void DenseLayers::out_ffn(int layer, const float* att, int n, float* x) {
  ensure(n);
  const LayerWeights& w = m_.layers[layer];
  const int dim = c_.dim;
  float* h = h_.data();
  linear(pool_, c_.mla() ? mla_out(layer, att, n) : att, n, {{w.wo, tmp_.data(), nullptr}}, linear_);
  if (c_.sandwich_norms)  // Gemma: the attention output normalised before the residual add
    for (int r = 0; r < n; ++r) rms_norm(tmp_.data() + r * dim, w.post_attn_norm.data(), dim, c_.rms_eps, tmp_.data() + r * dim);
  add_inplace(x, tmp_.data(), static_cast<int64_t>(n) * dim);
  for (int r0 = 0; r0 < n; r0 += kFfnRows) {
    const int nr = std::min(kFfnRows, n - r0);
    float* xr = x + static_cast<size_t>(r0) * dim;
    for (int r = 0; r < nr; ++r) rms_norm(xr + r * dim, w.ffn_norm.data(), dim, c_.rms_eps, h + r * dim);
    linear(pool_, h, nr, {{w.w_gate, gate_.data(), nullptr}, {w.w_up, up_.data(), nullptr}}, linear_);
    if (c_.ffn_activation == FfnActivation::kGeluTanh)
      geglu_tanh(gate_.data(), up_.data(), static_cast<int64_t>(nr) * c_.hidden_dim);
    else
      swiglu(gate_.data(), up_.data(), static_cast<int64_t>(nr) * c_.hidden_dim);
    linear(pool_, gate_.data(), nr, {{w.w_down, tmp_.data(), nullptr}}, linear_);
    if (c_.sandwich_norms)
      for (int r = 0; r < nr; ++r) rms_norm(tmp_.data() + r * dim, w.post_ffn_norm.data(), dim, c_.rms_eps, tmp_.data() + r * dim);
    add_inplace(xr, tmp_.data(), static_cast<int64_t>(nr) * dim);
  }
}

void DenseLayers::logits(const float* x, std::span<const int> rows, float* out) {
  if (rows.empty()) return;
  const int n_out = static_cast<int>(rows.size());
  ensure(n_out);
  const int dim = c_.dim;
  for (int i = 0; i < n_out; ++i)
    rms_norm(x + static_cast<size_t>(rows[i]) * dim, m_.final_norm.data(), dim, c_.rms_eps,
             h_.data() + static_cast<size_t>(i) * dim);
  linear(pool_, h_.data(), n_out, {{m_.lm_head, out, nullptr}}, linear_);
  if (const float cap = c_.final_softcap; cap > 0)  // Gemma 2: logits <- cap tanh(logits / cap)
    for (size_t i = 0; i < static_cast<size_t>(n_out) * c_.vocab_size; ++i) out[i] = cap * std::tanh(out[i] / cap);
}

}  // namespace kvlab::engine_detail
