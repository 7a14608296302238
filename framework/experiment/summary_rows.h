// Every scored cell of a results file as one flat row (run, policy, parameters, evaluation,
// task, protocol, context length, compression ratio, score, achieved KV memory), for
// `kvlab report --json` ("summaries") and `kvlab export --format kvpress`.
#pragma once

#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "framework/experiment/results.h"

namespace kvlab {

struct SummaryRow {
  std::string run, cell, kind;  // kind: "niah" | "ruler" (cells with a score)
  std::string policy_type;
  std::map<std::string, std::string> params;  // the run's effective parameters
  std::string task;      // ruler: the task; niah: "niah"
  std::string protocol;  // ruler/niah protocol ("" when not recorded)
  double context_length = 0, compression_ratio = 0, score = 0;
  double kv_bytes_peak = 0;      // peak KV bytes of a sample's sequence, mean over samples
  double kv_kept_fraction = 0;   // tokens resident after the prompt / prompt tokens (NaN: not measured)
  double samples = 0;
};

// In natural run order, then cell order.
std::vector<SummaryRow> summary_rows(const ResultsFile& file);

// The rows as a JSON array (NaN as null).
void print_summary_rows_json(const std::vector<SummaryRow>& rows, std::ostream& out, const std::string& indent);

// The RULER scores as a table: one row per (run, protocol, context length), one column per task,
// the mean over tasks last; nothing without RULER rows.
void print_ruler_table(const std::vector<SummaryRow>& rows, std::ostream& out);

// kvpress's evaluation layout (kvpress evaluation/evaluate.py: one directory per dataset x
// model x press x ratio, "ruler__4096__MODEL__PRESS__0.75[__query_aware]", holding
// predictions.csv (one row per sample: kvpress's task, question (the asked key or value), answer
// (a Python list literal), predicted_answer, compression_ratio, max_new_tokens, then kvlab's
// protocol, score, prompt_length, sample_seed, needle_pos (space-separated)),
// metrics.json ({task: {"string_match": score x 100}}) and config.yaml (the evaluation's
// settings)). RULER cells only. Returns the directories written; throws naming the file.
std::vector<std::filesystem::path> export_kvpress(const ResultsFile& file, const std::filesystem::path& dir);

}  // namespace kvlab
