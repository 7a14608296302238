// Experiment files: the YAML that says which model, which policies and which evaluations to run.
//
// parse_experiment() reads and validates the whole file before anything runs. Every error is a
// kvlab::Error of the form
//     FILE:LINE:COL: KEY.PATH: what was expected, got what (did you mean 'nearest_key'?)
// Unknown keys are errors (with the nearest valid key suggested); a value of the wrong type or
// out of range names its key path. Policy types and parameters are checked against the policy
// registry separately (check_policies), so this file needs no registry to parse.
//
// Schema (see docs/results_schema.md and experiments/*.yaml for complete examples):
//   name: str                         optional, default: the file's stem
//   model: {path, dtype: keep|f32|f16|bf16|q8_0, threads: int (0 = all cores), tokenizer: path}
//   kv: {block_size: int, budget_bytes: int | "64MiB" (0 = room for the model's max_seq_len),
//        format: NAME | [NAMES] (a list is a grid axis), fp8_scale: S | prompt, group_size, residual}
//   engine: {prefill_chunk: int, probe: bool, probe_every: int, probe_layers: [int], max_tokens: int,
//            prefix_reuse: bool}
//   policies: [{name, type, params: {key: scalar | [scalars]}, zip: [key, ...] | [[key, ...], ...]}]
//                                     lists expand as a grid (the cartesian product); the keys of
//                                     one zip group are lists of one length that step together
//   plugins: [path.so]
//   seeds: [int]                      default [0]
//   output: path                      default results/<name>.h5
//   max_cells: int                    refuse grids expanding past this many cells (1000000)
//   evals: {NAME: {...}}            each section parsed by its evaluation (evals/evaluation.h):
//     niah (evals/niah_eval.h), perplexity (evals/perplexity_eval.h), ruler (evals/ruler_eval.h)
// Relative paths are resolved against the current directory, else against the YAML file's
// directory (the first that exists; the current directory when neither does).
#pragma once

#include "framework/core/strings.h"  // nearest_name

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "evals/evaluation.h"
#include "evals/niah_eval.h"
#include "evals/perplexity_eval.h"
#include "framework/experiment/yaml_reader.h"
#include "framework/policy/params.h"

namespace kvlab {

class PolicyFactory;

struct ModelSpec {
  std::filesystem::path path;
  std::string dtype = "keep";       // keep | f32 | f16 | bf16 | q8_0
  int threads = 0;                  // 0 = all cores
  std::filesystem::path tokenizer;  // empty: the one inside the model file
  SourceRef path_ref;
};

struct KvSpec {
  int block_size_tokens = 16;
  uint64_t budget_bytes = 0;  // 0 = the engine's default: room for max_seq_len tokens
  // Storage formats (kernels/common/kv_format.h; f32 is exact). `format: NAME` gives one;
  // `format: [NAMES]` is a grid axis: every policy run once per format (cells.h).
  std::vector<std::string> formats{"f32"};
  double fp8_scale = 1.0;      // fp8 formats: the scale of every (layer, KV head)
  bool fp8_scale_from_prompt = false;  // fp8_scale: prompt (EngineOptions::kv_fp8_scale_from_prompt)
  int group_size = 32;         // int4 / int2 (KIVI): G, and the R newest tokens kept fp32
  int residual = 128;
  // block_tables: per_layer (default) | per_head: one block table per KV head, so per-head budgets
  // (adakv, duo) differ in bytes (KvStore "Per-head block tables"); the numbers are bit-identical.
  bool per_head_tables = false;
  SourceRef format_ref;        // where format was set (errors)
};

struct EngineSpec {
  int prefill_chunk_tokens = 256;
  bool probe = true;   // attention recall / output error against full attention
  int probe_every = 1; // probe every N-th decode step
  std::vector<int> probe_layers;  // layers probed; empty = the engine's default (first, middle, last)
  int64_t max_tokens = 0;  // most tokens per sequence; 0 = the model's max_seq_len (EngineOptions)
  // Prompts sharing a prefix fork its KV instead of prefilling it again (engine_lm.h PrefixCache),
  // in runs whose policy allows it (full attention); results are bit for bit those without.
  bool prefix_reuse = false;
};

// One entry of `policies:` as written (before grid expansion). A parameter holds one value or a
// list (the grid axis).
struct PolicyEntry {
  std::string name;
  std::string type;
  std::vector<std::pair<std::string, std::vector<ParamValue>>> params;  // in file order
  // The grid's axes, each a set of indices into params that step together: a parameter of its
  // own, or a zip group (equal lengths). Ordered by each axis's first parameter in file order.
  std::vector<std::vector<size_t>> axes;
  SourceRef ref;          // the entry
  SourceRef type_ref;
  SourceRef params_ref;
};

// The most cells an experiment may expand to unless its file says otherwise (max_cells:). A
// cell is minutes of compute, and expansion builds every cell in memory: a grid whose lists
// multiply past this is almost always a typo (or one list shared by every key through a YAML
// alias), and is refused before anything is built.
inline constexpr uint64_t kDefaultMaxCells = 1000000;
// Beyond this no max_cells helps: cells are numbered with int.
inline constexpr uint64_t kMaxCellsLimit = (uint64_t{1} << 31) - 1;

struct ExperimentSpec {
  std::string name;
  std::filesystem::path file;  // the YAML file
  std::string yaml_text;       // verbatim, recorded in the results
  ModelSpec model;
  KvSpec kv;
  EngineSpec engine;
  std::vector<PolicyEntry> policies;
  std::vector<std::filesystem::path> plugins;
  std::vector<uint64_t> seeds{0};
  std::filesystem::path output;
  // evals:, one entry per section, in registry order (builtin_evaluations): the cells of a run
  // are numbered in this order.
  std::vector<std::shared_ptr<Evaluation>> evals;
  uint64_t max_cells = kDefaultMaxCells;  // max_cells: in the file (1 .. kMaxCellsLimit)
  SourceRef max_cells_ref;                // where it was set (empty when defaulted)
};

// The evaluation of type T, or nullptr when the file has no such section.
template <class T>
const T* find_evaluation(const ExperimentSpec& spec) {
  for (const auto& e : spec.evals)
    if (const T* t = dynamic_cast<const T*>(e.get())) return t;
  return nullptr;
}
// The NIAH / perplexity sections (a disabled default when absent).
const NiahSpec& niah_spec(const ExperimentSpec& spec);
const PerplexitySpec& perplexity_spec(const ExperimentSpec& spec);

// How many runs and cells the spec expands to (cells.h), counted from the list lengths without
// building anything; saturates at UINT64_MAX instead of wrapping.
struct GridCount {
  uint64_t runs = 0;           // kv.format count x the sum over policy entries of the product of their list lengths
  uint64_t cells_per_run = 0;  // sum over evaluations of their cells
  uint64_t cells = 0;          // runs x cells_per_run
};
GridCount count_grid(const ExperimentSpec& spec);
// Throws kvlab::Error naming the file, the key whose lists multiply most and the limit when
// count_grid(spec).cells exceeds spec.max_cells. parse_experiment_text and expand_runs call it.
void check_grid_size(const ExperimentSpec& spec);

// Parses YAML text; `file` names it in errors and anchors relative paths.
ExperimentSpec parse_experiment_text(const std::string& text, const std::filesystem::path& file);
// Reads and parses a file (error "FILE: cannot read" when absent).
ExperimentSpec parse_experiment(const std::filesystem::path& file);

// Checks that every input file the experiment names exists (model, tokenizer, haystacks, texts,
// plugins); throws naming the key and the path.
void check_files_exist(const ExperimentSpec& spec);

// Looks up a policy type; nullptr when unknown. `known_types` lists all, for suggestions.
struct PolicyLookup {
  std::function<const PolicyFactory*(const std::string&)> find;
  std::function<std::vector<std::string>()> known_types;
};
// Checks each policy's type and every grid point's parameters against the registry
// (unknown type -> nearest registered type suggested; parameter errors name the key path).
void check_policies(const ExperimentSpec& spec, const PolicyLookup& lookup);

// "64MiB", "1.5GB", "4096" -> bytes. Throws kvlab::Error naming `what` on a malformed size.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace kvlab
