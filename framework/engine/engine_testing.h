// Shared setup of the engine tests: the small random-weight Llama shape they run on, random
// token ids, one sequence's prefill and decode logits (header-only; the tests link no extra library for it).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/model/model.h"

namespace kvlab {

// dim 64, 2 layers, hidden 96, interleaved RoPE with theta 10000 (ModelConfig's defaults).
inline ModelConfig tiny_llama_config(int vocab_size, int max_seq_len, int n_heads = 4,
                                     int n_kv_heads = 2, int head_dim = 16) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.hidden_dim = 96;
  c.vocab_size = vocab_size;
  c.max_seq_len = max_seq_len;
  return c;
}

// n token ids, each rng() % vocab of a std::mt19937 seeded with seed.
inline std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// One thread, blocks of `block_size_tokens`.
inline EngineOptions one_thread(int block_size_tokens) {
  EngineOptions o;
  o.threads = 1;
  o.block_size_tokens = block_size_tokens;
  return o;
}

// Prefill logits [n, vocab] of one sequence (one thread, blocks of 16 tokens).
inline std::vector<float> prefill_logits(const Model& m, const std::vector<int32_t>& tokens) {
  Engine e(m, one_thread(16));
  std::vector<float> lg;
  EXPECT_EQ(e.prefill(e.start_sequence(), tokens, lg, true), StepStatus::kOk);
  return lg;
}

// The same logits [n, vocab] decoded one token at a time (one thread; the default blocks of 7
// tokens cross block boundaries at other points than prefill's).
inline std::vector<float> decode_logits(const Model& m, const std::vector<int32_t>& tokens,
                                        int block_size_tokens = 7) {
  Engine e(m, one_thread(block_size_tokens));
  SeqId s = e.start_sequence();
  std::vector<float> all, lg;
  for (int32_t t : tokens) {
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kOk);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  return all;
}

// Logits [n_prompt + rest, vocab] of `tokens` under `policy`: the first n_prompt prefilled in
// chunks of `chunk` (the last one marked as the prompt's end), the rest decoded one at a time; one
// thread, blocks of `block_size` tokens. Every logit must be finite.
inline std::vector<float> prompt_then_decode(const Model& m, std::unique_ptr<AttentionPolicy> policy,
                                             const std::vector<int32_t>& tokens, int n_prompt, int block_size,
                                             int chunk) {
  EngineOptions o = one_thread(block_size);
  o.prefill_chunk_tokens = chunk;
  Engine e(m, o);
  SeqId s = e.start_sequence(std::move(policy));
  std::vector<float> all, lg;
  EXPECT_EQ(e.prefill(s, std::span(tokens).first(n_prompt), lg, true, /*prompt_end=*/true), StepStatus::kOk);
  all = lg;
  for (size_t i = n_prompt; i < tokens.size(); ++i) {
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&tokens[i], 1), lg), StepStatus::kOk);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  for (float v : all) EXPECT_TRUE(std::isfinite(v));
  return all;
}

}  // namespace kvlab
