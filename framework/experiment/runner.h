// `kvlab run`: executes an experiment's cells on the engine and writes the results file.
//
// Order of work: validate (files, policy types and parameters against the registry with
// plugins loaded), load the model, open or create the results file, then for every cell of
// this shard that is not complete yet: run it, then write it by replacing the file atomically
// (results.h). A SIGKILL or a full disk therefore loses at most the cell in progress; `resume`
// runs what is missing. At the end the summaries are rebuilt and the report printed. A KV pool
// (kv.budget_bytes) too small for a cell stops the run with one error naming the key.
//
// Determinism: a NIAH trial's value and haystack offset depend only on (seed, length, depth,
// trial) (cells.h trial_seed), greedy decoding has no randomness, and the engine is
// deterministic for a fixed thread count, so a resumed or sharded run writes the same contents
// as an uninterrupted one (timing attributes aside).
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "framework/engine/device.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/experiment.h"

namespace kvlab {

struct RunOptions {
  std::filesystem::path output;  // empty: the experiment's output
  bool resume = false;           // continue an existing file (else it must not exist)
  bool overwrite = false;        // replace an existing file
  int threads = -1;              // -1: model.threads from the YAML (0 = all cores)
  Device device = Device::kCpu;  // framework/engine/device.h
  DeviceDtype device_dtype = DeviceDtype::kBf16;  // EngineOptions::device_dtype
  bool dry_run = false;          // list cells and their estimated KV memory, run nothing
  Shard shard;
  std::FILE* progress = stderr;  // nullptr: no progress display
  int progress_interactive = -1; // -1: when `progress` is a terminal
  std::ostream* out = nullptr;   // summary table / dry-run listing (nullptr: std::cout)
};

// Throws kvlab::Error for anything that stops the run (bad input, unreadable files, a device
// that is not there). Returns the number of cells run.
//
// Resume is by cell identity (cell_identity below): a cell of the file is kept when its
// identity equals the one the experiment gives it now, so a comment, a reordered key or an
// added policy or length resumes (only the new cells run); a cell whose settings changed is an
// error naming the first differing line. Files of schema 1 (no identities) resume only with the
// same YAML text.
int run_experiment(const ExperimentSpec& spec, const RunOptions& options);

// Everything about an experiment that can be known without running a cell, checked against
// the model's configuration: context lengths (+ max_answer_tokens) and perplexity windows
// against the model's context or engine.max_tokens, probe layers, and every policy grid point
// built for the model. Throws kvlab::Error naming the key on an impossible setting; returns
// warnings (one line each) for settings that run but measure nothing (a budget at least every
// length, so the run equals full attention; landmark's dense prefill under a prefill-only
// perplexity protocol).
struct ModelConfig;
class PolicyRegistry;
std::vector<std::string> check_experiment_against_model(const ExperimentSpec& spec, const ModelConfig& config,
                                                        const PolicyRegistry& registry);

// The identity of one cell: canonical "key: value" lines naming the experiment, the model's
// digest and weight dtype, the policy type and its effective parameters, the evaluation's
// settings (input files by content digest, not path), the engine settings that change numbers,
// the device and the seeds. Two cells with equal identities compute the same numbers.
struct IdentityInputs {
  std::string model_sha256;
  std::string device;  // the root attribute `device`
  std::map<std::string, std::string> file_sha256;  // input file path -> digest
};
std::string cell_identity(const ExperimentSpec& spec, const RunSpec& run,
                          const std::map<std::string, ParamValue>& effective_params,
                          const CellSpec& cell, const IdentityInputs& inputs);

// Throws "--device cuda: ..." unless `device` can be used by this build and machine.
void check_device(Device device);

}  // namespace kvlab
