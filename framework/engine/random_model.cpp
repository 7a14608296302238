#include "framework/engine/random_model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "framework/core/error.h"

namespace kvlab {

namespace {

class Builder {
 public:
  Builder(Model& m, DType dtype, uint64_t seed) : m_(m), dtype_(dtype), rng_(seed) {}

  // Generated and converted 64 rows at a time, so building a big model never holds a second,
  // fp32 copy of a whole matrix (the benchmark measures peak RSS).
  WeightView matrix(int64_t rows, int64_t cols) {
    // uniform on [-a, a] with a = sqrt(3 / cols): variance 1 / cols, and cheap to draw
    const float a = std::sqrt(3.f / static_cast<float>(cols));
    const size_t row_bytes = dtype_bytes(dtype_, cols);
    std::shared_ptr<uint8_t[]> buf(new uint8_t[row_bytes * rows]);
    constexpr int64_t kRowsPerChunk = 64;
    std::vector<float> f(static_cast<size_t>(std::min(rows, kRowsPerChunk) * cols));
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerChunk) {
      const int64_t n = std::min(kRowsPerChunk, rows - r0);
      for (int64_t i = 0; i < n * cols; ++i) f[i] = a * uniform_pm1();
      from_float(dtype_, f.data(), buf.get() + r0 * row_bytes, n * cols);
    }
    m_.storage.push_back(std::shared_ptr<const void>(buf, buf.get()));
    return WeightView{dtype_, rows, cols, buf.get()};
  }
  // uniform on [-1, 1) from the top 24 bits of one draw
  float uniform_pm1() { return static_cast<float>(rng_() >> 40) * (2.f / 16777216.f) - 1.f; }

  std::vector<float> vec(int64_t n, float mean, float stddev) {
    std::normal_distribution<float> nd(mean, stddev);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(rng_);
    return v;
  }

 private:
  Model& m_;
  DType dtype_;
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<Model> make_random_model(const ModelConfig& c, DType weight_dtype, uint64_t seed) {
  if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.hidden_dim <= 0 || c.vocab_size <= 0)
    fail("make_random_model: non-positive shape");
  auto m = std::make_unique<Model>();
  m->config = c;
  m->format = "random";
  m->stored_dtype = dtype_name(weight_dtype);
  Builder b(*m, weight_dtype, seed);
  const int64_t qd = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const int64_t kvd = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  // embeddings: unit-scale rows (as trained models roughly have after the first norm)
  m->tok_embeddings = b.matrix(c.vocab_size, c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights w;
    w.attn_norm = b.vec(c.dim, 1.f, 0.1f);
    if (c.mla()) {  // model.h LayerWeights' MLA matrices
      const int64_t mla_q = int64_t{c.n_heads} * (c.qk_nope_head_dim + c.qk_rope_head_dim);
      if (c.q_lora_rank > 0) {
        w.wq_a = b.matrix(c.q_lora_rank, c.dim);
        w.q_a_norm = b.vec(c.q_lora_rank, 1.f, 0.1f);
        w.wq_b = b.matrix(mla_q, c.q_lora_rank);
      } else {
        w.wq = b.matrix(mla_q, c.dim);
      }
      w.wkv_a = b.matrix(c.kv_lora_rank + c.qk_rope_head_dim, c.dim);
      w.kv_a_norm = b.vec(c.kv_lora_rank, 1.f, 0.1f);
      w.wkv_b = b.matrix(int64_t{c.n_heads} * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
      w.wo = b.matrix(c.dim, int64_t{c.n_heads} * c.v_head_dim);
    } else {
      w.wq = b.matrix(qd, c.dim);
      w.wk = b.matrix(kvd, c.dim);
      w.wv = b.matrix(kvd, c.dim);
      w.wo = b.matrix(c.dim, qd);
    }
    if (c.qkv_bias) {
      w.bq = b.vec(qd, 0.f, 0.1f);
      w.bk = b.vec(kvd, 0.f, 0.1f);
      w.bv = b.vec(kvd, 0.f, 0.1f);
    }
    if (c.qk_norm) {
      w.q_norm = b.vec(c.head_dim, 1.f, 0.1f);
      w.k_norm = b.vec(c.head_dim, 1.f, 0.1f);
    }
    w.ffn_norm = b.vec(c.dim, 1.f, 0.1f);
    if (c.sandwich_norms) {
      w.post_attn_norm = b.vec(c.dim, 1.f, 0.1f);
      w.post_ffn_norm = b.vec(c.dim, 1.f, 0.1f);
    }
    w.w_gate = b.matrix(c.hidden_dim, c.dim);
    w.w_up = b.matrix(c.hidden_dim, c.dim);
    w.w_down = b.matrix(c.dim, c.hidden_dim);
    m->layers.push_back(std::move(w));
  }
  m->final_norm = b.vec(c.dim, 1.f, 0.1f);
  m->lm_head = c.tied_embeddings ? m->tok_embeddings : b.matrix(c.vocab_size, c.dim);
  return m;
}

namespace {
ModelConfig llama2c_config(int dim, int layers, int heads, int hidden) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = heads;
  c.head_dim = dim / heads;
  c.hidden_dim = hidden;
  c.vocab_size = 32000;
  c.max_seq_len = 1024;
  c.rope_style = RopeStyle::kInterleaved;
  c.tied_embeddings = true;  // llama2.c's stories models share the classifier
  return c;
}
}  // namespace

ModelConfig config_110m() { return llama2c_config(768, 12, 12, 2048); }
ModelConfig config_15m() { return llama2c_config(288, 6, 6, 768); }

}  // namespace kvlab
