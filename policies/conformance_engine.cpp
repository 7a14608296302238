// The conformance suite's engine pieces (conformance.h, namespace engine): the random GQA model,
// its inputs and options, a run's logits, and the double-precision masked reference.
#include <cmath>
#include <random>

#include "framework/core/error.h"
#include "framework/engine/random_model.h"
#include "kernels/testing/reference_attention.h"
#include "kernels/testing/reference_dense.h"
#include "policies/conformance.h"

namespace kvlab::conformance {

// ---- engine helpers -------------------------------------------------------------------------

namespace engine {

namespace {
ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 6;
  c.n_kv_heads = 2;  // G = 3
  c.head_dim = 16;
  c.hidden_dim = 96;
  c.vocab_size = 97;
  c.max_seq_len = 160;
  c.rope_theta = 10000.f;
  c.rope_style = RopeStyle::kInterleaved;
  return c;
}
}  // namespace

const Model& tiny_model() {
  static std::unique_ptr<Model> m = make_random_model(tiny_config(), DType::kF32, 1234);
  return *m;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % 97);
  return t;
}

EngineOptions engine_options(int max_batch) {
  EngineOptions o;
  o.threads = 1;
  o.max_batch = max_batch;
  o.prefill_chunk_tokens = 256;
  return o;
}

std::vector<float> run_logits(Engine& e, std::unique_ptr<AttentionPolicy> p, const std::vector<int32_t>& tokens,
                              const std::function<void(SeqId, int64_t)>& each_step) {
  const SeqId s = e.start_sequence(std::move(p));
  std::vector<float> all, lg;
  if (e.prefill(s, std::span(tokens.data(), kPrefill), all, true, /*prompt_end=*/true) != StepStatus::kOk)
    fail("conformance: prefill of ", kPrefill, " tokens did not return kOk");
  if (each_step) each_step(s, kPrefill);
  for (size_t i = kPrefill; i < tokens.size(); ++i) {
    if (e.decode(std::span(&s, 1), std::span(&tokens[i], 1), lg) != StepStatus::kOk)
      fail("conformance: decode step ", i, " did not return kOk");
    all.insert(all.end(), lg.begin(), lg.end());
    if (each_step) each_step(s, int64_t(i) + 1);
  }
  e.end_sequence(s);
  return all;
}

namespace {
using testing::reference_matvec;
using testing::reference_rmsnorm;

// Interleaved RoPE (pairs 2i, 2i+1) at position pos, every head of x [n, hd].
void rope(std::vector<double>& x, int n, int hd, double pos, double theta) {
  for (int h = 0; h < n; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      const double a = pos * std::pow(theta, -2.0 * i / hd), c = std::cos(a), s = std::sin(a);
      double& x0 = x[size_t(h) * hd + 2 * i];
      double& x1 = x[size_t(h) * hd + 2 * i + 1];
      const double u = x0, v = x1;
      x0 = u * c - v * s, x1 = u * s + v * c;
    }
}
}  // namespace

std::vector<float> masked_reference(const Model& m, const std::vector<int32_t>& tokens,
                                    const std::function<bool(int, int, int64_t, int64_t)>& mask) {
  const ModelConfig& c = m.config;
  const int hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, G = nh / nkv;
  const std::vector<float> emb = weight_to_float(m.tok_embeddings), head = weight_to_float(m.lm_head);
  std::vector<std::array<std::vector<float>, 7>> w;
  for (const LayerWeights& l : m.layers)
    w.push_back({weight_to_float(l.wq), weight_to_float(l.wk), weight_to_float(l.wv), weight_to_float(l.wo),
                 weight_to_float(l.w_gate), weight_to_float(l.w_up), weight_to_float(l.w_down)});
  std::vector<std::vector<std::vector<double>>> K(c.n_layers), V(c.n_layers);  // rotated keys
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<double> x(emb.begin() + size_t(tokens[i]) * c.dim, emb.begin() + size_t(tokens[i] + 1) * c.dim);
    for (int l = 0; l < c.n_layers; ++l) {
      auto h = reference_rmsnorm(x, m.layers[l].attn_norm, c.rms_eps);
      auto q = reference_matvec(w[l][0], nh * hd, h);
      auto k = reference_matvec(w[l][1], nkv * hd, h);
      auto v = reference_matvec(w[l][2], nkv * hd, h);
      rope(q, nh, hd, double(i), c.rope_theta);
      rope(k, nkv, hd, double(i), c.rope_theta);
      K[l].push_back(k), V[l].push_back(v);
      std::vector<double> o(size_t(nh) * hd, 0.0);
      for (int hq = 0; hq < nh; ++hq) {
        const int kh = hq / G;
        const testing::ReferenceRow ref = testing::reference_attention_row(
            q.data() + size_t(hq) * hd, hd, int64_t(i) + 1, 1.0 / std::sqrt(double(hd)),
            [&](int64_t j) { return K[l][j].data() + size_t(kh) * hd; },
            [&](int64_t j) { return V[l][j].data() + size_t(kh) * hd; },
            [&](int64_t j) { return mask(l, kh, int64_t(i), j); });
        for (int e = 0; e < hd; ++e) o[size_t(hq) * hd + e] = ref.out[e];
      }
      auto ao = reference_matvec(w[l][3], c.dim, o);
      for (int j = 0; j < c.dim; ++j) x[j] += ao[j];
      h = reference_rmsnorm(x, m.layers[l].ffn_norm, c.rms_eps);
      auto g = reference_matvec(w[l][4], c.hidden_dim, h), u = reference_matvec(w[l][5], c.hidden_dim, h);
      for (int j = 0; j < c.hidden_dim; ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
      auto dn = reference_matvec(w[l][6], c.dim, g);
      for (int j = 0; j < c.dim; ++j) x[j] += dn[j];
    }
    auto h = reference_rmsnorm(x, m.final_norm, c.rms_eps);
    auto lg = reference_matvec(head, c.vocab_size, h);
    logits.insert(logits.end(), lg.begin(), lg.end());
  }
  return logits;
}

}  // namespace engine

}  // namespace kvlab::conformance
