// The engine with every built-in policy of the registry (policies/builtin.h), default
// parameters, on a tiny random model: prefill in chunks then token-by-token decode run without
// error and give finite logits; after every step each layer and KV head keeps at most the
// policy's budget_tokens resident; and the `full` policy gives exactly the logits of no policy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/random_model.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

ModelConfig small_config() { return tiny_llama_config(/*vocab_size=*/101, /*max_seq_len=*/256); }

std::vector<int32_t> tokens(int n, uint32_t seed) { return random_tokens(n, 101, seed); }

// Logits of a 48-token chunked prefill and then 40 decode steps, concatenated.
std::vector<float> run(Engine& e, std::unique_ptr<AttentionPolicy> policy, const ModelConfig& c,
                       bool check_budget, bool expect_evictions = false) {
  const AttentionPolicy* p = policy.get();
  SeqId s = e.start_sequence(std::move(policy));
  std::vector<float> all, lg;
  const auto prompt = tokens(48, 1), cont = tokens(40, 2);
  EXPECT_EQ(e.prefill(s, prompt, lg), StepStatus::kOk);
  all.insert(all.end(), lg.begin(), lg.end());
  for (int32_t t : cont) {
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kOk);
    all.insert(all.end(), lg.begin(), lg.end());
    if (!check_budget || !p) continue;
    for (int l = 0; l < c.n_layers; ++l) {
      const int64_t budget = p->budget_tokens(l, e.n_tokens(s));
      if (budget < 0) continue;
      for (int h = 0; h < c.n_kv_heads; ++h)
        EXPECT_LE(e.kv().resident_tokens(s, l, h), budget) << "layer " << l << " head " << h;
    }
  }
  for (float v : all) EXPECT_TRUE(std::isfinite(v));
  if (expect_evictions)
    for (int l = 0; l < c.n_layers; ++l) EXPECT_LT(e.kv().resident_tokens(s, l, 0), e.n_tokens(s)) << "layer " << l;
  e.end_sequence(s);
  return all;
}

TEST(EnginePolicies, EveryBuiltinRunsWithinItsBudget) {
  const ModelConfig c = small_config();
  auto model = make_random_model(c, DType::kF32, 3);
  PolicyRegistry registry = make_builtin_registry();
  EngineOptions o{.threads = 1, .block_size_tokens = 8, .prefill_chunk_tokens = 16};
  Engine e(*model, o);
  const PolicyModelShape shape = policy_shape(c);
  // Parameters small enough that every policy evicts or selects within 88 tokens.
  const std::map<std::string, std::map<std::string, ParamValue>> acting = {
      {"h2o", {{"units", std::string("tokens")}, {"recent", 6.0}, {"heavy", 5.0}, {"sinks", int64_t{1}}}},
      {"landmark", {{"chunk_size", int64_t{8}}, {"top_k", int64_t{2}}, {"window", int64_t{12}}, {"sinks", int64_t{2}},
                    {"prefill", std::string("select")}}},
      {"sinks", {{"sinks", int64_t{2}}, {"recent", int64_t{10}}}},
      {"sliding_window", {{"window", int64_t{9}}}},
      {"strided", {{"stride", int64_t{5}}}},
      {"quest", {{"budget_tokens", int64_t{16}}, {"dense_layers", int64_t{1}}}},
  };
  for (const std::string& name : registry.names()) {
    for (bool defaults : {true, false}) {
      SCOPED_TRACE(name + (defaults ? " (defaults)" : " (acting)"));
      std::map<std::string, ParamValue> params;
      if (!defaults) {
        if (!acting.count(name)) continue;
        params = acting.at(name);
      }
      const bool evicts = !defaults && (name == "h2o" || name == "sinks" || name == "sliding_window");
      run(e, registry.create(name, params, shape), c, /*check_budget=*/true, evicts);
    }
  }
}

TEST(EnginePolicies, FullPolicyIsExactlyNoPolicy) {
  const ModelConfig c = small_config();
  auto model = make_random_model(c, DType::kF32, 4);
  PolicyRegistry registry = make_builtin_registry();
  EngineOptions o{.threads = 1, .prefill_chunk_tokens = 16};
  Engine e(*model, o);
  const auto none = run(e, nullptr, c, false);
  const auto full = run(e, registry.create("full", {}, policy_shape(c)), c, false);
  ASSERT_EQ(none.size(), full.size());
  for (size_t i = 0; i < none.size(); ++i) ASSERT_EQ(none[i], full[i]) << i;
}

}  // namespace
}  // namespace kvlab

namespace kvlab {
namespace {

// EngineOptions::max_tokens: a sequence may pass the model's max_seq_len (StreamingLLM's
// setting); the default stops it there; the limit returns kContextFull and changes nothing.
TEST(EnginePolicies, MaxTokensLetsSequencesPassTheModelContext) {
  const ModelConfig c = small_config();  // max_seq_len 256
  auto model = make_random_model(c, DType::kF32, 5);
  PolicyRegistry registry = make_builtin_registry();
  for (const char* policy : {"", "sinks"}) {
    SCOPED_TRACE(std::string("policy '") + policy + "'");
    for (int64_t max_tokens : {int64_t{0}, int64_t{600}}) {
      EngineOptions o{.threads = 1, .block_size_tokens = 8, .max_tokens = max_tokens};
      Engine e(*model, o);
      const int64_t limit = max_tokens ? max_tokens : c.max_seq_len;
      EXPECT_EQ(e.options().max_tokens, limit);
      const std::map<std::string, ParamValue> params = {{"sinks", int64_t{2}}, {"recent", int64_t{30}}};
      SeqId s = e.start_sequence(*policy ? registry.create(policy, params, policy_shape(c)) : nullptr);
      std::vector<float> lg;
      ASSERT_EQ(e.prefill(s, tokens(100, 3), lg), StepStatus::kOk);
      const auto cont = tokens(int(limit - 100), 4);
      for (int32_t t : cont) ASSERT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kOk);
      for (float v : lg) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(e.n_tokens(s), limit);
      int32_t t = 1;
      EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kContextFull);
      EXPECT_EQ(e.n_tokens(s), limit);
      if (*policy) {
        EXPECT_LE(e.kv().resident_tokens(s, 0, 0), 32);
      }
    }
  }
}

}  // namespace
}  // namespace kvlab
