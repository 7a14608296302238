#include "framework/experiment/report.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>

#include "framework/core/error.h"
#include "framework/experiment/cells.h"

namespace kvlab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The cell's dataset `name` as a vector of T; with `n`, it must hold exactly n values (the
// summaries index it per trial). `where` names the file and cell in errors.
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

double attr_number(const AttrMap& attrs, const std::string& name, double otherwise = kNaN) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return otherwise;
  if (auto* i = std::get_if<int64_t>(&it->second)) return double(*i);
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  return otherwise;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  int n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / n : kNaN;
}

Dataset dataset(auto values, std::vector<uint64_t> shape = {}) {
  Dataset d;
  d.data = std::move(values);
  d.shape = std::move(shape);
  return d;
}

std::string attr_text(const AttrValue& v) {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return str_cat(*d);
  return "[...]";
}

}  // namespace

ExperimentSpec experiment_of(const ResultsFile& file) {
  const AttrMap root = file.root_attrs();
  auto it = root.find("experiment");
  if (it == root.end() || !std::holds_alternative<std::string>(it->second))
    fail(file.path().string(), ": no 'experiment' root attribute (not written by kvlab run?)");
  auto name = root.find("experiment_file");
  const std::string yaml_name =
      name != root.end() && std::holds_alternative<std::string>(name->second)
          ? std::get<std::string>(name->second)
          : "experiment.yaml";
  return parse_experiment_text(std::get<std::string>(it->second), yaml_name);
}

void write_summaries(ResultsFile& file, const ExperimentSpec& spec) {
  const std::vector<RunSpec> runs = expand_runs(spec);
  const std::vector<std::string> present = file.runs();
  for (const RunSpec& run : runs) {
    if (std::find(present.begin(), present.end(), run.name) == present.end()) continue;
    const std::vector<std::string> complete = file.complete_cells(run.name);
    const std::set<std::string> done(complete.begin(), complete.end());
    if (spec.niah.enabled) {
      const auto& n = spec.niah;
      const size_t L = n.context_lengths.size(), D = n.depths.size();
      const size_t T = spec.seeds.size() * size_t(n.trials);
      std::vector<int8_t> correct(L * D * T, -1);
      std::vector<double> logprob(L * D * T, kNaN), accuracy(L * D, kNaN), kv(L * D, kNaN),
          recall(L * D, kNaN), tps(L * D, kNaN);
      std::vector<int64_t> first_wrong(L * D * T, -1), needle(L * D * T, -1);
      std::vector<std::string> answers(L * D * T), values(L * D * T);
      for (size_t l = 0; l < L; ++l)
        for (size_t d = 0; d < D; ++d) {
          const std::string id = str_cat("niah_L", n.context_lengths[l], "_D", n.depths[d]);
          if (!done.count(id)) continue;
          const CellRecord rec = file.read_cell(run.name, id);
          const std::string where = str_cat(file.path().string(), ": ", run.name, "/", id);
          const auto& c = values_of<int8_t>(rec, "correct");
          if (c.size() != T) fail(file.path().string(), ": cell ", run.name, "/", id, " has ", c.size(), " trials, expected ", T);
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
          kv[l * D + d] = mean_of(kvd);
          recall[l * D + d] = mean_of(values_of<double>(rec, "recall_mean", where));
          tps[l * D + d] = attr_number(rec.attrs, "tokens_per_s");
        }
      std::vector<int64_t> lengths(n.context_lengths.begin(), n.context_lengths.end());
      const std::vector<uint64_t> ldt{L, D, T}, ld{L, D};
      file.write_summary(run.name, "niah",
                         {{"context_lengths", dataset(lengths)},
                          {"depths", dataset(n.depths)},
                          {"correct", dataset(correct, ldt)},
                          {"value_logprob", dataset(logprob, ldt)},
                          {"first_wrong_token", dataset(first_wrong, ldt)},
                          {"needle_positions", dataset(needle, ldt)},
                          {"answers", dataset(answers, ldt)},
                          {"values", dataset(values, ldt)},
                          {"accuracy", dataset(accuracy, ld)},
                          {"kv_bytes_peak", dataset(kv, ld)},
                          {"recall_mean", dataset(recall, ld)},
                          {"tokens_per_s", dataset(tps, ld)}},
                         {{"cells_complete", int64_t(std::count_if(complete.begin(), complete.end(),
                                                                   [](auto& c) { return c.rfind("niah_", 0) == 0; }))},
                          {"cells_total", int64_t(L * D)}});
    }
    if (spec.perplexity.enabled) {
      const size_t X = spec.perplexity.text.size();
      std::vector<double> ppl(X, kNaN), se(X, kNaN), kv(X, kNaN), recall(X, kNaN), tps(X, kNaN);
      std::vector<int64_t> scored(X, 0);
      for (size_t x = 0; x < X; ++x) {
        const std::string id = str_cat("ppl_T", x);
        if (!done.count(id)) continue;
        const CellRecord rec = file.read_cell(run.name, id);
        ppl[x] = attr_number(rec.attrs, "ppl");
        se[x] = attr_number(rec.attrs, "ppl_stderr");
        const double n_scored = attr_number(rec.attrs, "n_scored", 0);
        if (!(std::fabs(n_scored) < 0x1p63))  // NaN or past int64: not a count
          fail(file.path().string(), ": ", run.name, "/", id, ": attribute n_scored = ", n_scored, " is not a count");
        scored[x] = int64_t(n_scored);
        kv[x] = attr_number(rec.attrs, "kv_bytes_peak");
        recall[x] = attr_number(rec.attrs, "recall_mean");
        tps[x] = attr_number(rec.attrs, "tokens_per_s");
      }
      std::vector<std::string> texts;
      for (const auto& t : spec.perplexity.text) texts.push_back(t.string());
      file.write_summary(run.name, "perplexity",
                         {{"ppl", dataset(ppl)}, {"ppl_stderr", dataset(se)},
                          {"n_scored", dataset(scored)}, {"kv_bytes_peak", dataset(kv)},
                          {"recall_mean", dataset(recall)}, {"tokens_per_s", dataset(tps)},
                          {"texts", dataset(texts)}},
                         {{"protocol", std::string(to_string(spec.perplexity.protocol))}});
    }
  }
}

void print_report(const ResultsFile& file, std::ostream& out) {
  const AttrMap root = file.root_attrs();
  auto text = [&](const char* k) { auto it = root.find(k); return it == root.end() ? std::string("?") : attr_text(it->second); };
  out << "experiment " << text("name") << "  (" << file.path().string() << ")\n"
      << "model " << text("model_path") << "  kvlab " << text("kvlab_version") << " ("
      << text("git_commit") << ")  " << text("start_time") << " .. " << text("end_time") << "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-32s %9s %10s %12s %9s %12s %8s %9s %7s\n", "run", "niah_acc",
                "niah_logp", "ppl", "ppl_se", "kv_peak_MiB", "recall", "tok/s", "cells");
  out << line;
  int cells_done = 0;
  for (const std::string& run : file.runs()) {
    const auto cells = file.complete_cells(run);
    cells_done += int(cells.size());
    const auto niah = file.read_summary(run, "niah");
    const auto ppl = file.read_summary(run, "perplexity");
    std::vector<double> acc, logp, kv, recall, tps, pp, se;
    if (niah.count("accuracy")) {
      acc = std::get<std::vector<double>>(niah.at("accuracy").data);
      logp = std::get<std::vector<double>>(niah.at("value_logprob").data);
      kv = std::get<std::vector<double>>(niah.at("kv_bytes_peak").data);
      recall = std::get<std::vector<double>>(niah.at("recall_mean").data);
      tps = std::get<std::vector<double>>(niah.at("tokens_per_s").data);
    }
    if (ppl.count("ppl")) {
      pp = std::get<std::vector<double>>(ppl.at("ppl").data);
      se = std::get<std::vector<double>>(ppl.at("ppl_stderr").data);
      const auto& k = std::get<std::vector<double>>(ppl.at("kv_bytes_peak").data);
      kv.insert(kv.end(), k.begin(), k.end());
      const auto& r = std::get<std::vector<double>>(ppl.at("recall_mean").data);
      recall.insert(recall.end(), r.begin(), r.end());
      if (ppl.count("tokens_per_s")) {
        const auto& t = std::get<std::vector<double>>(ppl.at("tokens_per_s").data);
        tps.insert(tps.end(), t.begin(), t.end());
      }
    }
    double kv_max = kNaN;
    for (double k : kv)
      if (std::isfinite(k)) kv_max = std::isfinite(kv_max) ? std::max(kv_max, k) : k;
    std::snprintf(line, sizeof line, "%-32s %9.3f %10.2f %12.3f %9.3f %12.2f %8.4f %9.0f %7zu\n",
                  run.c_str(), mean_of(acc), mean_of(logp), mean_of(pp), mean_of(se),
                  kv_max / 1048576.0, mean_of(recall), mean_of(tps), cells.size());
    out << line;
  }
  out << "\ncells complete: " << cells_done << " / " << text("cells_total")
      << "  (nan = not measured: eval absent, cells missing or probes off)\n";
}

bool same_cell_contents(const CellRecord& a, const CellRecord& b, std::string* difference) {
  auto differ = [&](const std::string& what) {
    if (difference) *difference = what;
    return false;
  };
  for (const auto* pair : {&a, &b}) {
    const CellRecord& other = pair == &a ? b : a;
    for (const auto& [k, v] : pair->attrs)
      if (!is_timing_attr(k) && (!other.attrs.count(k) || other.attrs.at(k) != v))
        return differ("attribute " + k);
  }
  if (a.datasets.size() != b.datasets.size()) return differ("dataset count");
  for (const auto& [k, v] : a.datasets) {
    auto it = b.datasets.find(k);
    if (it == b.datasets.end()) return differ("dataset " + k + " missing");
    if (it->second.dims() != v.dims()) return differ("dataset " + k + " shape");
    // NaN == NaN for our purpose: compare bit patterns through the variant's values.
    const bool equal = std::visit(
        [&](const auto& x) {
          using V = std::decay_t<decltype(x)>;
          const auto* y = std::get_if<V>(&it->second.data);
          if (!y || y->size() != x.size()) return false;
          for (size_t i = 0; i < x.size(); ++i) {
            if constexpr (std::is_floating_point_v<typename V::value_type>) {
              if (!(x[i] == (*y)[i] || (std::isnan(x[i]) && std::isnan((*y)[i])))) return false;
            } else if (x[i] != (*y)[i]) {
              return false;
            }
          }
          return true;
        },
        v.data);
    if (!equal) return differ("dataset " + k + " values");
  }
  return true;
}

int merge_results(const std::filesystem::path& out, const std::vector<std::filesystem::path>& shards) {
  if (shards.empty()) fail("merge: no shard files given");
  std::vector<ResultsFile> inputs;
  for (const auto& s : shards) inputs.push_back(ResultsFile::open(s));
  const AttrMap root = inputs[0].root_attrs();
  const auto yaml = root.find("experiment");
  if (yaml == root.end()) fail(shards[0].string(), ": no 'experiment' root attribute");
  for (size_t i = 1; i < inputs.size(); ++i) {
    const AttrMap other = inputs[i].root_attrs();
    auto it = other.find("experiment");
    if (it == other.end() || it->second != yaml->second)
      fail(shards[i].string(), ": records a different experiment than ", shards[0].string(),
           " (the YAML text differs); only shards of one experiment can be merged");
    for (const char* key : {"model_sha256", "schema_version"}) {
      auto a = root.find(key), b = other.find(key);
      if ((a == root.end()) != (b == other.end()) || (a != root.end() && a->second != b->second))
        fail(shards[i].string(), ": root attribute ", key, " differs from ", shards[0].string());
    }
  }
  for (const auto& s : shards)
    if (std::filesystem::exists(out) && std::filesystem::equivalent(out, s))
      fail("merge: the output ", out.string(), " is also an input");
  AttrMap merged_root = root;
  merged_root.erase("shard");
  merged_root["merged_from"] = int64_t(shards.size());
  ResultsFile merged = ResultsFile::create(out, merged_root);
  int n = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (const std::string& run : inputs[i].runs()) {
      merged.ensure_run(run, inputs[i].run_attrs(run));
      for (const std::string& cell : inputs[i].complete_cells(run)) {
        const CellRecord rec = inputs[i].read_cell(run, cell);
        if (merged.cell_complete(run, cell)) {
          std::string diff;
          if (!same_cell_contents(rec, merged.read_cell(run, cell), &diff))
            fail(shards[i].string(), ": cell ", run, "/", cell, " differs from an earlier shard's (", diff, ")");
          continue;
        }
        merged.write_cell(run, cell, rec);
        ++n;
      }
    }
  }
  ExperimentSpec spec = experiment_of(merged);
  write_summaries(merged, spec);
  return n;
}

}  // namespace kvlab
