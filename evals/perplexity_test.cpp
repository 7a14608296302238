#include "evals/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "evals/fake_lm_test_util.h"
#include "evals/niah.h"
#include "framework/core/error.h"

namespace kvlab {
namespace {

using testing::FunctionLm;
using testing::hash_logits;

constexpr int32_t kVocab = 23;
constexpr int32_t kBos = 1;

std::vector<int32_t> make_tokens(int n) {
  std::vector<int32_t> t{kBos};
  uint64_t s = 7;
  while (int(t.size()) < n) t.push_back(int32_t(2 + splitmix64(s) % (kVocab - 2)));
  return t;
}

// Direct NLL of tokens[i] given context tokens[begin, i) (context[0] replaced by `first`).
double direct_nll(const std::vector<int32_t>& tokens, int64_t begin, int64_t i, int32_t first = -1) {
  std::vector<int32_t> ctx(tokens.begin() + begin, tokens.begin() + i);
  if (first >= 0) ctx[0] = first;
  const std::vector<float> l = hash_logits(ctx, kVocab);
  double m = -INFINITY, s = 0;
  for (float x : l) m = std::max(m, double(x));
  for (float x : l) s += std::exp(x - m);
  return -(l[tokens[i]] - m - std::log(s));
}

FunctionLm make_lm() {
  return FunctionLm(kVocab, [](std::span<const int32_t> c) { return hash_logits(c, kVocab); });
}

TEST(Perplexity, StreamingScoresEveryTokenGivenTheWholePrefix) {
  FunctionLm lm = make_lm();
  const auto tokens = make_tokens(97);
  PerplexityOptions o;
  o.protocol = PplProtocol::kStreaming;
  const PerplexityResult r = evaluate_perplexity(lm, tokens, kBos, o);
  ASSERT_EQ(r.nll.size(), 96u);
  double sum = 0;
  for (int i = 1; i < 97; ++i) {
    EXPECT_EQ(r.positions[i - 1], i);
    EXPECT_NEAR(r.nll[i - 1], direct_nll(tokens, 0, i), 1e-5);
    sum += direct_nll(tokens, 0, i);
  }
  EXPECT_NEAR(r.ppl, std::exp(sum / 96), 1e-4 * r.ppl);
  EXPECT_EQ(lm.decoded, 96);  // all through the decode path, no prefill
  EXPECT_EQ(lm.prefilled, 0);
}

TEST(Perplexity, ChunkedIsLlamaCppProtocol) {
  FunctionLm lm = make_lm();
  const int n_ctx = 16;
  const auto tokens = make_tokens(3 * n_ctx + 5);  // 3 windows, the 5 extra tokens unused
  PerplexityOptions o;
  o.protocol = PplProtocol::kChunked;
  o.n_ctx = n_ctx;
  const PerplexityResult r = evaluate_perplexity(lm, tokens, kBos, o);
  std::vector<double> expected;
  for (int c = 0; c < 3; ++c)
    for (int j = n_ctx / 2 + 1; j < n_ctx; ++j) expected.push_back(direct_nll(tokens, c * n_ctx, c * n_ctx + j, kBos));
  ASSERT_EQ(r.nll.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) EXPECT_NEAR(r.nll[k], expected[k], 1e-5) << k;
  EXPECT_EQ(r.positions.front(), n_ctx / 2 + 1);
  EXPECT_EQ(r.positions.back(), 3 * n_ctx - 1);
  EXPECT_EQ(lm.sequences, 3);
  EXPECT_THROW(evaluate_perplexity(lm, make_tokens(2 * n_ctx - 1), kBos, o), Error);
}

TEST(Perplexity, SlidingIsHuggingFaceProtocol) {
  for (auto [n, window, stride] : {std::tuple{50, 16, 8}, {50, 16, 16}, {37, 10, 3}, {20, 32, 8}}) {
    FunctionLm lm = make_lm();
    const auto tokens = make_tokens(n);
    PerplexityOptions o;
    o.protocol = PplProtocol::kSliding;
    o.window = window;
    o.stride = stride;
    const PerplexityResult r = evaluate_perplexity(lm, tokens, kBos, o);
    // Reference: HF's loop, written out. With stride < window every token 1..n-1 is scored
    // exactly once; with stride == window the first token of each window is not (HF's label
    // shift drops it), as in the Hugging Face perplexity guide.
    SCOPED_TRACE(::testing::Message() << n << " " << window << " " << stride);
    if (stride < window) {
      ASSERT_EQ(int(r.nll.size()), n - 1);
    }
    int prev_end = 0, k = 0;
    for (int begin = 0; begin < n; begin += stride) {
      const int end = std::min(begin + window, n);
      for (int i = std::max(prev_end, begin + 1); i < end; ++i, ++k) {
        ASSERT_LT(k, int(r.nll.size()));
        EXPECT_EQ(r.positions[k], i);
        EXPECT_NEAR(r.nll[k], direct_nll(tokens, begin, i), 1e-5);
      }
      prev_end = end;
      if (end == n) break;
    }
    EXPECT_EQ(k, int(r.nll.size()));
  }
}

TEST(Perplexity, SlidingWithAWindowCoveringTheTextEqualsStreaming) {
  FunctionLm a = make_lm(), b = make_lm();
  const auto tokens = make_tokens(40);
  PerplexityOptions s, w;
  s.protocol = PplProtocol::kStreaming;
  w.protocol = PplProtocol::kSliding;
  w.window = 64;
  w.stride = 64;
  const auto rs = evaluate_perplexity(a, tokens, kBos, s);
  const auto rw = evaluate_perplexity(b, tokens, kBos, w);
  ASSERT_EQ(rs.nll.size(), rw.nll.size());
  for (size_t i = 0; i < rs.nll.size(); ++i) EXPECT_NEAR(rs.nll[i], rw.nll[i], 1e-5);
}

TEST(Perplexity, SummaryStatistics) {
  PerplexityResult r;
  r.nll = {1, 2, 3, 4, 5};
  summarize_perplexity(r, {});
  EXPECT_NEAR(r.mean_nll, 3, 1e-12);
  EXPECT_NEAR(r.ppl, std::exp(3.0), 1e-9);
  // sample sd of 1..5 = sqrt(2.5); stderr of the mean = sqrt(2.5 / 5)
  EXPECT_NEAR(r.ppl_stderr, std::exp(3.0) * std::sqrt(0.5), 1e-9);
  EXPECT_EQ(r.checkpoints, (std::vector<int64_t>{1, 2, 4, 5}));
  ASSERT_EQ(r.running_ppl.size(), 4u);
  EXPECT_NEAR(r.running_ppl[0], std::exp(1.0), 1e-9);
  EXPECT_NEAR(r.running_ppl[1], std::exp(1.5), 1e-9);
  EXPECT_NEAR(r.running_ppl[2], std::exp(2.5), 1e-9);
  summarize_perplexity(r, {3, 9});
  EXPECT_EQ(r.checkpoints, (std::vector<int64_t>{3}));
  EXPECT_NEAR(r.running_ppl[0], std::exp(2.0), 1e-9);
}

TEST(Perplexity, LogProbIsStable) {
  const std::vector<float> l{1000.f, 1000.f, -1000.f};
  EXPECT_NEAR(log_prob(l, 0), std::log(0.5), 1e-12);
  EXPECT_EQ(argmax(l), 0);
}

}  // namespace
}  // namespace kvlab
