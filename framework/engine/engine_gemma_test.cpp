// Gemma 2 / 3 in the engine on tiny random models (make_random_model with the Gemma features:
// sliding-window layers, per-layer RoPE base, q/k norm, sandwich norms, GeGLU, query_pre_attn
// scaling, soft-capping). The logits against the independent reference are engine_logits_test's
// (the Gemma fixtures); here the engine's own consistency:
//   - a window at least as long as the sequence changes nothing, bit for bit (the clip of the
//     selection is then a no-op);
//   - chunked prefill == token-by-token decode with a window shorter than the sequence;
//   - every built-in policy with its unlimited parameters == no policy (the model's window
//     composes with the policy's selections and evictions);
//   - paged == contiguous (with Qwen3's q/k norm too), windows shorter and longer than the sequence;
//   - a policy sees each layer's kind (LayerStep::sliding_window), and the scorer family's
//     budget_layers budgets per kind (global layers only, or all);
//   - a local layer keeps only its window in the store (W - 1 tokens between steps), alone and
//     under a policy's own budget;
//   - the probe's dense reference is the model's: full attention reads everything it allows
//     (recall 1 on local layers too);
//   - the device backends refuse the family by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

constexpr int kVocab = 101;

// Gemma 3's shape at toy size: layers 0, 1, 3 local, 2 global; window w.
ModelConfig gemma3_config(int window) {
  ModelConfig c = tiny_llama_config(kVocab, /*max_seq_len=*/256, /*n_heads=*/4, /*n_kv_heads=*/2,
                                    /*head_dim=*/24);  // head_dim != dim / n_heads
  c.arch = "gemma3";
  c.n_layers = 4;
  c.rope_style = RopeStyle::kNeox;
  c.tied_embeddings = true;
  c.qk_norm = true;
  c.embed_scale = true;
  c.sandwich_norms = true;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.query_scale = 1.f / std::sqrt(20.f);  // query_pre_attn_scalar 20 != head_dim
  c.rope_theta = 1e6f;
  c.rope_local_theta = 1e4f;
  c.sliding_window = window;
  c.local_layers = {1, 1, 0, 1};
  return c;
}

// Gemma 2's: even layers local, soft-capping small enough to bend the random model's scores.
ModelConfig gemma2_config(int window) {
  ModelConfig c = gemma3_config(window);
  c.arch = "gemma2";
  c.qk_norm = false;
  c.rope_local_theta = 0;
  c.rope_theta = 10000;
  c.local_layers = {1, 0, 1, 0};
  c.attn_softcap = 1.5f;
  c.final_softcap = 4.f;
  return c;
}

// Qwen3's: q/k RMSNorm per head before RoPE, head_dim 24 != 64 / 4, GQA 2, no bias.
ModelConfig qwen3_config() {
  ModelConfig c = tiny_llama_config(kVocab, /*max_seq_len=*/256, /*n_heads=*/4, /*n_kv_heads=*/2, /*head_dim=*/24);
  c.arch = "qwen3";
  c.qk_norm = true;
  c.rope_style = RopeStyle::kNeox;
  return c;
}

std::vector<float> run(const Model& m, std::unique_ptr<AttentionPolicy> policy, int n_prompt, int n_decode,
                       int chunk = 16, int block_size = 8) {
  return prompt_then_decode(m, std::move(policy), random_tokens(n_prompt + n_decode, kVocab, 7), n_prompt,
                            block_size, chunk);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST(EngineGemma, WindowLongerThanTheSequenceChangesNothing) {
  for (bool g2 : {false, true}) {
    SCOPED_TRACE(g2 ? "gemma2" : "gemma3");
    ModelConfig windowed = g2 ? gemma2_config(60) : gemma3_config(60);
    ModelConfig global = windowed;
    global.local_layers.clear();  // every layer global (Gemma 3: the global RoPE everywhere)
    windowed.rope_local_theta = 0;
    auto a = make_random_model(windowed, DType::kF32, 11), b = make_random_model(global, DType::kF32, 11);
    EXPECT_EQ(max_abs_diff(run(*a, nullptr, 40, 20), run(*b, nullptr, 40, 20)), 0.f);
  }
}

TEST(EngineGemma, ShortWindowChangesTheLogits) {  // the window is applied at all
  ModelConfig windowed = gemma3_config(5);
  ModelConfig global = windowed;
  global.local_layers.clear();
  windowed.rope_local_theta = 0;
  auto a = make_random_model(windowed, DType::kF32, 11), b = make_random_model(global, DType::kF32, 11);
  // past position 5 the local layers read fewer keys: far more than rounding apart
  EXPECT_GT(max_abs_diff(run(*a, nullptr, 40, 0), run(*b, nullptr, 40, 0)), 100 * logit_bound(*a, 40));
}

TEST(EngineGemma, PrefillEqualsDecodeWithAShortWindow) {
  for (bool g2 : {false, true}) {
    SCOPED_TRACE(g2 ? "gemma2" : "gemma3");
    auto m = make_random_model(g2 ? gemma2_config(5) : gemma3_config(5), DType::kF32, 12);
    const int n = 48;
    const auto prefill = run(*m, nullptr, n, 0, /*chunk=*/7);  // chunks straddle the window
    // decode: the first token by a one-row prefill, then one at a time
    auto decoded = run(*m, nullptr, 1, n - 1);
    // prefill (sgemm, multi-row attention) and decode (matvec) round differently: two passes
    EXPECT_LE(max_abs_diff(prefill, decoded), 2 * logit_bound(*m, n));
  }
}

// Paged == contiguous for the families' own attention paths: Gemma 3 and Gemma 2 with a window
// shorter (5) and longer (60) than the 45 tokens, and Qwen3 (q/k norm, head_dim 24 != 64 / 4,
// GQA 2), pages of 1, 3 and 16 tokens against one page per layer, within 2 logit_bound(), as
// EngineMla's (a page layout may change the order of fp32 sums; on this machine every case was
// equal bit for bit).
TEST(EngineFamilies, PagedEqualsContiguous) {
  const std::vector<std::pair<std::string, ModelConfig>> cases = {
      {"gemma3 w5", gemma3_config(5)}, {"gemma3 w60", gemma3_config(60)},
      {"gemma2 w5", gemma2_config(5)}, {"gemma2 w60", gemma2_config(60)}, {"qwen3", qwen3_config()}};
  for (const auto& [what, c] : cases) {
    SCOPED_TRACE(what);
    auto m = make_random_model(c, DType::kF32, 19);
    const double two = 2 * logit_bound(*m, 45);
    const auto contiguous = run(*m, nullptr, 20, 25, 16, /*block_size=*/256);
    for (int bs : {1, 3, 16}) {
      const float d = max_abs_diff(run(*m, nullptr, 20, 25, 16, bs), contiguous);
      EXPECT_LE(d, two) << "block " << bs;
      std::printf("  %s block %d: max |diff| %.3g, bound %.3g\n", what.c_str(), bs, d, two);
    }
  }
}

TEST(EngineGemma, EveryPolicyUnlimitedEqualsFull) {  // and Qwen3's q/k-normed keys
  PolicyRegistry registry = make_builtin_registry();
  const std::vector<std::pair<std::string, ModelConfig>> cases = {
      {"gemma3", gemma3_config(6)}, {"gemma2", gemma2_config(6)}, {"qwen3", qwen3_config()}};
  for (const auto& [what, c] : cases) {
    auto m = make_random_model(c, DType::kF32, 13);
    const auto full = run(*m, nullptr, 30, 20);
    const double bound = 2 * logit_bound(*m, 50);  // explicit selections sum in another order
    for (const std::string& name : registry.names()) {
      SCOPED_TRACE(what + " " + name);
      const auto params = registry.at(name).unlimited_params();
      if (!params) continue;
      const float d = max_abs_diff(run(*m, registry.create(name, *params, policy_shape(c)), 30, 20), full);
      EXPECT_LE(d, bound);
    }
  }
}

// Records LayerStep::sliding_window per layer.
class KindPolicy final : public AttentionPolicy {
 public:
  explicit KindPolicy(std::vector<int64_t>& seen) : seen_(seen) {}
  void select(const LayerStep& step, KeySelection&) override {
    if (static_cast<int>(seen_.size()) <= step.layer) seen_.resize(step.layer + 1, -1);
    seen_[step.layer] = step.sliding_window;
  }
  void reset() override {}

 private:
  std::vector<int64_t>& seen_;
};

TEST(EngineGemma, PoliciesSeeTheLayerKind) {
  const ModelConfig c = gemma3_config(6);
  auto m = make_random_model(c, DType::kF32, 14);
  std::vector<int64_t> seen;
  run(*m, std::make_unique<KindPolicy>(seen), 10, 2);
  EXPECT_EQ(seen, (std::vector<int64_t>{6, 6, 0, 6}));
}

// Tokens of (layer, KV head) resident after a prefill that ended the prompt, and block-table
// entries after `n_decode` more decode steps.
struct Resident {
  std::vector<int64_t> at_prompt_end;
  int64_t blocks_after_decode = 0;
};

Resident resident(const Model& m, std::unique_ptr<AttentionPolicy> policy, int n_prompt, int n_decode) {
  EngineOptions o{.threads = 1, .block_size_tokens = 8, .prefill_chunk_tokens = 7};
  Engine e(m, o);
  const auto tokens = random_tokens(n_prompt + n_decode, kVocab, 9);
  SeqId s = e.start_sequence(std::move(policy));
  std::vector<float> lg;
  EXPECT_EQ(e.prefill(s, std::span(tokens).first(n_prompt), lg, false, /*prompt_end=*/true), StepStatus::kOk);
  Resident r;
  r.at_prompt_end = e.sequence_stats(s).resident_at_prompt_end;
  for (int i = n_prompt; i < n_prompt + n_decode; ++i)
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&tokens[i], 1), lg), StepStatus::kOk);
  r.blocks_after_decode = e.sequence_stats(s).blocks_current;
  return r;
}

TEST(EngineGemma, LocalLayersKeepOnlyTheirWindow) {
  constexpr int kWindow = 5, kPrompt = 40, kDecode = 20;
  const ModelConfig c = gemma3_config(kWindow);  // layers 0, 1, 3 local, 2 global; 2 KV heads
  auto m = make_random_model(c, DType::kF32, 17);
  // The next query (position p + 1) reads positions > p + 1 - W: W - 1 tokens stay on a local
  // layer, every token on the global one.
  const std::vector<int64_t> kept = {4, 4, 4, 4, kPrompt, kPrompt, 4, 4};
  const Resident alone = resident(*m, nullptr, kPrompt, kDecode);
  EXPECT_EQ(alone.at_prompt_end, kept);
  // After 60 tokens the global layer holds ceil(60 / 8) = 8 blocks; a local layer's 4 live
  // tokens sit in at most 3 blocks (holes up to one block before compaction, plus the partly
  // filled last block), where it held 8 before: at most 8 + 3 x 3 blocks in all.
  EXPECT_LE(alone.blocks_after_decode, 8 + 3 * 3);
  // A policy's budget composes: h2o keeps 10 of the global layer, the window 4 of each local one.
  PolicyRegistry registry = make_builtin_registry();
  const Resident h2o = resident(*m, registry.create("h2o", {{"budget_tokens", ParamValue(int64_t(10))}}, policy_shape(c)),
                                kPrompt, kDecode);
  EXPECT_EQ(h2o.at_prompt_end, (std::vector<int64_t>{4, 4, 4, 4, 10, 10, 4, 4}));
}

// budget_layers (policies/budget.h): "all" budgets every layer; "global" budgets the global
// layers only, each local layer keeping its window as under full. Every built-in that declares
// the parameter (the scorer family) with budget_tokens 2, below the window's W - 1 = 4 tokens
// between steps: with "global" a local layer holds exactly W - 1 tokens per KV head (its bytes
// those of the window) and a global layer what it holds with "all" (the same budget there); with
// "all" a local layer holds fewer bytes than its window (the budget cuts it, and the window may
// cut the kept set further; AdaKV and PyramidKV move the budget across heads and layers, so only
// the layer's total is bounded). Unlimited, "global" equals "all" bit for bit and full within
// the bound of EveryPolicyUnlimitedEqualsFull (bit for bit for the policies that are bit for bit
// with "all": the parameter adds no computation).
TEST(EngineGemma, BudgetPerLayerKind) {
  constexpr int kWindow = 5, kPrompt = 40, kDecode = 20;
  PolicyRegistry registry = make_builtin_registry();
  int checked = 0;
  for (bool g2 : {false, true}) {
    const ModelConfig c = g2 ? gemma2_config(kWindow) : gemma3_config(kWindow);
    auto m = make_random_model(c, DType::kF32, 17);
    const auto full = run(*m, nullptr, 30, 20);
    const double bound = 2 * logit_bound(*m, 50);
    const int nkv = c.n_kv_heads;
    const int64_t bytes_per_token_head = 2 * int64_t(c.head_dim) * sizeof(float);  // K and V rows, f32 store
    for (const std::string& name : registry.names()) {
      const PolicyFactory& f = registry.at(name);
      bool declares = false;
      for (const ParamSpec& spec : f.params()) declares |= spec.name == "budget_layers";
      if (!declares) continue;
      SCOPED_TRACE(std::string(g2 ? "gemma2 " : "gemma3 ") + name);
      ++checked;
      std::map<std::string, std::vector<int64_t>> layer_bytes;  // budget_layers -> [layer] resident bytes
      for (const std::string layers : {"all", "global"}) {
        const std::map<std::string, ParamValue> params = {{"budget_tokens", ParamValue(int64_t(2))},
                                                          {"budget_layers", ParamValue(layers)}};
        const Resident r = resident(*m, registry.create(name, params, policy_shape(c)), kPrompt, kDecode);
        ASSERT_EQ(r.at_prompt_end.size(), size_t(c.n_layers * nkv));
        auto& bytes = layer_bytes[layers];
        bytes.assign(c.n_layers, 0);
        for (int l = 0; l < c.n_layers; ++l)
          for (int h = 0; h < nkv; ++h) {
            bytes[l] += r.at_prompt_end[l * nkv + h] * bytes_per_token_head;
            if (layers == "global" && layer_window(c, l) > 0)
              EXPECT_EQ(r.at_prompt_end[l * nkv + h], kWindow - 1) << "local layer " << l << ", KV head " << h;
          }
      }
      const int64_t window_bytes = (kWindow - 1) * nkv * bytes_per_token_head;
      for (int l = 0; l < c.n_layers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        if (layer_window(c, l) > 0) {
          EXPECT_EQ(layer_bytes["global"][l], window_bytes);
          EXPECT_LT(layer_bytes["all"][l], window_bytes);
        } else {
          EXPECT_EQ(layer_bytes["global"][l], layer_bytes["all"][l]);
          EXPECT_LE(layer_bytes["global"][l], 2 * 2 * nkv * bytes_per_token_head);  // a budget, not the 40 tokens
        }
      }
      auto unlimited = f.unlimited_params();
      ASSERT_TRUE(unlimited.has_value());
      const auto all = run(*m, registry.create(name, *unlimited, policy_shape(c)), 30, 20);
      (*unlimited)["budget_layers"] = ParamValue(std::string("global"));
      const auto global = run(*m, registry.create(name, *unlimited, policy_shape(c)), 30, 20);
      EXPECT_EQ(max_abs_diff(global, all), 0.f);
      EXPECT_LE(max_abs_diff(global, full), bound);
      std::printf("  %s %s unlimited, budget_layers global: max |diff| to full %.3g\n", g2 ? "gemma2" : "gemma3",
                  name.c_str(), max_abs_diff(global, full));
    }
  }
  EXPECT_EQ(checked, 2 * 7);  // h2o, snapkv, pyramidkv, adakv, tova, knorm, random
}

TEST(EngineGemma, ProbeReferenceIsTheWindowedModel) {
  const ModelConfig c = gemma2_config(5);
  auto m = make_random_model(c, DType::kF32, 15);
  EngineOptions o{.threads = 1, .block_size_tokens = 8};
  o.probe = true;
  o.probe_layers = {0, 1, 2, 3};
  Engine e(*m, o);
  const auto tokens = random_tokens(30, kVocab, 8);
  SeqId s = e.start_sequence();
  std::vector<float> lg;
  ASSERT_EQ(e.prefill(s, std::span(tokens).first(10), lg), StepStatus::kOk);
  for (int i = 10; i < 30; ++i) ASSERT_EQ(e.decode(std::span(&s, 1), std::span(&tokens[i], 1), lg), StepStatus::kOk);
  const SequenceStats st = e.sequence_stats(s);
  ASSERT_GT(st.probe_samples, 0);
  // full attention reads every key the model allows: recall 1 up to double rounding of sum p
  EXPECT_GE(st.probe_recall_min, 1 - 1e-9);
}

TEST(EngineGemma, DevicesRefuseTheFamily) {
  auto m = make_random_model(gemma3_config(6), DType::kF32, 16);
  EngineOptions o{.threads = 1};
  o.device = Device::kEmulated;
  try {
    Engine e(*m, o);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("sliding-window layers"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kvlab
