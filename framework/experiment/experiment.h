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
//   kv: {block_size: int, budget_bytes: int | "64MiB" (0 = room for the model's max_seq_len)}
//   engine: {prefill_chunk: int, probe: bool, probe_every: int, probe_layers: [int], max_tokens: int}
//   policies: [{name, type, params: {key: scalar | [scalars]}}]   lists expand as a grid
//   plugins: [path.so]
//   seeds: [int]                      default [0]
//   output: path                      default results/<name>.h5
//   max_cells: int                    refuse grids expanding past this many cells (1000000)
//   evals:
//     niah: {haystack: path | [paths], context_lengths: [int], depths: [0..100], trials: int,
//            needle: str with {value}, question: str, value_digits: int,
//            needle_placement: nearest|previous,
//            max_answer_tokens: int, decode_tail_tokens: int | "question",
//            protocol: decode_tail|query_agnostic|query_aware}
//     perplexity: {text: path | [paths], tokens: int, protocol: streaming|chunked|sliding,
//                  n_ctx: int (chunked), window: int, stride: int (sliding), checkpoints: [int]}
// Relative paths are resolved against the current directory, else against the YAML file's
// directory (the first that exists; the current directory when neither does).
#pragma once

#include "framework/core/strings.h"  // nearest_name

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "evals/niah.h"
#include "evals/perplexity.h"
#include "framework/policy/params.h"

namespace kvlab {

class PolicyFactory;

// Where a value came from, for error messages after parsing (registry checks, missing files).
struct SourceRef {
  std::string file;
  int line = 0;          // 1-based; 0 = unknown
  int column = 0;        // 1-based
  std::string key_path;  // "policies[2].params.budget"
  std::string str() const;  // "file:line:col: key.path"
};

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
  std::string format = "f32";  // storage format (kernels/common/kv_format.h); f32 is exact
  double fp8_scale = 1.0;      // fp8 formats: the scale of every (layer, KV head)
  int group_size = 32;         // int4 / int2 (KIVI): G, and the R newest tokens kept fp32
  int residual = 128;
  SourceRef format_ref;        // where format was set (errors)
};

struct EngineSpec {
  int prefill_chunk_tokens = 256;
  bool probe = true;   // attention recall / output error against full attention
  int probe_every = 1; // probe every N-th decode step
  std::vector<int> probe_layers;  // layers probed; empty = the engine's default (first, middle, last)
  int64_t max_tokens = 0;  // most tokens per sequence; 0 = the model's max_seq_len (EngineOptions)
};

// One entry of `policies:` as written (before grid expansion). A parameter holds one value or a
// list (the grid axis).
struct PolicyEntry {
  std::string name;
  std::string type;
  std::vector<std::pair<std::string, std::vector<ParamValue>>> params;  // in file order
  SourceRef ref;          // the entry
  SourceRef type_ref;
  SourceRef params_ref;
};

struct NiahSpec {
  bool enabled = false;
  std::vector<std::filesystem::path> haystack;
  std::vector<int> context_lengths;
  std::vector<double> depths;  // percent, 0..100
  int trials = 1;
  std::string needle = "The special magic number is {value}.";
  std::string question = "What is the special magic number? The special magic number is";
  int value_digits = 7;
  NeedlePlacement needle_placement = NeedlePlacement::kNearest;  // evals/niah.h
  int max_answer_tokens = 12;
  int decode_tail_tokens = -1;  // -1 = the question's tokens
  NiahProtocol protocol = NiahProtocol::kDecodeTail;  // evals/niah.h
  SourceRef ref;
};

struct PerplexitySpec {
  bool enabled = false;
  std::vector<std::filesystem::path> text;
  int tokens = 2048;  // tokens taken from the start of each text (after BOS)
  PplProtocol protocol = PplProtocol::kStreaming;
  int n_ctx = 512;    // chunked: window length
  int window = 1024;  // sliding: window length
  int stride = 512;   // sliding: stride
  std::vector<int> checkpoints;  // running PPL after this many scored tokens (default: powers of 2)
  SourceRef ref;
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
  NiahSpec niah;
  PerplexitySpec perplexity;
  uint64_t max_cells = kDefaultMaxCells;  // max_cells: in the file (1 .. kMaxCellsLimit)
  SourceRef max_cells_ref;                // where it was set (empty when defaulted)
};

// How many runs and cells the spec expands to (cells.h), counted from the list lengths without
// building anything; saturates at UINT64_MAX instead of wrapping.
struct GridCount {
  uint64_t runs = 0;           // sum over policy entries of the product of their list lengths
  uint64_t cells_per_run = 0;  // NIAH lengths x depths + perplexity texts
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
