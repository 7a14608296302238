#include "evals/perplexity.h"

#include <algorithm>
#include <cmath>

#include "framework/core/error.h"

namespace kvlab {

double log_prob(std::span<const float> logits, int32_t target) {
  KVLAB_CHECK(target >= 0 && size_t(target) < logits.size(), "target ", target, " outside the vocabulary");
  double m = -INFINITY;
  for (float l : logits) m = std::max(m, double(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - m);
  return double(logits[target]) - (m + std::log(sum));
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

namespace {

void score(PerplexityResult& r, std::span<const float> logits, int32_t target, int64_t position) {
  r.nll.push_back(float(-log_prob(logits, target)));
  r.positions.push_back(position);
}

void streaming(LanguageModel& lm, std::span<const int32_t> tokens, const PerplexityOptions& o,
               PerplexityResult& r) {
  std::unique_ptr<LmSequence> seq = lm.start(0);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const std::vector<float>* step = nullptr;
    try {
      step = &seq->decode(tokens[i]);
    } catch (const LmStepError& e) {
      r.stopped = str_cat("stopped at token ", i, ": ", e.what());
      break;
    }
    const std::vector<float>& logits = *step;
    score(r, logits, tokens[i + 1], int64_t(i + 1));
    ++r.tokens_fed;
    if (o.on_progress && (i % 64 == 63)) o.on_progress(r.tokens_fed);
  }
}

void chunked(LanguageModel& lm, std::span<const int32_t> tokens, int32_t bos_id,
             const PerplexityOptions& o, PerplexityResult& r) {
  const int64_t n_ctx = o.n_ctx;
  const int64_t n_chunks = int64_t(tokens.size()) / n_ctx;
  if (n_chunks < 2 || n_ctx < 4)
    fail("chunked perplexity needs at least 2 * n_ctx = ", 2 * n_ctx, " tokens, got ", tokens.size());
  const int64_t vocab = lm.vocab_size();
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> window(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    if (bos_id >= 0) window[0] = bos_id;
    std::unique_ptr<LmSequence> seq = lm.start(0);
    const std::vector<float>& logits = seq->prefill(window, true, false);
    for (int64_t j = n_ctx / 2 + 1; j < n_ctx; ++j)
      score(r, std::span(logits.data() + (j - 1) * vocab, size_t(vocab)), window[j], c * n_ctx + j);
    r.tokens_fed += n_ctx;
    if (o.on_progress) o.on_progress(r.tokens_fed);
  }
}

void sliding(LanguageModel& lm, std::span<const int32_t> tokens, const PerplexityOptions& o,
             PerplexityResult& r) {
  const int64_t n = int64_t(tokens.size());
  const int64_t vocab = lm.vocab_size();
  if (o.stride < 1 || o.stride > o.window) fail("sliding perplexity needs 1 <= stride <= window");
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < n; begin += o.stride) {
    const int64_t end = std::min(begin + o.window, n);
    std::unique_ptr<LmSequence> seq = lm.start(0);
    const std::vector<float>& logits = seq->prefill(tokens.subspan(begin, end - begin), true, false);
    for (int64_t i = std::max<int64_t>(prev_end, begin + 1); i < end; ++i)
      score(r, std::span(logits.data() + (i - 1 - begin) * vocab, size_t(vocab)), tokens[i], i);
    r.tokens_fed += end - begin;
    if (o.on_progress) o.on_progress(r.tokens_fed);
    prev_end = end;
    if (end == n) break;
  }
}

}  // namespace

void summarize_perplexity(PerplexityResult& r, const std::vector<int>& checkpoints) {
  const size_t n = r.nll.size();
  if (n == 0) fail("perplexity: no token was scored");
  double sum = 0, sum_sq = 0;
  for (float x : r.nll) sum += x, sum_sq += double(x) * x;
  r.mean_nll = sum / double(n);
  r.ppl = std::exp(r.mean_nll);
  const double var = n > 1 ? std::max(0.0, (sum_sq / double(n) - r.mean_nll * r.mean_nll) * double(n) / double(n - 1)) : 0.0;
  r.ppl_stderr = r.ppl * std::sqrt(var / double(n));
  r.checkpoints.clear();
  r.running_ppl.clear();
  if (checkpoints.empty()) {
    for (size_t c = 1; c < n; c *= 2) r.checkpoints.push_back(int64_t(c));
    r.checkpoints.push_back(int64_t(n));
  } else {
    for (int c : checkpoints)
      if (size_t(c) <= n) r.checkpoints.push_back(c);
  }
  double running = 0;
  size_t next = 0;
  for (size_t i = 0; i < n && next < r.checkpoints.size(); ++i) {
    running += r.nll[i];
    while (next < r.checkpoints.size() && size_t(r.checkpoints[next]) == i + 1)
      r.running_ppl.push_back(std::exp(running / double(i + 1))), ++next;
  }
}

PerplexityResult evaluate_perplexity(LanguageModel& lm, std::span<const int32_t> tokens,
                                     int32_t bos_id, const PerplexityOptions& options) {
  if (tokens.size() < 2) fail("perplexity needs at least 2 tokens, got ", tokens.size());
  PerplexityResult r;
  switch (options.protocol) {
    case PplProtocol::kStreaming: streaming(lm, tokens, options, r); break;
    case PplProtocol::kChunked: chunked(lm, tokens, bos_id, options, r); break;
    case PplProtocol::kSliding: sliding(lm, tokens, options, r); break;
  }
  summarize_perplexity(r, options.checkpoints);
  return r;
}

}  // namespace kvlab
