// Expansion of an experiment into runs (one per policy grid point) and cells (the unit of work,
// of crash safety and of sharding).
//
//   run  = one policy entry with one value per parameter. A parameter given as a list expands
//          into the cartesian product, in file order, the last parameter varying fastest; the run
//          is named "NAME" (no list) or "NAME@key=value,key=value" (only the listed keys).
//          A list of kv.format values multiplies the runs: every policy run once per format,
//          formats outermost (so the cells of one format are contiguous), named with a last
//          listed key "kv.format=NAME" ("full@kv.format=int4", "win@window=64,kv.format=int8").
//   cell = (run, evaluation, the evaluation's cell): NIAH (context length, depth) with every
//          seed x trial of that grid point, perplexity (text file), RULER (task, length).
// Cells are numbered in a fixed order (runs outer; then the evaluations in registry order, each
// in its own order: NIAH lengths, depths; perplexity texts; RULER tasks, lengths),
// so `--shard I/N` (cells with index % N == I) and `--resume` agree on what a cell is. Each cell
// has a stable string id that names its group in the results file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/experiment/experiment.h"

namespace kvlab {

struct RunSpec {
  std::string name;           // unique, safe as an HDF5 group name
  std::string entry_name;     // the policies[] entry's name
  std::string type;           // registered policy type
  std::map<std::string, ParamValue> params;  // one value each (raw; registry validates)
  int entry_index = 0;        // index into ExperimentSpec::policies
  std::string kv_format = "f32";  // one of ExperimentSpec::kv.formats
};

struct CellSpec {
  int index = 0;         // global order
  int run = 0;           // index into runs
  int eval = 0;          // index into ExperimentSpec::evals
  size_t eval_cell = 0;  // the evaluation's own cell index (Evaluation::cell_id)
  std::string id;        // "niah_L1024_D50" / "ppl_T0" / "ruler_niah_single_1_L1024"
};

std::vector<RunSpec> expand_runs(const ExperimentSpec& spec);
std::vector<CellSpec> expand_cells(const ExperimentSpec& spec, const std::vector<RunSpec>& runs);

// "I/N" with 0 <= I < N -> {I, N}; throws naming the option otherwise.
struct Shard {
  int index = 0;
  int count = 1;
};
Shard parse_shard(const std::string& text);
bool in_shard(const CellSpec& cell, const Shard& shard);

// trial_seed (the seed of one NIAH trial) is in evals/niah.h.

}  // namespace kvlab
