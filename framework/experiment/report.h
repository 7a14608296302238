// Summaries assembled from a results file's complete cells, and the report tables (the merge of
// shard files is framework/experiment/merge.h). Needs no model: everything is read from the file
// (the experiment's YAML is a root attribute, so the grid can be rebuilt).
#pragma once

#include <filesystem>
#include <ostream>
#include <vector>

#include "framework/experiment/experiment.h"
#include "framework/experiment/results.h"

namespace kvlab {

// Rebuilds /runs/RUN/niah and /runs/RUN/perplexity from the complete cells (missing cells:
// correct = -1, floats NaN, strings ""). Datasets (L = context lengths, D = depths,
// T = seeds x trials, X = texts):
//   niah: context_lengths [L], depths [D], correct [L,D,T] int8, value_logprob [L,D,T],
//         first_wrong_token [L,D,T], needle_positions [L,D,T], answers [L,D,T], values [L,D,T],
//         accuracy [L,D], kv_bytes_peak [L,D], recall_mean [L,D], tokens_per_s [L,D]
//   perplexity: ppl [X], ppl_stderr [X], n_scored [X], kv_bytes_peak [X], recall_mean [X],
//               tokens_per_s [X], texts [X]
void write_summaries(ResultsFile& file, const ExperimentSpec& spec);

// The experiment recorded in a results file (parsed from its `experiment` root attribute).
ExperimentSpec experiment_of(const ResultsFile& file);

// The report, built from the complete cells (so a partial file reports what is complete, and
// files of schema 1 read too). Runs in natural order (h2o_64 before h2o_512); only the columns
// of evaluations present.
//   text: per run the setting as written, NIAH accuracy and value log-probability, perplexity,
//         keys read per decode step against keys seen, KV kept (peak, per layer and KV head),
//         recall, tokens/s, cells; then NIAH accuracy per context length, the runs ordered by
//         the fraction of keys read (per policy family), and the parameters each run got by
//         default or resolved from "auto".
//   json: the same per run, plus every cell (NaN as null).
//   csv:  one row per complete cell (a tidy table for pandas or R).
enum class ReportFormat { kText, kJson, kCsv };
void print_report(const ResultsFile& file, std::ostream& out, ReportFormat format = ReportFormat::kText);

// a < b comparing digit runs as numbers ("h2o_64" < "h2o_512", "x@w=8" < "x@w=16").
bool natural_less(const std::string& a, const std::string& b);

}  // namespace kvlab
