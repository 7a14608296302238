// Test support for the end-to-end tests of `kvlab run` (run_e2e_test.cpp, run_resume_test.cpp):
// the fixture model, a scratch directory per test process, a haystack, the shared experiment
// YAML, quiet run options, the comparison of two results files up to timing, and the RunE2e
// fixture with its uninterrupted reference run.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "evals/niah.h"
#include "framework/experiment/experiment.h"
#include "framework/experiment/merge.h"
#include "framework/experiment/results.h"
#include "framework/experiment/runner.h"

namespace kvlab::e2e_test {

namespace fs = std::filesystem;

inline fs::path fixture_model() {
  return fs::path(KVLAB_BINARY_DIR) / "fixtures/llama_hd64_gqa2_untied/model.gguf";
}

inline fs::path work_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("kvlab_e2e_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// English-like text with sentence ends, written once.
inline fs::path haystack_file() {
  const fs::path p = work_dir() / "haystack.txt";
  if (!fs::exists(p)) {
    std::ofstream out(p);
    const char* words[] = {"the", "river", "ran", "past", "a", "quiet", "town", "where", "people",
                           "kept", "bees", "and", "read", "old", "books", "in", "winter"};
    uint64_t s = 3;
    for (int sentence = 0; sentence < 400; ++sentence) {
      const int n = 5 + int(splitmix64(s) % 9);
      for (int w = 0; w < n; ++w) out << (w ? " " : "") << words[splitmix64(s) % 17];
      out << ". ";
    }
  }
  return p;
}

// The evals: section both experiments share: NIAH over the given lengths and depths, then
// 160 tokens of streaming perplexity on the same haystack (the last line of the YAML text).
inline std::string evals_yaml(const std::string& context_lengths, const std::string& depths) {
  const std::string haystack = haystack_file().string();
  return "evals:\n  niah:\n    haystack: " + haystack + "\n    context_lengths: " + context_lengths +
         "\n    depths: " + depths + "\n    trials: 1\n    max_answer_tokens: 4\n  perplexity:\n" +
         "    text: " + haystack + "\n    tokens: 160\n    protocol: streaming\n";
}

inline std::string experiment_yaml(const std::string& name, int threads = 1) {
  return "name: " + name + "\nmodel: {path: " + fixture_model().string() + ", threads: " +
         std::to_string(threads) + "}\n" +
         R"(kv: {block_size: 4}
engine: {probe: true, probe_every: 2}
policies:
  - {name: full, type: full}
  - {name: win, type: sliding_window, params: {window: [16, 48]}}
  - {name: sinks, type: sinks, params: {sinks: 2, recent: 30}}
seeds: [0, 7]
)" + evals_yaml("[120, 200]", "[0, 50, 100]") + "    checkpoints: [10, 100]\n";
}

inline fs::path write_yaml(const std::string& name, const std::string& text) {
  const fs::path p = work_dir() / (name + ".yaml");
  std::ofstream(p) << text;
  return p;
}

inline RunOptions quiet_options(const fs::path& out) {
  RunOptions o;
  o.output = out;
  o.progress = nullptr;
  static std::ostringstream sink;
  o.out = &sink;
  return o;
}

// Equal up to timing attributes: runs, every complete cell, every summary.
inline void expect_same_runs(ResultsFile& a, ResultsFile& b) {
  ASSERT_EQ(a.runs(), b.runs());
  for (const std::string& run : a.runs()) {
    EXPECT_EQ(a.run_attrs(run), b.run_attrs(run)) << run;
    ASSERT_EQ(a.complete_cells(run), b.complete_cells(run)) << run;
    for (const std::string& cell : a.complete_cells(run)) {
      std::string diff;
      EXPECT_TRUE(same_cell_contents(a.read_cell(run, cell), b.read_cell(run, cell), &diff))
          << run << "/" << cell << ": " << diff;
    }
    for (const char* group : {"niah", "perplexity"}) {
      const auto sa = a.read_summary(run, group), sb = b.read_summary(run, group);
      ASSERT_EQ(sa.size(), sb.size()) << run << "/" << group;
      for (const auto& [name, ds] : sa) {
        if (name == "tokens_per_s") continue;  // timing
        CellRecord ca, cb;
        ca.datasets[name] = ds;
        cb.datasets[name] = sb.at(name);
        std::string diff;
        EXPECT_TRUE(same_cell_contents(ca, cb, &diff)) << run << "/" << group << "/" << name << ": " << diff;
      }
    }
  }
}

// expect_same_runs, and the root attributes naming the experiment, model and seeds.
inline void expect_same_results(const fs::path& a_path, const fs::path& b_path) {
  SCOPED_TRACE(a_path.string() + " vs " + b_path.string());
  ResultsFile a = ResultsFile::open(a_path), b = ResultsFile::open(b_path);
  const AttrMap ra = a.root_attrs(), rb = b.root_attrs();
  for (const char* key : {"experiment", "model_sha256", "model_config", "tokenizer", "seeds", "schema_version"})
    EXPECT_EQ(ra.at(key), rb.at(key)) << key;
  expect_same_runs(a, b);
}

class RunE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(fixture_model())) return;
    spec_ = new ExperimentSpec(parse_experiment(write_yaml("e2e", experiment_yaml("e2e"))));
  }
  // The uninterrupted, unsharded run, made on first use (ctest runs each test in its own process).
  static const fs::path& reference() {
    if (reference_.empty()) {
      reference_ = work_dir() / "reference.h5";
      run_experiment(*spec_, quiet_options(reference_));
    }
    return reference_;
  }
  static void TearDownTestSuite() {
    delete spec_;
    spec_ = nullptr;
    fs::remove_all(work_dir());
  }
  void SetUp() override {
    if (!fs::exists(fixture_model()))
      GTEST_SKIP() << "needs the tiny_models CTest fixture (" << fixture_model() << "): absent";
  }
  inline static ExperimentSpec* spec_ = nullptr;
  inline static fs::path reference_;
};

}  // namespace kvlab::e2e_test
