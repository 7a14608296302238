// The HDF5 results file (schema: docs/results_schema.md, version kResultsSchemaVersion).
//
//   /                          attributes: schema_version, kvlab_version, git_commit, experiment
//                              (YAML text), name, start_time, end_time, host, model_*, tokenizer,
//                              seeds, cells_total
//   /runs/RUN                  attributes: policy_name, policy_type, param.KEY (typed), params
//   /runs/RUN/cells/CELL       one finished unit of work: attributes + datasets and complete = 1
//                              (files of older builds, written in place, may hold a group without
//                              it: an interrupted cell, deleted on resume, skipped by readers)
//   /runs/RUN/niah, /runs/RUN/perplexity   summaries assembled from the complete cells
//
// Crash safety: the file is never changed in place (HDF5 has no journal, so a kill or a full
// disk in the middle of a write can leave its metadata half written). Every change (a cell, a
// summary, a root attribute) is made by HDF5 to an in-memory image of the file (core driver),
// which kvlab writes to PATH.partial, fsyncs and renames over PATH. At any instant PATH is a
// complete, closed file; a SIGKILL or an error (ENOSPC, EROFS) leaves it as it was before the
// change, at worst beside a stale PATH.partial that the next change overwrites. Each change
// needs room for a second copy of the file. A writer holds an exclusive flock on PATH while it
// replaces it. The default (oldest-compatible) file format is used.
//
// Every open waits (up to 2 minutes) while another process holds the file: HDF5 locks open
// files, so `kvlab report` or h5py reading between two cells must not kill a long run.
//
// This layer is generic: a cell is a set of named attributes and N-d datasets (CellRecord), so
// merge, resume and the tests compare records without knowing what the evals store.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvlab {

// 2: cells record `identity` (resume by cell identity), `policy_type`, `effective_params` and
//    what the policy kept and read; runs record `effective.KEY`. Files of version 1 stay readable.
inline constexpr int kResultsSchemaVersion = 2;

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;
using AttrMap = std::map<std::string, AttrValue>;

// An N-d dataset in row-major order; shape empty = 1-d of data's size.
struct Dataset {
  std::variant<std::vector<float>, std::vector<double>, std::vector<int64_t>, std::vector<int8_t>,
               std::vector<std::string>>
      data;
  std::vector<uint64_t> shape;
  AttrMap attrs;
  size_t size() const;
  std::vector<uint64_t> dims() const;  // shape, or {size()} when shape is empty
};

struct CellRecord {
  AttrMap attrs;
  std::map<std::string, Dataset> datasets;
};

// Names of attributes that measure time or the machine; equal runs differ only in these.
bool is_timing_attr(const std::string& name);

class ResultsFile {
 public:
  // Creates (truncating) a file and writes the root attributes.
  static ResultsFile create(const std::filesystem::path& path, const AttrMap& root_attrs);
  // Opens an existing file for reading and appending. Throws naming the path when it is not a
  // kvlab results file or its schema version is newer than this build's.
  static ResultsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }

  AttrMap root_attrs() const;
  void set_root_attr(const std::string& name, const AttrValue& value);

  // Creates /runs/RUN when absent and (re)writes the given attributes.
  void ensure_run(const std::string& run, const AttrMap& attrs);
  std::vector<std::string> runs() const;
  AttrMap run_attrs(const std::string& run) const;

  // Cells whose complete attribute is set (sorted by name).
  std::vector<std::string> complete_cells(const std::string& run) const;
  bool cell_complete(const std::string& run, const std::string& cell) const;
  // Deletes every cell group of every run that lacks complete = 1; returns how many.
  int delete_incomplete_cells();
  // Writes one cell (replacing an incomplete group of the same name) with complete = 1, as one
  // atomic replacement of the file. Throws if a complete cell of that name exists; on any error
  // the file is unchanged.
  void write_cell(const std::string& run, const std::string& cell, const CellRecord& record);
  CellRecord read_cell(const std::string& run, const std::string& cell) const;
  // A cell's attributes only (no datasets: cheap for reports and identity checks).
  AttrMap cell_attrs(const std::string& run, const std::string& cell) const;
  // The attributes of every complete cell of every run, in one open: run -> cell -> attributes.
  std::map<std::string, std::map<std::string, AttrMap>> all_cell_attrs() const;

  // /peer/RUN/CELL: the peer's answers to a cell's prompts (evals/peer/kvpress_runner.py writes
  // them; docs/results_schema.md), the complete groups only; empty without /peer.
  std::map<std::string, std::map<std::string, CellRecord>> peer_cells() const;
  // Summary groups: /runs/RUN/GROUP/NAME datasets (replaced when present).
  void write_summary(const std::string& run, const std::string& group,
                     const std::map<std::string, Dataset>& datasets, const AttrMap& attrs);
  std::map<std::string, Dataset> read_summary(const std::string& run, const std::string& group,
                                              AttrMap* attrs = nullptr) const;

 private:
  explicit ResultsFile(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// Current UTC time as ISO 8601 ("2026-11-30T18:02:54Z") and the host name.
std::string utc_now_iso8601();
std::string host_name();

}  // namespace kvlab
