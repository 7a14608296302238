#include "framework/experiment/merge.h"

#include <cmath>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "framework/core/error.h"
#include "framework/experiment/eval_columns.h"
#include "framework/experiment/report.h"

namespace kvlab {

bool same_cell_contents(const CellRecord& a, const CellRecord& b, std::string* difference) {
  auto differ = [&](const std::string& what) {
    if (difference) *difference = what;
    return false;
  };
  // Attributes too compare NaN equal to NaN (recall_mean with probes off is NaN in every run).
  auto same_attr = [](const AttrValue& x, const AttrValue& y) {
    if (x.index() != y.index()) return false;
    auto same = [](double p, double q) { return p == q || (std::isnan(p) && std::isnan(q)); };
    if (const double* dx = std::get_if<double>(&x)) return same(*dx, std::get<double>(y));
    if (const auto* vx = std::get_if<std::vector<double>>(&x)) {
      const auto& vy = std::get<std::vector<double>>(y);
      if (vx->size() != vy.size()) return false;
      for (size_t i = 0; i < vx->size(); ++i)
        if (!same((*vx)[i], vy[i])) return false;
      return true;
    }
    return x == y;
  };
  for (const auto* pair : {&a, &b}) {
    const CellRecord& other = pair == &a ? b : a;
    for (const auto& [k, v] : pair->attrs)
      if (!is_timing_attr(k) && (!other.attrs.count(k) || !same_attr(other.attrs.at(k), v)))
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
  namespace fs = std::filesystem;
  if (shards.empty()) fail("merge: no shard files given");
  for (size_t i = 0; i < shards.size(); ++i) {
    if (fs::exists(out) && fs::exists(shards[i]) && fs::equivalent(out, shards[i]))
      fail("merge: the output ", out.string(), " is also an input");
    for (size_t j = 0; j < i; ++j)
      if (fs::exists(shards[i]) && fs::exists(shards[j]) && fs::equivalent(shards[i], shards[j]))
        fail("merge: ", shards[i].string(), " is given twice (as file ", j + 1, " and ", i + 1,
             "); each shard is merged once");
  }
  std::vector<ResultsFile> inputs;
  for (const auto& s : shards) inputs.push_back(ResultsFile::open(s));
  std::vector<AttrMap> roots;
  for (const auto& f : inputs) roots.push_back(f.root_attrs());
  size_t widest = 0;  // the shard whose experiment has the most cells: its YAML describes the merge
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!roots[i].count("experiment")) fail(shards[i].string(), ": no 'experiment' root attribute");
    if (attr_number(roots[i], "cells_total", 0) > attr_number(roots[widest], "cells_total", 0)) widest = i;
    for (const char* key : {"name", "model_sha256", "schema_version"}) {
      auto a = roots[0].find(key), b = roots[i].find(key);
      if ((a == roots[0].end()) != (b == roots[i].end()) || (a != roots[0].end() && a->second != b->second))
        fail(shards[i].string(), ": root attribute ", key, " differs from ", shards[0].string(),
             key == std::string("model_sha256") ? " (another model file): only results of one model merge"
             : key == std::string("name")       ? " (another experiment): only one experiment's shards merge"
                                                : "");
    }
  }
  // Runs must mean the same policy in every file; with schema 1 (no effective parameters) the
  // YAML text must match, as before.
  const bool v1 = attr_number(roots[0], "schema_version", 1) < 2;
  std::map<std::string, std::pair<size_t, AttrMap>> run_seen;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (v1 && roots[i].at("experiment") != roots[0].at("experiment"))
      fail(shards[i].string(), ": records a different experiment than ", shards[0].string(),
           " (the YAML text differs; files of results schema 1 merge only with the same text)");
    for (const std::string& run : inputs[i].runs()) {
      const AttrMap a = inputs[i].run_attrs(run);
      auto [it, fresh] = run_seen.try_emplace(run, i, a);
      if (fresh || v1) continue;
      for (const char* key : {"policy_type", "effective_params"}) {
        const AttrMap& first = it->second.second;
        auto x = a.find(key);
        auto y = first.find(key);
        if ((x == a.end()) != (y == first.end()) || (x != a.end() && x->second != y->second))
          fail(shards[i].string(), ": run ", run, " has ", key, " '", x == a.end() ? "" : attr_text(x->second),
               "', but ", shards[it->second.first].string(), " has '",
               y == first.end() ? "" : attr_text(y->second), "'; only one experiment's shards merge");
      }
    }
  }
  // Every cell once: checked before the output is created, so a refused merge writes nothing.
  std::map<std::pair<std::string, std::string>, size_t> owner;  // (run, cell) -> input index
  for (size_t i = 0; i < inputs.size(); ++i)
    for (const std::string& run : inputs[i].runs())
      for (const std::string& cell : inputs[i].complete_cells(run)) {
        auto [it, fresh] = owner.try_emplace({run, cell}, i);
        if (!fresh)
          fail("merge: cell ", run, "/", cell, " is in both ", shards[it->second].string(), " and ",
               shards[i].string(), " (overlapping shards?); merge takes each cell from one file only");
      }
  AttrMap merged_root = roots[widest];
  merged_root.erase("shard");
  merged_root["merged_from"] = int64_t(shards.size());
  ResultsFile merged = ResultsFile::create(out, merged_root);
  int n = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (const std::string& run : inputs[i].runs()) {
      merged.ensure_run(run, inputs[i].run_attrs(run));
      for (const std::string& cell : inputs[i].complete_cells(run)) {
        merged.write_cell(run, cell, inputs[i].read_cell(run, cell));
        ++n;
      }
    }
  }
  ExperimentSpec spec = experiment_of(merged);
  write_summaries(merged, spec);
  return n;
}

}  // namespace kvlab
