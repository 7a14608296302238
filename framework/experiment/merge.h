// The merge of shard files into one results file (`kvlab merge`), and the cell comparison it and
// the end-to-end tests use. Needs no model: everything is read from the files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "framework/experiment/results.h"

namespace kvlab {

// Joins shard files into `out`: every complete cell of every shard, root attributes of the
// shard whose experiment has the most cells (shards of one sweep grown by resume may differ
// in their YAML), then the summaries. Refuses (an Error naming the files): a file given twice,
// files of another model, a run whose policy or effective parameters differ between files,
// and a cell present in two files (overlapping shards: merge takes each cell once). Returns
// the number of cells.
int merge_results(const std::filesystem::path& out, const std::vector<std::filesystem::path>& shards);

// True when two cell records are equal except for timing attributes (is_timing_attr).
bool same_cell_contents(const CellRecord& a, const CellRecord& b, std::string* difference = nullptr);

}  // namespace kvlab
