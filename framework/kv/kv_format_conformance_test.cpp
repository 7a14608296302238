// Every registered policy (built-ins and the example plugin) on a store of every KV format
// (POLICIES.md 17: "a format is a property of the store, a policy of the cache; every pair must
// run"), through the real engine on policies/conformance.h's random-weight model:
//   - unlimited budget == `full` of the same format, bit for bit: both runs store the same rows,
//     and an unlimited policy hands attention every key in slot order, so the kernels see the
//     same tiles (kv_store_test's KvFormat.AttentionEqualsF32AttentionOverTheDequantisedRows:
//     decoding is exact; the f32 suite allows two roundings, logit_bound.h, for its other
//     checks; here the runs are asserted identical). Except, for a format other
//     than f32, policies that rotate keys at read (PolicyNeeds::rope_at_cache_position: sinks
//     with rope_positions=cache): they store the raw (pre-RoPE) keys, so the store quantises
//     other vectors than `full` does and the two differ by quantisation error, not rounding;
//     their deviation is printed, not asserted;
//   - each acting parameter set (conformance_configs): resident tokens <= budget per layer and KV
//     head every step, and a budget under half the length holds fewer KV bytes than `full` of
//     the same format (evicted tokens free blocks) -- for int4 / int2 (no compaction: a key
//     group's rows never move) only where whole blocks empty, at least two configurations;
//   - a format other than f32 changes the logits (the format is really applied) and its `full`
//     holds fewer bytes than f32's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/engine/logit_bound.h"
#include "policies/conformance.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

using conformance::engine::engine_options;
using conformance::engine::random_tokens;
using conformance::engine::run_logits;
using conformance::engine::tiny_model;

constexpr int kTokens = 110;

TEST(KvFormatConformance, EveryPolicyOnEveryFormat) {
  PolicyRegistry& registry = testing::builtins_and_plugin(KVLAB_EXAMPLE_PLUGIN);
  const Model& m = tiny_model();
  const auto shape = policy_shape(m.config);
  const auto tokens = random_tokens(kTokens, 1);
  const double bound = 2 * logit_bound(m, tokens.size());
  const std::vector<conformance::Case> cases = conformance::cases(registry, registry.names());
  std::vector<float> f32_full;
  size_t f32_bytes = 0;
  for (KvFormat format : kAllKvFormats) {
    SCOPED_TRACE(kv_format_name(format));
    EngineOptions o = engine_options();
    o.kv_format = format;
    o.kv_group_size = 4;  // KIVI: divides the model's head_dim 16 and the block size 16
    o.kv_residual = 16;   // so most of the 110 tokens are quantised
    Engine e(m, o);
    size_t full_bytes = 0;
    const auto full = run_logits(e, nullptr, tokens, [&](SeqId s, int64_t) { full_bytes = e.sequence_stats(s).kv_bytes_current; });
    if (format == KvFormat::kF32) {
      f32_full = full;
      f32_bytes = full_bytes;
    } else {
      EXPECT_GT(testing::max_abs_diff(full, f32_full), 0.f) << "the format changed nothing";
      EXPECT_LT(full_bytes, f32_bytes);
    }
    int unlimited = 0, bit_exact = 0;
    for (const std::string& name : registry.names()) {
      auto params = registry.at(name).unlimited_params();
      if (!params) continue;
      auto policy = registry.create(name, *params, shape, "unlimited");
      const bool raw_keys = policy->needs().rope_at_cache_position;
      const auto got = run_logits(e, std::move(policy), tokens);
      const float d = testing::max_abs_diff(got, full);
      if (raw_keys && format != KvFormat::kF32) {
        std::printf("%s: %s stores pre-RoPE keys: max |logit - full| = %g (quantisation of other vectors)\n",
                    kv_format_name(format), name.c_str(), d);
        EXPECT_TRUE(std::isfinite(d)) << name;
        continue;
      }
      EXPECT_EQ(d, 0.f) << name << ": unlimited != full of the same format (the fp32 rounding bound is " << bound << ")";
      ++unlimited;
      bit_exact += d == 0.f;
    }
    EXPECT_GE(unlimited, 10);
    std::printf("%s: %d policies at unlimited budget, %d of them bit-identical to full\n",
                kv_format_name(format), unlimited, bit_exact);
    int acting = 0, freed = 0;
    for (const conformance::Case& c : cases) {
      SCOPED_TRACE(c.describe());
      auto budget_of = registry.create(c.policy, c.config.params, shape, "conformance");
      size_t bytes = 0;
      bool bounded = true;
      run_logits(e, registry.create(c.policy, c.config.params, shape, "conformance"), tokens,
                 [&](SeqId s, int64_t n_seen) {
                   for (int l = 0; l < m.config.n_layers; ++l) {
                     const int64_t budget = budget_of->budget_tokens(l, n_seen);
                     bounded &= budget >= 0;
                     for (int h = 0; h < m.config.n_kv_heads; ++h)
                       if (budget >= 0) ASSERT_LE(e.kv().resident_tokens(s, l, h), budget) << "layer " << l;
                   }
                   bytes = e.sequence_stats(s).kv_bytes_current;
                 });
      if (bounded && budget_of->budget_tokens(0, kTokens) * 2 < kTokens) {
        ++acting;
        if (kv_format_is_kivi(format)) {  // holes are freed only when a whole block empties
          EXPECT_LE(bytes, full_bytes);
          freed += bytes < full_bytes;
        } else {
          EXPECT_LT(bytes, full_bytes) << "evicted tokens were not freed";
        }
      }
    }
    EXPECT_GE(acting, 5);
    // KIVI never compacts (kv_store.h "KIVI"): policies that evict whole runs of slots (window,
    // sinks, strided) free blocks; scattered per-head evictions (h2o, snapkv) leave holes.
    if (kv_format_is_kivi(format)) {
      std::printf("%s: %d of %d acting configurations held fewer KV bytes than full\n", kv_format_name(format), freed, acting);
      EXPECT_GE(freed, 2);
    }
  }
}


// EngineOptions::kv_fp8_scale_from_prompt: each sequence's scale of (layer, KV head) is the
// max |x| of its first prefill chunk's rows over the format's largest value, K and V apart;
// later chunks saturate instead of rescaling; a second sequence with another prompt gets its own.
// Layer 0's rows are the f32 engine's (same embeddings), so its scales are checked exactly;
// deeper layers see the quantised cache's outputs, so there the scale shows in the codes: the
// largest magnitude of the first chunk encodes to the format's largest value.
TEST(KvFormatConformance, Fp8ScalesFromThePromptAreItsFirstChunksRange) {
  const Model& m = tiny_model();
  const int L = m.config.n_layers, H = m.config.n_kv_heads, D = m.config.head_dim;
  constexpr int kChunk = 16, kTokens = 40;
  for (KvFormat format : {KvFormat::kFp8E4m3, KvFormat::kFp8E5m2}) {
    SCOPED_TRACE(kv_format_name(format));
    const float fp8_max = kv_fp8_max(format);
    auto code_value = [&](uint8_t c) {
      return std::fabs(format == KvFormat::kFp8E4m3 ? kv_decode_e4m3(c) : kv_decode_e5m2(c));
    };
    EngineOptions o = engine_options();
    o.prefill_chunk_tokens = kChunk;
    EngineOptions o8 = o;
    o8.kv_format = format;
    o8.kv_fp8_scale_from_prompt = true;
    Engine e32(m, o), e8(m, o8);
    for (uint32_t seed : {1u, 2u}) {
      const auto tokens = random_tokens(kTokens, seed);
      std::vector<float> lg;
      const SeqId s32 = e32.start_sequence(), s8 = e8.start_sequence();
      ASSERT_EQ(e32.prefill(s32, std::span(tokens).first(kChunk), lg), StepStatus::kOk);
      ASSERT_EQ(e8.prefill(s8, tokens, lg), StepStatus::kOk);  // chunks of 16, 16, 8
      for (int l = 0; l < L; ++l) {
        const LayerKv kv8 = e8.kv().layer(s8, l);
        for (int h = 0; h < H; ++h) {
          SCOPED_TRACE("seed " + std::to_string(seed) + " layer " + std::to_string(l) + " head " + std::to_string(h));
          float kcode = 0, vcode = 0, later = 0;
          for (int slot = 0; slot < kTokens; ++slot)
            for (int d = 0; d < D; ++d) {
              const float kc = code_value(kv8.key_codes(slot, h)[d]), vc = code_value(kv8.value_codes(slot, h)[d]);
              if (slot < kChunk) kcode = std::max(kcode, kc), vcode = std::max(vcode, vc);
              else later = std::max({later, kc, vc});
            }
          EXPECT_EQ(kcode, fp8_max);
          EXPECT_EQ(vcode, fp8_max);
          EXPECT_LE(later, fp8_max);  // saturating, never inf or NaN
          if (l > 0) continue;
          const LayerKv rows = e32.kv().layer(s32, 0);
          float kmax = 0, vmax = 0;
          std::vector<float> row(D);
          for (int slot = 0; slot < kChunk; ++slot) {
            rows.load_key(slot, h, row.data());
            for (float x : row) kmax = std::max(kmax, std::fabs(x));
            rows.load_value(slot, h, row.data());
            for (float x : row) vmax = std::max(vmax, std::fabs(x));
          }
          EXPECT_EQ(kv8.key_scale(0, h), kmax / fp8_max);
          EXPECT_EQ(kv8.value_scale(0, h), vmax / fp8_max);
        }
      }
      e32.end_sequence(s32);
      e8.end_sequence(s8);
    }
  }
}
}  // namespace
}  // namespace kvlab
