// Expansion of an experiment into runs (one per policy grid point) and cells (the unit of work,
// of crash safety and of sharding).
//
//   run  = one policy entry with one value per parameter. A parameter given as a list expands
//          into the cartesian product, in file order, the last parameter varying fastest; the run
//          is named "NAME" (no list) or "NAME@key=value,key=value" (only the listed keys).
//   cell = (run, niah, context length, depth): every seed x trial of that grid point, or
//          (run, perplexity, text file).
// Cells are numbered in a fixed order (runs outer; NIAH lengths, depths; then perplexity texts),
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
};

enum class EvalKind { kNiah, kPerplexity };

struct CellSpec {
  int index = 0;       // global order
  int run = 0;         // index into runs
  EvalKind kind = EvalKind::kNiah;
  int length_idx = 0;  // NIAH: index into context_lengths
  int depth_idx = 0;   // NIAH: index into depths
  int text_idx = 0;    // perplexity: index into text
  std::string id;      // "niah_L1024_D50" / "ppl_T0"
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

// SplitMix64-based seed for one NIAH trial: a pure function of its coordinates, so shards and
// resumed runs draw the same needle values and haystack offsets. The run is deliberately not an
// input: every policy sees the same prompts.
uint64_t trial_seed(uint64_t seed, int64_t context_length, double depth_percent, int trial);

}  // namespace kvlab
