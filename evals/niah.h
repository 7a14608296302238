// Needle in a haystack (docs: shared POLICIES.md section 7; gkamradt's placement, RULER's
// 7-digit values, exact-match scoring plus two graded signals).
//
// Prompt, exactly `context_length` tokens:
//   [BOS] haystack[o, o+p) NEEDLE haystack[o+p, o+B) QUESTION
// where the haystack is tokenized once and read cyclically from a sentence start o drawn from
// the trial's seed, B = context_length - |BOS| - |NEEDLE| - |QUESTION| haystack tokens are
// kept, and the needle goes at a sentence boundary near t = floor(B * depth / 100), or at the
// very end when depth = 100. A boundary is an excerpt index i in [0, B] with i = 0 (the excerpt
// starts a sentence) or haystack token i-1 ending a sentence (its text, trailing white space
// removed, ends with '.', '!' or '?'). NeedlePlacement::kNearest takes the boundary nearest to
// t (ties to the earlier one); kPrevious the last boundary <= t (gkamradt's rule). Needle and question are tokenized on their own (SentencePiece adds
// its word-start space; a byte-level BPE tokenizer gets a leading space), so the needle's tokens
// are the same whatever surrounds it and its position is exact.
//
// Scoring (run_niah_trial): the prompt is prefilled except its last `decode_tail_tokens` tokens,
// which go through the decode path one by one (so selection policies act on the question);
// then greedy decoding for up to max_answer_tokens (stopping at EOS).
//   correct           = the first run of digits in the answer text equals the value;
//   first_wrong_token = index of the first greedy token that differs from the expected tokens
//                       (the value as the tokenizer writes it after the question), or their
//                       count when all of them were produced;
//   value_logprob     = sum_k log p(expected_k | prompt, expected_<k), teacher-forced (the prompt
//                       is replayed when greedy decoding leaves the expected path).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evals/lm.h"
#include "kernels/common/enum_names.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

// SplitMix64: the RNG of every seeded choice in the evals (fixed across platforms and
// standard libraries, unlike std::uniform_int_distribution).
uint64_t splitmix64(uint64_t& state);

// SplitMix64-based seed for one NIAH trial: a pure function of its coordinates, so shards and
// resumed runs draw the same needle values and haystack offsets. The run is deliberately not an
// input: every policy sees the same prompts.
uint64_t trial_seed(uint64_t seed, int64_t context_length, double depth_percent, int trial);

// A sentence tokenized on its own, as it reads after a previous sentence: SentencePiece adds its
// word-start space, a byte-level BPE tokenizer gets a leading space; no BOS.
std::vector<int32_t> encode_sentence(const Tokenizer& tokenizer, const std::string& text);

// A tokenized haystack text with its sentence ends.
struct Haystack {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> ends_sentence;  // [tokens.size()] 1 when the token ends a sentence
  std::vector<int64_t> sentence_starts;  // token indices that follow a sentence end (and 0)
};
Haystack make_haystack(const Tokenizer& tokenizer, const std::string& text);

enum class NeedlePlacement { kNearest, kPrevious };
const char* to_string(NeedlePlacement placement);  // "nearest" | "previous"

struct NiahOptions {
  std::string needle = "The special magic number is {value}.";
  std::string question = "What is the special magic number? The special magic number is";
  int value_digits = 7;
  NeedlePlacement placement = NeedlePlacement::kNearest;
};

struct NiahPrompt {
  std::vector<int32_t> tokens;          // [context_length]
  std::string value;                    // the digits hidden in the needle
  int64_t needle_pos = 0;               // index of the needle's first token in tokens
  int needle_tokens = 0;
  int question_tokens = 0;              // the question is the last question_tokens tokens
  int64_t haystack_offset = 0;          // haystack token where the excerpt starts
  std::vector<int32_t> expected_tokens; // the value as the model should write it next
};

// `value_digits` random digits, the first one nonzero.
std::string niah_value(uint64_t& rng_state, int digits);

// Throws kvlab::Error when context_length cannot hold BOS + needle + question (+1 haystack token).
NiahPrompt build_niah_prompt(const Tokenizer& tokenizer, const Haystack& haystack,
                             const NiahOptions& options, int context_length, double depth_percent,
                             uint64_t seed);

struct NiahScore {
  bool correct = false;
  int first_wrong_token = 0;
  double value_logprob = 0;
  std::string answer;                // decoded greedy answer
  std::vector<int32_t> answer_tokens;
};

// True when the first maximal run of ASCII digits in `answer` equals `value`.
bool value_matches(const std::string& answer, const std::string& value);

// How the prompt reaches the model (POLICIES.md 10); the answer is then decoded greedily.
//   decode_tail     prefill all but the last decode_tail_tokens tokens (< 0: the question's) --
//                   that prefill ends the prompt for prompt-end policies -- then the tail token
//                   by token through the decode path (kvlab's first protocol; the default)
//   query_agnostic  prefill the context (it ends the prompt: compression before the question is
//                   seen), then the question as a second prefill, appended uncompressed
//   query_aware     prefill context and question together: compression at the end of the whole
//                   prompt, the question inside the observation window
enum class NiahProtocol { kDecodeTail, kQueryAgnostic, kQueryAware };
inline constexpr EnumName<NiahProtocol> kNiahProtocolNames[] = {
    {NiahProtocol::kDecodeTail, "decode_tail"},
    {NiahProtocol::kQueryAgnostic, "query_agnostic"},
    {NiahProtocol::kQueryAware, "query_aware"}};
inline const char* niah_protocol_name(NiahProtocol p) { return enum_name(kNiahProtocolNames, p); }

// Feeds a prompt whose last `tail` tokens are the question under `protocol` and returns the
// logits after its last token: query_aware prefills everything with the prompt-end signal;
// query_agnostic prefills tokens[0, n - tail) with the signal, then the tail without it;
// decode_tail prefills the head with the signal, then decodes the tail token by token.
const std::vector<float>& feed_prompt(LmSequence& seq, const std::vector<int32_t>& tokens, int tail,
                                      NiahProtocol protocol);

// decode_tail_tokens < 0: the question's tokens (decode_tail only). `seed` starts the sequences
// (LanguageModel::start).
NiahScore run_niah_trial(LanguageModel& lm, const Tokenizer& tokenizer, const NiahPrompt& prompt,
                         int decode_tail_tokens, int max_answer_tokens,
                         NiahProtocol protocol = NiahProtocol::kDecodeTail, uint64_t seed = 0);

}  // namespace kvlab
