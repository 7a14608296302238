// kvlab: entry point. Dispatches to a subcommand (see commands.h); catches kvlab::Error and any
// std::exception so bad input always ends in one readable line and a non-zero exit.
#include <cstdio>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "framework/cli/commands.h"
#include "framework/core/strings.h"
#include "kvlab/version.h"

namespace kvlab::cli {
// Each command is defined in its own cmd_<name>.cpp.
// Declarations: int run_NAME(const std::vector<std::string>& args); one per command file.
// Add yours here and a row to kCommands below.
int run_policies(const std::vector<std::string>& args);
int run_tokenize(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args);
int run_validate(const std::vector<std::string>& args);
int run_merge(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args);
int run_report(const std::vector<std::string>& args);
int run_model_info(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_perplexity(const std::vector<std::string>& args);
int run_models(const std::vector<std::string>& args);
int run_calibrate_heads(const std::vector<std::string>& args);
int run_check_policy(const std::vector<std::string>& args);
}  // namespace kvlab::cli

namespace {

using kvlab::cli::Command;

constexpr Command kCommands[] = {
    // {"name", "summary", &kvlab::cli::run_name},
    {"policies", "list the attention policies (and --plugin ones) with their parameters", &kvlab::cli::run_policies},
    {"tokenize", "encode stdin with a tokenizer and print the ids (or pieces)", &kvlab::cli::run_tokenize},
    {"run", "run an experiment YAML (NIAH, perplexity) into an HDF5 results file", &kvlab::cli::run_run},
    {"validate", "check an experiment YAML without running it", &kvlab::cli::run_validate},
    {"merge", "join the results files of sharded runs (kvlab run --shard I/N)", &kvlab::cli::run_merge},
    {"export", "write a results file's RULER cells in kvpress's evaluation layout", &kvlab::cli::run_export},
    {"report", "print the summary tables of a results file", &kvlab::cli::run_report},
    {"models", "the registered models (scripts/setup_models.sh): names for --model and model.path", &kvlab::cli::run_models},
    {"model-info", "architecture, shapes, dtypes, parameters and KV bytes/token of a model file", &kvlab::cli::run_model_info},
    {"generate", "stream a continuation of a prompt (sampling, --policy)", &kvlab::cli::run_generate},
    {"perplexity", "perplexity of a text file (--protocol chunked: llama.cpp windows; streaming; sliding)", &kvlab::cli::run_perplexity},
    {"calibrate-heads", "retrieval score per layer and KV head from NIAH trials: the duo policy's head file", &kvlab::cli::run_calibrate_heads},
    {"check-policy", "run the policy conformance suite on a --plugin FILE.so (simulator and engine)", &kvlab::cli::run_check_policy},
};

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "kvlab %s (%s) - attention and KV-cache policy experiments for long-context LLMs\n\n"
               "usage: kvlab COMMAND [options]     (kvlab COMMAND --help for its options)\n\n"
               "commands:\n",
               kvlab::kVersion, kvlab::kGitCommit);
  for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "\noptions:\n  -h, --help   this help\n  --version    print the version\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version" || name == "version") {
    std::printf("kvlab %s (%s)\n", kvlab::kVersion, kvlab::kGitCommit);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    std::vector<std::string> args{std::string("kvlab ") + c.name};
    for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
    try {
      return c.run(args);
    } catch (const std::bad_alloc&) {
      // The loaders name their file when they run out of memory; this is everything else.
      std::fprintf(stderr, "kvlab %s: error: out of memory (std::bad_alloc)\n", c.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvlab %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::vector<std::string> names;
  for (const Command& c : kCommands) names.emplace_back(c.name);
  const std::string near = kvlab::nearest_name(name, names);
  if (!near.empty())
    std::fprintf(stderr, "kvlab: unknown command '%s' (did you mean '%s'?; see kvlab --help)\n", name.c_str(),
                 near.c_str());
  else
    std::fprintf(stderr, "kvlab: unknown command '%s' (see kvlab --help)\n", name.c_str());
  return 2;
}
