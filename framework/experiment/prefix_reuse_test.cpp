// engine.prefix_reuse (engine_lm.h PrefixCache): a sweep whose prompts share prefixes (NIAH with
// shared_haystack: every depth of a trial hides the same value in the same excerpt; wrong
// answers replay their prompt) gives bit for bit the results of the same sweep without reuse,
// forks a measurable number of prompt tokens in the full-attention run, and none in a run whose
// policy state does not allow it.
#include <gtest/gtest.h>

#include "framework/experiment/run_e2e_test_util.h"

namespace kvlab::e2e_test {
namespace {

std::string reuse_yaml(const std::string& name, bool reuse, const std::string& protocol) {
  const std::string haystack = haystack_file().string();
  // prefill_chunk 32 with block_size 4: fork points at multiples of 32 inside 120- and
  // 200-token prompts; two seeds x two trials per cell, so chains of different trials alternate.
  return "name: " + name + "\nmodel: {path: " + fixture_model().string() + ", threads: 1}\n" +
         "kv: {block_size: 4}\nengine: {probe: false, prefill_chunk: 32, prefix_reuse: " + (reuse ? "true" : "false") +
         "}\npolicies:\n  - {name: full, type: full}\n"
         "  - {name: snap, type: snapkv, params: {compression_ratio: 0.5, window: 8}}\n"
         "seeds: [0, 7]\nevals:\n  niah:\n    haystack: " + haystack +
         "\n    context_lengths: [120, 200]\n    depths: [0, 25, 50, 100]\n    trials: 2\n"
         "    max_answer_tokens: 4\n    shared_haystack: true\n    protocol: " + protocol + "\n"
         "  perplexity:\n    text: " + haystack + "\n    tokens: 160\n";
}

int64_t saved_in(const fs::path& file, const std::string& run) {
  ResultsFile f = ResultsFile::open(file);
  int64_t saved = 0;
  for (const std::string& cell : f.complete_cells(run)) {
    const AttrMap a = f.cell_attrs(run, cell);
    if (auto it = a.find("prefill_tokens_saved"); it != a.end()) saved += std::get<int64_t>(it->second);
  }
  return saved;
}

bool has_saved_attr(const fs::path& file, const std::string& run) {
  ResultsFile f = ResultsFile::open(file);
  for (const std::string& cell : f.complete_cells(run))
    if (f.cell_attrs(run, cell).count("prefill_tokens_saved")) return true;
  return false;
}

class PrefixReuse : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!fs::exists(fixture_model()))
      GTEST_SKIP() << "needs the tiny_models CTest fixture (" << fixture_model() << "): absent";
  }
};

TEST_P(PrefixReuse, SweepWithReuseEqualsOneWithout) {
  const std::string protocol = GetParam();
  const fs::path plain = work_dir() / ("plain_" + protocol + ".h5"), reused = work_dir() / ("reused_" + protocol + ".h5");
  run_experiment(parse_experiment(write_yaml("plain_" + protocol, reuse_yaml("r", false, protocol))), quiet_options(plain));
  run_experiment(parse_experiment(write_yaml("reused_" + protocol, reuse_yaml("r", true, protocol))), quiet_options(reused));
  // The YAML texts differ in prefix_reuse only: compare everything else.
  ResultsFile a = ResultsFile::open(plain), b = ResultsFile::open(reused);
  expect_same_runs(a, b);
  // Full attention forked prompts: at least every depth after the first shares a 32-token
  // chunk of its trial's excerpt (the needle at depth 25 of 120 tokens sits past token 25,
  // i.e. the first 32-token chunk boundary is shared only where the needle is later: lengths
  // 200 give depth 25 at ~45 tokens), so the count is positive; snapkv (its state cannot be
  // copied) forks nothing and records no such attribute.
  EXPECT_GT(saved_in(reused, "full"), 0);
  EXPECT_FALSE(has_saved_attr(reused, "snap"));
  EXPECT_FALSE(has_saved_attr(plain, "full"));
}

INSTANTIATE_TEST_SUITE_P(Protocols, PrefixReuse, ::testing::Values("decode_tail", "query_agnostic", "query_aware"));

}  // namespace
}  // namespace kvlab::e2e_test
