// The perplexity evaluation behind the registry (evaluation.h): `evals: {perplexity: ...}`.
// The protocols are evals/perplexity.h; this is its section, its cells (one per text), what a
// cell records and its summary (docs/results_schema.md).
//
//   perplexity: {text: path | [paths], tokens: int, protocol: streaming|chunked|sliding,
//                n_ctx: int (chunked), window: int, stride: int (sliding), checkpoints: [int]}
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "evals/evaluation.h"
#include "evals/perplexity.h"

namespace kvlab {

// The section's protocol settings are the PerplexityOptions each cell runs with (perplexity.h:
// protocol, n_ctx, window, stride, checkpoints); on_progress stays empty here.
struct PerplexitySpec : PerplexityOptions {
  bool enabled = false;
  std::vector<std::filesystem::path> text;
  int tokens = 2048;  // tokens taken from the start of each text (after BOS)
  SourceRef ref;
};

class PerplexityEvaluation final : public Evaluation {
 public:
  explicit PerplexityEvaluation(PerplexitySpec spec) : spec_(std::move(spec)) {}
  const PerplexitySpec& spec() const { return spec_; }

  std::string name() const override { return "perplexity"; }
  const SourceRef& ref() const override { return spec_.ref; }
  size_t cell_count() const override { return spec_.text.size(); }
  std::string cell_id(size_t cell) const override { return str_cat("ppl_T", cell); }
  std::vector<std::pair<std::string, std::filesystem::path>> input_files() const override;
  int64_t cell_tokens(size_t cell) const override;
  int64_t longest_tokens() const override { return spec_.tokens; }
  void check_limit(const TokenLimit& limit) const override;
  std::string policy_warning(const std::string& type, const std::map<std::string, ParamValue>& effective) const override;
  void prepare(const Tokenizer& tokenizer) override;
  std::string identity(size_t cell, const std::function<std::string(const std::filesystem::path&)>& digest) const override;
  CellRecord run_cell(size_t cell, EvalContext& ctx) const override;
  std::string outcome(const CellRecord& rec) const override;
  void summarise(const SummaryContext& ctx) const override;

 private:
  PerplexitySpec spec_;
  std::vector<std::vector<int32_t>> tokens_;  // per text, after prepare
};

std::unique_ptr<EvaluationFactory> make_perplexity_factory();

}  // namespace kvlab
