// The retrieval-score calibration on a fake copying model (evals/fake_lm_test_util.h): the fake
// LM answers every NIAH prompt by copying the value out of the needle, and a fake TopKeySource
// says, for each query head, which key position the head "attended" in the latest call. Scores
// are checked against what each fake head does by construction: a head that always attends to
// the copied needle token scores exactly 1, one that never does 0, one that does at every
// other answer step ceil(n/2)/n, and the KV head takes the max over its query heads.
#include "evals/retrieval_heads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "evals/fake_lm_test_util.h"
#include "framework/core/error.h"

namespace kvlab {
namespace {

using testing::ByteTokenizer;
using testing::FunctionLm;
using testing::kHay;

const std::string kNeedlePrefix = "The special magic number is";  // NiahOptions' default needle
const std::string kQuestion = NiahOptions{}.question;

// What the fake model saw in its latest call and where it copies from.
struct CopyState {
  std::vector<int32_t> context;
  int64_t copy_from = -1;  // needle position of the token emitted next
  int step = -1;           // answer step k of that token
};

int64_t find(const std::vector<int32_t>& ctx, const std::string& s) {
  const std::vector<int32_t> pat(s.begin(), s.end());
  auto it = std::search(ctx.begin(), ctx.end(), pat.begin(), pat.end());
  return it == ctx.end() ? -1 : int64_t(it - ctx.begin());
}

// Emits, after the question, the needle's tokens that follow kNeedlePrefix, one per step: the
// value with its leading space (ByteTokenizer: one token per byte), i.e. expected_tokens.
FunctionLm::Fn copying_fn(std::shared_ptr<CopyState> st) {
  return [st](std::span<const int32_t> context) {
    st->context.assign(context.begin(), context.end());
    const int64_t needle = find(st->context, kNeedlePrefix);
    const int64_t question = find(st->context, kQuestion);
    std::vector<float> logits(258, 0.f);
    if (needle < 0 || question < 0) return logits;
    st->step = int(int64_t(context.size()) - (question + int64_t(kQuestion.size())));
    st->copy_from = needle + int64_t(kNeedlePrefix.size()) + st->step;
    logits[size_t(st->context[size_t(st->copy_from)])] = 10.f;
    return logits;
  };
}

// 2 layers x 2 query heads, 1 KV head per layer (G = 2):
//   (0, 0) always the copied token           -> 1
//   (0, 1) BOS, never                         -> 0          KV (0, 0): max = 1
//   (1, 0) the copied token at even steps     -> ceil(n/2)/n
//   (1, 1) the needle's first token 'T' (inside the needle, but not the emitted token) -> 0
class FakeSource final : public TopKeySource {
 public:
  explicit FakeSource(std::shared_ptr<CopyState> st) : st_(std::move(st)) {}
  int n_layers() const override { return 2; }
  int n_heads() const override { return 2; }
  int n_kv_heads() const override { return 1; }
  std::vector<int64_t> top_positions() const override {
    const int64_t c = st_->copy_from, needle = find(st_->context, kNeedlePrefix);
    return {c, 0, st_->step % 2 == 0 ? c : 0, needle};
  }

 private:
  std::shared_ptr<CopyState> st_;
};

// What every test starts from: the haystack, the fake's shared state and the fake top-key source.
class RetrievalHeads : public ::testing::Test {
 protected:
  ByteTokenizer tok;
  const Haystack hay = make_haystack(tok, kHay);
  std::shared_ptr<CopyState> st = std::make_shared<CopyState>();
  FakeSource src{st};
};

TEST_F(RetrievalHeads, ScoresFollowWhatEachHeadAttends) {
  FunctionLm lm(258, copying_fn(st));
  RetrievalCalibrationOptions o;
  o.context_lengths = {200, 300};
  o.depths = {0, 50, 100};
  o.trials = 2;
  const RetrievalCalibration c = calibrate_retrieval_heads(lm, src, tok, hay, o);
  EXPECT_EQ(c.trials, 12);
  EXPECT_EQ(c.correct, 12);                 // the fake copies every value right
  const int n = 1 + NiahOptions{}.value_digits;  // " " + 7 digits per trial
  EXPECT_EQ(c.copy_tokens, 12 * n);
  ASSERT_EQ(c.head_score.size(), 4u);
  EXPECT_EQ(c.head_score[0], 1.0);
  EXPECT_EQ(c.head_score[1], 0.0);
  EXPECT_EQ(c.hits[2], 12 * ((n + 1) / 2));  // steps 0, 2, 4, 6 of 0..7
  EXPECT_DOUBLE_EQ(c.head_score[2], double((n + 1) / 2) / n);
  EXPECT_EQ(c.head_score[3], 0.0);
  ASSERT_EQ(c.kv_score.size(), 2u);
  EXPECT_EQ(c.kv_score[0], 1.0);
  EXPECT_DOUBLE_EQ(c.kv_score[1], double((n + 1) / 2) / n);
  // The model was asked for exactly the value's tokens per trial, after one prefill each.
  EXPECT_EQ(lm.sequences, 12);
  EXPECT_EQ(lm.decoded, 12 * (n - 1));
}

TEST_F(RetrievalHeads, AWrongAnswerScoresNoHitWhereTheTokenDiffers) {
  // The fake emits the copied token except at step 3, where it emits 'x'; a head attending to
  // the would-be copied token then holds a token the model did not emit: no hit at that step.
  FunctionLm::Fn copy = copying_fn(st);
  FunctionLm lm(258, [&](std::span<const int32_t> ctx) {
    std::vector<float> l = copy(ctx);
    if (st->step == 3) {
      std::fill(l.begin(), l.end(), 0.f);
      l['x'] = 10.f;
    }
    return l;
  });
  RetrievalCalibrationOptions o;
  o.context_lengths = {200};
  o.depths = {50};
  const RetrievalCalibration c = calibrate_retrieval_heads(lm, src, tok, hay, o);
  const int n = 1 + NiahOptions{}.value_digits;
  EXPECT_EQ(c.correct, 0);
  EXPECT_EQ(c.hits[0], n - 1);
  EXPECT_DOUBLE_EQ(c.head_score[0], double(n - 1) / n);
}

TEST_F(RetrievalHeads, BadGridOrShapeIsAnError) {
  FunctionLm lm(258, copying_fn(st));
  RetrievalCalibrationOptions o;
  o.depths.clear();
  EXPECT_THROW(calibrate_retrieval_heads(lm, src, tok, hay, o), Error);
  o = {};
  o.context_lengths = {20};  // cannot hold needle + question
  EXPECT_THROW(calibrate_retrieval_heads(lm, src, tok, hay, o), Error);
}

}  // namespace
}  // namespace kvlab
