// The NIAH evaluation (niah_eval.h): parse, cells, run, summary.
#include "evals/niah_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/core/error.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/eval_columns.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class NiahFactory final : public EvaluationFactory {
 public:
  std::string name() const override { return "niah"; }

  std::shared_ptr<Evaluation> parse(const EvalSection& s) const override {
    const Reader& r = s.reader;
    const YAML::Node& node = s.node;
    const std::string& path = s.path;
    NiahSpec n;
    r.expect_map(node, path,
                 {"haystack", "context_lengths", "depths", "trials", "needle", "question",
                  "value_digits", "needle_placement", "max_answer_tokens", "decode_tail_tokens",
                  "protocol", "shared_haystack"},
                 {"haystack", "context_lengths", "depths"});
    n.enabled = true;
    n.ref = r.ref(node, path);
    n.haystack = read_paths(r, node["haystack"], path + ".haystack", s.file);
    for (const auto& [v, p] : r.one_or_list(node["context_lengths"], path + ".context_lengths"))
      n.context_lengths.push_back(int(r.get_int(v, p, 16, 1 << 24)));
    for (const auto& [v, p] : r.one_or_list(node["depths"], path + ".depths"))
      n.depths.push_back(r.get_number(v, p, 0, 100));
    if (node["trials"]) n.trials = int(r.get_int(node["trials"], path + ".trials", 1, 100000));
    if (node["needle"]) {
      n.needle = r.get_string(node["needle"], path + ".needle");
      if (n.needle.find("{value}") == std::string::npos)
        r.error(node["needle"], path + ".needle", "expected a sentence containing '{value}', got '",
                n.needle, "'");
    }
    if (node["question"]) n.question = r.get_string(node["question"], path + ".question");
    if (node["value_digits"])
      n.value_digits = int(r.get_int(node["value_digits"], path + ".value_digits", 1, 18));
    if (node["needle_placement"])
      n.needle_placement = r.get_choice(node["needle_placement"], path + ".needle_placement",
                                        {"nearest", "previous"}) == "nearest"
                               ? NeedlePlacement::kNearest
                               : NeedlePlacement::kPrevious;
    if (node["max_answer_tokens"])
      n.max_answer_tokens = int(r.get_int(node["max_answer_tokens"], path + ".max_answer_tokens", 1, 4096));
    if (const YAML::Node t = node["decode_tail_tokens"]) {
      if (t.IsScalar() && t.Scalar() == "question")
        n.decode_tail_tokens = -1;
      else
        n.decode_tail_tokens = int(r.get_int(t, path + ".decode_tail_tokens", 0, 1 << 20));
    }
    if (node["protocol"]) {
      n.protocol = r.get_enum(node["protocol"], path + ".protocol", kNiahProtocolNames);
      if (node["decode_tail_tokens"] && n.protocol != NiahProtocol::kDecodeTail)
        r.error(node["decode_tail_tokens"], path + ".decode_tail_tokens",
                "decode_tail_tokens applies to protocol decode_tail only, not ", niah_protocol_name(n.protocol));
    }
    if (node["shared_haystack"]) n.shared_haystack = r.get_bool(node["shared_haystack"], path + ".shared_haystack");
    return std::make_shared<NiahEvaluation>(std::move(n));
  }
};

}  // namespace

std::unique_ptr<EvaluationFactory> make_niah_factory() { return std::make_unique<NiahFactory>(); }

std::string NiahEvaluation::cell_id(size_t cell) const {
  return str_cat("niah_L", length_of(cell), "_D", depth_of(cell));
}

std::vector<std::pair<std::string, fs::path>> NiahEvaluation::input_files() const {
  std::vector<std::pair<std::string, fs::path>> out;
  for (size_t i = 0; i < spec_.haystack.size(); ++i)
    out.emplace_back(str_cat("evals.niah.haystack[", i, "]"), spec_.haystack[i]);
  return out;
}

int64_t NiahEvaluation::longest_tokens() const {
  int64_t longest = 0;
  for (int l : spec_.context_lengths) longest = std::max<int64_t>(longest, l + spec_.max_answer_tokens);
  return longest;
}

void NiahEvaluation::check_limit(const TokenLimit& limit) const {
  for (size_t i = 0; i < spec_.context_lengths.size(); ++i)
    if (spec_.context_lengths[i] + spec_.max_answer_tokens > limit.max_tokens)
      fail(spec_.ref.str(), ".context_lengths[", i, "]: ", spec_.context_lengths[i], " + max_answer_tokens ",
           spec_.max_answer_tokens, " exceeds ", limit.what);
}

void NiahEvaluation::prepare(const Tokenizer& tokenizer) {
  std::string text;
  for (const auto& h : spec_.haystack) text += (text.empty() ? "" : "\n\n") + read_text_file(h);
  haystack_ = make_haystack(tokenizer, text);
  // Every length must hold BOS + needle + question: find out now, naming the key.
  const NiahOptions opt{spec_.needle, spec_.question, spec_.value_digits, spec_.needle_placement};
  for (size_t i = 0; i < spec_.context_lengths.size(); ++i) {
    try {
      build_niah_prompt(tokenizer, *haystack_, opt, spec_.context_lengths[i], 50, 0);
    } catch (const Error& e) {
      fail(spec_.ref.str(), ".context_lengths[", i, "]: ", e.what());
    }
  }
}

std::string NiahEvaluation::identity(size_t cell, const std::function<std::string(const fs::path&)>& digest) const {
  std::string id;
  auto line = [&](const std::string& key, const auto&... value) { id += str_cat(key, ": ", value..., "\n"); };
  const NiahSpec& n = spec_;
  std::string hay;
  for (const auto& h : n.haystack) hay += (hay.empty() ? "" : ",") + digest(h);
  line("niah.haystack_sha256", "[", hay, "]");
  line("niah.context_length", length_of(cell));
  line("niah.depth", depth_of(cell));
  line("niah.trials", n.trials);
  line("niah.needle", n.needle);
  line("niah.question", n.question);
  line("niah.value_digits", n.value_digits);
  line("niah.needle_placement", to_string(n.needle_placement));
  line("niah.max_answer_tokens", n.max_answer_tokens);
  line("niah.decode_tail_tokens", n.decode_tail_tokens);
  // Written only when not the default, so cells of files from before the protocols keep
  // their identity (resume, merge).
  if (n.protocol != NiahProtocol::kDecodeTail) line("niah.protocol", niah_protocol_name(n.protocol));
  if (n.shared_haystack) line("niah.shared_haystack", 1);
  return id;
}

CellRecord NiahEvaluation::run_cell(size_t cell, EvalContext& ctx) const {
  if (!haystack_) fail("NIAH: run_cell before prepare");
  const NiahSpec& n = spec_;
  EngineLm& lm = ctx.lm;
  const ModelConfig& config = ctx.config;
  const int length = length_of(cell);
  const double depth = depth_of(cell);
  NiahOptions opt{n.needle, n.question, n.value_digits, n.needle_placement};
  ColumnBuilder cols;
  std::vector<int64_t> needle_tokens;
  int n_correct = 0, n_trials = 0;
  double logprob_sum = 0;
  int64_t logprob_n = 0;
  lm.reset_counters();
  std::vector<SequenceStats> all_stats;
  // Which needle tokens each (layer, KV head) holds right after the prompt (the first sequence of
  // a trial; a teacher-forced replay is not recorded).
  KeptWatcher watcher(lm, config);
  for (uint64_t seed : ctx.seeds)
    for (int t = 0; t < n.trials; ++t) {
      // shared_haystack: one draw per trial for every depth (-1 is no depth's bits)
      const uint64_t ts = trial_seed(seed, length, n.shared_haystack ? -1.0 : depth, t);
      const NiahPrompt p = build_niah_prompt(ctx.tokenizer, *haystack_, opt, length, depth, ts);
      lm.ended.clear();
      watcher.start_sample(p.needle_pos, p.needle_pos + p.needle_tokens);
      NiahScore s;
      std::string st = "ok";
      try {
        s = run_niah_trial(lm, ctx.tokenizer, p, n.decode_tail_tokens, n.max_answer_tokens, n.protocol, ts);
      } catch (const LmStepError& e) {
        st = e.what();
        s.value_logprob = kNaN;
        s.first_wrong_token = -1;
      }
      const SequenceStats stats = lm.ended.empty() ? SequenceStats{} : lm.ended.front();
      all_stats.push_back(stats);
      ++n_trials;
      n_correct += s.correct ? 1 : 0;
      if (std::isfinite(s.value_logprob)) logprob_sum += s.value_logprob, ++logprob_n;
      needle_tokens.push_back(p.needle_tokens);
      cols.add("values", p.value);
      cols.add("answers", s.answer);
      cols.add("correct", int8_t(s.correct ? 1 : 0));
      cols.add("first_wrong_token", int64_t(s.first_wrong_token));
      cols.add("value_logprob", s.value_logprob);
      cols.add("needle_pos", int64_t(p.needle_pos));
      cols.add("needle_tokens", int64_t(p.needle_tokens));
      cols.add("haystack_offset", int64_t(p.haystack_offset));
      cols.add("seed", int64_t(seed));
      cols.add("trial_seed", int64_t(ts));
      cols.add("kv_bytes_peak", int64_t(stats.kv_bytes_peak));
      cols.add("kv_bytes_answer", int64_t(stats.kv_bytes_current));
      cols.add("blocks_peak", int64_t(stats.blocks_peak));
      cols.add("attended_set", stats.attended_set_mean);
      cols.add("attended_achieved", stats.attended_achieved_mean);
      cols.add("probe_samples", int64_t(stats.probe_samples));
      cols.add("recall_mean", stats.probe_samples ? stats.probe_recall_mean : kNaN);
      cols.add("recall_min", stats.probe_samples ? stats.probe_recall_min : kNaN);
      cols.add("rel_error_mean", stats.probe_samples ? stats.probe_rel_error_mean : kNaN);
      cols.add("rel_error_max", stats.probe_samples ? stats.probe_rel_error_max : kNaN);
      cols.add("status", st);
    }
  CellRecord rec;
  cols.write_into(rec.datasets);
  rec.attrs["kind"] = std::string("niah");
  rec.attrs["context_length"] = int64_t(length);
  rec.attrs["depth"] = depth;
  rec.attrs["trials"] = int64_t(n_trials);
  rec.attrs["accuracy"] = double(n_correct) / double(n_trials);
  rec.attrs["value_logprob_mean"] = logprob_n ? logprob_sum / double(logprob_n) : kNaN;
  add_sequence_attrs(rec.attrs, all_stats, config, lm.engine().kv().config());
  add_probe_layer_datasets(rec.datasets, all_stats);
  add_resident_datasets(rec, all_stats, config);
  add_needle_kept_dataset(rec, watcher.kept, needle_tokens, size_t(n_trials), config);
  add_timing_attrs(rec.attrs, lm);
  return rec;
}

std::string NiahEvaluation::outcome(const CellRecord& rec) const {
  return str_cat("accuracy ", std::get<double>(rec.attrs.at("accuracy")));
}

void NiahEvaluation::summarise(const SummaryContext& ctx) const {
  const NiahSpec& n = spec_;
  ResultsFile& file = ctx.file;
  const std::string& run = ctx.run;
  const size_t L = n.context_lengths.size(), D = n.depths.size();
  const size_t T = ctx.seeds.size() * size_t(n.trials);
  std::vector<int8_t> correct(L * D * T, -1);
  std::vector<double> logprob(L * D * T, kNaN), accuracy(L * D, kNaN), kv(L * D, kNaN),
      recall(L * D, kNaN), tps(L * D, kNaN);
  std::vector<int64_t> first_wrong(L * D * T, -1), needle(L * D * T, -1);
  std::vector<std::string> answers(L * D * T), values(L * D * T);
  for (size_t l = 0; l < L; ++l)
    for (size_t d = 0; d < D; ++d) {
      const std::string id = cell_id(l * D + d);
      if (!ctx.complete.count(id)) continue;
      const CellRecord rec = file.read_cell(run, id);
      const std::string where = str_cat(file.path().string(), ": ", run, "/", id);
      const auto& c = values_of<int8_t>(rec, "correct");
      if (c.size() != T) fail(file.path().string(), ": cell ", run, "/", id, " has ", c.size(), " trials, expected ", T);
      const size_t base = (l * D + d) * T;
      // Per-trial datasets must have T entries each (a corrupt file may say otherwise).
      const auto& lp = values_of<double>(rec, "value_logprob", where, T);
      const auto& fw = values_of<int64_t>(rec, "first_wrong_token", where, T);
      const auto& np = values_of<int64_t>(rec, "needle_pos", where, T);
      const auto& an = values_of<std::string>(rec, "answers", where, T);
      const auto& va = values_of<std::string>(rec, "values", where, T);
      int n_correct = 0;
      for (size_t t = 0; t < T; ++t) {
        correct[base + t] = c[t];
        n_correct += c[t] == 1;
        logprob[base + t] = lp[t];
        first_wrong[base + t] = fw[t];
        needle[base + t] = np[t];
        answers[base + t] = an[t];
        values[base + t] = va[t];
      }
      accuracy[l * D + d] = double(n_correct) / double(T);
      std::vector<double> kvd;
      for (int64_t b : values_of<int64_t>(rec, "kv_bytes_peak", where)) kvd.push_back(double(b));
      kv[l * D + d] = finite_mean(kvd);
      recall[l * D + d] = finite_mean(values_of<double>(rec, "recall_mean", where));
      tps[l * D + d] = attr_number(rec.attrs, "tokens_per_s");
    }
  std::vector<int64_t> lengths(n.context_lengths.begin(), n.context_lengths.end());
  const std::vector<uint64_t> ldt{L, D, T}, ld{L, D};
  file.write_summary(run, "niah",
                     {{"context_lengths", column(lengths)},
                      {"depths", column(n.depths)},
                      {"correct", shaped(correct, ldt)},
                      {"value_logprob", shaped(logprob, ldt)},
                      {"first_wrong_token", shaped(first_wrong, ldt)},
                      {"needle_positions", shaped(needle, ldt)},
                      {"answers", shaped(answers, ldt)},
                      {"values", shaped(values, ldt)},
                      {"accuracy", shaped(accuracy, ld)},
                      {"kv_bytes_peak", shaped(kv, ld)},
                      {"recall_mean", shaped(recall, ld)},
                      {"tokens_per_s", shaped(tps, ld)}},
                     {{"cells_complete", int64_t(std::count_if(ctx.complete.begin(), ctx.complete.end(),
                                                               [](auto& c) { return c.rfind("niah_", 0) == 0; }))},
                       {"cells_total", int64_t(L * D)}});
}

}  // namespace kvlab
