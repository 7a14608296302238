// Next-token sampling from logits: greedy (temperature 0), or temperature + top-k + top-p
// (nucleus) with a seeded generator, so a run is reproducible from its seed.
//
// Order (as llama.cpp and Hugging Face): scale by 1/temperature, keep the top_k largest
// (top_k <= 0: all), softmax over those, keep the smallest prefix (by descending probability)
// whose mass reaches top_p (top_p >= 1: all), renormalise, draw. Greedy ties break to the lower id.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kvlab {

struct SamplerOptions {
  float temperature = 0.f;  // 0 = greedy
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& opts);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace kvlab
