// Flat summary rows, their JSON, and the kvpress export (summary_rows.h).
#include "framework/experiment/summary_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "framework/core/error.h"
#include "framework/experiment/eval_columns.h"
#include "framework/experiment/report.h"
#include "framework/experiment/text_escape.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string text_of(const AttrMap& a, const std::string& k) {
  auto it = a.find(k);
  if (it == a.end()) return "";
  if (auto* s = std::get_if<std::string>(&it->second)) return *s;
  if (auto* i = std::get_if<int64_t>(&it->second)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&it->second)) return str_cat(*d);
  return "";
}

// A Python list literal of strings, as pandas writes a list column to CSV.
std::string py_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    std::string q;
    for (char c : items[i]) q += c == '\'' ? std::string("\\'") : c == '\\' ? std::string("\\\\") : std::string(1, c);
    out += (i ? ", '" : "'") + q + "'";
  }
  return out + "]";
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// kvlab policy types under kvpress's press names where kvpress has the method.
std::string press_name(const std::string& type) {
  static const std::map<std::string, std::string> kNames = {
      {"full", "no_press"}, {"sinks", "streaming_llm"}, {"snapkv", "snapkv"}, {"pyramidkv", "pyramidkv"},
      {"tova", "tova"},     {"knorm", "knorm"},          {"random", "random"}, {"adakv", "adakv_snapkv"},
      {"duo", "duo_attention"}, {"h2o", "observed_attention"}};
  auto it = kNames.find(type);
  return it == kNames.end() ? "kvlab_" + type : it->second;
}

}  // namespace

std::vector<SummaryRow> summary_rows(const ResultsFile& file) {
  std::vector<SummaryRow> rows;
  const auto cells = file.all_cell_attrs();
  std::vector<std::string> runs;
  for (const auto& [run, _] : cells) runs.push_back(run);
  std::sort(runs.begin(), runs.end(), natural_less);
  for (const std::string& run : runs) {
    const AttrMap ra = file.run_attrs(run);
    std::map<std::string, std::string> params;
    for (const auto& [k, v] : ra)
      if (k.rfind("effective.", 0) == 0) params[k.substr(10)] = text_of(ra, k);
    std::vector<std::string> ids;
    for (const auto& [id, _] : cells.at(run)) ids.push_back(id);
    std::sort(ids.begin(), ids.end(), natural_less);
    for (const std::string& id : ids) {
      const AttrMap& a = cells.at(run).at(id);
      const std::string kind = text_of(a, "kind");
      if (kind != "ruler" && kind != "niah") continue;
      SummaryRow r;
      r.run = run, r.cell = id, r.kind = kind;
      r.policy_type = text_of(ra, "policy_type");
      r.params = params;
      r.task = kind == "ruler" ? text_of(a, "task") : "niah";
      r.protocol = text_of(a, "protocol");
      r.context_length = attr_number(a, "context_length");
      auto cr = params.find("compression_ratio");
      r.compression_ratio = cr == params.end() ? 0.0 : std::strtod(cr->second.c_str(), nullptr);
      r.score = kind == "ruler" ? attr_number(a, "score") : attr_number(a, "accuracy");
      r.kv_bytes_peak = attr_number(a, "kv_bytes_peak");
      r.kv_kept_fraction = attr_number(a, "kv_kept_fraction");
      r.samples = attr_number(a, kind == "ruler" ? "samples" : "trials");
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

void print_summary_rows_json(const std::vector<SummaryRow>& rows, std::ostream& out, const std::string& indent) {
  out << "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const SummaryRow& r = rows[i];
    out << (i ? "," : "") << "\n" << indent << "  {\"run\": " << json_string(r.run) << ", \"policy_type\": "
        << json_string(r.policy_type) << ", \"params\": {";
    bool first = true;
    for (const auto& [k, v] : r.params) out << (first ? "" : ", ") << json_string(k) << ": " << json_string(v), first = false;
    out << "}, \"evaluation\": " << json_string(r.kind) << ", \"cell\": " << json_string(r.cell)
        << ", \"task\": " << json_string(r.task) << ", \"protocol\": " << json_string(r.protocol)
        << ", \"context_length\": " << json_number(r.context_length)
        << ", \"compression_ratio\": " << json_number(r.compression_ratio) << ", \"score\": " << json_number(r.score)
        << ", \"samples\": " << json_number(r.samples) << ", \"kv_bytes_peak\": " << json_number(r.kv_bytes_peak)
        << ", \"kv_kept_fraction\": " << json_number(r.kv_kept_fraction) << "}";
  }
  out << "\n" << indent << "]";
}

void print_ruler_table(const std::vector<SummaryRow>& rows, std::ostream& out) {
  std::vector<std::string> tasks;  // in first-seen order
  std::map<std::tuple<std::string, std::string, double>, std::map<std::string, double>> table;
  std::vector<std::tuple<std::string, std::string, double>> order;
  for (const SummaryRow& r : rows) {
    if (r.kind != "ruler") continue;
    if (std::find(tasks.begin(), tasks.end(), r.task) == tasks.end()) tasks.push_back(r.task);
    const auto key = std::make_tuple(r.run, r.protocol, r.context_length);
    if (!table.count(key)) order.push_back(key);
    table[key][r.task] = r.score;
  }
  if (order.empty()) return;
  auto cell = [](double v) {
    char b[16];
    std::snprintf(b, sizeof b, "%.2f", v);
    return std::isfinite(v) ? std::string(b) : std::string("-");
  };
  std::vector<std::vector<std::string>> t{{"run", "protocol", "length"}};
  for (const auto& task : tasks) t[0].push_back(task);
  t[0].push_back("mean");
  for (const auto& key : order) {
    std::vector<std::string> row{std::get<0>(key), std::get<1>(key), str_cat(int64_t(std::get<2>(key)))};
    double sum = 0;
    int n = 0;
    for (const auto& task : tasks) {
      auto it = table[key].find(task);
      row.push_back(it == table[key].end() ? "" : cell(it->second));
      if (it != table[key].end() && std::isfinite(it->second)) sum += it->second, ++n;
    }
    row.push_back(n ? cell(sum / n) : "-");
    t.push_back(std::move(row));
  }
  std::vector<size_t> w(t[0].size(), 0);
  for (const auto& r : t)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  out << "\nRULER score (fraction of references found, RULER's string_match_all; passkey: the first number), "
         "mean over samples\n";
  for (const auto& r : t) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      const std::string pad(w[i] - r[i].size(), ' ');
      line += (i ? "  " : "") + (i < 2 ? r[i] + pad : pad + r[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

std::vector<fs::path> export_kvpress(const ResultsFile& file, const fs::path& dir) {
  const AttrMap root = file.root_attrs();
  std::string model = fs::path(text_of(root, "model_path")).stem().string();
  if (model.empty()) model = "model";
  // (dataset, data_dir, press, ratio, query_aware) -> rows
  struct Group {
    std::string press, policy_type, run;
    std::map<std::string, std::string> params;
    double ratio = 0, length = 0;
    bool query_aware = false;
    std::vector<const SummaryRow*> rows;
  };
  const std::vector<SummaryRow> rows = summary_rows(file);
  std::map<std::string, Group> groups;
  for (const SummaryRow& r : rows) {
    if (r.kind != "ruler") continue;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f", r.compression_ratio);
    const bool qa = r.protocol == "query_aware";
    // A run whose name differs from its type (a grid point, a second entry) keeps its name.
    std::string press = press_name(r.policy_type);
    const std::string base = r.run.substr(0, r.run.find('@'));
    if (base != r.policy_type) press += "-" + base;
    const std::string name = str_cat("ruler__", int64_t(r.context_length), "__", model, "__", press, "__", ratio,
                                     qa ? "__query_aware" : "");
    Group& g = groups[name + "\n" + r.run];
    g.press = press, g.policy_type = r.policy_type, g.run = r.run, g.params = r.params;
    g.ratio = r.compression_ratio, g.length = r.context_length, g.query_aware = qa;
    g.rows.push_back(&r);
  }
  std::vector<fs::path> written;
  std::set<std::string> used;
  for (const auto& [key, g] : groups) {
    std::string name = key.substr(0, key.find('\n'));
    for (int i = 1; used.count(name); ++i) name = key.substr(0, key.find('\n')) + "__" + std::to_string(i);
    used.insert(name);
    const fs::path out = dir / name;
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) fail(out.string(), ": cannot create: ", ec.message());
    std::ofstream csv(out / "predictions.csv", std::ios::binary);
    if (!csv) fail((out / "predictions.csv").string(), ": cannot write");
    csv << "task,question,answer,predicted_answer,compression_ratio,max_new_tokens,protocol,score,prompt_length,"
           "sample_seed,needle_pos\n";
    std::map<std::string, std::pair<double, int>> per_task;  // task -> (score sum, samples)
    for (const SummaryRow* r : g.rows) {
      const CellRecord rec = file.read_cell(r->run, r->cell);
      const std::string where = str_cat(file.path().string(), ": ", r->run, "/", r->cell);
      const auto& score = values_of<double>(rec, "score", where);
      const size_t n = score.size();
      const auto& query = values_of<std::string>(rec, "query", where, n);
      const auto& refs = values_of<std::string>(rec, "references", where, n);
      const auto& pred = values_of<std::string>(rec, "prediction", where, n);
      const auto& plen = values_of<int64_t>(rec, "prompt_length", where, n);
      const auto& seeds = values_of<int64_t>(rec, "sample_seed", where, n);
      const auto& npos = values_of<int64_t>(rec, "needle_pos", where);
      const size_t width = n ? npos.size() / n : 0;
      const int64_t max_new = int64_t(attr_number(rec.attrs, "max_answer_tokens", 0));
      for (size_t i = 0; i < n; ++i) {
        std::string pos;
        for (size_t j = 0; j < width; ++j)
          if (npos[i * width + j] >= 0) pos += (pos.empty() ? "" : " ") + std::to_string(npos[i * width + j]);
        char sc[32];
        std::snprintf(sc, sizeof sc, "%.17g", score[i]);
        char cr[32];
        std::snprintf(cr, sizeof cr, "%.17g", g.ratio);
        csv << csv_field(r->task) << "," << csv_field(query[i]) << "," << csv_field(py_list(split_lines(refs[i])))
            << "," << csv_field(pred[i]) << "," << cr << "," << max_new << "," << csv_field(r->protocol) << "," << sc << "," << plen[i] << "," << uint64_t(seeds[i]) << "," << csv_field(pos) << "\n";
        per_task[r->task].first += score[i];
        per_task[r->task].second += 1;
      }
    }
    if (!csv) fail((out / "predictions.csv").string(), ": write failed");
    std::ofstream metrics(out / "metrics.json", std::ios::binary);
    metrics << "{";
    bool first = true;
    for (const auto& [task, sn] : per_task) {
      // kvpress's RULER scorer: per task {"string_match": mean score x 100}.
      metrics << (first ? "" : ",") << "\n    " << json_string(task) << ": {\n        \"string_match\": "
              << json_number(sn.second ? 100.0 * sn.first / sn.second : kNaN) << "\n    }";
      first = false;
    }
    metrics << "\n}\n";
    if (!metrics) fail((out / "metrics.json").string(), ": write failed");
    std::ofstream cfg(out / "config.yaml", std::ios::binary);
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.17g", g.ratio);
    cfg << "dataset: ruler\ndata_dir: '" << int64_t(g.length) << "'\nmodel: " << model << "\npress_name: " << g.press
        << "\ncompression_ratio: " << ratio << "\nquery_aware: " << (g.query_aware ? "true" : "false")
        << "\nmax_context_length: " << int64_t(g.length) << "\noutput_dir: " << dir.string()
        << "\npress_init_command: 'kvlab " << g.policy_type << "(";
    bool f2 = true;
    for (const auto& [k, v] : g.params) cfg << (f2 ? "" : ", ") << k << "=" << v, f2 = false;
    cfg << ")'\nkvlab_run: " << g.run << "\nkvlab_results: " << file.path().string() << "\n";
    if (!cfg) fail((out / "config.yaml").string(), ": write failed");
    written.push_back(out);
  }
  return written;
}

}  // namespace kvlab
