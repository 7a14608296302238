// Models with random weights built in memory (no file): for the benchmark and the engine's
// self-consistency tests.
//
// Matrices ~ uniform with variance 1/fan_in, so activations stay O(1) through the layers; norms ~ 1 +
// N(0, 0.1) (the multipliers the engine reads; with sandwich_norms also post_attn_norm and
// post_ffn_norm); biases (qkv_bias) ~ N(0, 0.1). Matrices are generated in fp32 and stored as
// `weight_dtype` (Q8_0 needs every matrix's cols to be a multiple of 32).
#pragma once

#include <cstdint>
#include <memory>

#include "framework/model/model.h"

namespace kvlab {

std::unique_ptr<Model> make_random_model(const ModelConfig& config, DType weight_dtype,
                                         uint64_t seed);

// The benchmark configurations (llama2.c's "stories" shapes: vocab 32000, tied embeddings,
// max_seq_len 1024).
ModelConfig config_110m();  // dim 768, 12 layers, 12 heads, hidden 2048
ModelConfig config_15m();   // dim 288, 6 layers, 6 heads, hidden 768

}  // namespace kvlab
