// Conformance of every registered policy (built-ins and the example plugin) through the real
// engine (framework/engine) on a random-weight model built in memory:
//   - unlimited budget == full (same logits to float tolerance);
//   - every mask-based policy == a plain double-precision forward pass (written here, no KV
//     store) whose attention reads exactly the keys of the mask the policy claims;
//   - resident tokens <= budget every step; evicted tokens free KV blocks (bytes measured);
//     allocated-but-unused KV memory < 5% in a mixed-length batch;
//   - two sequences decoded in one batch == each decoded alone; a reset policy == a new one.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "framework/engine/engine.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "kernels/testing/reference_attention.h"
#include "policies/builtin.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {


PolicyRegistry& registry() { return testing::builtins_and_plugin(KVLAB_EXAMPLE_PLUGIN); }

ModelConfig tiny_config(int max_seq_len = 160) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 6;
  c.n_kv_heads = 2;  // G = 3
  c.head_dim = 16;
  c.hidden_dim = 96;
  c.vocab_size = 97;
  c.max_seq_len = max_seq_len;
  c.rope_theta = 10000.f;
  c.rope_style = RopeStyle::kInterleaved;
  return c;
}

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

EngineOptions engine_options(int max_batch = 1) {
  EngineOptions o;
  o.threads = 1;
  o.max_batch = max_batch;
  o.prefill_chunk_tokens = 256;
  return o;
}

constexpr int kPrefill = 20, kTokens = 110;

// All logits [kTokens, vocab]: a prefill of kPrefill tokens (all logits), then decode.
std::vector<float> run_logits(Engine& e, std::unique_ptr<AttentionPolicy> p,
                              const std::vector<int32_t>& tokens,
                              const std::function<void(SeqId, int64_t)>& each_step = {}) {
  const SeqId s = e.start_sequence(std::move(p));
  std::vector<float> all, lg;
  EXPECT_EQ(e.prefill(s, std::span(tokens.data(), kPrefill), all, true, /*prompt_end=*/true), StepStatus::kOk);
  if (each_step) each_step(s, kPrefill);
  for (size_t i = kPrefill; i < tokens.size(); ++i) {
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&tokens[i], 1), lg), StepStatus::kOk);
    all.insert(all.end(), lg.begin(), lg.end());
    if (each_step) each_step(s, int64_t(i) + 1);
  }
  e.end_sequence(s);
  return all;
}

using testing::max_abs_diff;

// ---- independent reference: token-by-token double forward pass under a mask ------------------

using Mask = std::function<bool(int layer, int kv_head, int64_t i, int64_t j)>;

std::vector<double> matvec(const std::vector<float>& w, int rows, int cols, const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    const float* wr = w.data() + size_t(r) * cols;
    for (int k = 0; k < cols; ++k) y[r] += double(wr[k]) * x[k];
  }
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

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

std::vector<float> masked_reference(const Model& m, const std::vector<int32_t>& tokens, const Mask& mask) {
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
      auto h = rmsnorm(x, m.layers[l].attn_norm, c.rms_eps);
      auto q = matvec(w[l][0], nh * hd, c.dim, h);
      auto k = matvec(w[l][1], nkv * hd, c.dim, h);
      auto v = matvec(w[l][2], nkv * hd, c.dim, h);
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
      auto ao = matvec(w[l][3], c.dim, nh * hd, o);
      for (int j = 0; j < c.dim; ++j) x[j] += ao[j];
      h = rmsnorm(x, m.layers[l].ffn_norm, c.rms_eps);
      auto g = matvec(w[l][4], c.hidden_dim, c.dim, h), u = matvec(w[l][5], c.hidden_dim, c.dim, h);
      for (int j = 0; j < c.hidden_dim; ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
      auto dn = matvec(w[l][6], c.dim, c.hidden_dim, g);
      for (int j = 0; j < c.dim; ++j) x[j] += dn[j];
    }
    auto h = rmsnorm(x, m.final_norm, c.rms_eps);
    auto lg = matvec(head, c.vocab_size, c.dim, h);
    logits.insert(logits.end(), lg.begin(), lg.end());
  }
  return logits;
}

// ---- configurations -------------------------------------------------------------------------

using Config = testing::PolicyConfig;
using testing::describe;
std::vector<Config> budgeted_configs() { return testing::acting_policy_configs(registry().names()); }

std::unique_ptr<AttentionPolicy> make(const Config& c) {
  return registry().create(c.policy, c.params, policy_shape(tiny_model().config));
}

// ---- tests ----------------------------------------------------------------------------------

TEST(EngineConformance, UnlimitedBudgetEqualsFull) {
  Engine e(tiny_model(), engine_options());
  const auto tokens = random_tokens(kTokens, 1);
  const auto full = run_logits(e, nullptr, tokens);
  for (const std::string& name : registry().names()) {
    auto params = registry().at(name).unlimited_params();
    ASSERT_TRUE(params) << name;
    const auto got = run_logits(e, make({name, *params}), tokens);
    // the policy's path (explicit selections, eviction bookkeeping) may sum in another order:
    // two differently rounded passes (logit_bound.h)
    EXPECT_LE(max_abs_diff(got, full), 2 * logit_bound(tiny_model(), tokens.size())) << name;
  }
}

TEST(EngineConformance, MaskPoliciesEqualDenseMaskedReference) {
  Engine e(tiny_model(), engine_options());
  const auto tokens = random_tokens(kTokens, 2);
  int checked = 0;
  for (const Config& c : budgeted_configs()) {
    auto p = make(c);
    auto mask = p->claimed_mask();
    if (!mask) continue;
    ++checked;
    const auto want = masked_reference(tiny_model(), tokens, mask->allow);
    const auto got = run_logits(e, std::move(p), tokens);
    // against the double-precision masked reference: one fp32 pass (logit_bound.h)
    EXPECT_LE(max_abs_diff(got, want), logit_bound(tiny_model(), tokens.size())) << describe(c);
  }
  // full is checked against the causal reference too.
  const auto want = masked_reference(tiny_model(), tokens, [](int, int, int64_t i, int64_t j) { return j <= i; });
  EXPECT_LE(max_abs_diff(run_logits(e, nullptr, tokens), want), logit_bound(tiny_model(), tokens.size())) << "full";
  EXPECT_GE(checked, 8);
}

TEST(EngineConformance, ResidentWithinBudgetAndEvictionFreesBlocks) {
  Engine e(tiny_model(), engine_options());
  const auto tokens = random_tokens(kTokens, 3);
  const int n_layers = tiny_model().config.n_layers, n_kv = tiny_model().config.n_kv_heads;
  size_t full_bytes = 0;
  run_logits(e, nullptr, tokens, [&](SeqId s, int64_t) { full_bytes = e.sequence_stats(s).kv_bytes_current; });
  for (const Config& c : budgeted_configs()) {
    SCOPED_TRACE(describe(c));
    auto budget_of = make(c);  // same parameters: budget_tokens is a function of them
    size_t bytes = 0;
    bool bounded = true;
    run_logits(e, make(c), tokens, [&](SeqId s, int64_t n_seen) {
      for (int l = 0; l < n_layers; ++l) {
        const int64_t budget = budget_of->budget_tokens(l, n_seen);
        bounded &= budget >= 0;
        for (int h = 0; h < n_kv; ++h)
          if (budget >= 0) {
            ASSERT_LE(e.kv().resident_tokens(s, l, h), budget) << "layer " << l << " n_seen " << n_seen;
          }
      }
      bytes = e.sequence_stats(s).kv_bytes_current;
    });
    // A policy with a token budget below the length holds fewer blocks than full attention:
    // evicted tokens are really freed, not just masked.
    if (bounded && budget_of->budget_tokens(0, kTokens) * 2 < kTokens) {
      EXPECT_LT(bytes, full_bytes) << bytes << " bytes resident vs full " << full_bytes;
    }
  }
}

TEST(EngineConformance, WindowMemoryStaysFlat) {
  Engine e(tiny_model(), engine_options());
  const auto tokens = random_tokens(kTokens + 40, 4);
  std::vector<float> lg;
  const SeqId s = e.start_sequence(make({"sliding_window", {{"window", int64_t(16)}}}));
  size_t peak_late = 0, at_32 = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    ASSERT_EQ(e.decode(std::span(&s, 1), std::span(&tokens[i], 1), lg), StepStatus::kOk);
    const size_t b = e.sequence_stats(s).kv_bytes_current;
    if (i == 32) at_32 = b;
    if (i > 32) peak_late = std::max(peak_late, b);
  }
  // 16 resident tokens span at most 2 blocks of 16 per layer, plus one being filled.
  EXPECT_LE(peak_late, at_32 + at_32 / 2);
  EXPECT_GT(at_32, 0u);
  e.end_sequence(s);
  EXPECT_EQ(e.kv().stats().blocks_in_use, 0);
}

TEST(EngineConformance, MixedLengthBatchWastesUnderFivePercent) {
  auto model = make_random_model(tiny_config(1100), DType::kF32, 99);
  const PolicyModelShape shape = policy_shape(model->config);
  const int lengths[] = {347, 512, 731, 1001};
  // Two mixes: mostly dense, and every sequence evicting (per-head holes, compaction).
  const std::vector<std::vector<Config>> mixes = {
      {{"full", {}}, {"sliding_window", {{"window", int64_t(320)}}}, {"full", {}}, {"strided", {}}},
      {{"h2o", {{"heavy", 0.2}, {"recent", 0.1}}}, {"sinks", {{"recent", int64_t(300)}}},
       {"h2o", {{"heavy", 0.2}, {"recent", 0.1}}}, {"landmark", {}}},
  };
  for (const auto& mix : mixes) {
    Engine e(*model, engine_options(4));
    std::vector<float> lg;
    std::vector<SeqId> seqs;
    for (int k = 0; k < 4; ++k) {
      seqs.push_back(e.start_sequence(registry().create(mix[k].policy, mix[k].params, shape)));
      const auto t = random_tokens(lengths[k], 10 + k);
      ASSERT_EQ(e.prefill(seqs.back(), t, lg), StepStatus::kOk);
    }
    // Decode the batch for a while (the evicting sequences drop tokens every step).
    for (int step = 0; step < 40; ++step) {
      std::vector<int32_t> tok(4, int32_t(step % 97));
      ASSERT_EQ(e.decode(seqs, tok, lg), StepStatus::kOk);
      const KvStats st = e.kv().stats();
      ASSERT_LT(st.waste_fraction, 0.05) << describe(mix[0]) << " mix, step " << step << ": "
                                         << st.slots_valid << " live of " << st.slots_allocated;
    }
  }
}

TEST(EngineConformance, BatchedEqualsAloneAndResetEqualsNew) {
  const auto ta = random_tokens(kTokens, 5), tb = random_tokens(kTokens, 6);
  for (const Config& c : budgeted_configs()) {
    SCOPED_TRACE(describe(c));
    Engine solo(tiny_model(), engine_options());
    const auto alone_a = run_logits(solo, make(c), ta);
    const auto alone_b = run_logits(solo, make(c), tb);
    Engine batch(tiny_model(), engine_options(2));
    const SeqId sa = batch.start_sequence(make(c)), sb = batch.start_sequence(make(c));
    std::vector<float> la, lb, lg;
    ASSERT_EQ(batch.prefill(sa, std::span(ta.data(), kPrefill), la, true, true), StepStatus::kOk);
    ASSERT_EQ(batch.prefill(sb, std::span(tb.data(), kPrefill), lb, true, true), StepStatus::kOk);
    const std::vector<SeqId> both = {sa, sb};
    const size_t vocab = 97;
    for (int i = kPrefill; i < kTokens; ++i) {
      const std::vector<int32_t> tok = {ta[i], tb[i]};
      ASSERT_EQ(batch.decode(both, tok, lg), StepStatus::kOk);
      la.insert(la.end(), lg.begin(), lg.begin() + vocab);
      lb.insert(lb.end(), lg.begin() + vocab, lg.end());
    }
    EXPECT_LE(max_abs_diff(la, alone_a), 1e-5f) << "batched a != alone";
    EXPECT_LE(max_abs_diff(lb, alone_b), 1e-5f) << "batched b != alone";

    // Reset: one policy object serves sequence a, is reset, then serves b (through a thin
    // forwarding wrapper, since the engine owns what it is given).
    struct Forward final : AttentionPolicy {
      AttentionPolicy* p;
      explicit Forward(AttentionPolicy* x) : p(x) {}
      PolicyNeeds needs() const override { return p->needs(); }
      void select(const LayerStep& s, KeySelection& o) override { p->select(s, o); }
      void after_attention(const LayerStep& s, const StepStats& st, Evictions& o) override { p->after_attention(s, st, o); }
      int64_t budget_tokens(int l, int64_t n) const override { return p->budget_tokens(l, n); }
      void reset() override { p->reset(); }
    };
    auto shared = make(c);
    run_logits(solo, std::make_unique<Forward>(shared.get()), ta);
    shared->reset();
    EXPECT_LE(max_abs_diff(run_logits(solo, std::make_unique<Forward>(shared.get()), tb), alone_b), 0.f)
        << "reset != new";
  }
}

}  // namespace
}  // namespace kvlab
