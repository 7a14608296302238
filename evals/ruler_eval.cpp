// The RULER evaluation (ruler_eval.h): parse, cells, run, summary.
#include "evals/ruler_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>

#include "framework/core/error.h"
#include "framework/experiment/eval_columns.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<std::string> kFamilies = {"niah", "vt", "cwe", "fwe", "passkey", "kv_retrieval"};
const std::vector<RulerFamily> kFamilyIds = {RulerFamily::kNiah, RulerFamily::kVt, RulerFamily::kCwe,
                                             RulerFamily::kFwe, RulerFamily::kPasskey, RulerFamily::kKvRetrieval};

RulerTemplates parse_templates(const Reader& r, const YAML::Node& node, const std::string& path) {
  const std::vector<std::string> sets = {"instruct", "kvlab-tiny"};
  if (node.IsScalar()) return *builtin_ruler_templates(r.get_choice(node, path, sets));
  std::vector<std::string> keys = kFamilies;
  keys.insert(keys.begin(), "base");
  r.expect_map(node, path, keys);
  RulerTemplates t = *builtin_ruler_templates(node["base"] ? r.get_choice(node["base"], path + ".base", sets) : "kvlab-tiny");
  t.name = "custom (base " + t.name + ")";
  for (size_t i = 0; i < kFamilies.size(); ++i) {
    const YAML::Node f = node[kFamilies[i]];
    if (!f) continue;
    const std::string fp = path + "." + kFamilies[i];
    const bool has_example = kFamilyIds[i] == RulerFamily::kVt || kFamilyIds[i] == RulerFamily::kCwe;
    std::vector<std::string> fields = {"intro", "needle", "question", "answer_prefix"};
    if (has_example) fields.push_back("example");
    r.expect_map(f, fp, fields);
    RulerTemplate& tpl = t.of(kFamilyIds[i]);
    if (f["example"]) tpl.example = r.get_bool(f["example"], fp + ".example");
    if (f["intro"]) tpl.intro = r.get_string(f["intro"], fp + ".intro");
    if (f["needle"]) tpl.needle = r.get_string(f["needle"], fp + ".needle");
    if (f["question"]) tpl.question = r.get_string(f["question"], fp + ".question");
    if (f["answer_prefix"]) tpl.answer_prefix = r.get_string(f["answer_prefix"], fp + ".answer_prefix");
    const std::string problem = check_ruler_template(kFamilyIds[i], tpl);
    if (!problem.empty()) {
      // "templates.niah.needle: missing {key}" -> point at that field when it is written.
      const std::string field = problem.substr(problem.find('.', 10) + 1, problem.find(':') - problem.find('.', 10) - 1);
      r.error(f[field] ? f[field] : f, fp + "." + field, "template '", kFamilies[i], "' (", t.name, "), field '",
              field, "': ", problem.substr(problem.find(':') + 2));
    }
  }
  return t;
}

class RulerFactory final : public EvaluationFactory {
 public:
  std::string name() const override { return "ruler"; }

  std::shared_ptr<Evaluation> parse(const EvalSection& sec) const override {
    const Reader& r = sec.reader;
    const YAML::Node& node = sec.node;
    const std::string& path = sec.path;
    RulerSpec s;
    r.expect_map(node, path,
                 {"tasks", "context_lengths", "samples", "protocol", "haystack", "templates", "max_answer_tokens",
                  "store_prompts"},
                 {"tasks", "context_lengths"});
    s.ref = r.ref(node, path);
    std::vector<std::string> names;
    for (const auto& t : ruler_tasks()) names.push_back(t.name);
    if (node["tasks"].IsScalar() && node["tasks"].Scalar() == "all") {
      for (const auto& t : ruler_tasks()) s.tasks.push_back(&t);
    } else {
      for (const auto& [v, p] : r.one_or_list(node["tasks"], path + ".tasks")) {
        const std::string n = r.get_string(v, p);
        const RulerTaskInfo* t = find_ruler_task(n);
        if (!t) {
          const std::string near = nearest_name(n, names);
          r.error(v, p, "unknown task '", n, "'", near.empty() ? "" : " (did you mean '" + near + "'?)",
                  "; the tasks are ", ruler_task_names(), " (or all)");
        }
        if (std::find(s.tasks.begin(), s.tasks.end(), t) != s.tasks.end()) r.error(v, p, "task '", n, "' listed twice");
        s.tasks.push_back(t);
      }
    }
    for (const auto& [v, p] : r.one_or_list(node["context_lengths"], path + ".context_lengths"))
      s.context_lengths.push_back(int(r.get_int(v, p, 16, 1 << 24)));
    if (node["samples"]) s.samples = int(r.get_int(node["samples"], path + ".samples", 1, 100000));
    if (node["protocol"]) {
      s.protocols.clear();
      for (const auto& [v, p] : r.one_or_list(node["protocol"], path + ".protocol")) {
        const NiahProtocol pr = r.get_choice(v, p, {"query_agnostic", "query_aware"}) == "query_aware"
                                    ? NiahProtocol::kQueryAware
                                    : NiahProtocol::kQueryAgnostic;
        if (std::find(s.protocols.begin(), s.protocols.end(), pr) != s.protocols.end())
          r.error(v, p, "protocol '", niah_protocol_name(pr), "' listed twice");
        s.protocols.push_back(pr);
      }
    }
    if (node["haystack"]) {
      const std::string h = r.get_string(node["haystack"], path + ".haystack");
      if (h != "noise") s.haystack = resolve_path(h, sec.file);
    }
    s.templates = node["templates"] ? parse_templates(r, node["templates"], path + ".templates")
                                    : *builtin_ruler_templates("kvlab-tiny");
    if (node["max_answer_tokens"])
      s.max_answer_tokens = int(r.get_int(node["max_answer_tokens"], path + ".max_answer_tokens", 1, 4096));
    if (node["store_prompts"]) s.store_prompts = r.get_bool(node["store_prompts"], path + ".store_prompts");
    return std::make_shared<RulerEvaluation>(std::move(s));
  }
};

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// CPU seconds of the whole process, every thread (CLOCK_PROCESS_CPUTIME_ID): what the peer
// runner's time.process_time() measures, so per-sample CPU compares like for like with kvpress's.
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

std::unique_ptr<EvaluationFactory> make_ruler_factory() { return std::make_unique<RulerFactory>(); }

RulerEvaluation::Coord RulerEvaluation::coord(size_t cell) const {
  const size_t L = spec_.context_lengths.size(), K = spec_.tasks.size();
  return {spec_.protocols[cell / (K * L)], spec_.tasks[(cell / L) % K], spec_.context_lengths[cell % L]};
}

std::string RulerEvaluation::cell_id(size_t cell) const {
  const Coord c = coord(cell);
  return str_cat("ruler_", niah_protocol_name(c.protocol), "_", c.task->name, "_L", c.length);
}

std::vector<std::pair<std::string, fs::path>> RulerEvaluation::input_files() const {
  if (spec_.haystack.empty()) return {};
  return {{"evals.ruler.haystack", spec_.haystack}};
}

int64_t RulerEvaluation::cell_tokens(size_t cell) const {
  return coord(cell).length;  // prompt + answer (RULER's max_seq_length)
}

int64_t RulerEvaluation::longest_tokens() const {
  int64_t longest = 0;
  for (size_t i = 0; i < cell_count(); ++i) longest = std::max(longest, cell_tokens(i));
  return longest;
}

void RulerEvaluation::check_limit(const TokenLimit& limit) const {
  for (size_t i = 0; i < spec_.context_lengths.size(); ++i)
    for (const RulerTaskInfo* t : spec_.tasks)
      if (spec_.context_lengths[i] > limit.max_tokens)
        fail(spec_.ref.str(), ".context_lengths[", i, "]: ", spec_.context_lengths[i], " tokens (prompt and the ",
             spec_.answer_tokens(*t), " answer tokens of task ", t->name, ") exceeds ", limit.what);
      else if (spec_.context_lengths[i] <= spec_.answer_tokens(*t))
        fail(spec_.ref.str(), ".context_lengths[", i, "]: ", spec_.context_lengths[i], " tokens leave no room for a "
             "prompt beside the ", spec_.answer_tokens(*t), " answer tokens of task ", t->name);
}

void RulerEvaluation::prepare(const Tokenizer& tokenizer) {
  if (!spec_.haystack.empty()) essay_ = make_haystack(tokenizer, read_text_file(spec_.haystack));
  // Every (task, length) must hold its fixed parts: find out now, naming the key.
  const RulerSource src{tokenizer, spec_.templates, essay_ ? &*essay_ : nullptr};
  for (size_t i = 0; i < spec_.context_lengths.size(); ++i)
    for (const RulerTaskInfo* t : spec_.tasks) {
      try {
        build_ruler_sample(src, *t, spec_.context_lengths[i] - spec_.answer_tokens(*t), spec_.context_lengths[i], 0);
      } catch (const Error& e) {
        fail(spec_.ref.str(), ".context_lengths[", i, "]: ", e.what());
      }
    }
  prepared_ = true;
}

std::string RulerEvaluation::identity(size_t cell, const std::function<std::string(const fs::path&)>& digest) const {
  const Coord c = coord(cell);
  std::string id;
  auto line = [&](const std::string& key, const auto&... value) { id += str_cat(key, ": ", value..., "\n"); };
  line("ruler.task", c.task->name);
  line("ruler.context_length", c.length);
  line("ruler.protocol", niah_protocol_name(c.protocol));
  line("ruler.samples", spec_.samples);
  line("ruler.haystack_sha256", spec_.haystack.empty() ? std::string("noise") : digest(spec_.haystack));
  const RulerTemplate& t = spec_.templates.of(c.task->family);
  line("ruler.templates", spec_.templates.name);
  line("ruler.template", "[", t.intro, "|", t.needle, "|", t.question, "|", t.answer_prefix, "]");
  line("ruler.answer_tokens", spec_.answer_tokens(*c.task));
  // (only when on: cells without an example keep the identity they had before examples existed)
  if (has_example(*c.task)) line("ruler.example", "RULER's in-context example (ruler_tasks.h)");
  return id;
}

CellRecord RulerEvaluation::run_cell(size_t cell, EvalContext& ctx) const {
  if (!prepared_) fail("RULER: run_cell before prepare");
  const Coord c = coord(cell);
  const RulerSource src{ctx.tokenizer, spec_.templates, essay_ ? &*essay_ : nullptr};
  const int answer_tokens = spec_.answer_tokens(*c.task);
  EngineLm& lm = ctx.lm;
  lm.reset_counters();
  ColumnBuilder cols;
  std::vector<std::vector<int64_t>> positions;
  std::vector<std::vector<int32_t>> prompts;  // store_prompts only
  std::vector<double> sample_s;               // wall seconds per sample (a timing attribute)
  std::vector<double> sample_cpu_s;           // process CPU seconds per sample (likewise)
  std::vector<SequenceStats> all_stats;
  double score_sum = 0;
  int n = 0;
  for (uint64_t seed : ctx.seeds)
    for (int k = 0; k < spec_.samples; ++k) {
      const uint64_t ss = ruler_sample_seed(seed, c.task->task, c.length, k);
      const RulerSample s = build_ruler_sample(src, *c.task, c.length - answer_tokens, c.length, ss);
      lm.ended.clear();
      std::string status = "ok", prediction;
      std::vector<int32_t> answer;
      const auto t0 = std::chrono::steady_clock::now();
      const double cpu0 = process_cpu_s();
      try {
        std::unique_ptr<LmSequence> seq = lm.start(ss);
        const std::vector<float>* logits = &feed_prompt(*seq, s.tokens, s.question_tokens, c.protocol);
        for (int t = 0; t < answer_tokens; ++t) {
          const int32_t next = argmax(*logits);
          if (next == ctx.tokenizer.eos_id()) break;
          answer.push_back(next);
          if (t + 1 == answer_tokens) break;
          logits = &seq->decode(next);
        }
      } catch (const LmStepError& e) {
        status = e.what();
      }
      sample_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      sample_cpu_s.push_back(process_cpu_s() - cpu0);
      prediction = ctx.tokenizer.decode(answer);
      const double score = ruler_score(c.task->scoring, prediction, s.references);
      const SequenceStats stats = lm.ended.empty() ? SequenceStats{} : lm.ended.front();
      all_stats.push_back(stats);
      score_sum += score, ++n;
      positions.push_back(s.needle_pos);
      if (spec_.store_prompts) prompts.push_back(s.tokens);
      cols.add("seed", int64_t(seed));
      cols.add("sample_seed", int64_t(ss));
      cols.add("prompt_length", int64_t(s.tokens.size()));
      cols.add("question_tokens", int64_t(s.question_tokens));
      cols.add("needles", int64_t(s.needle_pos.size()));
      cols.add("haystack_offset", s.haystack_offset);
      cols.add("pad_tokens", int64_t(s.pad_tokens));
      if (has_example(*c.task)) cols.add("example_tokens", int64_t(s.example_tokens));
      cols.add("query", s.query);
      cols.add("references", join(s.references, "\n"));
      cols.add("prediction", prediction);
      cols.add("answer_tokens", int64_t(answer.size()));
      cols.add("score", score);
      cols.add("kv_bytes_peak", int64_t(stats.kv_bytes_peak));
      cols.add("status", status);
    }
  CellRecord rec;
  cols.write_into(rec.datasets);
  // needle_pos [samples, max needles]: the first token of each needle, -1 past a sample's last.
  size_t width = 1;
  for (const auto& p : positions) width = std::max(width, p.size());
  std::vector<int64_t> flat;
  for (const auto& p : positions)
    for (size_t j = 0; j < width; ++j) flat.push_back(j < p.size() ? p[j] : -1);
  rec.datasets["needle_pos"] = shaped(flat, {uint64_t(positions.size()), uint64_t(width)});
  if (spec_.store_prompts) {
    // prompt_tokens [samples, longest prompt]: the ids fed, -1 past a sample's prompt_length.
    size_t longest = 1;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    std::vector<int64_t> ids;
    ids.reserve(prompts.size() * longest);
    for (const auto& p : prompts)
      for (size_t j = 0; j < longest; ++j) ids.push_back(j < p.size() ? int64_t(p[j]) : -1);
    rec.datasets["prompt_tokens"] = shaped(ids, {uint64_t(prompts.size()), uint64_t(longest)});
  }
  rec.attrs["kind"] = std::string("ruler");
  rec.attrs["task"] = std::string(c.task->name);
  rec.attrs["context_length"] = int64_t(c.length);
  rec.attrs["protocol"] = std::string(niah_protocol_name(c.protocol));
  rec.attrs["samples"] = int64_t(n);
  rec.attrs["templates"] = spec_.templates.name;
  rec.attrs["haystack"] = spec_.haystack.empty() ? std::string("noise") : spec_.haystack.string();
  rec.attrs["max_answer_tokens"] = int64_t(answer_tokens);
  rec.attrs["score"] = n ? score_sum / double(n) : kNaN;
  add_sequence_attrs(rec.attrs, all_stats, ctx.config, ctx.lm.engine().kv().config());
  add_resident_datasets(rec, all_stats, ctx.config);
  add_timing_attrs(rec.attrs, lm);
  rec.attrs["sample_s"] = sample_s;
  rec.attrs["sample_cpu_s"] = sample_cpu_s;
  return rec;
}

std::string RulerEvaluation::outcome(const CellRecord& rec) const {
  return str_cat("score ", std::get<double>(rec.attrs.at("score")));
}

void RulerEvaluation::summarise(const SummaryContext& ctx) const {
  const size_t P = spec_.protocols.size(), K = spec_.tasks.size(), L = spec_.context_lengths.size();
  std::vector<double> score(P * K * L, kNaN), kept(P * K * L, kNaN), kv(P * K * L, kNaN);
  for (size_t i = 0; i < cell_count(); ++i) {
    const std::string id = cell_id(i);
    if (!ctx.complete.count(id)) continue;
    const AttrMap a = ctx.file.cell_attrs(ctx.run, id);
    score[i] = attr_number(a, "score");
    kept[i] = attr_number(a, "kv_kept_fraction");
    kv[i] = attr_number(a, "kv_bytes_peak");
  }
  std::vector<std::string> protocols, tasks;
  for (NiahProtocol p : spec_.protocols) protocols.push_back(niah_protocol_name(p));
  for (const RulerTaskInfo* t : spec_.tasks) tasks.push_back(t->name);
  std::vector<int64_t> lengths(spec_.context_lengths.begin(), spec_.context_lengths.end());
  const std::vector<uint64_t> pkl{P, K, L};
  ctx.file.write_summary(ctx.run, "ruler",
                         {{"protocols", column(protocols)},
                          {"tasks", column(tasks)},
                          {"context_lengths", column(lengths)},
                          {"score", shaped(score, pkl)},
                          {"kv_kept_fraction", shaped(kept, pkl)},
                          {"kv_bytes_peak", shaped(kv, pkl)}},
                         {{"cells_complete", int64_t(std::count_if(ctx.complete.begin(), ctx.complete.end(),
                                                                   [](auto& c) { return c.rfind("ruler_", 0) == 0; }))},
                          {"cells_total", int64_t(cell_count())}});
}

}  // namespace kvlab
