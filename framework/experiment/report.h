// Summaries assembled from a results file's complete cells, the report tables, and the merge
// of shard files. Needs no model: everything is read from the file (the experiment's YAML is a
// root attribute, so the grid can be rebuilt).
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

// Per run: NIAH accuracy and mean value log-probability over complete cells, perplexity,
// KV bytes (peak), attention recall, tokens/s; then cells complete / total.
void print_report(const ResultsFile& file, std::ostream& out);

// Joins shard files (same experiment YAML, else an Error naming the file) into `out`: every
// complete cell of every shard (a cell present in two shards must be identical up to timing),
// root attributes of the first shard, then the summaries. Returns the number of cells.
int merge_results(const std::filesystem::path& out, const std::vector<std::filesystem::path>& shards);

// True when two cell records are equal except for timing attributes (is_timing_attr).
bool same_cell_contents(const CellRecord& a, const CellRecord& b, std::string* difference = nullptr);

}  // namespace kvlab
