// The engine against an independent, plain double-precision forward pass (written here, with
// its own RoPE and attention; no KV store), and against itself: prefill vs token-by-token
// decode, batched vs single, paged (block sizes 1, 3, 16) vs one contiguous block, prefill chunk
// sizes, fork with copy-on-write, every weight dtype, GQA ratios, QKV bias and both RoPE
// layouts, an evicting window policy and a StreamingLLM-style rope-at-cache-position policy,
// the attention probe, and bad input.
#include "framework/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "framework/core/error.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "kernels/cpu/quant_matvec.h"

namespace kvlab {
namespace {

ModelConfig tiny_config(int n_heads = 4, int n_kv_heads = 2, int head_dim = 16) {
  return tiny_llama_config(/*vocab_size=*/97, /*max_seq_len=*/64, n_heads, n_kv_heads, head_dim);
}

// ---- the reference ---------------------------------------------------------------------------

// Which earlier tokens (indices into the sequence, ascending, ending with i itself) query i
// reads, and whether keys are rotated to their rank in that list (StreamingLLM) rather than
// their text position.
struct RefAttention {
  std::function<std::vector<int>(int layer, int i)> keys;
  bool rope_at_rank = false;
};

RefAttention dense_causal() {
  return {[](int, int i) {
            std::vector<int> k(i + 1);
            std::iota(k.begin(), k.end(), 0);
            return k;
          },
          false};
}

void ref_rope(std::vector<double>& x, int n_heads, int hd, double pos, const ModelConfig& c) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
      const double a = pos * freq, co = std::cos(a), si = std::sin(a);
      const int ia = c.rope_style == RopeStyle::kNeox ? i : 2 * i;
      const int ib = c.rope_style == RopeStyle::kNeox ? i + hd / 2 : 2 * i + 1;
      const double xa = x[h * hd + ia], xb = x[h * hd + ib];
      x[h * hd + ia] = xa * co - xb * si;
      x[h * hd + ib] = xa * si + xb * co;
    }
}

std::vector<double> ref_matvec(const std::vector<float>& w, int rows, int cols, const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k) y[r] += static_cast<double>(w[static_cast<size_t>(r) * cols + k]) * x[k];
  return y;
}

std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// Token-by-token forward in double; returns logits [tokens, vocab].
std::vector<float> reference_logits(const Model& m, const std::vector<int32_t>& tokens,
                                    const RefAttention& att = dense_causal()) {
  const ModelConfig& c = m.config;
  const int hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, G = nh / nkv;
  struct L {
    std::vector<float> wq, wk, wv, wo, wg, wu, wd;
  };
  std::vector<L> lw;
  for (const LayerWeights& w : m.layers)
    lw.push_back({weight_to_float(w.wq), weight_to_float(w.wk), weight_to_float(w.wv), weight_to_float(w.wo),
                  weight_to_float(w.w_gate), weight_to_float(w.w_up), weight_to_float(w.w_down)});
  const std::vector<float> emb = weight_to_float(m.tok_embeddings), head = weight_to_float(m.lm_head);
  // raw (unrotated) keys and values per layer and token
  std::vector<std::vector<std::vector<double>>> K(c.n_layers), V(c.n_layers);
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<double> x(emb.begin() + static_cast<size_t>(tokens[i]) * c.dim,
                          emb.begin() + static_cast<size_t>(tokens[i] + 1) * c.dim);
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& w = m.layers[l];
      auto h = ref_rmsnorm(x, w.attn_norm, c.rms_eps);
      auto q = ref_matvec(lw[l].wq, nh * hd, c.dim, h);
      auto k = ref_matvec(lw[l].wk, nkv * hd, c.dim, h);
      auto v = ref_matvec(lw[l].wv, nkv * hd, c.dim, h);
      if (!w.bq.empty())
        for (int j = 0; j < nh * hd; ++j) q[j] += w.bq[j];
      if (!w.bk.empty())
        for (int j = 0; j < nkv * hd; ++j) k[j] += w.bk[j], v[j] += w.bv[j];
      if (c.qk_norm) {  // Qwen3: per head, before RoPE
        auto per_head = [&](std::vector<double>& t, int heads, const std::vector<float>& g) {
          for (int hh = 0; hh < heads; ++hh) {
            const auto y = ref_rmsnorm(std::vector<double>(t.begin() + hh * hd, t.begin() + (hh + 1) * hd), g, c.rms_eps);
            std::copy(y.begin(), y.end(), t.begin() + hh * hd);
          }
        };
        per_head(q, nh, w.q_norm);
        per_head(k, nkv, w.k_norm);
      }
      K[l].push_back(k);
      V[l].push_back(v);
      const std::vector<int> keys = att.keys(l, static_cast<int>(i));
      ref_rope(q, nh, hd, att.rope_at_rank ? keys.size() - 1 : i, c);
      std::vector<std::vector<double>> krot;
      for (size_t r = 0; r < keys.size(); ++r) {
        auto kr = K[l][keys[r]];
        ref_rope(kr, nkv, hd, att.rope_at_rank ? r : keys[r], c);
        krot.push_back(kr);
      }
      std::vector<double> o(nh * hd, 0.0);
      for (int hq = 0; hq < nh; ++hq) {
        const int kh = hq / G;
        std::vector<double> s(keys.size());
        double mx = -INFINITY;
        for (size_t r = 0; r < keys.size(); ++r) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += q[hq * hd + e] * krot[r][kh * hd + e];
          s[r] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[r]);
        }
        double z = 0;
        for (double& v2 : s) z += (v2 = std::exp(v2 - mx));
        for (size_t r = 0; r < keys.size(); ++r)
          for (int e = 0; e < hd; ++e) o[hq * hd + e] += s[r] / z * V[l][keys[r]][kh * hd + e];
      }
      auto ao = ref_matvec(lw[l].wo, c.dim, nh * hd, o);
      for (int j = 0; j < c.dim; ++j) x[j] += ao[j];
      h = ref_rmsnorm(x, w.ffn_norm, c.rms_eps);
      auto g = ref_matvec(lw[l].wg, c.hidden_dim, c.dim, h);
      auto u = ref_matvec(lw[l].wu, c.hidden_dim, c.dim, h);
      for (int j = 0; j < c.hidden_dim; ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
      auto dn = ref_matvec(lw[l].wd, c.dim, c.hidden_dim, g);
      for (int j = 0; j < c.dim; ++j) x[j] += dn[j];
    }
    auto h = ref_rmsnorm(x, m.final_norm, c.rms_eps);
    auto lg = ref_matvec(head, c.vocab_size, c.dim, h);
    logits.insert(logits.end(), lg.begin(), lg.end());
  }
  return logits;
}

// ---- helpers ---------------------------------------------------------------------------------


float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

// Logits of every token, fed one at a time through decode().
std::vector<float> decode_all(Engine& e, SeqId s, const std::vector<int32_t>& tokens) {
  std::vector<float> all, lg;
  for (int32_t t : tokens) {
    EXPECT_EQ(e.decode(std::span<const SeqId>(&s, 1), std::span<const int32_t>(&t, 1), lg), StepStatus::kOk);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  return all;
}

constexpr float kTol = 1e-4f;

// ---- tests -----------------------------------------------------------------------------------

TEST(Engine, PrefillAndDecodeMatchTheReference) {
  auto model = make_random_model(tiny_config(), DType::kF32, 1);
  const auto tokens = random_tokens(37, model->config.vocab_size, 2);
  const auto want = reference_logits(*model, tokens);
  for (int threads : {1, 2}) {
    EngineOptions o;
    o.threads = threads;
    o.prefill_chunk_tokens = 16;  // 37 = 16 + 16 + 5: chunks continue the cache
    o.max_batch = 2;              // KV room for two sequences
    Engine e(*model, o);
    SeqId s = e.start_sequence();
    std::vector<float> got;
    ASSERT_EQ(e.prefill(s, tokens, got, /*all_logits=*/true), StepStatus::kOk);
    EXPECT_LE(max_abs_diff(got, want), kTol) << "prefill, threads " << threads;
    EXPECT_EQ(e.n_tokens(s), 37);
    SeqId d = e.start_sequence();
    EXPECT_LE(max_abs_diff(decode_all(e, d, tokens), want), kTol) << "decode, threads " << threads;
  }
}

TEST(Engine, LongPrefillChunkMatchesTheReference) {
  // 300 rows in one chunk: the feed-forward block runs in several row blocks, and the dense
  // layers take the sgemm path
  ModelConfig c = tiny_config();
  c.max_seq_len = 320;
  auto model = make_random_model(c, DType::kF32, 31);
  const auto tokens = random_tokens(300, c.vocab_size, 32);
  EngineOptions o{.threads = 2, .prefill_chunk_tokens = 512};
  Engine e(*model, o);
  std::vector<float> got;
  ASSERT_EQ(e.prefill(e.start_sequence(), tokens, got, true), StepStatus::kOk);
  EXPECT_LE(max_abs_diff(got, reference_logits(*model, tokens)), kTol);
}

TEST(Engine, LastLogitsOnlyAndPrefillThenDecode) {
  auto model = make_random_model(tiny_config(), DType::kF32, 3);
  const int V = model->config.vocab_size;
  const auto tokens = random_tokens(20, V, 4);
  const auto want = reference_logits(*model, tokens);
  Engine e(*model, {});
  SeqId s = e.start_sequence();
  std::vector<float> lg;
  ASSERT_EQ(e.prefill(s, std::span(tokens).first(12), lg), StepStatus::kOk);
  ASSERT_EQ(lg.size(), static_cast<size_t>(V));
  EXPECT_LE(max_abs_diff(lg, std::vector<float>(want.begin() + 11 * V, want.begin() + 12 * V)), kTol);
  const std::vector<int32_t> rest(tokens.begin() + 12, tokens.end());
  EXPECT_LE(max_abs_diff(decode_all(e, s, rest), std::vector<float>(want.begin() + 12 * V, want.end())), kTol);
}

struct ShapeCase {
  int n_heads, n_kv_heads, head_dim;
  DType dtype;
  bool bias;
  RopeStyle rope;
  bool qk_norm = false;
};

class EngineShapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(EngineShapes, MatchTheReference) {
  const ShapeCase p = GetParam();
  ModelConfig c = tiny_config(p.n_heads, p.n_kv_heads, p.head_dim);
  c.qkv_bias = p.bias;
  c.qk_norm = p.qk_norm;
  c.arch = p.qk_norm ? "qwen3" : p.bias ? "qwen2" : "llama";
  c.rope_style = p.rope;
  auto model = make_random_model(c, p.dtype, 5);
  const auto tokens = random_tokens(19, c.vocab_size, 6);
  const auto want = reference_logits(*model, tokens);
  EngineOptions o{.threads = 2, .block_size_tokens = 3, .max_batch = 2};
  Engine e(*model, o);
  std::vector<float> got;
  ASSERT_EQ(e.prefill(e.start_sequence(), tokens, got, true), StepStatus::kOk);
  EXPECT_LE(max_abs_diff(got, want), kTol);  // sgemm on dequantised weights: fp32 rounding only
  const auto dec = decode_all(e, e.start_sequence(), tokens);
  if (!quant_matvec_supports(p.dtype)) {
    EXPECT_LE(max_abs_diff(dec, want), kTol);
    return;
  }
  // q8_0 decode multiplies with int8 activations (kernels/cpu/quant_matvec.h): logit_bound.h's
  // bound for that, per logit (and a broken kernel, off by O(1), still fails it)
  ASSERT_EQ(dec.size(), want.size());
  for (size_t i = 0; i < dec.size(); ++i)
    ASSERT_LE(std::fabs(double(dec[i]) - want[i]),
              activation_quant_logit_bound(*model, quant_block_values(p.dtype), int64_t(i % c.vocab_size), tokens.size()))
        << "decode logit " << i;
}

INSTANTIATE_TEST_SUITE_P(
    GqaDtypesBiasRope, EngineShapes,
    ::testing::Values(ShapeCase{4, 4, 16, DType::kF32, false, RopeStyle::kInterleaved},   // MHA
                      ShapeCase{4, 1, 16, DType::kF32, false, RopeStyle::kNeox},          // MQA
                      ShapeCase{8, 2, 8, DType::kF32, true, RopeStyle::kNeox},            // G=4, bias
                      ShapeCase{2, 2, 32, DType::kF16, false, RopeStyle::kInterleaved},
                      ShapeCase{4, 2, 16, DType::kBF16, true, RopeStyle::kInterleaved},
                      ShapeCase{4, 2, 16, DType::kQ8_0, false, RopeStyle::kNeox},
                      ShapeCase{8, 2, 24, DType::kF32, false, RopeStyle::kNeox, true},    // Qwen3 QK-norm
                      ShapeCase{4, 4, 16, DType::kBF16, false, RopeStyle::kNeox, true}),
    [](const ::testing::TestParamInfo<ShapeCase>& info) {
      const ShapeCase& p = info.param;
      return str_cat("h", p.n_heads, "_kv", p.n_kv_heads, "_hd", p.head_dim, "_", dtype_name(p.dtype),
                     p.bias ? "_bias" : "", p.rope == RopeStyle::kNeox ? "_neox" : "_interleaved",
                     p.qk_norm ? "_qknorm" : "");
    });

TEST(Engine, PagedMatchesContiguousAndChunkSizesAgree) {
  auto model = make_random_model(tiny_config(), DType::kF32, 7);
  const auto tokens = random_tokens(45, model->config.vocab_size, 8);
  std::vector<float> contiguous;
  {
    EngineOptions o;
    o.block_size_tokens = 64;  // the whole context in one block per layer
    Engine e(*model, o);
    ASSERT_EQ(e.prefill(e.start_sequence(), tokens, contiguous, true), StepStatus::kOk);
  }
  for (int bs : {1, 3, 7, 16})
    for (int chunk : {1, 5, 256}) {
      EngineOptions o{.block_size_tokens = bs, .prefill_chunk_tokens = chunk};
      Engine e(*model, o);
      std::vector<float> got;
      ASSERT_EQ(e.prefill(e.start_sequence(), tokens, got, true), StepStatus::kOk);
      EXPECT_LE(max_abs_diff(got, contiguous), kTol) << "block " << bs << " chunk " << chunk;
    }
}

TEST(Engine, BatchedDecodeMatchesSingle) {
  auto model = make_random_model(tiny_config(), DType::kF32, 9);
  const int V = model->config.vocab_size;
  const int B = 10;  // above kGemmMinTokens: the batch takes the sgemm path
  std::vector<std::vector<int32_t>> prompts, conts;
  for (int b = 0; b < B; ++b) {
    prompts.push_back(random_tokens(3 + b, V, 100 + b));  // different lengths
    conts.push_back(random_tokens(6, V, 200 + b));
  }
  for (int batch : {3, B}) {
    EngineOptions o{.threads = 2, .max_batch = batch};
    Engine e(*model, o);
    std::vector<SeqId> seqs;
    std::vector<float> lg;
    for (int b = 0; b < batch; ++b) {
      seqs.push_back(e.start_sequence());
      ASSERT_EQ(e.prefill(seqs.back(), prompts[b], lg), StepStatus::kOk);
    }
    std::vector<std::vector<float>> got(batch);
    for (int step = 0; step < 6; ++step) {
      std::vector<int32_t> toks;
      for (int b = 0; b < batch; ++b) toks.push_back(conts[b][step]);
      ASSERT_EQ(e.decode(seqs, toks, lg), StepStatus::kOk);
      ASSERT_EQ(lg.size(), static_cast<size_t>(batch) * V);
      for (int b = 0; b < batch; ++b) got[b].insert(got[b].end(), lg.begin() + b * V, lg.begin() + (b + 1) * V);
    }
    for (int b = 0; b < batch; ++b) {
      std::vector<int32_t> all = prompts[b];
      all.insert(all.end(), conts[b].begin(), conts[b].end());
      const auto want = reference_logits(*model, all);
      EXPECT_LE(max_abs_diff(got[b], std::vector<float>(want.end() - 6 * V, want.end())), kTol)
          << "batch " << batch << " seq " << b;
    }
  }
}

TEST(Engine, ForkKeepsBothSequencesExact) {
  auto model = make_random_model(tiny_config(), DType::kF32, 11);
  const int V = model->config.vocab_size;
  const auto prompt = random_tokens(21, V, 12);  // ends mid-block: the shared last block is COW'd
  const auto a = random_tokens(9, V, 13), b = random_tokens(9, V, 14);
  EngineOptions o{.block_size_tokens = 4, .max_batch = 2};
  Engine e(*model, o);
  SeqId parent = e.start_sequence();
  std::vector<float> lg;
  ASSERT_EQ(e.prefill(parent, prompt, lg), StepStatus::kOk);
  SeqId child = e.fork(parent);
  EXPECT_EQ(e.n_tokens(child), 21);
  const auto got_child = decode_all(e, child, b);    // the child writes first
  const auto got_parent = decode_all(e, parent, a);  // the parent must not see the child's rows
  auto pa = prompt, pb = prompt;
  pa.insert(pa.end(), a.begin(), a.end());
  pb.insert(pb.end(), b.begin(), b.end());
  const auto wa = reference_logits(*model, pa), wb = reference_logits(*model, pb);
  EXPECT_LE(max_abs_diff(got_parent, std::vector<float>(wa.end() - 9 * V, wa.end())), kTol);
  EXPECT_LE(max_abs_diff(got_child, std::vector<float>(wb.end() - 9 * V, wb.end())), kTol);
  e.end_sequence(child);
  EXPECT_THROW(e.n_tokens(child), Error);
}

// Sliding window of W keys (i - W < j <= i) by selection, evicting what no later query reads.
class WindowPolicy : public AttentionPolicy {
 public:
  explicit WindowPolicy(int w) : w_(w) {}
  void select(const LayerStep& step, KeySelection& out) override {
    const LayerCacheView& cv = *step.cache;
    out.begin(step.n_new, step.shape.n_kv_heads);
    for (int r = 0; r < step.n_new; ++r)
      for (int h = 0; h < step.shape.n_kv_heads; ++h) {
        for (int s = 0; s < cv.n_slots(); ++s) {
          const int64_t p = cv.slot_position(s, h);
          if (cv.slot_valid(s, h) && p > step.positions[r] - w_ && p <= step.positions[r]) out.add(s, s + 1);
        }
        out.close_list();
      }
  }
  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    const LayerCacheView& cv = *step.cache;
    const int64_t last = step.positions[step.n_new - 1];
    for (int h = 0; h < step.shape.n_kv_heads; ++h)
      for (int s = 0; s < cv.n_slots(); ++s)
        if (cv.slot_valid(s, h) && cv.slot_position(s, h) <= last - w_) out.slots[h].push_back(s);
  }
  int64_t budget_tokens(int, int64_t n_seen) const override { return std::min<int64_t>(w_, n_seen); }
  void reset() override {}

 private:
  int w_;
};

// StreamingLLM: S sinks + R recent kept after each step, keys rotated at their cache rank.
class SinkPolicy : public AttentionPolicy {
 public:
  SinkPolicy(int s, int r) : s_(s), r_(r) {}
  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.rope_at_cache_position = true;
    return n;
  }
  void after_attention(const LayerStep& step, const StepStats&, Evictions& out) override {
    const LayerCacheView& cv = *step.cache;
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      std::vector<int> live;
      for (int s = 0; s < cv.n_slots(); ++s)
        if (cv.slot_valid(s, h)) live.push_back(s);
      const int n = static_cast<int>(live.size());
      if (n > s_ + r_)
        for (int k = s_; k < n - r_; ++k) out.slots[h].push_back(live[k]);
    }
  }
  int64_t budget_tokens(int, int64_t n_seen) const override { return std::min<int64_t>(s_ + r_, n_seen); }
  void reset() override {}

 private:
  int s_, r_;
};

TEST(Engine, WindowPolicyMatchesMaskedReferenceInPrefillAndDecode) {
  auto model = make_random_model(tiny_config(), DType::kF32, 15);
  const int W = 6;
  const auto tokens = random_tokens(40, model->config.vocab_size, 16);
  RefAttention win{[&](int, int i) {
                     std::vector<int> k;
                     for (int j = std::max(0, i - W + 1); j <= i; ++j) k.push_back(j);
                     return k;
                   },
                   false};
  const auto want = reference_logits(*model, tokens, win);
  EngineOptions o{.block_size_tokens = 4, .max_batch = 2, .prefill_chunk_tokens = 8};
  Engine e(*model, o);
  std::vector<float> got;
  SeqId p = e.start_sequence(std::make_unique<WindowPolicy>(W));
  ASSERT_EQ(e.prefill(p, tokens, got, true), StepStatus::kOk);
  EXPECT_LE(max_abs_diff(got, want), kTol);
  SeqId d = e.start_sequence(std::make_unique<WindowPolicy>(W));
  EXPECT_LE(max_abs_diff(decode_all(e, d, tokens), want), kTol);
  const SequenceStats st = e.sequence_stats(d);
  EXPECT_EQ(st.decode_steps, 40);
  EXPECT_DOUBLE_EQ(st.attended_set_last, W);
  EXPECT_DOUBLE_EQ(st.attended_achieved_last, W);
  // evicted blocks went back: at most ceil(W / 4) + 1 blocks per layer stay resident
  EXPECT_LE(st.blocks_current, model->config.n_layers * 3);
  EXPECT_GT(st.blocks_peak, 0);
}

TEST(Engine, SinkPolicyRotatesKeysAtCachePositions) {
  auto model = make_random_model(tiny_config(), DType::kF32, 17);
  const int S = 2, R = 5;
  const auto tokens = random_tokens(30, model->config.vocab_size, 18);
  // step i reads sinks [0,S), the R most recent earlier tokens kept after step i-1, and i
  RefAttention sinks{[&](int, int i) {
                       std::vector<int> k;
                       for (int j = 0; j <= i; ++j)
                         if (j < S || j >= i - R) k.push_back(j);
                       return k;
                     },
                     true};
  const auto want = reference_logits(*model, tokens, sinks);
  EngineOptions o;
  o.block_size_tokens = 3;
  Engine e(*model, o);
  SeqId s = e.start_sequence(std::make_unique<SinkPolicy>(S, R));
  EXPECT_LE(max_abs_diff(decode_all(e, s, tokens), want), kTol);
  EXPECT_DOUBLE_EQ(e.sequence_stats(s).attended_achieved_last, S + R + 1);
}

TEST(Engine, ProbeMeasuresRecallAndError) {
  auto model = make_random_model(tiny_config(), DType::kF32, 19);
  const auto tokens = random_tokens(40, model->config.vocab_size, 20);
  EngineOptions o{.max_batch = 2, .probe = true, .probe_every = 1};
  Engine e(*model, o);
  SeqId full = e.start_sequence();
  decode_all(e, full, tokens);
  SequenceStats st = e.sequence_stats(full);
  EXPECT_EQ(st.probe_samples, 40 * 2 /*probed layers 0, 1*/ * 4 /*query heads*/);
  EXPECT_NEAR(st.probe_recall_min, 1.0, 1e-9);
  EXPECT_LT(st.probe_rel_error_max, 1e-4);
  SeqId win = e.start_sequence(std::make_unique<WindowPolicy>(4));
  decode_all(e, win, tokens);
  st = e.sequence_stats(win);
  EXPECT_LT(st.probe_recall_mean, 0.999);
  EXPECT_GT(st.probe_recall_mean, 0.0);
  EXPECT_GT(st.probe_rel_error_mean, 1e-4);
}

// Per-layer probe sums add up to the pooled values: samples sum to probe_samples, recall and
// error sums over layers divided by probe_samples give the pooled means.
TEST(Engine, ProbePerLayerPoolsToTheTotals) {
  auto model = make_random_model(tiny_config(), DType::kF32, 19);
  const auto tokens = random_tokens(40, model->config.vocab_size, 20);
  EngineOptions o{.probe = true, .probe_every = 3};
  o.probe_layers = {1, 0};  // the engine sorts them
  Engine e(*model, o);
  SeqId win = e.start_sequence(std::make_unique<WindowPolicy>(4));
  decode_all(e, win, tokens);
  const SequenceStats st = e.sequence_stats(win);
  ASSERT_EQ(st.probe_per_layer.size(), 2u);
  int64_t samples = 0;
  double recall = 0, err = 0;
  for (size_t i = 0; i < st.probe_per_layer.size(); ++i) {
    const LayerProbeStats& lp = st.probe_per_layer[i];
    EXPECT_EQ(lp.layer, int(i));
    // decode steps 0, 3, ..., 39 probed (14 steps), 4 query heads each
    EXPECT_EQ(lp.samples, 14 * 4);
    EXPECT_NEAR(lp.recall_mean(), lp.recall_sum / double(lp.samples), 1e-15);
    EXPECT_GT(lp.recall_mean(), 0.0);
    EXPECT_LT(lp.recall_mean(), 0.999);
    EXPECT_GE(lp.recall_mean(), st.probe_recall_min - 1e-12);
    EXPECT_LE(lp.rel_error_mean(), st.probe_rel_error_max + 1e-12);
    samples += lp.samples;
    recall += lp.recall_sum;
    err += lp.rel_error_sum;
  }
  EXPECT_EQ(samples, st.probe_samples);
  EXPECT_NEAR(recall / double(samples), st.probe_recall_mean, 1e-12);
  EXPECT_NEAR(err / double(samples), st.probe_rel_error_mean, 1e-12);

  // Only the listed layer is reported; full attention recalls everything in it.
  EngineOptions one = o;
  one.probe_layers = {1};
  Engine e1(*model, one);
  SeqId full = e1.start_sequence();
  decode_all(e1, full, tokens);
  const SequenceStats fs = e1.sequence_stats(full);
  ASSERT_EQ(fs.probe_per_layer.size(), 1u);
  EXPECT_EQ(fs.probe_per_layer[0].layer, 1);
  EXPECT_EQ(fs.probe_per_layer[0].samples, fs.probe_samples);
  EXPECT_NEAR(fs.probe_per_layer[0].recall_mean(), 1.0, 1e-9);
  EXPECT_LT(fs.probe_per_layer[0].rel_error_mean(), 1e-4);

  // Probes off: nothing per layer.
  Engine e0(*model, EngineOptions{});
  SeqId plain = e0.start_sequence();
  decode_all(e0, plain, tokens);
  EXPECT_TRUE(e0.sequence_stats(plain).probe_per_layer.empty());
}

TEST(Engine, BadInputIsAnErrorOrAStatus) {
  auto model = make_random_model(tiny_config(), DType::kF32, 21);
  EngineOptions o;
  o.max_batch = 2;
  Engine e(*model, o);
  SeqId s = e.start_sequence();
  std::vector<float> lg;
  const auto too_long = random_tokens(65, model->config.vocab_size, 22);
  EXPECT_EQ(e.prefill(s, too_long, lg), StepStatus::kContextFull);
  EXPECT_EQ(e.n_tokens(s), 0);
  std::vector<int32_t> bad = {5, 97};
  EXPECT_THROW(e.prefill(s, bad, lg), Error);
  EXPECT_THROW(e.prefill(s, {}, lg), Error);
  EXPECT_THROW(e.n_tokens(1234), Error);
  const std::vector<SeqId> twice = {s, s};
  const std::vector<int32_t> two = {1, 2};
  EXPECT_THROW(e.decode(twice, two, lg), Error);
  const auto fill = random_tokens(64, model->config.vocab_size, 23);
  ASSERT_EQ(e.prefill(s, fill, lg), StepStatus::kOk);
  const int32_t t = 3;
  EXPECT_EQ(e.decode(std::span<const SeqId>(&s, 1), std::span<const int32_t>(&t, 1), lg), StepStatus::kContextFull);
  SeqId with_policy = e.start_sequence(std::make_unique<WindowPolicy>(3));
  EXPECT_THROW(e.fork(with_policy), Error);
}

TEST(Engine, OutOfBlocksIsAStatus) {
  auto model = make_random_model(tiny_config(), DType::kF32, 24);
  EngineOptions o;
  o.block_size_tokens = 4;
  const size_t block_bytes = 2 * 4 * 2 * 16 * sizeof(float);
  o.kv_budget_bytes = block_bytes * 2 /*layers*/ * 3;  // 12 tokens
  Engine e(*model, o);
  SeqId s = e.start_sequence();
  std::vector<float> lg;
  EXPECT_EQ(e.prefill(s, random_tokens(12, 97, 25), lg), StepStatus::kOk);
  const int32_t t = 3;
  EXPECT_EQ(e.decode(std::span<const SeqId>(&s, 1), std::span<const int32_t>(&t, 1), lg), StepStatus::kOutOfBlocks);
  EXPECT_EQ(e.n_tokens(s), 12);
}

}  // namespace
}  // namespace kvlab
