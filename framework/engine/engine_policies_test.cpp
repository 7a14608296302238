// The engine with every built-in policy of the registry (policies/builtin.h), default
// parameters, on a tiny random model: prefill in chunks then token-by-token decode run without
// error and give finite logits; after every step each layer and KV head keeps at most the
// policy's budget_tokens resident; and the `full` policy gives exactly the logits of no policy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

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
  EXPECT_EQ(e.prefill(s, prompt, lg, false, /*prompt_end=*/true), StepStatus::kOk);
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
      {"snapkv", {{"compression_ratio", 0.5}, {"window", int64_t{8}}}},
      {"pyramidkv", {{"compression_ratio", 0.5}, {"window", int64_t{8}}}},
      {"adakv", {{"compression_ratio", 0.5}, {"window", int64_t{8}}}},
      {"tova", {{"budget_tokens", int64_t{20}}}},
      {"knorm", {{"compression_ratio", 0.5}}},
      {"random", {{"budget_tokens", int64_t{12}}, {"compress", std::string("every_step")}}},
  };
  for (const std::string& name : registry.names()) {
    for (bool defaults : {true, false}) {
      SCOPED_TRACE(name + (defaults ? " (defaults)" : " (acting)"));
      std::map<std::string, ParamValue> params;
      if (!defaults) {
        if (!acting.count(name)) continue;
        params = acting.at(name);
      }
      const bool evicts = !defaults && name != "landmark" && name != "strided";
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
// The prompt-end protocol (policy.h): a policy that observes a window of w rows sees
// LayerStep::prompt_end on the prefill's last chunk only, that chunk holds at least w rows (the
// chunk before it shrinks), StepStats::window_attention holds, per query head, the last
// min(w, rows) rows' probabilities (each row's sum to 1 under full attention), queries arrive
// only when asked, and the sequence's seed reaches every step.
class RecordingPolicy final : public AttentionPolicy {
 public:
  struct Seen {
    int layer, n_new;
    bool prompt_end;
    int window_rows;
    std::vector<double> head_sums;  // per query head, sum of window_attention
    bool queries;
    uint64_t seed;
  };
  RecordingPolicy(int window, bool queries, std::vector<Seen>& log)
      : window_(window), queries_(queries), log_(log) {}
  PolicyNeeds needs() const override {
    PolicyNeeds n;
    n.observation_window = window_;
    n.queries = queries_;
    return n;
  }
  void after_attention(const LayerStep& step, const StepStats& stats, Evictions&) override {
    Seen s{step.layer, step.n_new, step.prompt_end, stats.window_rows, {}, !step.queries.empty(), step.seed};
    if (!stats.window_attention.empty())
      for (int h = 0; h < step.shape.n_heads; ++h) {
        double sum = 0;
        for (int j = 0; j < stats.n_slots; ++j) sum += stats.window_attention[size_t(h) * stats.n_slots + j];
        s.head_sums.push_back(sum);
      }
    log_.push_back(s);
  }
  void reset() override {}

 private:
  int window_;
  bool queries_;
  std::vector<Seen>& log_;
};

TEST(EnginePolicies, PromptEndChunkHoldsTheObservationWindow) {
  const ModelConfig c = small_config();
  auto model = make_random_model(c, DType::kF32, 7);
  EngineOptions o{.threads = 1, .block_size_tokens = 8, .prefill_chunk_tokens = 8};
  Engine e(*model, o);
  for (const auto& [n, window, prompt_end, queries] :
       std::vector<std::tuple<int, int, bool, bool>>{{17, 6, true, false}, {16, 5, true, true},
                                                     {17, 6, false, true}, {4, 6, true, false},
                                                     {17, 12, true, false}}) {
    SCOPED_TRACE(testing::Message() << "n " << n << " window " << window << " prompt_end " << prompt_end);
    std::vector<RecordingPolicy::Seen> log;
    const SeqId s = e.start_sequence(std::make_unique<RecordingPolicy>(window, queries, log), 99);
    std::vector<float> lg;
    ASSERT_EQ(e.prefill(s, tokens(n, 8), lg, false, prompt_end), StepStatus::kOk);
    int32_t t = 3;
    ASSERT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kOk);
    e.end_sequence(s);
    // the chunks the policy saw (layer 0): 8-token chunks, the last lengthened to the window
    std::vector<int> chunks;
    for (const auto& r : log) if (r.layer == 0) chunks.push_back(r.n_new);
    int last = n % 8 == 0 ? 8 : n % 8;
    if (prompt_end) last = std::max(last, std::min(n, window));
    std::vector<int> want;
    for (int done = 0; done < n - last; done += 8) want.push_back(std::min(8, n - last - done));
    want.push_back(last);
    want.push_back(1);  // the decode step
    EXPECT_EQ(chunks, want);
    for (size_t i = 0; i < log.size(); ++i) {
      const auto& r = log[i];
      const bool end = prompt_end && i + c.n_layers * 2 >= log.size() && i + c.n_layers < log.size();
      EXPECT_EQ(r.prompt_end, end) << "record " << i;
      EXPECT_EQ(r.queries, queries);
      EXPECT_EQ(r.seed, 99u);
      if (!end) {
        EXPECT_EQ(r.window_rows, 0);
        continue;
      }
      EXPECT_EQ(r.window_rows, std::min(window, r.n_new));
      ASSERT_EQ(int(r.head_sums.size()), c.n_heads);
      // each row's probabilities sum to 1 (float sums over <= 17 slots and <= 12 rows)
      for (double sum : r.head_sums) EXPECT_NEAR(sum, r.window_rows, 1e-5);
    }
  }
}

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
