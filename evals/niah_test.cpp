#include "evals/niah.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "evals/fake_lm_test_util.h"
#include "framework/core/error.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using testing::ByteTokenizer;
using testing::FunctionLm;
using testing::kHay;

std::string replace_value(const std::string& needle, const std::string& value) {
  std::string s = needle;
  s.replace(s.find("{value}"), 7, value);
  return s;
}

// Checks every structural promise of build_niah_prompt for one prompt.
void check_prompt(const Tokenizer& tok, const Haystack& hay, const NiahOptions& opt, int length,
                  double depth, const NiahPrompt& p) {
  SCOPED_TRACE(::testing::Message() << "length " << length << " depth " << depth);
  ASSERT_EQ(int(p.tokens.size()), length);
  EXPECT_EQ(p.tokens[0], tok.bos_id());
  EXPECT_EQ(int(p.value.size()), opt.value_digits);
  EXPECT_NE(p.value[0], '0');
  const std::string needle = tok.decode(std::span(p.tokens).subspan(p.needle_pos, p.needle_tokens));
  EXPECT_NE(needle.find(replace_value(opt.needle, p.value)), std::string::npos) << needle;
  const std::vector<int32_t> q(p.tokens.end() - p.question_tokens, p.tokens.end());
  EXPECT_NE(tok.decode(q).find(opt.question), std::string::npos);

  // The haystack tokens (everything but BOS, needle, question) are the cyclic excerpt.
  std::vector<int32_t> excerpt(p.tokens.begin() + 1, p.tokens.begin() + p.needle_pos);
  excerpt.insert(excerpt.end(), p.tokens.begin() + p.needle_pos + p.needle_tokens,
                 p.tokens.end() - p.question_tokens);
  const int64_t n = int64_t(hay.tokens.size());
  for (size_t i = 0; i < excerpt.size(); ++i)
    ASSERT_EQ(excerpt[i], hay.tokens[(p.haystack_offset + int64_t(i)) % n]) << i;
  EXPECT_TRUE(p.haystack_offset == 0 || hay.ends_sentence[p.haystack_offset - 1]);

  // Placement: at = haystack tokens before the needle. Boundaries are excerpt indices i in
  // [0, B] with i = 0 or haystack token i-1 ending a sentence; with t = floor(B * depth / 100),
  // kPrevious takes the last boundary <= t, kNearest the one nearest t (ties: the earlier one);
  // depth 100 puts the needle at the end.
  const int64_t budget = int64_t(excerpt.size());
  const int64_t at = p.needle_pos - 1;
  if (depth >= 100) {
    EXPECT_EQ(at, budget);
  } else {
    const int64_t target = int64_t(std::floor(double(budget) * depth / 100));
    int64_t want = -1;
    for (int64_t i = 0; i <= budget; ++i) {
      if (i != 0 && !hay.ends_sentence[(p.haystack_offset + i - 1) % n]) continue;
      if (opt.placement == NeedlePlacement::kPrevious) {
        if (i <= target) want = i;
      } else if (want < 0 || std::abs(i - target) < std::abs(want - target)) {
        want = i;
      }
    }
    EXPECT_EQ(at, want) << "target " << target << ", placement " << to_string(opt.placement);
  }
}

TEST(Niah, PromptHasExactLengthAndNeedlePlacement) {
  ByteTokenizer tok;
  const Haystack hay = make_haystack(tok, kHay);
  ASSERT_GT(hay.sentence_starts.size(), 5u);
  EXPECT_EQ(NiahOptions{}.placement, NeedlePlacement::kNearest);
  int moved_forward = 0;  // prompts where nearest lies after the target (differs from previous)
  for (NeedlePlacement placement : {NeedlePlacement::kNearest, NeedlePlacement::kPrevious}) {
    NiahOptions opt;
    opt.placement = placement;
    for (int length : {140, 200, 257, 1000})  // 1000 > haystack: the haystack wraps around
      for (double depth : {0.0, 10.0, 33.3, 50.0, 70.0, 90.0, 100.0})
        for (uint64_t seed : {1, 2, 3}) {
          const NiahPrompt p = build_niah_prompt(tok, hay, opt, length, depth, seed);
          check_prompt(tok, hay, opt, length, depth, p);
          if (placement == NeedlePlacement::kNearest) {
            NiahOptions prev = opt;
            prev.placement = NeedlePlacement::kPrevious;
            const NiahPrompt q = build_niah_prompt(tok, hay, prev, length, depth, seed);
            EXPECT_GE(p.needle_pos, q.needle_pos);
            EXPECT_EQ(p.value, q.value);
            EXPECT_EQ(p.haystack_offset, q.haystack_offset);
            moved_forward += p.needle_pos > q.needle_pos;
          }
        }
  }
  EXPECT_GT(moved_forward, 0);
}

// Sentences of 6 tokens: boundaries at every multiple of 6 of the excerpt. A target 3 past a
// boundary is a tie (nearest takes the earlier one), 4 past goes forward, 2 past goes back.
TEST(Niah, NearestPlacementTiesToTheEarlierBoundary) {
  ByteTokenizer tok;
  std::string text;
  for (int i = 0; i < 100; ++i) text += "abcde.";
  const Haystack hay = make_haystack(tok, text);
  const int length = 300;
  NiahOptions nearest, previous;
  previous.placement = NeedlePlacement::kPrevious;
  const NiahPrompt probe = build_niah_prompt(tok, hay, nearest, length, 0, 5);
  const int64_t budget = length - 1 - probe.needle_tokens - probe.question_tokens;
  for (int64_t target : {int64_t(60), int64_t(62), int64_t(63), int64_t(64), int64_t(65)}) {
    SCOPED_TRACE(target);
    const double depth = 100.0 * (double(target) + 0.5) / double(budget);
    ASSERT_EQ(int64_t(std::floor(double(budget) * depth / 100)), target);
    const int64_t at_nearest = build_niah_prompt(tok, hay, nearest, length, depth, 5).needle_pos - 1;
    const int64_t at_previous = build_niah_prompt(tok, hay, previous, length, depth, 5).needle_pos - 1;
    EXPECT_EQ(at_previous, 60);
    EXPECT_EQ(at_nearest, target - 60 <= 3 ? 60 : 66);
  }
}

TEST(Niah, PromptsAreAFunctionOfTheSeed) {
  ByteTokenizer tok;
  const Haystack hay = make_haystack(tok, kHay);
  NiahOptions opt;
  opt.value_digits = 9;
  const NiahPrompt a = build_niah_prompt(tok, hay, opt, 300, 50, 42);
  const NiahPrompt b = build_niah_prompt(tok, hay, opt, 300, 50, 42);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.value.size(), 9u);
  std::set<std::string> values;
  for (uint64_t s = 0; s < 20; ++s) values.insert(build_niah_prompt(tok, hay, opt, 300, 50, s).value);
  EXPECT_GE(values.size(), 19u);
}

TEST(Niah, TooShortAContextIsAnError) {
  ByteTokenizer tok;
  const Haystack hay = make_haystack(tok, kHay);
  EXPECT_THROW(build_niah_prompt(tok, hay, NiahOptions{}, 60, 50, 1), Error);
}

TEST(Niah, ValueMatching) {
  EXPECT_TRUE(value_matches(" 1234567.", "1234567"));
  EXPECT_TRUE(value_matches("1234567 and 99", "1234567"));
  EXPECT_FALSE(value_matches(" 12345678", "1234567"));
  EXPECT_FALSE(value_matches(" 123456", "1234567"));
  EXPECT_FALSE(value_matches(" 99 1234567", "1234567"));
  EXPECT_FALSE(value_matches("no digits", "1234567"));
}

// A model that writes the expected tokens right after the prompt (peaked logits), then EOS;
// at answer step `wrong_at` it prefers 'x' instead. Its logits also depend on the last token,
// so teacher forcing after a wrong token needs the replay.
FunctionLm::Fn answering_fn(const NiahPrompt& p, int wrong_at) {
  return [p, wrong_at](std::span<const int32_t> ctx) {
    std::vector<float> l(258, 0.f);
    const int64_t k = int64_t(ctx.size()) - int64_t(p.tokens.size());
    if (k >= 0 && k < int64_t(p.expected_tokens.size())) l[p.expected_tokens[k]] = 5.f;
    if (k >= int64_t(p.expected_tokens.size())) l[257] = 9.f;
    if (k == wrong_at) l['x'] = 7.f;
    l[(ctx.back() * 7) % 256] += 0.5f;
    return l;
  };
}

double direct_logprob(const FunctionLm::Fn& fn, const NiahPrompt& p) {
  std::vector<int32_t> ctx = p.tokens;
  double lp = 0;
  for (int32_t t : p.expected_tokens) {
    lp += log_prob(fn(ctx), t);
    ctx.push_back(t);
  }
  return lp;
}

TEST(Niah, TrialScoresExactMatchFirstWrongTokenAndLogprob) {
  ByteTokenizer tok;
  const Haystack hay = make_haystack(tok, kHay);
  const NiahPrompt p = build_niah_prompt(tok, hay, NiahOptions{}, 200, 50, 5);
  ASSERT_EQ(tok.decode(p.expected_tokens), " " + p.value);  // the space after "... is"
  const int n_expected = int(p.expected_tokens.size());

  FunctionLm right(258, answering_fn(p, -1));
  const NiahScore s = run_niah_trial(right, tok, p, -1, 12);
  EXPECT_TRUE(s.correct);
  EXPECT_EQ(s.answer, " " + p.value);
  EXPECT_EQ(s.first_wrong_token, n_expected);
  EXPECT_NEAR(s.value_logprob, direct_logprob(answering_fn(p, -1), p), 1e-6);
  EXPECT_EQ(int(s.answer_tokens.size()), n_expected + 1);  // + EOS
  // Decode tail = the question: prefill covers the rest, then question + answer decode steps
  // (no decode after EOS), one sequence (no replay needed).
  EXPECT_EQ(right.prefilled, 200 - p.question_tokens);
  EXPECT_EQ(right.decoded, p.question_tokens + n_expected);
  EXPECT_EQ(right.sequences, 1);

  FunctionLm wrong(258, answering_fn(p, 2));
  const NiahScore w = run_niah_trial(wrong, tok, p, 5, 12);
  EXPECT_FALSE(w.correct);
  EXPECT_EQ(w.first_wrong_token, 2);
  EXPECT_EQ(w.answer.substr(0, 3), " " + p.value.substr(0, 1) + "x");
  EXPECT_NEAR(w.value_logprob, direct_logprob(answering_fn(p, 2), p), 1e-6);
  EXPECT_EQ(wrong.sequences, 2);  // replayed for teacher forcing
  EXPECT_EQ(wrong.prefilled, 2 * (200 - 5));

  // max_answer_tokens shorter than the value: not correct, log-prob still complete.
  FunctionLm short_lm(258, answering_fn(p, -1));
  const NiahScore t = run_niah_trial(short_lm, tok, p, 0, 3);
  EXPECT_FALSE(t.correct);
  EXPECT_EQ(t.first_wrong_token, 3);
  EXPECT_NEAR(t.value_logprob, direct_logprob(answering_fn(p, -1), p), 1e-6);
}

fs::path shared_dir() {
  if (const char* env = std::getenv("KVLAB_SHARED_DIR")) return env;
  return fs::path(KVLAB_SOURCE_DIR) / ".." / "shared";
}

TEST(Niah, Llama2TokenizerPromptsAreExact) {
  const fs::path model = shared_dir() / "tokenizers/llama2/tokenizer.model";
  const fs::path text = shared_dir() / "text/pride_and_prejudice.txt";
  if (!fs::exists(model) || !fs::exists(text))
    GTEST_SKIP() << "needs ../shared/tokenizers/llama2/tokenizer.model and text/pride_and_prejudice.txt: absent";
  const auto tok = load_tokenizer(model);
  std::ifstream in(text);
  std::stringstream ss;
  ss << in.rdbuf();
  const Haystack hay = make_haystack(*tok, ss.str().substr(0, 60000));
  NiahOptions opt;
  for (int length : {256, 1000, 4096})
    for (double depth : {0.0, 25.0, 50.0, 100.0}) {
      const NiahPrompt p = build_niah_prompt(*tok, hay, opt, length, depth, uint64_t(length + depth));
      check_prompt(*tok, hay, opt, length, depth, p);
      // The value as the model would write it after the question: " 1234567" (SentencePiece
      // digits are single tokens after a word-start piece).
      std::string expected = tok->decode(p.expected_tokens);
      while (!expected.empty() && expected[0] == ' ') expected.erase(0, 1);
      EXPECT_EQ(expected, p.value);
    }
}

}  // namespace
}  // namespace kvlab
