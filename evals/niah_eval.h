// The needle-in-a-haystack evaluation behind the registry (evaluation.h): `evals: {niah: ...}`.
// The prompt and the scoring are evals/niah.h; this is its section, its cells (context length x
// depth, every seed x trial inside), what a cell records and its summary (docs/results_schema.md).
//
//   niah: {haystack: path | [paths], context_lengths: [int], depths: [0..100], trials: int,
//          needle: str with {value}, question: str, value_digits: int,
//          needle_placement: nearest|previous, max_answer_tokens: int,
//          decode_tail_tokens: int | "question", protocol: decode_tail|query_agnostic|query_aware,
//          shared_haystack: bool}
// shared_haystack (default false): a trial's excerpt and needle value are drawn without its
// depth (trial_seed with depth -1), so every depth of a trial hides the same value in the same
// text and the prompts share their start up to the earlier needle -- what engine.prefix_reuse
// forks instead of prefilling again. Default: each (depth, trial) draws its own.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "evals/evaluation.h"
#include "evals/niah.h"

namespace kvlab {

struct NiahSpec {
  bool enabled = false;
  std::vector<std::filesystem::path> haystack;
  std::vector<int> context_lengths;
  std::vector<double> depths;  // percent, 0..100
  int trials = 1;
  std::string needle = "The special magic number is {value}.";
  std::string question = "What is the special magic number? The special magic number is";
  int value_digits = 7;
  NeedlePlacement needle_placement = NeedlePlacement::kNearest;  // evals/niah.h
  int max_answer_tokens = 12;
  int decode_tail_tokens = -1;  // -1 = the question's tokens
  NiahProtocol protocol = NiahProtocol::kDecodeTail;  // evals/niah.h
  bool shared_haystack = false;
  SourceRef ref;
};

class NiahEvaluation final : public Evaluation {
 public:
  explicit NiahEvaluation(NiahSpec spec) : spec_(std::move(spec)) {}
  const NiahSpec& spec() const { return spec_; }
  int length_of(size_t cell) const { return spec_.context_lengths[cell / spec_.depths.size()]; }
  double depth_of(size_t cell) const { return spec_.depths[cell % spec_.depths.size()]; }

  std::string name() const override { return "niah"; }
  const SourceRef& ref() const override { return spec_.ref; }
  size_t cell_count() const override { return spec_.context_lengths.size() * spec_.depths.size(); }
  std::string cell_id(size_t cell) const override;
  std::vector<std::pair<std::string, std::filesystem::path>> input_files() const override;
  int64_t cell_tokens(size_t cell) const override { return length_of(cell) + spec_.max_answer_tokens; }
  int64_t longest_tokens() const override;
  void check_limit(const TokenLimit& limit) const override;
  void prepare(const Tokenizer& tokenizer) override;
  std::string identity(size_t cell, const std::function<std::string(const std::filesystem::path&)>& digest) const override;
  CellRecord run_cell(size_t cell, EvalContext& ctx) const override;
  std::string outcome(const CellRecord& rec) const override;
  void summarise(const SummaryContext& ctx) const override;

 private:
  NiahSpec spec_;
  std::optional<Haystack> haystack_;
};

std::unique_ptr<EvaluationFactory> make_niah_factory();

}  // namespace kvlab
