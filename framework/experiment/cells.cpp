#include "framework/experiment/cells.h"

#include <cmath>
#include <cstring>

#include "evals/niah.h"
#include "framework/core/error.h"

namespace kvlab {

std::vector<RunSpec> expand_runs(const ExperimentSpec& spec) {
  check_grid_size(spec);  // counted before anything is built
  std::vector<RunSpec> runs;
  for (size_t e = 0; e < spec.policies.size(); ++e) {
    const PolicyEntry& entry = spec.policies[e];
    // Odometer over the parameter lists, last parameter fastest.
    std::vector<size_t> at(entry.params.size(), 0);
    while (true) {
      RunSpec run;
      run.entry_name = entry.name;
      run.type = entry.type;
      run.entry_index = int(e);
      run.name = entry.name;
      std::string suffix;
      for (size_t p = 0; p < entry.params.size(); ++p) {
        const auto& [key, values] = entry.params[p];
        run.params[key] = values[at[p]];
        if (values.size() > 1) suffix += (suffix.empty() ? "" : ",") + key + "=" + to_string(values[at[p]]);
      }
      if (!suffix.empty()) run.name += "@" + suffix;
      runs.push_back(std::move(run));
      // Advance the odometer; done when the first digit wraps (or there are no digits).
      size_t p = entry.params.size();
      bool wrapped = true;
      while (p > 0 && wrapped) {
        --p;
        wrapped = ++at[p] == entry.params[p].second.size();
        if (wrapped) at[p] = 0;
      }
      if (wrapped) break;
    }
  }
  return runs;
}

std::vector<CellSpec> expand_cells(const ExperimentSpec& spec, const std::vector<RunSpec>& runs) {
  std::vector<CellSpec> cells;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (spec.niah.enabled) {
      for (size_t l = 0; l < spec.niah.context_lengths.size(); ++l)
        for (size_t d = 0; d < spec.niah.depths.size(); ++d) {
          CellSpec c;
          c.run = int(r);
          c.kind = EvalKind::kNiah;
          c.length_idx = int(l);
          c.depth_idx = int(d);
          c.id = str_cat("niah_L", spec.niah.context_lengths[l], "_D", spec.niah.depths[d]);
          cells.push_back(c);
        }
    }
    if (spec.perplexity.enabled) {
      for (size_t t = 0; t < spec.perplexity.text.size(); ++t) {
        CellSpec c;
        c.run = int(r);
        c.kind = EvalKind::kPerplexity;
        c.text_idx = int(t);
        c.id = str_cat("ppl_T", t);
        cells.push_back(c);
      }
    }
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

uint64_t trial_seed(uint64_t seed, int64_t context_length, double depth_percent, int trial) {
  uint64_t depth_bits;
  std::memcpy(&depth_bits, &depth_percent, sizeof depth_bits);
  uint64_t state = seed;
  uint64_t h = splitmix64(state);
  for (uint64_t part : {uint64_t(context_length), depth_bits, uint64_t(trial)}) {
    state = h ^ part;
    h = splitmix64(state);
  }
  return h;
}

}  // namespace kvlab
