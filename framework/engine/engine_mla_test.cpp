// Multi-head latent attention (MLA, ModelConfig::mla()) in the engine, on tiny random models
// (make_random_model with the MLA matrices). The engine runs MLA absorbed (model.h): one latent
// KV head per layer of kv_lora_rank + qk_rope_head_dim features, the value rows aliasing the key
// rows (kv_store.h "Values alias keys"). Checked here:
//   - the absorbed engine equals the decompressed form (per head K = [W_UK c ; k_rope],
//     V = W_UV c, plain attention), written below as a float64 loop reference, within
//     logit_bound() (the engine's fp32 rounding; the reference's is negligible);
//   - chunked prefill == token-by-token decode, and small pages == one page per layer (paged ==
//     contiguous), within 2 logit_bound() (two differently rounded fp32 passes);
//   - every built-in policy with its unlimited parameters == no policy, on the latent slots (one
//     KV head, GQA ratio n_heads); policies that rotate keys at their cache position are refused;
//   - store bytes per token = (kv_lora_rank + qk_rope_head_dim) x layers x bytes per element, for
//     f32, f16 and int8 (its per-row scale included), and what a sequence holds;
//   - KIVI formats and the device backends are refused naming the feature.
// The logits against the numpy reference on the GGUF fixtures are engine_mla_logits_test's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "kernels/testing/reference_dense.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

constexpr int kVocab = 97;

// q_lora > 0 (V2/V3) or not (V2-Lite); v_head_dim != qk_nope != qk_rope; head_dim = r + rope.
ModelConfig mla_config(bool q_lora) {
  ModelConfig c = tiny_llama_config(kVocab, /*max_seq_len=*/256, /*n_heads=*/4, /*n_kv_heads=*/1,
                                    /*head_dim=*/40);
  c.arch = "deepseek2";
  c.n_layers = 3;
  c.rope_style = RopeStyle::kInterleaved;
  c.q_lora_rank = q_lora ? 24 : 0;
  c.kv_lora_rank = q_lora ? 32 : 48;
  c.qk_nope_head_dim = q_lora ? 16 : 8;
  c.qk_rope_head_dim = q_lora ? 8 : 16;
  c.v_head_dim = q_lora ? 20 : 12;
  c.head_dim = c.kv_lora_rank + c.qk_rope_head_dim;
  c.query_scale = 1.f / std::sqrt(float(c.qk_nope_head_dim + c.qk_rope_head_dim));
  c.tied_embeddings = !q_lora;
  return c;
}

// ---- the decompressed reference (float64 loops) ----

std::vector<double> to_double(const WeightView& w) {
  const std::vector<float> f = weight_to_float(w);
  return std::vector<double>(f.begin(), f.end());
}

// y[rows] = W[rows, cols] x[cols]
using testing::reference_matvec;  // the fp64 dense pieces (kernels/testing/reference_dense.h)
using testing::reference_rmsnorm;

// Interleaved RoPE of x[d] at pos: pair (2i, 2i+1) by pos * theta^(-2i/d).
void rope(double* x, int d, int64_t pos, double theta) {
  for (int i = 0; i < d / 2; ++i) {
    const double a = double(pos) * std::pow(theta, -2.0 * i / d);
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
    x[2 * i + 1] = x1 * std::cos(a) + x0 * std::sin(a);
  }
}

std::vector<double> decompressed_logits(const Model& m, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = m.config;
  const int n = static_cast<int>(tokens.size()), H = c.n_heads, D = c.dim;
  const int nope = c.qk_nope_head_dim, rp = c.qk_rope_head_dim, vh = c.v_head_dim, r = c.kv_lora_rank;
  const int qk = nope + rp;
  const double scale = 1.0 / std::sqrt(double(qk));
  std::vector<std::vector<double>> x(n);
  const std::vector<double> emb = to_double(m.tok_embeddings);
  for (int t = 0; t < n; ++t) x[t].assign(emb.begin() + int64_t(tokens[t]) * D, emb.begin() + int64_t(tokens[t] + 1) * D);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = m.layers[l];
    const auto wq_a = to_double(w.wq_a), wq_b = to_double(w.wq_b), wq = to_double(w.wq);
    const auto wkv_a = to_double(w.wkv_a), wkv_b = to_double(w.wkv_b), wo = to_double(w.wo);
    const auto wg = to_double(w.w_gate), wu = to_double(w.w_up), wd = to_double(w.w_down);
    // per token: q [H, qk], per-head K [H, qk] and V [H, vh]
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto h = reference_rmsnorm(x[t], w.attn_norm, c.rms_eps);
      q[t] = c.q_lora_rank > 0
                 ? reference_matvec(wq_b, int64_t(H) * qk,
                                    reference_rmsnorm(reference_matvec(wq_a, c.q_lora_rank, h), w.q_a_norm, c.rms_eps))
                 : reference_matvec(wq, int64_t(H) * qk, h);
      const auto kva = reference_matvec(wkv_a, r + rp, h);
      const auto cl = reference_rmsnorm(std::vector<double>(kva.begin(), kva.begin() + r), w.kv_a_norm, c.rms_eps);
      std::vector<double> k_rope(kva.begin() + r, kva.end());
      rope(k_rope.data(), rp, t, c.rope_theta);
      const auto kv = reference_matvec(wkv_b, int64_t(H) * (nope + vh), cl);  // per head [k_nope ; v]
      k[t].resize(size_t(H) * qk);
      v[t].resize(size_t(H) * vh);
      for (int hh = 0; hh < H; ++hh) {
        rope(&q[t][size_t(hh) * qk + nope], rp, t, c.rope_theta);
        for (int i = 0; i < nope; ++i) k[t][size_t(hh) * qk + i] = kv[size_t(hh) * (nope + vh) + i];
        for (int i = 0; i < rp; ++i) k[t][size_t(hh) * qk + nope + i] = k_rope[i];
        for (int i = 0; i < vh; ++i) v[t][size_t(hh) * vh + i] = kv[size_t(hh) * (nope + vh) + nope + i];
      }
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(size_t(H) * vh, 0.0);
      for (int hh = 0; hh < H; ++hh) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < qk; ++i) d += q[t][size_t(hh) * qk + i] * k[j][size_t(hh) * qk + i];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < vh; ++i) att[size_t(hh) * vh + i] += s[j] / sum * v[j][size_t(hh) * vh + i];
      }
      const auto o = reference_matvec(wo, D, att);
      for (int i = 0; i < D; ++i) x[t][i] += o[i];
      const auto h = reference_rmsnorm(x[t], w.ffn_norm, c.rms_eps);
      auto g = reference_matvec(wg, c.hidden_dim, h);
      const auto u = reference_matvec(wu, c.hidden_dim, h);
      for (int i = 0; i < c.hidden_dim; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const auto f = reference_matvec(wd, D, g);
      for (int i = 0; i < D; ++i) x[t][i] += f[i];
    }
  }
  const auto lm = to_double(m.lm_head);
  std::vector<double> out;
  for (int t = 0; t < n; ++t) {
    const auto lg = reference_matvec(lm, c.vocab_size, reference_rmsnorm(x[t], m.final_norm, c.rms_eps));
    out.insert(out.end(), lg.begin(), lg.end());
  }
  return out;
}

// ---- engine runs ----

std::vector<float> run(const Model& m, std::unique_ptr<AttentionPolicy> policy, int n_prompt, int n_decode,
                       int block_size = 8, int chunk = 16) {
  return prompt_then_decode(m, std::move(policy), random_tokens(n_prompt + n_decode, kVocab, 7), n_prompt,
                            block_size, chunk);
}

template <typename A, typename B>
double max_abs_diff(const A& a, const B& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

TEST(EngineMla, AbsorbedEqualsTheDecompressedReference) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "q_lora" : "no q_lora");
    auto m = make_random_model(mla_config(q_lora), DType::kF32, 21);
    const auto tokens = random_tokens(37, kVocab, 3);
    const auto want = decompressed_logits(*m, tokens);
    const auto got = prefill_logits(*m, tokens);
    const double d = max_abs_diff(got, want), bound = logit_bound(*m, tokens.size());
    std::printf("  %s: max |absorbed - decompressed| %.3g, bound %.3g\n", q_lora ? "q_lora" : "no q_lora", d, bound);
    EXPECT_LE(d, bound);
    // the attention is not degenerate: the logits vary with the context
    EXPECT_GT(max_abs_diff(std::vector<float>(got.begin(), got.begin() + kVocab),
                           std::vector<float>(got.end() - kVocab, got.end())), 100 * bound);
  }
}

TEST(EngineMla, PrefillEqualsDecodeAndPagedEqualsContiguous) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora ? "q_lora" : "no q_lora");
    auto m = make_random_model(mla_config(q_lora), DType::kF32, 22);
    const int n = 45;
    const double two = 2 * logit_bound(*m, n);
    const auto prefill = run(*m, nullptr, n, 0, /*block_size=*/7, /*chunk=*/16);
    const auto decoded = run(*m, nullptr, 1, n - 1, 7);
    EXPECT_LE(max_abs_diff(prefill, decoded), two);
    for (int bs : {1, 3, 16}) EXPECT_LE(max_abs_diff(run(*m, nullptr, 20, 25, bs), run(*m, nullptr, 20, 25, 256)), two) << bs;
  }
}

TEST(EngineMla, EveryPolicyUnlimitedEqualsFull) {
  PolicyRegistry registry = make_builtin_registry();
  const ModelConfig c = mla_config(true);
  auto m = make_random_model(c, DType::kF32, 23);
  const auto full = run(*m, nullptr, 30, 20);
  const double bound = 2 * logit_bound(*m, 50);  // explicit selections sum in another order
  int checked = 0;
  for (const std::string& name : registry.names()) {
    SCOPED_TRACE(name);
    const auto params = registry.at(name).unlimited_params();
    if (!params) continue;
    auto policy = registry.create(name, *params, policy_shape(c));
    if (policy->needs().rope_at_cache_position) {  // refused, naming the feature
      EngineOptions o{.threads = 1};
      Engine e(*m, o);
      try {
        e.start_sequence(std::move(policy));
        ADD_FAILURE() << "expected an Error";
      } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("multi-head latent attention"), std::string::npos) << err.what();
      }
      continue;
    }
    EXPECT_LE(max_abs_diff(run(*m, std::move(policy), 30, 20), full), bound);
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

TEST(EngineMla, StoreBytesPerTokenAreTheLatentRow) {
  const ModelConfig c = mla_config(true);
  auto m = make_random_model(c, DType::kF32, 24);
  const size_t row = size_t(c.kv_lora_rank + c.qk_rope_head_dim) * c.n_layers;  // elements per token
  EXPECT_EQ(c.kv_bytes_per_token(DType::kF32), row * 4);
  EXPECT_EQ(c.kv_bytes_per_token(DType::kF16), row * 2);
  EXPECT_EQ(c.mha_kv_bytes_per_token(DType::kF32),
            size_t(c.n_layers) * c.n_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim) * 4);
  const int bs = 8;
  for (auto [format, bytes] : {std::pair{KvFormat::kF32, 4.0}, std::pair{KvFormat::kF16, 2.0},
                               std::pair{KvFormat::kBf16, 2.0}}) {
    SCOPED_TRACE(kv_format_name(format));
    EngineOptions o{.threads = 1, .block_size_tokens = bs, .kv_format = format};
    Engine e(*m, o);
    EXPECT_DOUBLE_EQ(kv_bytes_per_token(e.kv().config()), double(row) * bytes);
    EXPECT_EQ(e.kv().block_bytes(), size_t(bs) * (c.kv_lora_rank + c.qk_rope_head_dim) * bytes);
    SeqId s = e.start_sequence();
    std::vector<float> lg;
    const auto tokens = random_tokens(3 * bs, kVocab, 5);
    ASSERT_EQ(e.prefill(s, tokens, lg), StepStatus::kOk);
    EXPECT_EQ(e.sequence_stats(s).kv_bytes_current, size_t(3 * bs) * row * size_t(bytes));
    // one KV head: the values are the keys' rows
    const LayerKv kv = e.kv().layer(s, 0);
    EXPECT_EQ(kv.view.num_kv_heads, 1);
    EXPECT_EQ(kv.k_bytes, kv.v_bytes);
  }
  // int8: the row's fp32 scale too (kv_format.h), still one row per token
  EngineOptions o{.threads = 1, .block_size_tokens = bs, .kv_format = KvFormat::kInt8};
  Engine e(*m, o);
  KvStoreConfig two_arenas = e.kv().config();
  two_arenas.values_alias_keys = false;
  EXPECT_DOUBLE_EQ(2 * kv_bytes_per_token(e.kv().config()), kv_bytes_per_token(two_arenas));
}

TEST(EngineMla, RefusesKiviAndDevicesNamingTheFeature) {
  auto m = make_random_model(mla_config(true), DType::kF32, 26);
  auto expect_error = [&](EngineOptions o, const std::string& needle) {
    try {
      Engine e(*m, o);
      ADD_FAILURE() << "expected an Error mentioning " << needle;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
  };
  expect_error(EngineOptions{.kv_format = KvFormat::kInt4}, "MLA's latent cache");
  expect_error(EngineOptions{.kv_format = KvFormat::kInt2}, "MLA's latent cache");
  expect_error(EngineOptions{.device = Device::kEmulated}, "multi-head latent attention");
}

}  // namespace
}  // namespace kvlab
