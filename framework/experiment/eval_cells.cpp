// The evaluation cells of `kvlab run` (eval_cells.h).
#include "framework/experiment/eval_cells.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "evals/lm.h"
#include "framework/core/error.h"

namespace kvlab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Dataset column(auto values) {
  Dataset d;
  d.data = std::move(values);
  return d;
}

// The engine's per-sequence statistics as cell attributes (mean over `stats`, peaks as max).
// Tokens in the context, mean over a sequence's decode steps: its decode steps are its last
// `decode_steps` tokens (prefill comes first), so the step of token n saw n + 1 tokens.
double seen_mean(const SequenceStats& s) {
  return s.decode_steps > 0 ? double(s.n_tokens) - double(s.decode_steps - 1) / 2.0 : 0.0;
}

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
// KV heads), the mean over trials: the measured 1 - compression ratio). Written only when every
// trial fed a prompt end.
void add_resident_datasets(CellRecord& rec, const std::vector<SequenceStats>& stats,
                           const ModelConfig& config) {
  const size_t per = size_t(config.n_layers) * config.n_kv_heads;
  std::vector<int64_t> resident;
  double fraction = 0;
  for (const SequenceStats& s : stats) {
    if (s.resident_at_prompt_end.size() != per || s.tokens_at_prompt_end <= 0) return;
    int64_t sum = 0;
    for (int64_t r : s.resident_at_prompt_end) resident.push_back(r), sum += r;
    fraction += double(sum) / (double(s.tokens_at_prompt_end) * double(per));
  }
  if (stats.empty()) return;
  Dataset d = column(resident);
  d.shape = {uint64_t(stats.size()), uint64_t(config.n_layers), uint64_t(config.n_kv_heads)};
  d.attrs["bytes_per_token_per_head"] = int64_t(2) * config.head_dim * int64_t(sizeof(float));
  rec.datasets["kv_resident_tokens"] = std::move(d);
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
  a["prefill_tokens_per_s"] = lm.prefill_s > 0 ? double(lm.prefill_tokens) / lm.prefill_s : 0.0;
  a["decode_tokens_per_s"] = lm.decode_s > 0 ? double(lm.decode_tokens) / lm.decode_s : 0.0;
}

}  // namespace

CellRecord run_niah_cell(const CellSpec& cell, EngineLm& lm, CellInputs& in, const ModelConfig& config) {
  const NiahSpec& n = in.spec.niah;
  const int length = n.context_lengths[cell.length_idx];
  const double depth = n.depths[cell.depth_idx];
  NiahOptions opt{n.needle, n.question, n.value_digits, n.needle_placement};
  std::vector<std::string> values, answers;
  std::vector<int8_t> correct;
  std::vector<int64_t> first_wrong, needle_pos, needle_tokens, offsets, seeds, trial_seeds, kv_peak,
      kv_answer, blocks_peak, probe_samples;
  std::vector<double> logprob, att_set, att_achieved, recall, recall_min, err, err_max;
  std::vector<std::string> status;
  AttrMap a;
  lm.reset_counters();
  std::vector<SequenceStats> all_stats;
  // Which needle tokens each (layer, KV head) holds right after the prompt (the first sequence of
  // a trial; a teacher-forced replay is not recorded): [trial][layer][kv_head][needle token].
  std::vector<std::vector<int8_t>> needle_kept;
  int64_t watch_begin = 0, watch_end = 0;
  bool watched = false;
  lm.on_prompt_end = [&](SeqId s) {
    if (watched) return;
    watched = true;
    std::vector<int8_t> kept;
    for (int l = 0; l < config.n_layers; ++l) {
      const LayerKv kv = lm.engine().kv().layer(s, l);
      for (int h = 0; h < config.n_kv_heads; ++h) {
        std::vector<int8_t> row(size_t(watch_end - watch_begin), 0);
        for (int slot = 0; slot < kv.n_slots; ++slot) {
          const int64_t pos = kv.position(slot, h);
          if (kv.is_valid(slot, h) && pos >= watch_begin && pos < watch_end) row[size_t(pos - watch_begin)] = 1;
        }
        kept.insert(kept.end(), row.begin(), row.end());
      }
    }
    needle_kept.push_back(std::move(kept));
  };
  for (uint64_t seed : in.spec.seeds)
    for (int t = 0; t < n.trials; ++t) {
      const uint64_t ts = trial_seed(seed, length, depth, t);
      const NiahPrompt p = build_niah_prompt(in.tokenizer, *in.haystack, opt, length, depth, ts);
      lm.ended.clear();
      watch_begin = p.needle_pos, watch_end = p.needle_pos + p.needle_tokens, watched = false;
      NiahScore s;
      std::string st = "ok";
      try {
        s = run_niah_trial(lm, in.tokenizer, p, n.decode_tail_tokens, n.max_answer_tokens, n.protocol, ts);
      } catch (const LmStepError& e) {
        st = e.what();
        s.value_logprob = kNaN;
        s.first_wrong_token = -1;
      }
      const SequenceStats stats = lm.ended.empty() ? SequenceStats{} : lm.ended.front();
      all_stats.push_back(stats);
      values.push_back(p.value);
      answers.push_back(s.answer);
      correct.push_back(s.correct ? 1 : 0);
      first_wrong.push_back(s.first_wrong_token);
      logprob.push_back(s.value_logprob);
      needle_pos.push_back(p.needle_pos);
      needle_tokens.push_back(p.needle_tokens);
      offsets.push_back(p.haystack_offset);
      seeds.push_back(int64_t(seed));
      trial_seeds.push_back(int64_t(ts));
      kv_peak.push_back(int64_t(stats.kv_bytes_peak));
      kv_answer.push_back(int64_t(stats.kv_bytes_current));
      blocks_peak.push_back(stats.blocks_peak);
      att_set.push_back(stats.attended_set_mean);
      att_achieved.push_back(stats.attended_achieved_mean);
      probe_samples.push_back(stats.probe_samples);
      recall.push_back(stats.probe_samples ? stats.probe_recall_mean : kNaN);
      recall_min.push_back(stats.probe_samples ? stats.probe_recall_min : kNaN);
      err.push_back(stats.probe_samples ? stats.probe_rel_error_mean : kNaN);
      err_max.push_back(stats.probe_samples ? stats.probe_rel_error_max : kNaN);
      status.push_back(st);
    }
  CellRecord rec;
  rec.datasets = {{"values", column(values)}, {"answers", column(answers)},
                  {"correct", column(correct)}, {"first_wrong_token", column(first_wrong)},
                  {"value_logprob", column(logprob)}, {"needle_pos", column(needle_pos)},
                  {"needle_tokens", column(needle_tokens)}, {"haystack_offset", column(offsets)},
                  {"seed", column(seeds)}, {"trial_seed", column(trial_seeds)},
                  {"kv_bytes_peak", column(kv_peak)}, {"kv_bytes_answer", column(kv_answer)},
                  {"blocks_peak", column(blocks_peak)}, {"attended_set", column(att_set)},
                  {"attended_achieved", column(att_achieved)}, {"probe_samples", column(probe_samples)},
                  {"recall_mean", column(recall)}, {"recall_min", column(recall_min)},
                  {"rel_error_mean", column(err)}, {"rel_error_max", column(err_max)},
                  {"status", column(status)}};
  rec.attrs["kind"] = std::string("niah");
  rec.attrs["context_length"] = int64_t(length);
  rec.attrs["depth"] = depth;
  rec.attrs["trials"] = int64_t(correct.size());
  int n_correct = 0;
  for (int8_t c : correct) n_correct += c;
  rec.attrs["accuracy"] = double(n_correct) / double(correct.size());
  double logprob_sum = 0;
  int64_t logprob_n = 0;
  for (double lp : logprob)
    if (std::isfinite(lp)) logprob_sum += lp, ++logprob_n;
  rec.attrs["value_logprob_mean"] = logprob_n ? logprob_sum / double(logprob_n) : kNaN;
  add_sequence_attrs(rec.attrs, all_stats, config, lm.engine().kv().config());
  add_probe_layer_datasets(rec.datasets, all_stats);
  add_resident_datasets(rec, all_stats, config);
  lm.on_prompt_end = nullptr;
  add_needle_kept_dataset(rec, needle_kept, needle_tokens, correct.size(), config);
  add_timing_attrs(rec.attrs, lm);
  return rec;
}

CellRecord run_ppl_cell(const CellSpec& cell, EngineLm& lm, CellInputs& in, const ModelConfig& config) {
  const PerplexitySpec& s = in.spec.perplexity;
  PerplexityOptions o;
  o.protocol = s.protocol;
  o.n_ctx = s.n_ctx;
  o.window = s.window;
  o.stride = s.stride;
  o.checkpoints = s.checkpoints;
  lm.reset_counters();
  const std::vector<int32_t>& tokens = in.ppl_tokens[cell.text_idx];
  const PerplexityResult r = evaluate_perplexity(lm, tokens, in.tokenizer.bos_id(), o);
  CellRecord rec;
  Dataset nll = column(r.nll);
  nll.attrs["unit"] = std::string("nats");
  rec.datasets = {{"nll", nll}, {"positions", column(r.positions)},
                  {"checkpoints", column(r.checkpoints)}, {"running_ppl", column(r.running_ppl)}};
  rec.attrs["kind"] = std::string("perplexity");
  rec.attrs["text"] = s.text[cell.text_idx].string();
  rec.attrs["protocol"] = std::string(to_string(s.protocol));
  rec.attrs["n_ctx"] = int64_t(s.n_ctx);
  rec.attrs["window"] = int64_t(s.window);
  rec.attrs["stride"] = int64_t(s.stride);
  rec.attrs["tokens"] = int64_t(tokens.size());
  rec.attrs["bos"] = int64_t(in.tokenizer.bos_id() >= 0 && !tokens.empty() && tokens[0] == in.tokenizer.bos_id());
  rec.attrs["n_scored"] = int64_t(r.nll.size());
  rec.attrs["ppl"] = r.ppl;
  rec.attrs["ppl_stderr"] = r.ppl_stderr;
  rec.attrs["mean_nll"] = r.mean_nll;
  rec.attrs["status"] = r.stopped.empty() ? std::string("ok") : r.stopped;
  add_sequence_attrs(rec.attrs, lm.ended, config, lm.engine().kv().config());
  add_probe_layer_datasets(rec.datasets, lm.ended);
  add_timing_attrs(rec.attrs, lm);
  return rec;
}

}  // namespace kvlab
