// EngineLm (engine_lm.h).
#include "framework/experiment/engine_lm.h"

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
  const std::vector<float>& prefill(std::span<const int32_t> tokens, bool all_logits) override {
    const auto t0 = Clock::now();
    check(lm_.engine_.prefill(id_, tokens, logits_, all_logits));
    lm_.prefill_s += seconds_since(t0);
    lm_.prefill_tokens += int64_t(tokens.size());
    if (lm_.on_tokens) lm_.on_tokens(lm_.prefill_tokens + lm_.decode_tokens);
    return logits_;
  }
  const std::vector<float>& decode(int32_t token) override {
    const auto t0 = Clock::now();
    check(lm_.engine_.decode(std::span(&id_, 1), std::span(&token, 1), logits_));
    lm_.decode_s += seconds_since(t0);
    ++lm_.decode_tokens;
    if (lm_.on_tokens && lm_.decode_tokens % 16 == 0) lm_.on_tokens(lm_.prefill_tokens + lm_.decode_tokens);
    return logits_;
  }

 private:
  void check(StepStatus s) {
    if (s != StepStatus::kOk)
      throw LmStepError(str_cat(step_status_name(s), " after ", lm_.engine_.n_tokens(id_), " tokens"));
  }
  EngineLm& lm_;
  SeqId id_;
  std::vector<float> logits_;
};

std::unique_ptr<LmSequence> EngineLm::start() {
  return std::make_unique<Seq>(*this, engine_.start_sequence(make_policy_()));
}

}  // namespace kvlab
