// EngineLm (engine_lm.h).
#include "framework/experiment/engine_lm.h"

#include <algorithm>
#include <chrono>

namespace kvlab {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

class EngineLm::Seq : public LmSequence {
 public:
  Seq(EngineLm& lm, SeqId id) : lm_(lm), id_(id) {}
  ~Seq() override {
    lm_.ended.push_back(lm_.engine_.sequence_stats(id_));
    lm_.engine_.end_sequence(id_);
  }
  const std::vector<float>& prefill(std::span<const int32_t> tokens, bool all_logits,
                                    bool prompt_end) override {
    const auto t0 = Clock::now();
    const int64_t before = lm_.engine_.n_tokens(id_);
    const StepStatus st = lm_.engine_.prefill(id_, tokens, logits_, all_logits, prompt_end);
    // prefill stops at the chunk that found no room (engine.h): that chunk is the need
    const int64_t left = int64_t(tokens.size()) - (lm_.engine_.n_tokens(id_) - before);
    check(st, int(std::min<int64_t>(left, lm_.engine_.options().prefill_chunk_tokens)));
    lm_.prefill_s += seconds_since(t0);
    lm_.prefill_tokens += int64_t(tokens.size());
    if (lm_.on_tokens) lm_.on_tokens(lm_.prefill_tokens + lm_.decode_tokens);
    if (prompt_end && lm_.on_prompt_end) lm_.on_prompt_end(id_);
    return logits_;
  }
  const std::vector<float>& decode(int32_t token) override {
    const auto t0 = Clock::now();
    check(lm_.engine_.decode(std::span(&id_, 1), std::span(&token, 1), logits_), 1);
    lm_.decode_s += seconds_since(t0);
    ++lm_.decode_tokens;
    if (lm_.on_tokens && lm_.decode_tokens % 16 == 0) lm_.on_tokens(lm_.prefill_tokens + lm_.decode_tokens);
    return logits_;
  }

 private:
  void check(StepStatus s, int n_new) {
    if (s == StepStatus::kOutOfBlocks) {
      const KvStore& kv = lm_.engine_.kv();
      const int64_t held = kv.sequence_blocks(id_), needed = kv.blocks_needed(id_, n_new);
      throw KvPoolExhausted(str_cat(
          "the pool holds ", kv.stats().blocks_total, " KV blocks of ", kv.block_bytes(),
          " bytes; after ", lm_.engine_.n_tokens(id_), " tokens the sequence holds ", held,
          " and its next step (", n_new, " token", n_new == 1 ? "" : "s", ") needs ", needed,
          " more, ", kv.free_blocks(), " free: at least ", size_t(held + needed) * kv.block_bytes(),
          " bytes"));
    }
    if (s != StepStatus::kOk)
      throw LmStepError(str_cat(step_status_name(s), " after ", lm_.engine_.n_tokens(id_), " tokens"));
  }
  EngineLm& lm_;
  SeqId id_;
  std::vector<float> logits_;
};

std::unique_ptr<LmSequence> EngineLm::start(uint64_t seed) {
  return std::make_unique<Seq>(*this, engine_.start_sequence(make_policy_(), seed));
}

}  // namespace kvlab
