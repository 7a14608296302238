// End-to-end resumption and sharding of `kvlab run` on a fixture model: SIGKILL + --resume
// equals an uninterrupted run; shards merged equal a single run (and other experiments' shards
// are refused); --resume after a comment, an added policy or a changed setting; cells record
// their identity; merge refuses duplicates; a partial file's report.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "evals/niah.h"
#include "evals/perplexity.h"
#include "framework/engine/device.h"
#include "framework/engine/engine.h"
#include "framework/experiment/cells.h"
#include "framework/experiment/merge.h"
#include "framework/experiment/report.h"
#include "framework/experiment/results.h"
#include "framework/experiment/run_e2e_test_util.h"
#include "framework/experiment/runner.h"
#include "framework/experiment/sha256.h"
#include "framework/model/model.h"
#include "framework/policy/registry.h"
#include "policies/builtin.h"


namespace kvlab {
namespace {

namespace fs = std::filesystem;
using namespace e2e_test;  // NOLINT(google-build-using-namespace): the tests' own helpers

// Runs `spec` as shards 0..n-1 of n into DIR/PREFIXi.h5; returns the files in shard order.
std::vector<fs::path> run_shards(const ExperimentSpec& spec, const fs::path& dir, const std::string& prefix, int n) {
  std::vector<fs::path> shards;
  for (int i = 0; i < n; ++i) {
    RunOptions o = quiet_options(dir / (prefix + std::to_string(i) + ".h5"));
    o.shard = Shard{i, n};
    run_experiment(spec, o);
    shards.push_back(o.output);
  }
  return shards;
}

TEST_F(RunE2e, ShardsMergedEqualASingleRun) {
  const std::vector<fs::path> shards = run_shards(*spec_, work_dir(), "shard", 3);
  for (const fs::path& shard : shards) EXPECT_LT(ResultsFile::open(shard).complete_cells("full").size(), 7u);
  const fs::path merged = work_dir() / "merged.h5";
  EXPECT_EQ(merge_results(merged, shards), 28);
  expect_same_results(reference(), merged);
  // Shards of another experiment are refused.
  const ExperimentSpec other = parse_experiment(write_yaml("other", experiment_yaml("other")));
  RunOptions o = quiet_options(work_dir() / "other.h5");
  o.shard = Shard{0, 28};
  run_experiment(other, o);
  EXPECT_THROW(merge_results(work_dir() / "bad_merge.h5", {shards[0], o.output}), Error);
}

TEST_F(RunE2e, KilledRunResumesToTheSameFile) {
  const fs::path kvlab = fs::path(KVLAB_BINARY_DIR) / "bin/kvlab";
  if (!fs::exists(kvlab)) GTEST_SKIP() << "needs the kvlab executable (" << kvlab << "): absent";
  const fs::path yaml = write_yaml("e2e", experiment_yaml("e2e"));  // same text as the reference
  const fs::path out = work_dir() / "killed.h5";
  const fs::path log = work_dir() / "killed.log";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(kvlab.c_str(), "kvlab", "run", yaml.c_str(), "-o", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill it (SIGKILL: no cleanup at all) as soon as the first cell is reported finished.
  bool killed = false;
  for (int i = 0; i < 6000 && !killed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::ifstream in(log);
    std::stringstream s;
    s << in.rdbuf();
    if (s.str().find("[1/28]") != std::string::npos) {
      kill(pid, SIGKILL);
      killed = true;
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(killed) << "the child never reported a finished cell";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished before it was killed";

  {  // The killed file is valid and holds only finished cells.
    ResultsFile partial = ResultsFile::open(out);
    size_t n = 0;
    for (const auto& run : partial.runs()) n += partial.complete_cells(run).size();
    EXPECT_GE(n, 1u);
    EXPECT_LT(n, 28u);
  }
  const std::string resume = kvlab.string() + " run " + yaml.string() + " -o " + out.string() +
                             " --resume > " + (work_dir() / "resume.log").string() + " 2>&1";
  ASSERT_EQ(std::system(resume.c_str()), 0);
  expect_same_results(reference(), out);
  // Resuming a complete file runs nothing and changes nothing.
  ASSERT_EQ(std::system(resume.c_str()), 0);
  expect_same_results(reference(), out);
}

TEST_F(RunE2e, ResumeAfterACommentRunsNothing) {
  const fs::path out = work_dir() / "comment.h5";
  fs::copy_file(reference(), out, fs::copy_options::overwrite_existing);
  const ExperimentSpec commented =
      parse_experiment(write_yaml("e2e_commented", "# a note about this sweep\n" + experiment_yaml("e2e")));
  RunOptions o = quiet_options(out);
  o.resume = true;
  EXPECT_EQ(run_experiment(commented, o), 0);
  ResultsFile f = ResultsFile::open(out);
  EXPECT_EQ(std::get<std::string>(f.root_attrs().at("experiment")), commented.yaml_text);
  for (const std::string& run : f.runs())
    for (const std::string& cell : f.complete_cells(run)) {
      std::string diff;
      EXPECT_TRUE(same_cell_contents(f.read_cell(run, cell), ResultsFile::open(reference()).read_cell(run, cell), &diff))
          << run << "/" << cell << ": " << diff;
    }
}

TEST_F(RunE2e, ResumeAfterAddingAPolicyRunsOnlyItsCellsAndEqualsAFreshRun) {
  std::string grown = experiment_yaml("e2e");
  const std::string marker = "seeds: [0, 7]\n";
  grown.replace(grown.find(marker), marker.size(),
                "  - {name: landmark, type: landmark, params: {chunk_size: 16, top_k: 2, window: 32}}\n" + marker);
  const ExperimentSpec spec = parse_experiment(write_yaml("e2e_grown", grown));
  const fs::path resumed = work_dir() / "grown_resumed.h5", fresh = work_dir() / "grown_fresh.h5";
  fs::copy_file(reference(), resumed, fs::copy_options::overwrite_existing);
  RunOptions o = quiet_options(resumed);
  o.resume = true;
  EXPECT_EQ(run_experiment(spec, o), 7);  // 2 lengths x 3 depths + 1 text, of the new run only
  run_experiment(spec, quiet_options(fresh));
  expect_same_results(fresh, resumed);
  // The landmark run records its effective parameters (defaults and the written ones).
  const AttrMap run = ResultsFile::open(resumed).run_attrs("landmark");
  EXPECT_EQ(std::get<int64_t>(run.at("effective.chunk_size")), 16);
  EXPECT_EQ(std::get<int64_t>(run.at("effective.sinks")), 4);  // a default
  EXPECT_EQ(std::get<std::string>(run.at("effective.prefill")), "dense");
}

TEST_F(RunE2e, ResumeWithAChangedSettingNamesIt) {
  const fs::path out = work_dir() / "changed.h5";
  fs::copy_file(reference(), out, fs::copy_options::overwrite_existing);
  std::string changed = experiment_yaml("e2e");
  changed.replace(changed.find("recent: 30"), 10, "recent: 31");
  RunOptions o = quiet_options(out);
  o.resume = true;
  try {
    run_experiment(parse_experiment(write_yaml("e2e_changed", changed)), o);
    ADD_FAILURE() << "a changed policy parameter resumed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sinks/"), std::string::npos) << msg;
    EXPECT_NE(msg.find("was 'policy.recent: 30', now 'policy.recent: 31'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  }
}

TEST_F(RunE2e, CellsRecordIdentityEffectiveParametersAndWhatWasRead) {
  ResultsFile f = ResultsFile::open(reference());
  const AttrMap run = f.run_attrs("sinks");
  // Written: sinks, recent; defaulted: rope_positions (its default, "cache").
  EXPECT_EQ(std::get<std::string>(run.at("params")), "recent=30, sinks=2");
  EXPECT_EQ(std::get<std::string>(run.at("effective.rope_positions")), "cache");
  const AttrMap cell = f.cell_attrs("sinks", "niah_L200_D50");
  const std::string identity = std::get<std::string>(cell.at("identity"));
  for (const char* line : {"policy.type: sinks\n", "policy.rope_positions: cache\n", "niah.context_length: 200\n",
                           "seeds: [0,7]\n", "model_sha256: "})
    EXPECT_NE(identity.find(line), std::string::npos) << line << " in\n" << identity;
  EXPECT_EQ(identity.find(fixture_model().string()), std::string::npos) << "paths are not identity";
  // sinks 2 + recent 30 resident, plus the new token: a decode step reads 33 keys per head. The
  // steps (question tail and answer, after the prefill) see between half the prompt and the
  // prompt + max_answer_tokens 4.
  EXPECT_DOUBLE_EQ(std::get<double>(cell.at("keys_read_mean")), 33.0);
  EXPECT_GT(std::get<double>(cell.at("keys_seen_mean")), 100.0);
  EXPECT_LE(std::get<double>(cell.at("keys_seen_mean")), 204.0);
  EXPECT_DOUBLE_EQ(std::get<double>(cell.at("kv_read_bytes_per_layer_head")), 33.0 * 2 * 64 * 4);  // head_dim 64, fp32
  // (every parameter with its value, the budget convention's two included: POLICIES.md 9)
  EXPECT_EQ(std::get<std::string>(cell.at("effective_params")),
            "budget_tokens=0, compression_ratio=0, recent=30, rope_positions=cache, sinks=2");
  const AttrMap full = f.cell_attrs("full", "niah_L200_D50");
  EXPECT_DOUBLE_EQ(std::get<double>(full.at("keys_read_mean")), std::get<double>(full.at("keys_seen_mean")));
}

TEST_F(RunE2e, MergeRefusesDuplicateCellsAndTheSameShardTwice) {
  const std::vector<fs::path> shards = run_shards(*spec_, work_dir(), "dup", 2);
  auto error_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of([&] { merge_results(work_dir() / "dup_a.h5", {shards[0], shards[1], shards[0]}); });
  EXPECT_NE(e.find("given twice"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(work_dir() / "dup_a.h5"));
  // A copy of a shard under another name: its cells are duplicates.
  const fs::path copy = work_dir() / "dup0_copy.h5";
  fs::copy_file(shards[0], copy, fs::copy_options::overwrite_existing);
  e = error_of([&] { merge_results(work_dir() / "dup_b.h5", {shards[0], shards[1], copy}); });
  EXPECT_NE(e.find("is in both"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(work_dir() / "dup_b.h5"));
  EXPECT_EQ(merge_results(work_dir() / "dup_ok.h5", shards), 28);
  expect_same_results(reference(), work_dir() / "dup_ok.h5");
}

TEST_F(RunE2e, ReportOfAPartialFileShowsWhatIsComplete) {
  RunOptions o = quiet_options(work_dir() / "partial.h5");
  o.shard = Shard{0, 3};  // 10 of 28 cells
  run_experiment(*spec_, o);
  ResultsFile f = ResultsFile::open(o.output);
  std::ostringstream text, json, csv;
  print_report(f, text);
  print_report(f, json, ReportFormat::kJson);
  print_report(f, csv, ReportFormat::kCsv);
  const std::string t = text.str();
  EXPECT_NE(t.find("cells complete: 10 / 28  (partial file"), std::string::npos) << t;
  EXPECT_EQ(t.find("nan"), std::string::npos) << t;
  // Natural order: win@window=16 before win@window=48; per-length table; keys read.
  EXPECT_LT(t.find("win@window=16"), t.find("win@window=48")) << t;
  EXPECT_NE(t.find("NIAH accuracy by context length"), std::string::npos) << t;
  EXPECT_NE(t.find("keys_read"), std::string::npos) << t;
  EXPECT_NE(t.find("rope_positions=cache"), std::string::npos) << t;  // a default, listed
  EXPECT_NE(json.str().find("\"cells_complete\": 10"), std::string::npos) << json.str();
  const std::string c = csv.str();
  EXPECT_EQ(std::count(c.begin(), c.end(), '\n'), 11) << c;  // header + 10 cells
  // The accuracy in the report equals the mean of the complete cells' accuracies.
  double sum = 0;
  int n = 0;
  for (const std::string& cell : f.complete_cells("full"))
    if (cell.rfind("niah_", 0) == 0) sum += std::get<double>(f.cell_attrs("full", cell).at("accuracy")), ++n;
  ASSERT_GT(n, 0);
  char expected[32];
  std::snprintf(expected, sizeof expected, "%.3f", sum / n);
  const size_t row = t.find("\nfull ");
  ASSERT_NE(row, std::string::npos) << t;
  EXPECT_NE(t.substr(row, t.find('\n', row + 1) - row).find(expected), std::string::npos) << t;
}

}  // namespace
}  // namespace kvlab
