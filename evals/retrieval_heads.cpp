#include "evals/retrieval_heads.h"

#include <algorithm>

#include "framework/core/error.h"

namespace kvlab {

RetrievalCalibration calibrate_retrieval_heads(LanguageModel& lm, TopKeySource& source,
                                               const Tokenizer& tokenizer, const Haystack& haystack,
                                               const RetrievalCalibrationOptions& o) {
  if (o.context_lengths.empty() || o.depths.empty() || o.trials < 1)
    fail("calibrate-heads: empty grid (", o.context_lengths.size(), " lengths, ", o.depths.size(),
         " depths, ", o.trials, " trials)");
  RetrievalCalibration c;
  c.n_layers = source.n_layers();
  c.n_heads = source.n_heads();
  c.n_kv_heads = source.n_kv_heads();
  if (c.n_layers < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0)
    fail("calibrate-heads: inconsistent head shape (", c.n_layers, " layers, ", c.n_heads, " heads, ",
         c.n_kv_heads, " KV heads)");
  const size_t n_qh = size_t(c.n_layers) * c.n_heads;
  c.hits.assign(n_qh, 0);
  const int total = int(o.context_lengths.size() * o.depths.size()) * o.trials;
  int cell = 0;
  for (int length : o.context_lengths)
    for (double depth : o.depths) {
      for (int t = 0; t < o.trials; ++t) {
        uint64_t state = o.seed * 0x9E3779B97F4A7C15ull + uint64_t(cell) * 1000003ull + uint64_t(t);
        const uint64_t trial_seed = splitmix64(state);
        const NiahPrompt p = build_niah_prompt(tokenizer, haystack, o.niah, length, depth, trial_seed);
        const int64_t needle_end = p.needle_pos + p.needle_tokens;
        std::unique_ptr<LmSequence> seq = lm.start(trial_seed);
        const std::vector<float>* logits = &seq->prefill(p.tokens, false, /*prompt_end=*/true);
        std::vector<int32_t> answer;
        const int n_expected = int(p.expected_tokens.size());
        for (int k = 0; k < n_expected; ++k) {
          const int32_t w = argmax(*logits);
          answer.push_back(w);
          const std::vector<int64_t> top = source.top_positions();
          if (top.size() != n_qh)
            fail("calibrate-heads: the top-key source returned ", top.size(), " positions, expected ", n_qh);
          for (size_t qh = 0; qh < n_qh; ++qh) {
            const int64_t j = top[qh];
            if (j >= p.needle_pos && j < needle_end && p.tokens[size_t(j)] == w) ++c.hits[qh];
          }
          if (w == tokenizer.eos_id() || k + 1 == n_expected) break;
          logits = &seq->decode(w);
        }
        c.copy_tokens += n_expected;
        ++c.trials;
        if (!answer.empty() && answer.back() == tokenizer.eos_id()) answer.pop_back();
        c.correct += value_matches(tokenizer.decode(answer), p.value) ? 1 : 0;
        if (o.on_trial) o.on_trial(c.trials, total);
      }
      ++cell;
    }
  c.head_score.assign(n_qh, 0.0);
  for (size_t qh = 0; qh < n_qh; ++qh)
    c.head_score[qh] = c.copy_tokens > 0 ? double(c.hits[qh]) / double(c.copy_tokens) : 0.0;
  const int group = c.n_heads / c.n_kv_heads;
  c.kv_score.assign(size_t(c.n_layers) * c.n_kv_heads, 0.0);
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_heads; ++h) {
      double& kv = c.kv_score[size_t(l) * c.n_kv_heads + h / group];
      kv = std::max(kv, c.head_score[size_t(l) * c.n_heads + h]);
    }
  return c;
}

}  // namespace kvlab
