// Shared setup of the engine tests: the small random-weight Llama shape they run on, random
// token ids, one sequence's prefill logits (header-only; the tests link no extra library for it).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
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

// Prefill logits [n, vocab] of one sequence (one thread, blocks of 16 tokens).
inline std::vector<float> prefill_logits(const Model& m, const std::vector<int32_t>& tokens) {
  EngineOptions o;
  o.threads = 1;
  o.block_size_tokens = 16;
  Engine e(m, o);
  std::vector<float> lg;
  EXPECT_EQ(e.prefill(e.start_sequence(), tokens, lg, true), StepStatus::kOk);
  return lg;
}

}  // namespace kvlab
