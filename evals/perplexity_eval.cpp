// The perplexity evaluation (perplexity_eval.h): parse, cells, run, summary.
#include "evals/perplexity_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/core/error.h"
#include "framework/experiment/eval_columns.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class PerplexityFactory final : public EvaluationFactory {
 public:
  std::string name() const override { return "perplexity"; }

  std::shared_ptr<Evaluation> parse(const EvalSection& sec) const override {
    const Reader& r = sec.reader;
    const YAML::Node& node = sec.node;
    const std::string& path = sec.path;
    PerplexitySpec s;
    r.expect_map(node, path, {"text", "tokens", "protocol", "n_ctx", "window", "stride", "checkpoints"},
                 {"text"});
    s.enabled = true;
    s.ref = r.ref(node, path);
    s.text = read_paths(r, node["text"], path + ".text", sec.file);
    if (node["tokens"]) s.tokens = int(r.get_int(node["tokens"], path + ".tokens", 2, 1 << 26));
    if (node["protocol"]) s.protocol = r.get_enum(node["protocol"], path + ".protocol", kPplProtocolNames);
    if (node["n_ctx"]) s.n_ctx = int(r.get_int(node["n_ctx"], path + ".n_ctx", 4, 1 << 24));
    if (node["window"]) s.window = int(r.get_int(node["window"], path + ".window", 2, 1 << 24));
    if (node["stride"]) s.stride = int(r.get_int(node["stride"], path + ".stride", 1, 1 << 24));
    if (s.protocol == PplProtocol::kChunked && s.tokens < 2 * s.n_ctx)
      r.error(node["tokens"] ? node["tokens"] : node, path + ".tokens",
              "the chunked protocol needs tokens >= 2 * n_ctx (", 2 * s.n_ctx, "), got ", s.tokens);
    if (s.protocol == PplProtocol::kSliding && s.stride > s.window)
      r.error(node["stride"], path + ".stride", "expected stride <= window (", s.window, "), got ", s.stride);
    if (node["checkpoints"]) {
      for (const auto& [v, p] : r.one_or_list(node["checkpoints"], path + ".checkpoints"))
        s.checkpoints.push_back(int(r.get_int(v, p, 1, 1 << 26)));
      if (!std::is_sorted(s.checkpoints.begin(), s.checkpoints.end()))
        r.error(node["checkpoints"], path + ".checkpoints", "expected increasing token counts");
    }
    return std::make_shared<PerplexityEvaluation>(std::move(s));
  }
};

}  // namespace

std::unique_ptr<EvaluationFactory> make_perplexity_factory() { return std::make_unique<PerplexityFactory>(); }

std::vector<std::pair<std::string, fs::path>> PerplexityEvaluation::input_files() const {
  std::vector<std::pair<std::string, fs::path>> out;
  for (size_t i = 0; i < spec_.text.size(); ++i) out.emplace_back(str_cat("evals.perplexity.text[", i, "]"), spec_.text[i]);
  return out;
}

int64_t PerplexityEvaluation::cell_tokens(size_t) const {
  return spec_.protocol == PplProtocol::kStreaming ? spec_.tokens
         : spec_.protocol == PplProtocol::kChunked ? spec_.n_ctx
                                                   : spec_.window;
}

void PerplexityEvaluation::check_limit(const TokenLimit& limit) const {
  // (streaming runs until the limit and records where it stopped)
  const int64_t window = spec_.protocol == PplProtocol::kChunked   ? spec_.n_ctx
                         : spec_.protocol == PplProtocol::kSliding ? spec_.window
                                                                   : 0;
  if (window > limit.max_tokens) fail(spec_.ref.str(), ": window of ", window, " tokens exceeds ", limit.what);
}

std::string PerplexityEvaluation::policy_warning(const std::string& type,
                                                 const std::map<std::string, ParamValue>& effective) const {
  auto prefill = effective.find("prefill");
  if (spec_.protocol != PplProtocol::kStreaming && type == "landmark" && prefill != effective.end() &&
      prefill->second == ParamValue(std::string("dense")))
    return str_cat("the ", to_string(spec_.protocol),
                   " perplexity protocol scores prefill logits only and landmark's prefill is "
                   "dense (prefill: dense), so its perplexity equals full attention's; use "
                   "protocol: streaming or prefill: select");
  return "";
}

void PerplexityEvaluation::prepare(const Tokenizer& tokenizer) {
  tokens_.clear();
  for (size_t i = 0; i < spec_.text.size(); ++i) {
    std::vector<int32_t> t = tokenizer.encode(read_text_file(spec_.text[i]), EncodeOptions{.add_bos = tokenizer.bos_id() >= 0});
    if (int64_t(t.size()) < spec_.tokens)
      fail(spec_.ref.str(), ".text[", i, "]: ", spec_.text[i].string(), " has ", t.size(),
           " tokens, fewer than tokens: ", spec_.tokens);
    t.resize(spec_.tokens);
    tokens_.push_back(std::move(t));
  }
}

std::string PerplexityEvaluation::identity(size_t cell, const std::function<std::string(const fs::path&)>& digest) const {
  std::string id;
  auto line = [&](const std::string& key, const auto&... value) { id += str_cat(key, ": ", value..., "\n"); };
  auto ints = [](const auto& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ",") + str_cat(x);
    return "[" + out + "]";
  };
  const PerplexitySpec& p = spec_;
  line("perplexity.text_sha256", digest(p.text[cell]));
  line("perplexity.tokens", p.tokens);
  line("perplexity.protocol", to_string(p.protocol));
  line("perplexity.n_ctx", p.n_ctx);
  line("perplexity.window", p.window);
  line("perplexity.stride", p.stride);
  line("perplexity.checkpoints", ints(p.checkpoints));
  return id;
}

CellRecord PerplexityEvaluation::run_cell(size_t cell, EvalContext& ctx) const {
  if (cell >= tokens_.size()) fail("perplexity: run_cell before prepare");
  const PerplexitySpec& s = spec_;
  EngineLm& lm = ctx.lm;
  lm.reset_counters();
  const std::vector<int32_t>& tokens = tokens_[cell];
  const PerplexityResult r = evaluate_perplexity(lm, tokens, ctx.tokenizer.bos_id(), s);
  CellRecord rec;
  Dataset nll = column(r.nll);
  nll.attrs["unit"] = std::string("nats");
  rec.datasets = {{"nll", nll}, {"positions", column(r.positions)},
                  {"checkpoints", column(r.checkpoints)}, {"running_ppl", column(r.running_ppl)}};
  rec.attrs["kind"] = std::string("perplexity");
  rec.attrs["text"] = s.text[cell].string();
  rec.attrs["protocol"] = std::string(to_string(s.protocol));
  rec.attrs["n_ctx"] = int64_t(s.n_ctx);
  rec.attrs["window"] = int64_t(s.window);
  rec.attrs["stride"] = int64_t(s.stride);
  rec.attrs["tokens"] = int64_t(tokens.size());
  rec.attrs["bos"] = int64_t(ctx.tokenizer.bos_id() >= 0 && !tokens.empty() && tokens[0] == ctx.tokenizer.bos_id());
  rec.attrs["n_scored"] = int64_t(r.nll.size());
  rec.attrs["ppl"] = r.ppl;
  rec.attrs["ppl_stderr"] = r.ppl_stderr;
  rec.attrs["mean_nll"] = r.mean_nll;
  rec.attrs["status"] = r.stopped.empty() ? std::string("ok") : r.stopped;
  add_sequence_attrs(rec.attrs, lm.ended, ctx.config, ctx.lm.engine().kv().config());
  add_probe_layer_datasets(rec.datasets, lm.ended);
  add_timing_attrs(rec.attrs, lm);
  return rec;
}

std::string PerplexityEvaluation::outcome(const CellRecord& rec) const {
  return str_cat("ppl ", std::get<double>(rec.attrs.at("ppl")));
}

void PerplexityEvaluation::summarise(const SummaryContext& ctx) const {
  ResultsFile& file = ctx.file;
  const size_t X = spec_.text.size();
  std::vector<double> ppl(X, kNaN), se(X, kNaN), kv(X, kNaN), recall(X, kNaN), tps(X, kNaN);
  std::vector<int64_t> scored(X, 0);
  for (size_t x = 0; x < X; ++x) {
    const std::string id = cell_id(x);
    if (!ctx.complete.count(id)) continue;
    const CellRecord rec = file.read_cell(ctx.run, id);
    ppl[x] = attr_number(rec.attrs, "ppl");
    se[x] = attr_number(rec.attrs, "ppl_stderr");
    const double n_scored = attr_number(rec.attrs, "n_scored", 0);
    if (!(std::fabs(n_scored) < 0x1p63))  // NaN or past int64: not a count
      fail(file.path().string(), ": ", ctx.run, "/", id, ": attribute n_scored = ", n_scored, " is not a count");
    scored[x] = int64_t(n_scored);
    kv[x] = attr_number(rec.attrs, "kv_bytes_peak");
    recall[x] = attr_number(rec.attrs, "recall_mean");
    tps[x] = attr_number(rec.attrs, "tokens_per_s");
  }
  std::vector<std::string> texts;
  for (const auto& t : spec_.text) texts.push_back(t.string());
  file.write_summary(ctx.run, "perplexity",
                     {{"ppl", column(ppl)}, {"ppl_stderr", column(se)},
                      {"n_scored", column(scored)}, {"kv_bytes_peak", column(kv)},
                      {"recall_mean", column(recall)}, {"tokens_per_s", column(tps)},
                      {"texts", column(texts)}},
                     {{"protocol", std::string(to_string(spec_.protocol))}});
}

}  // namespace kvlab
