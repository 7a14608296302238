#include "evals/niah.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "framework/core/error.h"

namespace kvlab {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const char* to_string(NeedlePlacement placement) {
  return placement == NeedlePlacement::kNearest ? "nearest" : "previous";
}

std::vector<int32_t> encode_sentence(const Tokenizer& tokenizer, const std::string& text) {
  return tokenizer.encode(tokenizer.kind() == "bpe" ? " " + text : text);
}

namespace {

bool piece_ends_sentence(std::string piece) {
  while (!piece.empty() && std::isspace(static_cast<unsigned char>(piece.back()))) piece.pop_back();
  return !piece.empty() && (piece.back() == '.' || piece.back() == '!' || piece.back() == '?');
}

std::string replace_value(std::string templ, const std::string& value) {
  const std::string key = "{value}";
  for (size_t at = templ.find(key); at != std::string::npos; at = templ.find(key, at + value.size()))
    templ.replace(at, key.size(), value);
  return templ;
}

uint64_t uniform(uint64_t& state, uint64_t n) { return splitmix64(state) % n; }

}  // namespace

Haystack make_haystack(const Tokenizer& tokenizer, const std::string& text) {
  Haystack h;
  h.tokens = tokenizer.encode(text);
  if (h.tokens.empty()) fail("haystack text is empty");
  h.ends_sentence.resize(h.tokens.size());
  h.sentence_starts.push_back(0);
  for (size_t i = 0; i < h.tokens.size(); ++i) {
    h.ends_sentence[i] = piece_ends_sentence(tokenizer.token_to_piece(h.tokens[i]));
    if (h.ends_sentence[i] && i + 1 < h.tokens.size()) h.sentence_starts.push_back(int64_t(i + 1));
  }
  return h;
}

std::string niah_value(uint64_t& rng_state, int digits) {
  std::string v;
  for (int i = 0; i < digits; ++i)
    v += char('0' + (i == 0 ? 1 + uniform(rng_state, 9) : uniform(rng_state, 10)));
  return v;
}

NiahPrompt build_niah_prompt(const Tokenizer& tokenizer, const Haystack& haystack,
                             const NiahOptions& options, int context_length, double depth_percent,
                             uint64_t seed) {
  uint64_t rng = seed;
  NiahPrompt p;
  p.value = niah_value(rng, options.value_digits);
  const std::vector<int32_t> needle = encode_sentence(tokenizer, replace_value(options.needle, p.value));
  const std::vector<int32_t> question = encode_sentence(tokenizer, options.question);
  const int n_bos = tokenizer.bos_id() >= 0 ? 1 : 0;
  const int64_t budget = int64_t(context_length) - n_bos - int64_t(needle.size()) - int64_t(question.size());
  if (budget < 1)
    fail("NIAH context length ", context_length, " cannot hold BOS + needle (", needle.size(),
         " tokens) + question (", question.size(), " tokens) + haystack");

  // Expected continuation: the value as written after the question, when the question's tokens
  // are a prefix of (question + " " + value); else the value encoded on its own.
  const std::vector<int32_t> joined = encode_sentence(tokenizer, options.question + " " + p.value);
  if (joined.size() > question.size() && std::equal(question.begin(), question.end(), joined.begin()))
    p.expected_tokens.assign(joined.begin() + question.size(), joined.end());
  else
    p.expected_tokens = tokenizer.encode(tokenizer.kind() == "bpe" ? " " + p.value : p.value);

  const int64_t n_hay = int64_t(haystack.tokens.size());
  p.haystack_offset = haystack.sentence_starts[uniform(rng, haystack.sentence_starts.size())];
  auto hay_at = [&](int64_t i) { return (p.haystack_offset + i) % n_hay; };

  // Needle position inside the excerpt: the sentence boundary before (or nearest to)
  // t = floor(B * d / 100); see niah.h.
  const int64_t target = depth_percent >= 100 ? budget : int64_t(std::floor(double(budget) * depth_percent / 100.0));
  int64_t at = target;
  if (depth_percent < 100) {
    auto is_boundary = [&](int64_t i) { return i == 0 || haystack.ends_sentence[hay_at(i - 1)]; };
    int64_t before = target;
    while (!is_boundary(before)) --before;
    at = before;
    if (options.placement == NeedlePlacement::kNearest)
      for (int64_t after = target + 1; after <= budget && after - target < target - before; ++after)
        if (is_boundary(after)) {
          at = after;
          break;
        }
  }

  p.tokens.reserve(context_length);
  if (n_bos) p.tokens.push_back(tokenizer.bos_id());
  for (int64_t i = 0; i < at; ++i) p.tokens.push_back(haystack.tokens[hay_at(i)]);
  p.needle_pos = int64_t(p.tokens.size());
  p.needle_tokens = int(needle.size());
  p.tokens.insert(p.tokens.end(), needle.begin(), needle.end());
  for (int64_t i = at; i < budget; ++i) p.tokens.push_back(haystack.tokens[hay_at(i)]);
  p.question_tokens = int(question.size());
  p.tokens.insert(p.tokens.end(), question.begin(), question.end());
  KVLAB_CHECK(int64_t(p.tokens.size()) == context_length);
  return p;
}

bool value_matches(const std::string& answer, const std::string& value) {
  size_t i = 0;
  while (i < answer.size() && !std::isdigit(static_cast<unsigned char>(answer[i]))) ++i;
  size_t j = i;
  while (j < answer.size() && std::isdigit(static_cast<unsigned char>(answer[j]))) ++j;
  return j > i && answer.compare(i, j - i, value) == 0 && j - i == value.size();
}

const std::vector<float>& feed_prompt(LmSequence& seq, const std::vector<int32_t>& tokens, int tail,
                                      NiahProtocol protocol) {
  const size_t head = tokens.size() - size_t(tail);
  const std::span<const int32_t> all(tokens);
  switch (protocol) {
    case NiahProtocol::kQueryAware:
      return seq.prefill(all, false, true);
    case NiahProtocol::kQueryAgnostic:
      seq.prefill(all.first(head), false, true);
      return seq.prefill(all.subspan(head), false, false);
    case NiahProtocol::kDecodeTail:
      break;
  }
  const std::vector<float>* logits = &seq.prefill(all.first(head), false, true);
  for (size_t i = head; i < tokens.size(); ++i) logits = &seq.decode(tokens[i]);
  return *logits;
}

NiahScore run_niah_trial(LanguageModel& lm, const Tokenizer& tokenizer, const NiahPrompt& prompt,
                         int decode_tail_tokens, int max_answer_tokens, NiahProtocol protocol,
                         uint64_t seed) {
  const int n = int(prompt.tokens.size());
  const int tail = std::clamp(decode_tail_tokens < 0 || protocol != NiahProtocol::kDecodeTail
                                  ? prompt.question_tokens : decode_tail_tokens, 0, n - 1);
  const std::vector<int32_t>& expected = prompt.expected_tokens;
  const int n_expected = int(expected.size());

  NiahScore score;
  score.first_wrong_token = -1;
  int scored = 0;  // expected tokens whose log-probability is in value_logprob
  std::unique_ptr<LmSequence> seq = lm.start(seed);
  const std::vector<float>* logits = &feed_prompt(*seq, prompt.tokens, tail, protocol);
  for (int k = 0; k < max_answer_tokens; ++k) {
    const bool on_path = score.first_wrong_token < 0 && k < n_expected;
    if (on_path) {
      score.value_logprob += log_prob(*logits, expected[k]);
      ++scored;
    }
    const int32_t next = argmax(*logits);
    if (on_path && next != expected[k]) score.first_wrong_token = k;
    score.answer_tokens.push_back(next);
    if (next == tokenizer.eos_id() || k + 1 == max_answer_tokens) break;
    logits = &seq->decode(next);
  }
  if (score.first_wrong_token < 0)
    score.first_wrong_token = std::min<int>(n_expected, int(score.answer_tokens.size()));
  if (scored < n_expected) {  // left the expected path (or stopped early): replay, teacher-forced
    seq.reset();  // end the first sequence before the replay needs its KV blocks
    seq = lm.start(seed);
    logits = &feed_prompt(*seq, prompt.tokens, tail, protocol);
    for (int k = 0; k < n_expected; ++k) {
      if (k >= scored) score.value_logprob += log_prob(*logits, expected[k]);
      if (k + 1 < n_expected) logits = &seq->decode(expected[k]);
    }
  }
  // The answer text, without a trailing EOS.
  std::vector<int32_t> text_ids = score.answer_tokens;
  if (!text_ids.empty() && text_ids.back() == tokenizer.eos_id()) text_ids.pop_back();
  score.answer = tokenizer.decode(text_ids);
  score.correct = value_matches(score.answer, prompt.value);
  return score;
}

uint64_t trial_seed(uint64_t seed, int64_t context_length, double depth_percent, int trial) {
  uint64_t depth_bits;
  std::memcpy(&depth_bits, &depth_percent, sizeof depth_bits);
  uint64_t state = seed;
  uint64_t h = splitmix64(state);
  for (uint64_t part : {uint64_t(context_length), depth_bits, uint64_t(trial)}) {
    state = h ^ part;
    h = splitmix64(state);
  }
  return h;
}

}  // namespace kvlab
