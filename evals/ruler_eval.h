// RULER's synthetic tasks as one evaluation behind the registry (evaluation.h); the prompts and
// the scoring are ruler_tasks.h.
//
//   ruler: {tasks: [name] | all, context_lengths: [int], samples: int (per seed),
//           protocol: query_agnostic | query_aware | [both], haystack: noise | PATH,
//           templates: instruct | kvlab-tiny | {base: instruct | kvlab-tiny,
//                                            FAMILY: {intro, needle, question, answer_prefix,
//                                                     example: bool (vt, cwe only)}},
//           max_answer_tokens: int (default: each task's RULER length),
//           store_prompts: bool (default false: also store each sample's prompt token ids,
//                                for evals/peer/kvpress_runner.py; no effect on the results)}
// FAMILY is niah, vt, cwe, fwe, passkey or kv_retrieval. haystack PATH is the essay role (any
// prose file); noise puts the passkey filler there too.
//
// A context length is RULER's max_seq_length: the prompt has context_length minus the task's
// answer tokens, so prompt and answer fit exactly.
// Cells: protocol x task x context length, every seed x sample inside; ids
// "ruler_<protocol>_<task>_L<length>". A sample's prompt depends on (seed, task, length, sample)
// only, so both protocols and every policy see the same prompts.
// Protocols (POLICIES.md 10; evals/niah.h feed_prompt): query_agnostic prefills the context with
// the prompt-end signal, then the question and answer prefix as a second prefill; query_aware
// prefills the whole prompt with the signal. Then greedy decoding up to the task's answer length,
// stopping at EOS; the prediction is scored (RULER's string_match_all; passkey: the first number).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "evals/evaluation.h"
#include "evals/niah.h"
#include "evals/ruler_tasks.h"

namespace kvlab {

struct RulerSpec {
  std::vector<const RulerTaskInfo*> tasks;
  std::vector<int> context_lengths;
  int samples = 4;
  std::vector<NiahProtocol> protocols{NiahProtocol::kQueryAgnostic};
  std::filesystem::path haystack;  // empty = noise
  RulerTemplates templates;
  int max_answer_tokens = 0;  // 0 = each task's own
  bool store_prompts = false;  // write prompt_tokens [S, longest prompt] (not part of the identity)
  SourceRef ref;
  int answer_tokens(const RulerTaskInfo& t) const { return max_answer_tokens > 0 ? max_answer_tokens : t.answer_tokens; }
};

class RulerEvaluation final : public Evaluation {
 public:
  explicit RulerEvaluation(RulerSpec spec) : spec_(std::move(spec)) {}
  const RulerSpec& spec() const { return spec_; }
  struct Coord {
    NiahProtocol protocol;
    const RulerTaskInfo* task;
    int length;
  };
  Coord coord(size_t cell) const;
  // The task's template prepends RULER's in-context example (vt, cwe; ruler_tasks.h).
  bool has_example(const RulerTaskInfo& task) const {
    return (task.family == RulerFamily::kVt || task.family == RulerFamily::kCwe) && spec_.templates.of(task.family).example;
  }

  std::string name() const override { return "ruler"; }
  const SourceRef& ref() const override { return spec_.ref; }
  size_t cell_count() const override {
    return spec_.protocols.size() * spec_.tasks.size() * spec_.context_lengths.size();
  }
  std::string cell_id(size_t cell) const override;
  std::vector<std::pair<std::string, std::filesystem::path>> input_files() const override;
  int64_t cell_tokens(size_t cell) const override;
  int64_t longest_tokens() const override;
  void check_limit(const TokenLimit& limit) const override;
  void prepare(const Tokenizer& tokenizer) override;
  std::string identity(size_t cell, const std::function<std::string(const std::filesystem::path&)>& digest) const override;
  CellRecord run_cell(size_t cell, EvalContext& ctx) const override;
  std::string outcome(const CellRecord& rec) const override;
  void summarise(const SummaryContext& ctx) const override;

 private:
  RulerSpec spec_;
  std::optional<Haystack> essay_;
  bool prepared_ = false;
};

std::unique_ptr<EvaluationFactory> make_ruler_factory();

}  // namespace kvlab
