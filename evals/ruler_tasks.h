// RULER's synthetic tasks (arXiv 2404.06654; the definitions follow NVIDIA/RULER
// scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,freq_words_extraction}.py,
// scripts/synthetic.yaml and scripts/data/synthetic/constants.py; shared POLICIES.md section 18),
// plus passkey (Landmark Attention) and kv_retrieval (InfiniteBench): prompt generators with
// exact token lengths and RULER's scoring. Pure functions of (tokenizer, inputs, seed).
//
// Prompt, exactly `prompt_length` tokens (the evaluation passes RULER's max_seq_length minus the
// task's tokens to generate, so prompt and answer fill the context length, as in RULER):
//   [BOS] INTRO  CONTEXT  QUESTION+ANSWER_PREFIX
// Every piece is tokenized on its own (encode_sentence, niah.h) and the token sequences are
// concatenated, so a needle's tokens and position are exact whatever surrounds it. CONTEXT holds
// haystack units (a noise sentence, an essay sentence, a distractor needle, a key/value pair or
// a word-list entry) with the needles inserted between units; the haystack is filled to the
// exact token budget by cutting its last unit (for cwe and fwe, whose answer is a count, the
// list keeps whole entries and the rest is padding: the tokens of " ..." repeated, cut to fit).
//
// Needle placement (RULER): essay haystacks put needle k at sentence boundary
// floor(n_boundaries * depth_k / 100), the depths drawn without replacement from 40 depths
// round(linspace(0, 100, 40)) and sorted; noise and needle haystacks (and vt's chain, passkey,
// kv_retrieval) insert each needle before a unit drawn without replacement, in order.
// Departures from RULER, for lack of its data offline: words (keys, cwe's list) come from a
// built-in list of English words (RULER: the wonderwords lists); the essay is any text file
// (RULER: Paul Graham's essays).
//
// In-context example (RULER variable_tracking.py and common_words_extraction.py prepend one
// solved instance of the task; a template's `example`, on in the instruct set): right after BOS,
// before INTRO, the same template filled for a smaller instance of the task, followed by its
// answer. vt: a chain of 3-letter names in a noise haystack, the example and its answer taking
// exactly 500 - 30 = 470 tokens (RULER sizes it for a max_seq_length of 500 with vt's 30 answer
// tokens); answer the names separated by spaces, then a blank line. cwe: 20 words, the 10
// common ones 3 times and the others once (below a context length of 4096; else 40 words, 10 and
// 3 times), no padding; answer "1. w 2. w ... 10. w", then a newline. The example is drawn from
// its own stream of the sample's seed (vt's chain stays the one drawn without it; cwe's list is
// drawn for its size, which the example shrinks), and its tokens count inside the exact prompt
// length (the haystack or the list gets that much less).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evals/niah.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

enum class RulerTask {
  kNiahSingle1,
  kNiahSingle2,
  kNiahSingle3,
  kNiahMultikey1,
  kNiahMultikey2,
  kNiahMultikey3,
  kNiahMultivalue,
  kNiahMultiquery,
  kVt,
  kCwe,
  kFwe,
  kPasskey,
  kKvRetrieval,
};

enum class RulerFamily { kNiah, kVt, kCwe, kFwe, kPasskey, kKvRetrieval };
enum class RulerHaystack { kNoise, kEssay, kNeedle, kPairs, kWords };
enum class RulerItem { kNumber, kWord, kUuid };
enum class RulerScoring { kMatchAll, kMatchPart, kFirstNumber };

struct RulerTaskInfo {
  RulerTask task;
  const char* name;
  RulerFamily family;
  RulerHaystack haystack;
  RulerItem key = RulerItem::kWord, value = RulerItem::kNumber;
  int num_keys = 1, num_values = 1, num_queries = 1;  // niah (RULER's num_needle_k/v/q)
  int answer_tokens = 128;                             // tokens to generate
  RulerScoring scoring = RulerScoring::kMatchAll;
};

// Every task, in a fixed order (the order of RulerTask).
const std::vector<RulerTaskInfo>& ruler_tasks();
// nullptr when unknown.
const RulerTaskInfo* find_ruler_task(const std::string& name);
std::string ruler_task_names();  // "niah_single_1, ..., kv_retrieval"

// The words of one prompt family. Placeholders: {key} {value} in the needle; {query} (the asked
// keys, or vt's value) and {type} (RULER's type_needle_v: "number"/"numbers", "word"/"words",
// "uuid"/"uuids", singular when one answer) in intro, question and answer_prefix; {num_v} (vt's
// variable count) anywhere.
struct RulerTemplate {
  std::string intro;          // before the context
  std::string needle;         // niah, passkey, kv_retrieval: the hidden sentence
  std::string question;       // after the context
  std::string answer_prefix;  // appended to the question: the model continues it
  bool example = false;       // vt, cwe: prepend RULER's solved in-context example (above)
};
struct RulerTemplates {
  std::string name;  // "instruct" | "kvlab-tiny" | "custom"
  RulerTemplate niah, vt, cwe, fwe, passkey, kv_retrieval;
  RulerTemplate& of(RulerFamily f);
  const RulerTemplate& of(RulerFamily f) const;
};
// "instruct" (RULER's prompt structure in kvlab's words, for instruction-tuned models; RULER's
// own strings are not shipped: give them as a templates mapping) or "kvlab-tiny"
// (prompts whose answer prefix ends with the words before the value in the needle, which the
// bundled model can continue); nullopt for another name.
std::optional<RulerTemplates> builtin_ruler_templates(const std::string& name);
// Names the family and field ("templates.niah.needle: missing {key}") or "" when usable.
std::string check_ruler_template(RulerFamily family, const RulerTemplate& t);
const char* ruler_family_name(RulerFamily f);  // "niah", "vt", "cwe", "fwe", "passkey", "kv_retrieval"

// What a prompt is built from.
struct RulerSource {
  const Tokenizer& tokenizer;
  const RulerTemplates& templates;
  const Haystack* essay = nullptr;  // the essay role; nullptr = noise instead (haystack: noise)
};

struct RulerSample {
  std::vector<int32_t> tokens;          // [prompt_length]
  int question_tokens = 0;              // the last question_tokens tokens are QUESTION+ANSWER_PREFIX
  std::vector<int64_t> needle_pos;      // first token of each needle (vt: each chain statement), in order
  std::vector<int64_t> needle_tokens;   // their lengths
  std::vector<std::string> references;  // the answer values (RULER's outputs)
  std::string query;
  int64_t haystack_offset = -1;         // essay: token where the excerpt starts; else -1
  int pad_tokens = 0;                   // cwe/fwe: padding after the list
  int example_tokens = 0;               // the in-context example's tokens (after BOS), 0 without one
  std::vector<std::string> example_references;  // the example's answer (as written after it)
};

// Throws kvlab::Error when prompt_length cannot hold the task's fixed parts (naming the
// shortest length that can). cwe's frequencies switch at `context_length` 4096 (RULER's rule on
// its max_seq_length).
RulerSample build_ruler_sample(const RulerSource& source, const RulerTaskInfo& task, int prompt_length,
                               int context_length, uint64_t seed);

// RULER's metrics (scripts/eval/synthetic/constants.py), in [0, 1] (RULER reports x100):
// match_all = mean over references of "the reference occurs in the prediction" (case-
// insensitive); match_part = the max of the same. kFirstNumber: the first run of digits in the
// prediction equals the (single) reference (passkey, POLICIES.md 7).
double ruler_score(RulerScoring scoring, const std::string& prediction, const std::vector<std::string>& references);
double string_match_all(const std::string& prediction, const std::vector<std::string>& references);
double string_match_part(const std::string& prediction, const std::vector<std::string>& references);

// The seed of one sample: a pure function of its coordinates (not of the policy, nor the
// protocol: every run and both protocols see the same prompts).
uint64_t ruler_sample_seed(uint64_t seed, RulerTask task, int64_t context_length, int sample);

}  // namespace kvlab
