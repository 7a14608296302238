// The evaluation cells of `kvlab run`: one NIAH or perplexity cell of one policy, run through an
// EngineLm and turned into a CellRecord -- the datasets and attributes of docs/results_schema.md
// (answers, accuracy, log-probabilities, what the policy kept and read, probes, timing).
// runner.cpp owns everything around them (the grid, files, resume, identity).
#pragma once

#include <optional>
#include <vector>

#include "evals/niah.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/engine_lm.h"
#include "framework/experiment/experiment.h"
#include "framework/experiment/results.h"
#include "framework/model/model.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

// What every cell of a run reads, prepared once: the spec, its tokenizer, the haystack (NIAH)
// and each perplexity text's tokens.
struct CellInputs {
  const ExperimentSpec& spec;
  const Tokenizer& tokenizer;
  std::optional<Haystack> haystack;
  std::vector<std::vector<int32_t>> ppl_tokens;  // per text
};

CellRecord run_niah_cell(const CellSpec& cell, EngineLm& lm, CellInputs& in, const ModelConfig& config);
CellRecord run_ppl_cell(const CellSpec& cell, EngineLm& lm, CellInputs& in, const ModelConfig& config);

}  // namespace kvlab
