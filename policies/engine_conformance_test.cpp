// Conformance of every registered policy (built-ins and the example plugin) through the real
// engine (framework/engine) on a random-weight model built in memory. The per-policy checks live
// in policies/conformance.h (also run by `kvlab check-policy`), on each factory's acting
// parameter sets (PolicyFactory::conformance_configs):
//   - unlimited budget == full (same logits to float tolerance);
//   - every mask-based policy == a plain double-precision forward pass (no KV store) whose
//     attention reads exactly the keys of the mask the policy claims;
//   - resident tokens <= budget every step; evicted tokens free KV blocks (bytes measured);
//   - two sequences decoded in one batch == each decoded alone; a reset policy == a new one.
// Here as well: allocated-but-unused KV memory < 5% in a mixed-length batch; a window's memory
// stays flat.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "framework/engine/engine.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "policies/builtin.h"
#include "policies/conformance.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

using conformance::Case;
using conformance::Verdict;
using conformance::engine::engine_options;
using conformance::engine::random_tokens;
using conformance::engine::run_logits;
using conformance::engine::tiny_model;
using testing::max_abs_diff;

constexpr int kTokens = 110;

PolicyRegistry& registry() { return testing::builtins_and_plugin(KVLAB_EXAMPLE_PLUGIN); }

ModelConfig tiny_config(int max_seq_len) {
  ModelConfig c = tiny_model().config;
  c.max_seq_len = max_seq_len;
  return c;
}

using Config = testing::PolicyConfig;
using testing::describe;

std::unique_ptr<AttentionPolicy> make(const Config& c) {
  return registry().create(c.policy, c.params, policy_shape(tiny_model().config));
}

// Runs `check` on every case (or every policy); returns how many ran (not skipped).
int expect_passes(const std::string& check_name) {
  int ran = 0;
  for (const conformance::Outcome& o : conformance::run_check_over(
           conformance::check_named(check_name), registry(), registry().names(),
           conformance::cases(registry(), registry().names()))) {
    EXPECT_NE(o.verdict.kind, Verdict::kFail) << check_name << " " << o.subject << ": " << o.verdict.detail;
    ran += o.verdict.kind == Verdict::kPass;
  }
  return ran;
}

// ---- tests ----------------------------------------------------------------------------------

TEST(EngineConformance, UnlimitedBudgetEqualsFull) { expect_passes("engine.unlimited_equals_full"); }

TEST(EngineConformance, MaskPoliciesEqualDenseMaskedReference) {
  EXPECT_GE(expect_passes("engine.mask_equals_dense"), 8);
  // full is checked against the causal reference too.
  Engine e(tiny_model(), engine_options());
  const auto tokens = random_tokens(110, 2);
  const auto want = conformance::engine::masked_reference(tiny_model(), tokens,
                                                          [](int, int, int64_t i, int64_t j) { return j <= i; });
  EXPECT_LE(max_abs_diff(run_logits(e, nullptr, tokens), want), logit_bound(tiny_model(), tokens.size())) << "full";
}

TEST(EngineConformance, ResidentWithinBudgetAndEvictionFreesBlocks) {
  expect_passes("engine.resident_within_budget");
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

TEST(EngineConformance, BatchedEqualsAloneAndResetEqualsNew) { expect_passes("engine.batched_reset"); }

// AdaKV allocates one layer's budget across its KV heads: with per-head block tables the heads
// that keep fewer tokens hold fewer blocks, so the bytes follow the allocation (with per-layer
// tables every head of a layer holds its fullest head's blocks).
TEST(EngineConformance, AdaKvPerHeadBudgetsDifferInBytesWithPerHeadTables) {
  const Model& m = tiny_model();
  const int L = m.config.n_layers, H = m.config.n_kv_heads;
  const auto prompt = random_tokens(150, 21);
  auto kept = [&](bool per_head, std::vector<int64_t>& resident, std::vector<int64_t>& blocks) {
    EngineOptions o = engine_options();
    o.kv_per_head_tables = per_head;
    Engine e(m, o);
    const SeqId s = e.start_sequence(make({"adakv", {{"scorer", std::string("snapkv")}, {"compression_ratio", 0.75},
                                                     {"window", int64_t(16)}}}));
    std::vector<float> lg;
    EXPECT_EQ(e.prefill(s, prompt, lg, false, /*prompt_end=*/true), StepStatus::kOk);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        resident.push_back(e.kv().resident_tokens(s, l, h));
        blocks.push_back(e.kv().head_blocks(s, l, h));
      }
    const size_t bytes = e.sequence_stats(s).kv_bytes_current;
    e.end_sequence(s);
    return bytes;
  };
  std::vector<int64_t> r_layer, b_layer, r_head, b_head;
  const size_t bytes_layer = kept(false, r_layer, b_layer), bytes_head = kept(true, r_head, b_head);
  ASSERT_EQ(r_head, r_layer);
  int64_t total = 0;
  bool unequal_layer = false;
  for (int l = 0; l < L; ++l) {
    std::string where = "layer " + std::to_string(l);
    int64_t layer_total = 0, most = 0;
    for (int h = 0; h < H; ++h) {
      const int64_t r = r_head[l * H + h];
      layer_total += r;
      most = std::max(most, r);
      // After the prompt-end compaction a head's live tokens fill its first pages.
      EXPECT_EQ(b_head[l * H + h], (r + 15) / 16) << where << " head " << h;
    }
    for (int h = 0; h < H; ++h) EXPECT_EQ(b_layer[l * H + h], (most + 15) / 16) << where;
    unequal_layer |= r_head[l * H] != r_head[l * H + 1];
    EXPECT_EQ(layer_total, 2 * (150 - 112)) << where;  // AdaKV keeps the layer's total: n - floor(0.75 n) per head
    for (int h = 0; h < H; ++h) total += b_head[l * H + h];
  }
  EXPECT_TRUE(unequal_layer) << "adakv gave every head the same count: the test shows nothing";
  EXPECT_LT(bytes_head, bytes_layer);
  EXPECT_EQ(bytes_head * 2, size_t(total) * (bytes_layer / (b_layer[0] + b_layer[H])));
}

TEST(EngineConformance, PerHeadBlockTablesEqualPerLayerTablesBitForBit) {
  const size_t n_cases = conformance::cases(registry(), registry().names()).size();
  EXPECT_EQ(expect_passes("engine.per_head_tables"), static_cast<int>(n_cases));
}

}  // namespace
}  // namespace kvlab
