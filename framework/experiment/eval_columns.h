// What every evaluation cell writes the same way: a column builder for per-sample datasets and
// the engine's statistics of the cell's sequences (docs/results_schema.md): what the policy kept
// and read, the probes, the achieved KV memory after the prompt, and timing.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/engine_lm.h"
#include "framework/experiment/results.h"
#include "framework/model/model.h"

namespace kvlab {

// A 1-d dataset from a vector.
template <class T>
Dataset column(std::vector<T> values) {
  Dataset d;
  d.data = std::move(values);
  return d;
}

// An N-d dataset from a row-major vector.
template <class T>
Dataset shaped(std::vector<T> values, std::vector<uint64_t> shape) {
  Dataset d = column(std::move(values));
  d.shape = std::move(shape);
  return d;
}

// A cell's dataset `name` as a vector of T; with `n`, it must hold exactly n values (summaries
// index it per sample). `where` names the file and cell in errors.
template <class T>
const std::vector<T>& values_of(const CellRecord& rec, const std::string& name, const std::string& where = "",
                                std::optional<size_t> n = std::nullopt) {
  const std::string prefix = where.empty() ? "" : where + ": ";
  auto it = rec.datasets.find(name);
  if (it == rec.datasets.end()) fail(prefix, "cell lacks dataset '", name, "'");
  const auto* v = std::get_if<std::vector<T>>(&it->second.data);
  if (!v) fail(prefix, "cell dataset '", name, "' has an unexpected type");
  if (n && v->size() != *n) fail(prefix, "cell dataset '", name, "' has ", v->size(), " values, expected ", *n);
  return *v;
}

// A numeric attribute as double; `otherwise` when absent or not a number.
double attr_number(const AttrMap& attrs, const std::string& name,
                   double otherwise = std::numeric_limits<double>::quiet_NaN());
// A scalar attribute as text (a string as is, numbers printed); "[...]" for a list.
std::string attr_text(const AttrValue& v);
// The mean of the finite values; NaN when there are none.
double finite_mean(const std::vector<double>& v);

// Per-sample columns, one value per sample and column, written as 1-d datasets. Every column
// must hold as many values as the first one when the record is built (an internal invariant:
// a sample that skipped a column would shift every later row).
class ColumnBuilder {
 public:
  void add(const std::string& name, int8_t v) { push<int8_t>(name, v); }
  void add(const std::string& name, int64_t v) { push<int64_t>(name, v); }
  void add(const std::string& name, double v) { push<double>(name, v); }
  void add(const std::string& name, std::string v) { push<std::string>(name, std::move(v)); }
  // Throws kvlab::Error naming the column whose length differs.
  void write_into(std::map<std::string, Dataset>& datasets) const;

 private:
  template <class T>
  void push(const std::string& name, T v) {
    auto [it, fresh] = columns_.try_emplace(name);
    if (fresh) it->second.data = std::vector<T>{};
    auto* vec = std::get_if<std::vector<T>>(&it->second.data);
    if (!vec) fail("ColumnBuilder: column '", name, "' added with two types");
    vec->push_back(std::move(v));
  }
  std::map<std::string, Dataset> columns_;
};

// Cell attributes from the statistics of its sequences (mean over `stats`, peaks as max):
// kv_bytes_peak, blocks_peak, attended_*, decode_steps, keys_seen_mean, keys_read_mean,
// kv_read_bytes_per_layer_head, kv_kept_bytes_peak_per_layer_head, probe_samples, recall_*,
// rel_error_*.
void add_sequence_attrs(AttrMap& a, const std::vector<SequenceStats>& stats, const ModelConfig& c,
                        const KvStoreConfig& kv);
// probe_layers [L], probe_samples_per_layer [L], attention_recall_per_layer [L],
// output_rel_error_per_layer [L], pooled over `stats`; nothing when no sequence was probed.
void add_probe_layer_datasets(std::map<std::string, Dataset>& datasets, const std::vector<SequenceStats>& stats);
// kv_resident_tokens and kv_resident_bytes [samples, n_layers, n_kv_heads] and the attribute
// kv_kept_fraction, when every sample fed a prompt end.
void add_resident_datasets(CellRecord& rec, const std::vector<SequenceStats>& stats, const ModelConfig& config);
// needle_kept int8 [samples, n_layers, n_kv_heads, max needle tokens] (1 kept, 0 evicted, -1 past
// a shorter needle), when every sample recorded one.
void add_needle_kept_dataset(CellRecord& rec, const std::vector<std::vector<int8_t>>& kept,
                             const std::vector<int64_t>& needle_tokens, size_t samples, const ModelConfig& config);
// prefill_s, decode_s, prefill_tokens, decode_tokens, tokens_per_s, prefill_tokens_per_s,
// decode_tokens_per_s.
void add_timing_attrs(AttrMap& a, const EngineLm& lm);

// Records, right after each sample's first prompt-end prefill, which positions in
// [begin, end) every (layer, KV head) holds: installs EngineLm::on_prompt_end until destroyed.
class KeptWatcher {
 public:
  KeptWatcher(EngineLm& lm, const ModelConfig& config);
  ~KeptWatcher();
  void start_sample(int64_t begin, int64_t end);  // the next prompt end records [begin, end)
  std::vector<std::vector<int8_t>> kept;           // [sample][layer][kv_head][end - begin]

 private:
  EngineLm& lm_;
  const ModelConfig& config_;
  int64_t begin_ = 0, end_ = 0;
  bool watched_ = true;
};

}  // namespace kvlab
