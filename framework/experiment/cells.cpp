#include "framework/experiment/cells.h"

#include <cmath>

#include "evals/niah.h"
#include "framework/core/error.h"

namespace kvlab {

std::vector<RunSpec> expand_runs(const ExperimentSpec& spec) {
  check_grid_size(spec);  // counted before anything is built
  std::vector<RunSpec> runs;
  const bool format_axis = spec.kv.formats.size() > 1;
  for (const std::string& format : spec.kv.formats)
  for (size_t e = 0; e < spec.policies.size(); ++e) {
    const PolicyEntry& entry = spec.policies[e];
    // Odometer over the grid's axes (a parameter, or a zip group stepping together), last axis
    // fastest.
    std::vector<size_t> at(entry.axes.size(), 0);
    std::vector<size_t> value_of(entry.params.size(), 0);
    while (true) {
      for (size_t a = 0; a < entry.axes.size(); ++a)
        for (size_t p : entry.axes[a]) value_of[p] = at[a];
      RunSpec run;
      run.entry_name = entry.name;
      run.type = entry.type;
      run.entry_index = int(e);
      run.kv_format = format;
      run.name = entry.name;
      std::string suffix;
      for (size_t p = 0; p < entry.params.size(); ++p) {
        const auto& [key, values] = entry.params[p];
        run.params[key] = values[value_of[p]];
        if (values.size() > 1) suffix += (suffix.empty() ? "" : ",") + key + "=" + to_string(values[value_of[p]]);
      }
      if (format_axis) suffix += (suffix.empty() ? "" : ",") + std::string("kv.format=") + format;
      if (!suffix.empty()) run.name += "@" + suffix;
      runs.push_back(std::move(run));
      // Advance the odometer; done when the first digit wraps (or there are no digits).
      size_t a = entry.axes.size();
      bool wrapped = true;
      while (a > 0 && wrapped) {
        --a;
        wrapped = ++at[a] == entry.params[entry.axes[a].front()].second.size();
        if (wrapped) at[a] = 0;
      }
      if (wrapped) break;
    }
  }
  return runs;
}

std::vector<CellSpec> expand_cells(const ExperimentSpec& spec, const std::vector<RunSpec>& runs) {
  std::vector<CellSpec> cells;
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t e = 0; e < spec.evals.size(); ++e)
      for (size_t k = 0; k < spec.evals[e]->cell_count(); ++k) {
        CellSpec c;
        c.run = int(r);
        c.eval = int(e);
        c.eval_cell = k;
        c.id = spec.evals[e]->cell_id(k);
        cells.push_back(c);
      }
  for (size_t i = 0; i < cells.size(); ++i) cells[i].index = int(i);
  return cells;
}

Shard parse_shard(const std::string& text) {
  Shard s;
  char slash = 0;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%d%c%d%n", &s.index, &slash, &s.count, &consumed) != 3 ||
      slash != '/' || consumed != int(text.size()) || s.count < 1 || s.index < 0 ||
      s.index >= s.count)
    fail("--shard: expected I/N with 0 <= I < N (e.g. 0/4), got '", text, "'");
  return s;
}

bool in_shard(const CellSpec& cell, const Shard& shard) { return cell.index % shard.count == shard.index; }

}  // namespace kvlab
