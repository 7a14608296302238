// EngineLm: the Engine as the evaluations see it (evals/lm.h), for `kvlab run` (runner.cpp) and
// `kvlab perplexity`: every start() is a fresh sequence with a fresh policy from `make_policy`.
// Keeps the time spent in prefill and decode and the statistics of every sequence when it
// ends. A step the engine refuses (out of KV blocks, context full) throws LmStepError
// ("<status> after <n> tokens"), which the evaluations record as where the sample stopped,
// except an exhausted KV pool (kv.budget_bytes): that says nothing about the policy, so it throws
// KvPoolExhausted (with the blocks held, needed and free) and the run stops with one error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "evals/lm.h"
#include "framework/core/error.h"
#include "framework/engine/engine.h"

namespace kvlab {

// The KV pool had no room for a step; run_experiment adds the file, key and cell.
class KvPoolExhausted : public Error {
 public:
  using Error::Error;
};

class EngineLm : public LanguageModel {
 public:
  using PolicyMaker = std::function<std::unique_ptr<AttentionPolicy>()>;
  EngineLm(Engine& engine, PolicyMaker make_policy)
      : engine_(engine), make_policy_(std::move(make_policy)) {}

  int32_t vocab_size() const override { return engine_.config().vocab_size; }
  std::unique_ptr<LmSequence> start(uint64_t seed) override;

  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  std::vector<SequenceStats> ended;  // in the order the sequences ended
  std::function<void(int64_t)> on_tokens;  // tokens fed so far (every prefill, every 16 decodes)
  // Called right after a prefill that ended the prompt (the policy has compressed): what the
  // evaluations read of the cache there (NIAH: which needle tokens each layer kept).
  std::function<void(SeqId)> on_prompt_end;
  const Engine& engine() const { return engine_; }

  void reset_counters() {
    prefill_s = decode_s = 0;
    prefill_tokens = decode_tokens = 0;
    ended.clear();
  }

 private:
  class Seq;
  Engine& engine_;
  PolicyMaker make_policy_;
};

}  // namespace kvlab
