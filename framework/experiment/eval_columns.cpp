// The column builder and the engine statistics every evaluation cell records (eval_columns.h).
#include "framework/experiment/eval_columns.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/core/error.h"

namespace kvlab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Tokens in the context, mean over a sequence's decode steps: its decode steps are its last
// `decode_steps` tokens (prefill comes first), so the step of token n saw n + 1 tokens.
double seen_mean(const SequenceStats& s) {
  return s.decode_steps > 0 ? double(s.n_tokens) - double(s.decode_steps - 1) / 2.0 : 0.0;
}

}  // namespace

double attr_number(const AttrMap& attrs, const std::string& name, double otherwise) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return otherwise;
  if (auto* i = std::get_if<int64_t>(&it->second)) return double(*i);
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  return otherwise;
}

std::string attr_text(const AttrValue& v) {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return str_cat(*d);
  return "[...]";
}

double finite_mean(const std::vector<double>& v) {
  double s = 0;
  int n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / n : kNaN;
}

void ColumnBuilder::write_into(std::map<std::string, Dataset>& datasets) const {
  size_t rows = 0;
  bool first = true;
  for (const auto& [name, d] : columns_) {
    if (first) rows = d.size(), first = false;
    if (d.size() != rows) fail("ColumnBuilder: column '", name, "' has ", d.size(), " values, expected ", rows);
  }
  for (const auto& [name, d] : columns_) datasets[name] = d;
}

// The engine's per-sequence statistics as cell attributes (mean over `stats`, peaks as max).

void add_sequence_attrs(AttrMap& a, const std::vector<SequenceStats>& stats, const ModelConfig& c,
                        const KvStoreConfig& kv) {
  size_t kv_peak = 0;
  int64_t blocks_peak = 0, probes = 0, decode_steps = 0;
  double set = 0, achieved = 0, seen = 0, recall = 0, recall_min = 1, err = 0, err_max = 0;
  for (const auto& s : stats) {
    kv_peak = std::max(kv_peak, s.kv_bytes_peak);
    blocks_peak = std::max(blocks_peak, s.blocks_peak);
    set += s.attended_set_mean / double(stats.size());
    achieved += s.attended_achieved_mean / double(stats.size());
    seen += seen_mean(s) / double(stats.size());
    decode_steps += s.decode_steps;
    if (s.probe_samples > 0) {
      recall += s.probe_recall_mean * double(s.probe_samples);
      err += s.probe_rel_error_mean * double(s.probe_samples);
      recall_min = std::min(recall_min, s.probe_recall_min);
      err_max = std::max(err_max, s.probe_rel_error_max);
      probes += s.probe_samples;
    }
  }
  a["kv_bytes_peak"] = int64_t(kv_peak);
  a["blocks_peak"] = blocks_peak;
  a["attended_set_mean"] = set;
  a["attended_achieved_mean"] = achieved;
  // What the policy kept and read, per layer and KV head, in the store's format (data and
  // metadata, measured from the store's block layout).
  const double bytes_per_key = kv_bytes_per_token(kv) / (c.n_layers * c.n_kv_heads);
  a["kv_format"] = std::string(kv_format_name(kv.format));
  a["kv_bytes_per_token"] = kv_bytes_per_token(kv);
  a["decode_steps"] = decode_steps;
  a["keys_seen_mean"] = decode_steps ? seen : kNaN;
  a["keys_read_mean"] = decode_steps ? achieved : kNaN;
  a["kv_read_bytes_per_layer_head"] = decode_steps ? achieved * bytes_per_key : kNaN;
  a["kv_kept_bytes_peak_per_layer_head"] = double(kv_peak) / double(c.n_layers * c.n_kv_heads);
  a["probe_samples"] = probes;
  a["recall_mean"] = probes ? recall / double(probes) : kNaN;
  a["recall_min"] = probes ? recall_min : kNaN;
  a["rel_error_mean"] = probes ? err / double(probes) : kNaN;
  a["rel_error_max"] = probes ? err_max : kNaN;
}

// The probes per layer, pooled over `stats` (samples-weighted): datasets probe_layers [L],
// probe_samples_per_layer [L], attention_recall_per_layer [L] and output_rel_error_per_layer [L]
// (NaN for a layer without samples). Nothing when no sequence was probed.
// Achieved memory after the prompt (POLICIES.md 9): kv_resident_tokens [trials, n_layers,
// n_kv_heads] (tokens per layer and KV head right after the prompt-end prefill; bytes =
// tokens x bytes_per_token_per_head) and kv_kept_fraction (resident / (prompt tokens x layers x
// KV heads), the mean over trials: the measured 1 - compression ratio), and kv_resident_bytes
// [trials, n_layers, n_kv_heads], the pool bytes holding each head's rows then
// (KvStore::head_bytes: per-head with per-head block tables, the head's share of its layer's
// blocks otherwise). Written only when every trial fed a prompt end.
void add_resident_datasets(CellRecord& rec, const std::vector<SequenceStats>& stats,
                           const ModelConfig& config) {
  const size_t per = size_t(config.n_layers) * config.n_kv_heads;
  std::vector<int64_t> resident, bytes;
  double fraction = 0;
  for (const SequenceStats& s : stats) {
    if (s.resident_at_prompt_end.size() != per || s.tokens_at_prompt_end <= 0) return;
    int64_t sum = 0;
    for (int64_t r : s.resident_at_prompt_end) resident.push_back(r), sum += r;
    fraction += double(sum) / (double(s.tokens_at_prompt_end) * double(per));
    if (s.resident_bytes_at_prompt_end.size() == per)
      bytes.insert(bytes.end(), s.resident_bytes_at_prompt_end.begin(), s.resident_bytes_at_prompt_end.end());
  }
  if (stats.empty()) return;
  const std::vector<uint64_t> shape = {uint64_t(stats.size()), uint64_t(config.n_layers), uint64_t(config.n_kv_heads)};
  Dataset d = column(resident);
  d.shape = shape;
  d.attrs["bytes_per_token_per_head"] = int64_t(2) * config.head_dim * int64_t(sizeof(float));
  rec.datasets["kv_resident_tokens"] = std::move(d);
  if (bytes.size() == resident.size()) {
    Dataset b = column(bytes);
    b.shape = shape;
    rec.datasets["kv_resident_bytes"] = std::move(b);
  }
  rec.attrs["kv_kept_fraction"] = fraction / double(stats.size());
}

// needle_kept int8 [trials, n_layers, n_kv_heads, max needle tokens]: 1 where that needle token
// was resident right after the prompt, 0 where evicted, -1 past a shorter needle. Written only
// when every trial recorded one.
void add_needle_kept_dataset(CellRecord& rec, const std::vector<std::vector<int8_t>>& kept,
                             const std::vector<int64_t>& needle_tokens, size_t trials,
                             const ModelConfig& config) {
  if (trials == 0 || kept.size() != trials || needle_tokens.size() != trials) return;
  const int64_t width = *std::max_element(needle_tokens.begin(), needle_tokens.end());
  const size_t heads = size_t(config.n_layers) * config.n_kv_heads;
  std::vector<int8_t> out;
  for (size_t t = 0; t < trials; ++t)
    for (size_t lh = 0; lh < heads; ++lh)
      for (int64_t k = 0; k < width; ++k)
        out.push_back(k < needle_tokens[t] ? kept[t][lh * size_t(needle_tokens[t]) + size_t(k)] : int8_t(-1));
  Dataset d = column(out);
  d.shape = {uint64_t(trials), uint64_t(config.n_layers), uint64_t(config.n_kv_heads), uint64_t(width)};
  rec.datasets["needle_kept"] = std::move(d);
}

void add_probe_layer_datasets(std::map<std::string, Dataset>& datasets,
                              const std::vector<SequenceStats>& stats) {
  std::map<int, LayerProbeStats> pooled;
  for (const SequenceStats& s : stats)
    for (const LayerProbeStats& lp : s.probe_per_layer) {
      LayerProbeStats& p = pooled[lp.layer];
      p.layer = lp.layer;
      p.samples += lp.samples;
      p.recall_sum += lp.recall_sum;
      p.rel_error_sum += lp.rel_error_sum;
    }
  if (pooled.empty()) return;
  std::vector<int64_t> layers, samples;
  std::vector<double> recall, err;
  for (const auto& [layer, p] : pooled) {
    layers.push_back(layer);
    samples.push_back(p.samples);
    recall.push_back(p.recall_mean());
    err.push_back(p.rel_error_mean());
  }
  datasets["probe_layers"] = column(layers);
  datasets["probe_samples_per_layer"] = column(samples);
  datasets["attention_recall_per_layer"] = column(recall);
  datasets["output_rel_error_per_layer"] = column(err);
}

void add_timing_attrs(AttrMap& a, const EngineLm& lm) {
  a["prefill_s"] = lm.prefill_s;
  a["decode_s"] = lm.decode_s;
  a["prefill_tokens"] = lm.prefill_tokens;
  a["decode_tokens"] = lm.decode_tokens;
  const double s = lm.prefill_s + lm.decode_s;
  a["tokens_per_s"] = s > 0 ? double(lm.prefill_tokens + lm.decode_tokens) / s : 0.0;
  // tokens computed: a forked prefix (engine.prefix_reuse) took no prefill time
  a["prefill_tokens_per_s"] = lm.prefill_s > 0 ? double(lm.prefill_tokens - lm.prefill_tokens_saved) / lm.prefill_s : 0.0;
  a["decode_tokens_per_s"] = lm.decode_s > 0 ? double(lm.decode_tokens) / lm.decode_s : 0.0;
}

KeptWatcher::KeptWatcher(EngineLm& lm, const ModelConfig& config) : lm_(lm), config_(config) {
  lm_.on_prompt_end = [this](SeqId s) {
    if (watched_) return;
    watched_ = true;
    std::vector<int8_t> row_all;
    for (int l = 0; l < config_.n_layers; ++l) {
      const LayerKv kv = lm_.engine().kv().layer(s, l);
      for (int h = 0; h < config_.n_kv_heads; ++h) {
        std::vector<int8_t> row(size_t(end_ - begin_), 0);
        for (int slot = 0; slot < kv.n_slots; ++slot) {
          const int64_t pos = kv.position(slot, h);
          if (kv.is_valid(slot, h) && pos >= begin_ && pos < end_) row[size_t(pos - begin_)] = 1;
        }
        row_all.insert(row_all.end(), row.begin(), row.end());
      }
    }
    kept.push_back(std::move(row_all));
  };
}

KeptWatcher::~KeptWatcher() { lm_.on_prompt_end = nullptr; }

void KeptWatcher::start_sample(int64_t begin, int64_t end) {
  begin_ = begin, end_ = end;
  watched_ = false;
}

}  // namespace kvlab
