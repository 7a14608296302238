// decode_batched (batch_decode.h) against each request run alone: with a pool that holds every
// request at once (no pre-emption), with pools that hold only some (pre-emption and
// recomputation, full attention and an evicting policy), and with a pool too small for one
// request (one clear Error, the engine still usable). Also Engine::decode itself: a batch that
// outgrows the pool reports kOutOfBlocks and changes no sequence.
#include "framework/engine/batch_decode.h"

#include <gtest/gtest.h>

#include <random>

#include "framework/core/error.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/random_model.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

ModelConfig tiny_config() { return tiny_llama_config(/*vocab_size=*/97, /*max_seq_len=*/128); }

constexpr int kBlockTokens = 4;
// One KV block: K and V, kBlockTokens slots, 2 KV heads x 16 features, fp32.
constexpr size_t kBlockBytes = size_t{2} * kBlockTokens * 2 * 16 * sizeof(float);


EngineOptions options_with_blocks(int64_t blocks) {
  EngineOptions o;
  o.threads = 1;
  o.block_size_tokens = kBlockTokens;
  o.prefill_chunk_tokens = 8;
  o.kv_budget_bytes = size_t(blocks) * kBlockBytes;
  return o;
}

// Requests of different lengths; `window` > 0 gives each a sliding-window policy.
std::vector<DecodeRequest> requests(int window) {
  std::vector<DecodeRequest> out;
  const int prompts[] = {9, 14, 5, 20, 11};
  const int news[] = {12, 7, 16, 9, 13};
  for (int i = 0; i < 5; ++i) {
    DecodeRequest q;
    q.prompt = random_tokens(prompts[i], 97, 100 + i);
    q.max_new_tokens = news[i];
    if (window > 0)
      q.make_policy = [window] {
        static const PolicyRegistry registry = make_builtin_registry();
        return registry.create("sliding_window", {{"window", ParamValue(int64_t(window))}},
                               policy_shape(tiny_config()));
      };
    out.push_back(std::move(q));
  }
  return out;
}

// The request alone on its own engine: prefill, then greedy decode with a batch of one.
DecodeResult alone(const Model& model, const DecodeRequest& q) {
  Engine e(model, options_with_blocks(1000));
  const SeqId s = e.start_sequence(q.make_policy ? q.make_policy() : nullptr);
  std::vector<float> logits;
  EXPECT_EQ(e.prefill(s, q.prompt, logits), StepStatus::kOk);
  DecodeResult r;
  while (true) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(next);
    r.final_logits = logits;
    if (int(r.tokens.size()) == q.max_new_tokens) break;
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&next, 1), logits), StepStatus::kOk);
  }
  return r;
}

// Peak blocks of a request alone: 2 layers x ceil(tokens fed / block) (full attention).
int64_t peak_blocks(const DecodeRequest& q) {
  const int64_t fed = int64_t(q.prompt.size()) + q.max_new_tokens - 1;
  return 2 * ((fed + kBlockTokens - 1) / kBlockTokens);
}

void expect_same_as_alone(const Model& model, const std::vector<DecodeRequest>& qs,
                          const std::vector<DecodeResult>& got) {
  ASSERT_EQ(got.size(), qs.size());
  for (size_t i = 0; i < qs.size(); ++i) {
    const DecodeResult want = alone(model, qs[i]);
    EXPECT_EQ(got[i].tokens, want.tokens) << "request " << i;
    EXPECT_EQ(got[i].final_logits, want.final_logits) << "request " << i << ": logits not bit-identical";
    EXPECT_FALSE(got[i].context_full);
  }
}

TEST(BatchDecode, RoomyPoolMatchesEachRequestAlone) {
  auto model = make_random_model(tiny_config(), DType::kF32, 7);
  const auto qs = requests(0);
  Engine e(*model, options_with_blocks(1000));
  const auto got = decode_batched(e, qs, {.max_batch = 5});
  for (const auto& r : got) EXPECT_EQ(r.preemptions, 0);
  expect_same_as_alone(*model, qs, got);
  EXPECT_EQ(e.kv().stats().blocks_in_use, 0);  // every sequence ended
}

// The pool holds the largest request alone but not all five at their peaks: the batch is
// pre-empted and recomputed, and every request still matches its run alone bit for bit.
TEST(BatchDecode, TightPoolPreemptsAndRecomputes) {
  auto model = make_random_model(tiny_config(), DType::kF32, 8);
  for (int window : {0, 6}) {
    SCOPED_TRACE(window ? "sliding window 6" : "full attention");
    const auto qs = requests(window);
    int64_t largest = 0, sum = 0;
    for (const auto& q : qs) {
      largest = std::max(largest, peak_blocks(q));
      sum += peak_blocks(q);
    }
    // Window 6 keeps at most 3 blocks per layer once it evicts, but its prefill chunk (8 tokens)
    // is reserved before eviction: 2 layers x ceil((6 + 8) / 4) = 8 blocks bound a sequence.
    const int64_t pool = window ? 8 + 4 : largest;
    ASSERT_LT(pool, window ? 5 * 8 : sum);  // not everything fits at once
    Engine e(*model, options_with_blocks(pool));
    const auto got = decode_batched(e, qs, {.max_batch = 5});
    int preemptions = 0;
    for (const auto& r : got) preemptions += r.preemptions;
    EXPECT_GT(preemptions, 0) << "the pool never ran out";
    expect_same_as_alone(*model, qs, got);
    EXPECT_EQ(e.kv().stats().blocks_in_use, 0);
  }
}

// A pool too small for one of the requests alone: one Error saying what the step needed and
// naming the budget; the engine has no sequence left and serves the next call.
TEST(BatchDecode, PoolTooSmallForOneRequestIsAClearError) {
  auto model = make_random_model(tiny_config(), DType::kF32, 9);
  auto qs = requests(0);
  Engine e(*model, options_with_blocks(peak_blocks(qs[3]) - 2));  // request 3 is the largest
  try {
    decode_batched(e, qs, {.max_batch = 2});
    ADD_FAILURE() << "request 3 cannot fit";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("request 3 does not fit in the KV pool even alone"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kv_budget_bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs at least " + std::to_string(peak_blocks(qs[3]) * kBlockBytes) + " bytes"),
              std::string::npos) << msg;
  }
  EXPECT_EQ(e.kv().stats().blocks_in_use, 0);
  qs.erase(qs.begin() + 3);
  expect_same_as_alone(*model, qs, decode_batched(e, qs, {.max_batch = 2}));
}

TEST(BatchDecode, BadRequestsAreErrors) {
  auto model = make_random_model(tiny_config(), DType::kF32, 10);
  Engine e(*model, options_with_blocks(100));
  DecodeRequest empty;
  EXPECT_THROW(decode_batched(e, {empty}), Error);
  DecodeRequest none;
  none.prompt = {1, 2};
  none.max_new_tokens = 0;
  EXPECT_THROW(decode_batched(e, {none}), Error);
  DecodeRequest too_long;
  too_long.prompt = random_tokens(129, 97, 1);
  EXPECT_THROW(decode_batched(e, {too_long}), Error);
  EXPECT_THROW(decode_batched(e, {}, {.max_batch = 0}), Error);
}

// Engine::decode on a batch whose next tokens need more blocks than are free: kOutOfBlocks and
// no sequence changed (the contract pre-emption relies on); after one sequence ends, the others
// decode on exactly as they would have.
TEST(BatchDecode, EngineBatchOutgrowingThePoolChangesNothing) {
  auto model = make_random_model(tiny_config(), DType::kF32, 11);
  // Three sequences of 8 tokens: 2 blocks per layer each, 12 blocks; the next token of each
  // opens a new block in both layers (6 more) but only 4 are free.
  Engine e(*model, options_with_blocks(16));
  Engine ref(*model, options_with_blocks(100));
  std::vector<SeqId> seqs, ref_seqs;
  std::vector<float> logits, ref_logits;
  for (int i = 0; i < 3; ++i) {
    const auto prompt = random_tokens(8, 97, 50 + i);
    seqs.push_back(e.start_sequence());
    ref_seqs.push_back(ref.start_sequence());
    ASSERT_EQ(e.prefill(seqs.back(), prompt, logits), StepStatus::kOk);
    ASSERT_EQ(ref.prefill(ref_seqs.back(), prompt, ref_logits), StepStatus::kOk);
  }
  const std::vector<int32_t> next = {3, 5, 7};
  const int64_t free_before = e.kv().free_blocks();
  ASSERT_EQ(free_before, 4);
  EXPECT_EQ(e.decode(seqs, next, logits), StepStatus::kOutOfBlocks);
  EXPECT_EQ(e.kv().free_blocks(), free_before);
  for (SeqId s : seqs) EXPECT_EQ(e.n_tokens(s), 8);
  e.end_sequence(seqs[2]);  // pre-empt one: the other two fit
  const std::vector<SeqId> two(seqs.begin(), seqs.begin() + 2), ref_two(ref_seqs.begin(), ref_seqs.begin() + 2);
  const std::vector<int32_t> next2(next.begin(), next.begin() + 2);
  ASSERT_EQ(e.decode(two, next2, logits), StepStatus::kOk);
  ASSERT_EQ(ref.decode(ref_two, next2, ref_logits), StepStatus::kOk);
  EXPECT_EQ(logits, ref_logits);
}

}  // namespace
}  // namespace kvlab
