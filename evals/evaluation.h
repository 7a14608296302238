// The evaluation registry: what `evals:` in an experiment file may name, like the policy
// registry for `policies:` (framework/policy/registry.h).
//
// An evaluation owns everything about itself that the runner used to know:
//   parse      its YAML section (EvaluationFactory::parse; errors name file:line:col, the key
//              path and the nearest valid key through the shared Reader, yaml_reader.h)
//   cells      the cells of one run, in a fixed order, each with a stable id (its HDF5 group)
//   checks     input files, sizes the model cannot hold (before anything runs), warnings
//   identity   the lines that say what a cell computes (resume and merge compare them)
//   run        one cell against the language-model interface (evals/lm.h, here an EngineLm
//              with its statistics), into a CellRecord built with a ColumnBuilder
//   summarise  /runs/RUN/<name> from the complete cells
// Built-ins register in a fixed order (niah, perplexity, ruler): cells are numbered runs outer,
// then evaluations in registry order, so `--shard` and `--resume` agree whatever the file order.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/experiment/engine_lm.h"
#include "framework/experiment/results.h"
#include "framework/experiment/yaml_reader.h"
#include "framework/model/model.h"
#include "framework/policy/params.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

// The most tokens one sequence may hold, and how to name that limit in an error.
struct TokenLimit {
  int64_t max_tokens = 0;
  std::string what;  // "the model's context (4096 tokens; engine.max_tokens raises it)"
};

// What a cell runs with.
struct EvalContext {
  EngineLm& lm;
  const Tokenizer& tokenizer;
  const ModelConfig& config;
  const std::vector<uint64_t>& seeds;  // the experiment's seeds:
};

// What a summary reads: one run's complete cells.
struct SummaryContext {
  ResultsFile& file;
  const std::string& run;
  const std::set<std::string>& complete;  // complete cell ids of the run
  const std::vector<uint64_t>& seeds;
};

class Evaluation {
 public:
  virtual ~Evaluation() = default;
  virtual std::string name() const = 0;  // its key under evals:
  virtual const SourceRef& ref() const = 0;  // its section in the file

  virtual size_t cell_count() const = 0;
  virtual std::string cell_id(size_t cell) const = 0;

  // (key path, path) of every input file, for check_files_exist and the identity digests.
  virtual std::vector<std::pair<std::string, std::filesystem::path>> input_files() const { return {}; }
  // Tokens one sequence of the cell holds at most (the dry run's KV estimate).
  virtual int64_t cell_tokens(size_t cell) const = 0;
  // The longest input of any cell, for "the budget keeps every token" warnings.
  virtual int64_t longest_tokens() const = 0;
  // Throws kvlab::Error naming the key when a cell cannot fit the limit (validate, --dry-run).
  virtual void check_limit(const TokenLimit& limit) const = 0;
  // A warning (text after "run NAME: ") for a policy setting that cannot differ from full
  // attention under this evaluation; "" for none.
  virtual std::string policy_warning(const std::string& /*type*/,
                                     const std::map<std::string, ParamValue>& /*effective*/) const {
    return "";
  }

  // Reads and tokenizes the inputs once before the cells run; throws naming the key when an
  // input cannot serve (a text too short, a length too small for the needle).
  virtual void prepare(const Tokenizer& tokenizer) = 0;
  // "key: value" lines (each ending in '\n') that identify what the cell computes; `digest`
  // maps an input file to its sha256.
  virtual std::string identity(size_t cell, const std::function<std::string(const std::filesystem::path&)>& digest) const = 0;
  virtual CellRecord run_cell(size_t cell, EvalContext& ctx) const = 0;
  // The progress display's outcome of a finished cell ("accuracy 0.5").
  virtual std::string outcome(const CellRecord& rec) const = 0;
  virtual void summarise(const SummaryContext& ctx) const = 0;
};

// A YAML section handed to a factory.
struct EvalSection {
  const Reader& reader;
  const YAML::Node& node;
  std::string path;             // "evals.niah"
  std::filesystem::path file;   // the YAML file (relative paths)
};

class EvaluationFactory {
 public:
  virtual ~EvaluationFactory() = default;
  virtual std::string name() const = 0;
  virtual std::shared_ptr<Evaluation> parse(const EvalSection& section) const = 0;
};

class EvaluationRegistry {
 public:
  void add(std::unique_ptr<EvaluationFactory> factory);  // throws on a duplicate name
  const EvaluationFactory* find(const std::string& name) const;  // nullptr when unknown
  std::vector<std::string> names() const;  // registration order
 private:
  std::vector<std::unique_ptr<EvaluationFactory>> factories_;
};

// niah, perplexity, ruler (in this order).
const EvaluationRegistry& builtin_evaluations();

}  // namespace kvlab
