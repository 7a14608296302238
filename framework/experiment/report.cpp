#include "framework/experiment/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/eval_columns.h"
#include "framework/experiment/summary_rows.h"
#include "framework/experiment/text_escape.h"

namespace kvlab {

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
    for (const auto& e : spec.evals) e->summarise(SummaryContext{file, run.name, done, spec.seeds});
  }
}

bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      // Compare as numbers: strip leading zeros, then length, then digits.
      size_t ia = i, jb = j;
      while (ia + 1 < ie && a[ia] == '0') ++ia;
      while (jb + 1 < je && b[jb] == '0') ++jb;
      if (ie - ia != je - jb) return ie - ia < je - jb;
      const int c = a.compare(ia, ie - ia, b, jb, je - jb);
      if (c != 0) return c < 0;
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One complete cell as the report sees it (NaN where the cell does not say).
struct CellRow {
  std::string run, cell, kind, protocol;
  double context_length = kNaN, depth = kNaN, trials = kNaN, accuracy = kNaN, logprob = kNaN;
  double ppl = kNaN, ppl_se = kNaN, n_scored = kNaN;
  double keys_read = kNaN, keys_seen = kNaN, read_bytes = kNaN, kept_bytes = kNaN, kv_peak = kNaN;
  double recall = kNaN, tps = kNaN;
  double read_fraction() const { return keys_read / keys_seen; }
};

struct RunRow {
  std::string name, type, params, effective;
  std::vector<CellRow> cells;
};

struct Mean {
  double sum = 0;
  int n = 0;
  void add(double x) {
    if (std::isfinite(x)) sum += x, ++n;
  }
  double get() const { return n ? sum / n : kNaN; }
};

std::string text_attr(const AttrMap& a, const std::string& k) {
  auto it = a.find(k);
  return it == a.end() ? std::string() : attr_text(it->second);
}

// n_layers * n_kv_heads from the model_config JSON root attribute (0 when absent).
int64_t layer_heads_of(const AttrMap& root) {
  const std::string json = text_attr(root, "model_config");
  auto field = [&](const std::string& key) -> int64_t {
    const size_t at = json.find("\"" + key + "\":");
    return at == std::string::npos ? 0 : std::atoll(json.c_str() + at + key.size() + 3);
  };
  return field("n_layers") * field("n_kv_heads");
}

std::vector<RunRow> collect(const ResultsFile& file, const AttrMap& root) {
  const int64_t layer_heads = layer_heads_of(root);
  std::vector<RunRow> runs;
  for (const auto& [run, cells] : file.all_cell_attrs()) {
    const AttrMap ra = file.run_attrs(run);
    RunRow r{run, text_attr(ra, "policy_type"), text_attr(ra, "params"), text_attr(ra, "effective_params"), {}};
    for (const auto& [cell, a] : cells) {
      CellRow c;
      c.run = run;
      c.cell = cell;
      c.kind = text_attr(a, "kind");
      c.protocol = text_attr(a, "protocol");
      c.context_length = attr_number(a, "context_length");
      c.depth = attr_number(a, "depth");
      c.trials = attr_number(a, "trials");
      c.accuracy = attr_number(a, "accuracy");
      c.logprob = attr_number(a, "value_logprob_mean");
      if (c.kind == "niah" && !a.count("value_logprob_mean")) {  // schema 1: from the dataset
        std::vector<double> lp = values_of<double>(file.read_cell(run, cell), "value_logprob");
        c.logprob = finite_mean(lp);
      }
      c.ppl = attr_number(a, "ppl");
      c.ppl_se = attr_number(a, "ppl_stderr");
      c.n_scored = attr_number(a, "n_scored");
      c.kv_peak = attr_number(a, "kv_bytes_peak");
      // Schema 1 cells: keys read = attended_achieved_mean; no keys seen.
      c.keys_read = a.count("keys_read_mean") ? attr_number(a, "keys_read_mean")
                    : attr_number(a, "decode_tokens", 0) > 0 ? attr_number(a, "attended_achieved_mean")
                                                             : kNaN;
      c.keys_seen = attr_number(a, "keys_seen_mean");
      c.read_bytes = attr_number(a, "kv_read_bytes_per_layer_head");
      c.kept_bytes = a.count("kv_kept_bytes_peak_per_layer_head")
                         ? attr_number(a, "kv_kept_bytes_peak_per_layer_head")
                         : layer_heads > 0 ? c.kv_peak / double(layer_heads) : kNaN;
      c.recall = attr_number(a, "recall_mean");
      c.tps = attr_number(a, "tokens_per_s");
      if (r.type.empty()) r.type = text_attr(a, "policy_type");
      r.cells.push_back(std::move(c));
    }
    std::sort(r.cells.begin(), r.cells.end(),
              [](const CellRow& a, const CellRow& b) { return natural_less(a.cell, b.cell); });
    runs.push_back(std::move(r));
  }
  std::sort(runs.begin(), runs.end(), [](const RunRow& a, const RunRow& b) { return natural_less(a.name, b.name); });
  return runs;
}

// Aggregates of one run over its cells of one kind ("" = all kinds).
struct Agg {
  Mean acc, logp, ppl, se, read, seen, frac, read_bytes, kept, recall, tps;
  double kv_peak_max = kNaN;
  int cells = 0;
};
Agg aggregate(const RunRow& r, const std::string& kind = "", double length = kNaN) {
  Agg g;
  for (const CellRow& c : r.cells) {
    if (!kind.empty() && c.kind != kind) continue;
    if (std::isfinite(length) && c.context_length != length) continue;
    ++g.cells;
    g.acc.add(c.accuracy);
    g.logp.add(c.logprob);
    g.ppl.add(c.ppl);
    g.se.add(c.ppl_se);
    g.read.add(c.keys_read);
    g.seen.add(c.keys_seen);
    g.frac.add(c.read_fraction());
    g.read_bytes.add(c.read_bytes);
    g.kept.add(c.kept_bytes);
    g.recall.add(c.recall);
    g.tps.add(c.tps);
    if (std::isfinite(c.kv_peak)) g.kv_peak_max = std::isfinite(g.kv_peak_max) ? std::max(g.kv_peak_max, c.kv_peak) : c.kv_peak;
  }
  return g;
}

std::string fmt(double v, const char* f) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A column-aligned table: the first `left` columns (names) left-aligned, the numbers right-aligned.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows, size_t left = 1) {
  if (rows.empty()) return;
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      const std::string pad(w[i] - r[i].size(), ' ');
      line += (i ? "  " : "") + (i < left ? r[i] + pad : pad + r[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

std::string csv_number(double v) {
  if (!std::isfinite(v)) return "";
  char b[64];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}

// "key=value" items of `effective` whose key is not written in `params`.
std::string defaulted(const std::string& params, const std::string& effective) {
  std::set<std::string> written;
  std::istringstream ps(params);
  for (std::string item; std::getline(ps, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    written.insert(item.substr(0, item.find('=')));
  }
  std::string out;
  std::istringstream es(effective);
  for (std::string item; std::getline(es, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    if (!written.count(item.substr(0, item.find('=')))) out += (out.empty() ? "" : ", ") + item;
  }
  return out;
}

// Mean of a numeric cell dataset, NaN when absent.
double dataset_mean(const CellRecord& rec, const std::string& name) {
  auto it = rec.datasets.find(name);
  if (it == rec.datasets.end()) return kNaN;
  const auto* v = std::get_if<std::vector<double>>(&it->second.data);
  if (!v || v->empty()) return kNaN;
  double sum = 0;
  for (double x : *v) sum += x;
  return sum / double(v->size());
}

// The peer side by side (/peer, evals/peer/kvpress_runner.py): per cell the kvpress press, its
// score and seconds per sample beside kvlab's on the same prompts; nothing without /peer.
void print_peer_table(const ResultsFile& file, std::ostream& out) {
  const auto peer = file.peer_cells();
  if (peer.empty()) return;
  out << "\nkvlab and the peer (kvpress) on the same prompts: score (mean over samples), wall seconds per sample\n";
  std::vector<std::vector<std::string>> t{
      {"run", "cell", "press", "ratio", "kvlab", "kvpress", "kvlab_s", "kvpress_s", "kvlab/kvpress_s", "samples"}};
  for (const auto& [run, cells] : peer)
    for (const auto& [cell, rec] : cells) {
      if (!file.cell_complete(run, cell)) continue;
      const AttrMap mine = file.cell_attrs(run, cell);
      double kv_s = kNaN;
      if (auto it = mine.find("sample_s"); it != mine.end())
        if (const auto* v = std::get_if<std::vector<double>>(&it->second); v && !v->empty())
          kv_s = std::accumulate(v->begin(), v->end(), 0.0) / double(v->size());
      if (!std::isfinite(kv_s))  // files without sample_s: the cell's engine time over its samples
        kv_s = (attr_number(mine, "prefill_s") + attr_number(mine, "decode_s")) / attr_number(mine, "samples");
      const double peer_s = dataset_mean(rec, "sample_s");
      const auto n = rec.datasets.count("score") ? rec.datasets.at("score").size() : size_t(0);
      t.push_back({run, cell, text_attr(rec.attrs, "press"), fmt(attr_number(rec.attrs, "compression_ratio"), "%.2f"),
                   fmt(attr_number(mine, "score"), "%.3f"), fmt(dataset_mean(rec, "score"), "%.3f"),
                   fmt(kv_s, "%.2f"), fmt(peer_s, "%.2f"), fmt(kv_s / peer_s, "%.2f"), std::to_string(n)});
    }
  print_table(out, t, 3);
}

void print_text(const ResultsFile& file, const AttrMap& root, const std::vector<RunRow>& runs, std::ostream& out) {
  auto text = [&](const char* k) { auto it = root.find(k); return it == root.end() ? std::string("?") : attr_text(it->second); };
  int done = 0;
  bool niah = false, ppl = false, probes = false, reads = false;
  std::set<double> lengths;
  for (const RunRow& r : runs)
    for (const CellRow& c : r.cells) {
      ++done;
      niah |= c.kind == "niah";
      ppl |= c.kind == "perplexity";
      probes |= std::isfinite(c.recall);
      reads |= std::isfinite(c.keys_read);
      if (c.kind == "niah" && std::isfinite(c.context_length)) lengths.insert(c.context_length);
    }
  const std::string total = text("cells_total");
  const double total_n = attr_number(root, "cells_total");
  const bool partial = std::isfinite(total_n) && done < total_n;
  // A resume with a smaller experiment leaves the cells of runs it no longer lists.
  const bool extra = std::isfinite(total_n) && done > total_n;
  out << "experiment " << text("name") << "  (" << file.path().string() << ")\n"
      << "model " << text("model_path") << "  kvlab " << text("kvlab_version") << " (" << text("git_commit")
      << ")  " << text("start_time") << " .. " << (root.count("end_time") ? text("end_time") : std::string("(not finished)"))
      << "\ncells complete: " << done << " / " << total
      << (partial ? "  (partial file: every table below uses only the complete cells)" : "")
      << (extra ? "  (the file also holds cells of runs the last experiment written to it does not list)" : "")
      << "\n\n";

  std::vector<std::string> head{"run", "policy", "setting"};
  if (niah) head.insert(head.end(), {"niah_acc", "niah_logp"});
  if (ppl) head.insert(head.end(), {"ppl", "ppl_se"});
  if (reads) head.insert(head.end(), {"keys_read", "of_seen", "read_%"});
  head.insert(head.end(), {"kept_KiB/lh"});
  if (probes) head.push_back("recall");
  head.insert(head.end(), {"tok/s", "cells"});
  std::vector<std::vector<std::string>> rows{head};
  for (const RunRow& r : runs) {
    const Agg a = aggregate(r), an = aggregate(r, "niah"), ap = aggregate(r, "perplexity");
    std::vector<std::string> row{r.name, r.type, r.params.empty() ? "-" : r.params};
    if (niah) row.insert(row.end(), {fmt(an.acc.get(), "%.3f"), fmt(an.logp.get(), "%.2f")});
    if (ppl) row.insert(row.end(), {fmt(ap.ppl.get(), "%.3f"), fmt(ap.se.get(), "%.3f")});
    if (reads)
      row.insert(row.end(), {fmt(a.read.get(), "%.1f"), fmt(a.seen.get(), "%.1f"), fmt(100 * a.frac.get(), "%.1f")});
    row.push_back(fmt(a.kept.get() / 1024.0, "%.1f"));
    if (probes) row.push_back(fmt(a.recall.get(), "%.4f"));
    row.insert(row.end(), {fmt(a.tps.get(), "%.0f"), std::to_string(a.cells)});
    rows.push_back(std::move(row));
  }
  print_table(out, rows, 3);
  out << "\nkeys_read: keys one query head read per decode step (mean over steps, layers, heads), of_seen:\n"
         "tokens in the context at those steps; kept_KiB/lh: peak KV held per layer and KV head (mean over\n"
         "cells); '-': not measured (no decode steps, e.g. the chunked/sliding protocols; probes off).\n";

  if (niah && !lengths.empty()) {
    out << "\nNIAH accuracy by context length (mean over the complete depths; [cells])\n";
    std::vector<std::string> h{"run"};
    for (double l : lengths) h.push_back(fmt(l, "%.0f"));
    std::vector<std::vector<std::string>> t{h};
    std::vector<std::vector<std::string>> k{h};
    for (const RunRow& r : runs) {
      std::vector<std::string> row{r.name}, krow{r.name};
      bool any = false;
      for (double l : lengths) {
        const Agg g = aggregate(r, "niah", l);
        any |= g.cells > 0;
        row.push_back(g.cells ? fmt(g.acc.get(), "%.2f") + " [" + std::to_string(g.cells) + "]" : "-");
        krow.push_back(g.cells ? fmt(g.read.get(), "%.0f") + "/" + fmt(g.seen.get(), "%.0f") : "-");
      }
      if (any) t.push_back(std::move(row)), k.push_back(std::move(krow));
    }
    print_table(out, t);
    if (reads) {
      out << "\nkeys read / seen per decode step, by context length\n";
      print_table(out, k);
    }
  }

  if (reads) {
    out << "\nby fraction of keys read (compression ratio = 1 - read fraction), per policy family\n";
    std::vector<const RunRow*> order;
    for (const RunRow& r : runs) order.push_back(&r);
    std::stable_sort(order.begin(), order.end(), [](const RunRow* a, const RunRow* b) {
      if (a->type != b->type) return a->type < b->type;
      const double fa = aggregate(*a).frac.get(), fb = aggregate(*b).frac.get();
      return fa > fb;  // NaN compares false: kept in name order
    });
    std::vector<std::string> h{"policy", "run", "read_%", "compression"};
    if (niah) h.push_back("niah_acc");
    if (ppl) h.push_back("ppl");
    std::vector<std::vector<std::string>> t{h};
    for (const RunRow* r : order) {
      const Agg a = aggregate(*r);
      std::vector<std::string> row{r->type, r->name, fmt(100 * a.frac.get(), "%.1f"), fmt(1 - a.frac.get(), "%.3f")};
      if (niah) row.push_back(fmt(aggregate(*r, "niah").acc.get(), "%.3f"));
      if (ppl) row.push_back(fmt(aggregate(*r, "perplexity").ppl.get(), "%.3f"));
      t.push_back(std::move(row));
    }
    print_table(out, t, 2);
  }
  print_ruler_table(summary_rows(file), out);
  print_peer_table(file, out);

  bool any_default = false;
  for (const RunRow& r : runs) any_default |= !defaulted(r.params, r.effective).empty();
  if (any_default) {
    out << "\nparameters not written in the experiment (defaults; \"auto\" values resolved for this model)\n";
    for (const RunRow& r : runs) {
      const std::string d = defaulted(r.params, r.effective);
      if (!d.empty()) out << "  " << r.name << ": " << d << "\n";
    }
  }
}

void print_json(const ResultsFile& file, const AttrMap& root, const std::vector<RunRow>& runs, std::ostream& out) {
  int done = 0;
  for (const RunRow& r : runs) done += int(r.cells.size());
  auto kv_list = [](const std::string& text) {
    std::string o = "{";
    std::istringstream s(text);
    bool first = true;
    for (std::string item; std::getline(s, item, ',');) {
      item.erase(0, item.find_first_not_of(' '));
      const size_t eq = item.find('=');
      if (eq == std::string::npos) continue;
      o += (first ? "" : ", ") + json_string(item.substr(0, eq)) + ": " + json_string(item.substr(eq + 1));
      first = false;
    }
    return o + "}";
  };
  out << "{\n  \"file\": " << json_string(file.path().string())
      << ",\n  \"experiment\": " << json_string(text_attr(root, "name"))
      << ",\n  \"model_path\": " << json_string(text_attr(root, "model_path"))
      << ",\n  \"schema_version\": " << json_number(attr_number(root, "schema_version"))
      << ",\n  \"cells_complete\": " << done
      << ",\n  \"cells_total\": " << json_number(attr_number(root, "cells_total")) << ",\n  \"runs\": [";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRow& r = runs[i];
    const Agg a = aggregate(r), an = aggregate(r, "niah"), ap = aggregate(r, "perplexity");
    out << (i ? "," : "") << "\n    {\"name\": " << json_string(r.name) << ", \"policy_type\": " << json_string(r.type)
        << ", \"params\": " << kv_list(r.params) << ", \"effective_params\": " << kv_list(r.effective)
        << ", \"cells\": " << a.cells << ", \"keys_read_mean\": " << json_number(a.read.get())
        << ", \"keys_seen_mean\": " << json_number(a.seen.get()) << ", \"read_fraction\": " << json_number(a.frac.get())
        << ", \"kv_read_bytes_per_layer_head\": " << json_number(a.read_bytes.get())
        << ", \"kv_kept_bytes_peak_per_layer_head\": " << json_number(a.kept.get())
        << ", \"recall_mean\": " << json_number(a.recall.get()) << ", \"tokens_per_s\": " << json_number(a.tps.get());
    if (an.cells) {
      out << ", \"niah\": {\"cells\": " << an.cells << ", \"accuracy\": " << json_number(an.acc.get())
          << ", \"value_logprob\": " << json_number(an.logp.get()) << ", \"per_length\": [";
      std::set<double> lengths;
      for (const CellRow& c : r.cells)
        if (c.kind == "niah") lengths.insert(c.context_length);
      bool first = true;
      for (double l : lengths) {
        const Agg g = aggregate(r, "niah", l);
        out << (first ? "" : ", ") << "{\"context_length\": " << json_number(l) << ", \"cells\": " << g.cells
            << ", \"accuracy\": " << json_number(g.acc.get()) << ", \"keys_read_mean\": " << json_number(g.read.get())
            << ", \"keys_seen_mean\": " << json_number(g.seen.get()) << "}";
        first = false;
      }
      out << "]}";
    }
    if (ap.cells)
      out << ", \"perplexity\": {\"cells\": " << ap.cells << ", \"ppl\": " << json_number(ap.ppl.get())
          << ", \"ppl_stderr\": " << json_number(ap.se.get()) << "}";
    out << "}";
  }
  out << "\n  ],\n  \"cells\": [";
  bool first = true;
  for (const RunRow& r : runs)
    for (const CellRow& c : r.cells) {
      out << (first ? "" : ",") << "\n    {\"run\": " << json_string(c.run) << ", \"cell\": " << json_string(c.cell)
          << ", \"kind\": " << json_string(c.kind);
      if (c.kind == "niah")
        out << ", \"context_length\": " << json_number(c.context_length) << ", \"depth\": " << json_number(c.depth)
            << ", \"trials\": " << json_number(c.trials) << ", \"accuracy\": " << json_number(c.accuracy)
            << ", \"value_logprob\": " << json_number(c.logprob);
      else
        out << ", \"protocol\": " << json_string(c.protocol) << ", \"ppl\": " << json_number(c.ppl)
            << ", \"ppl_stderr\": " << json_number(c.ppl_se) << ", \"n_scored\": " << json_number(c.n_scored);
      out << ", \"keys_read_mean\": " << json_number(c.keys_read) << ", \"keys_seen_mean\": " << json_number(c.keys_seen)
          << ", \"kv_kept_bytes_peak_per_layer_head\": " << json_number(c.kept_bytes)
          << ", \"kv_bytes_peak\": " << json_number(c.kv_peak) << ", \"recall_mean\": " << json_number(c.recall) << "}";
      first = false;
    }
  out << "\n  ],\n  \"summaries\": ";
  print_summary_rows_json(summary_rows(file), out, "  ");
  out << "\n}\n";
}

void print_csv(const std::vector<RunRow>& runs, std::ostream& out) {
  out << "run,policy_type,params,effective_params,kind,cell,context_length,depth,trials,accuracy,value_logprob,"
         "protocol,ppl,ppl_stderr,n_scored,keys_read_mean,keys_seen_mean,read_fraction,"
         "kv_read_bytes_per_layer_head,kv_kept_bytes_peak_per_layer_head,kv_bytes_peak,recall_mean,tokens_per_s\n";
  for (const RunRow& r : runs)
    for (const CellRow& c : r.cells) {
      const std::vector<std::string> f{
          csv_field(r.name), csv_field(r.type), csv_field(r.params), csv_field(r.effective), c.kind, c.cell,
          csv_number(c.context_length), csv_number(c.depth), csv_number(c.trials), csv_number(c.accuracy),
          csv_number(c.logprob), c.protocol, csv_number(c.ppl), csv_number(c.ppl_se), csv_number(c.n_scored),
          csv_number(c.keys_read), csv_number(c.keys_seen), csv_number(c.read_fraction()), csv_number(c.read_bytes),
          csv_number(c.kept_bytes), csv_number(c.kv_peak), csv_number(c.recall), csv_number(c.tps)};
      for (size_t i = 0; i < f.size(); ++i) out << (i ? "," : "") << f[i];
      out << "\n";
    }
}

}  // namespace

void print_report(const ResultsFile& file, std::ostream& out, ReportFormat format) {
  const AttrMap root = file.root_attrs();
  const std::vector<RunRow> runs = collect(file, root);
  switch (format) {
    case ReportFormat::kText: print_text(file, root, runs, out); break;
    case ReportFormat::kJson: print_json(file, root, runs, out); break;
    case ReportFormat::kCsv: print_csv(runs, out); break;
  }
}

}  // namespace kvlab
