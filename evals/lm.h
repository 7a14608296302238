// The language model as the evaluations see it: a factory of fresh token sequences that return
// logits. The real implementation wraps kvlab::Engine with a policy (framework/experiment/
// runner.cpp); tests use small fakes, so the eval math is checked without a model file.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "framework/core/error.h"

namespace kvlab {

// A model call that could not run: the context is full or the KV store has no free block. The
// sequence is unchanged; evals record the reason and stop (streaming perplexity) or fail the
// trial.
class LmStepError : public Error {
 public:
  using Error::Error;
};

// One sequence of a model with its attention policy (state: the KV cache and the policy).
class LmSequence {
 public:
  virtual ~LmSequence() = default;
  // Feeds tokens through the prefill path (dense chunks, the policy evicting between chunks).
  // Returns logits [vocab] of the last token, or [tokens.size(), vocab] with all_logits.
  // prompt_end: these tokens end the prompt (where prompt-end policies compress; engine.h).
  virtual const std::vector<float>& prefill(std::span<const int32_t> tokens, bool all_logits,
                                            bool prompt_end) = 0;
  // Feeds one token through the decode path (the policy selects and evicts per step).
  // Returns its logits [vocab].
  virtual const std::vector<float>& decode(int32_t token) = 0;
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual int32_t vocab_size() const = 0;
  // A fresh, empty sequence with a fresh policy; `seed` is the sample's (randomised policies).
  virtual std::unique_ptr<LmSequence> start(uint64_t seed) = 0;
};

// log softmax(logits)[target], computed stably in double: logit[t] - (m + log sum exp(l - m)).
double log_prob(std::span<const float> logits, int32_t target);
// Index of the largest logit (the lowest index on ties).
int32_t argmax(std::span<const float> logits);

}  // namespace kvlab
