// Perplexity under three protocols (shared POLICIES.md section 8). `tokens` is the tokenized
// text with BOS first (when the tokenizer has one); a "scored token" is tokens[i], i >= 1,
// predicted from the logits at i - 1.
//
//   streaming (StreamingLLM): one sequence, every token through the decode path one at a time
//       with the policy active; tokens[1..N) each scored once, given the cache after tokens[i-1].
//   chunked (llama.cpp perplexity): non-overlapping windows of n_ctx tokens (N >= 2 n_ctx;
//       floor(N / n_ctx) windows); each window's first token replaced by BOS; a fresh sequence
//       per window, prefilled with all logits; positions j = n_ctx/2 + 1 .. n_ctx - 1 scored.
//   sliding (Hugging Face): windows [b, min(b + window, N)) for b = 0, stride, 2 stride, ...
//       until a window reaches N; each window scores the tokens after the previous window's end
//       (the first window: positions 1..), each with context from its window's start.
//
// Results: nll[k] = -log p(tokens[positions[k]] | context) in nats (float32, text order);
//   PPL = exp(mean nll); its standard error by the delta method, PPL * sd(nll) / sqrt(n)
//   (as llama.cpp); running PPL after the first c scored tokens for each checkpoint c
//   (default: powers of two below n, and n).
// Streaming stops early, keeping what was scored, when the model refuses a step (LmStepError:
// the context is full, e.g. full attention past the model's max_seq_len); `stopped` says why.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "evals/lm.h"
#include "kernels/common/enum_names.h"

namespace kvlab {

enum class PplProtocol { kStreaming, kChunked, kSliding };
inline constexpr EnumName<PplProtocol> kPplProtocolNames[] = {
    {PplProtocol::kStreaming, "streaming"}, {PplProtocol::kChunked, "chunked"}, {PplProtocol::kSliding, "sliding"}};
inline const char* to_string(PplProtocol p) { return enum_name(kPplProtocolNames, p); }

struct PerplexityOptions {
  PplProtocol protocol = PplProtocol::kStreaming;
  int n_ctx = 512;    // chunked
  int window = 1024;  // sliding
  int stride = 512;   // sliding
  std::vector<int> checkpoints;  // scored-token counts; empty = powers of two
  // Called now and then with the number of tokens fed so far (for progress displays).
  std::function<void(int64_t)> on_progress;
};

struct PerplexityResult {
  std::vector<float> nll;          // [n_scored]
  std::vector<int64_t> positions;  // [n_scored] index into tokens of each scored token
  double mean_nll = 0, ppl = 0, ppl_stderr = 0;
  std::vector<int64_t> checkpoints;  // [n_checkpoints] scored-token counts
  std::vector<double> running_ppl;   // [n_checkpoints]
  int64_t tokens_fed = 0;            // tokens that went through the model (all windows)
  std::string stopped;               // streaming: why scoring ended early (LmStepError), or ""
};

// Throws kvlab::Error when the text is too short for the protocol.
PerplexityResult evaluate_perplexity(LanguageModel& lm, std::span<const int32_t> tokens,
                                     int32_t bos_id, const PerplexityOptions& options);

// Fills mean_nll, ppl, ppl_stderr, checkpoints, running_ppl from nll.
void summarize_perplexity(PerplexityResult& result, const std::vector<int>& checkpoints);

}  // namespace kvlab
