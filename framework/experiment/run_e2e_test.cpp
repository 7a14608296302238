// End-to-end: tiny experiments on a fixture model (random weights: mechanics and file contents,
// not accuracy), read back from HDF5; streaming, chunked and sliding perplexity equal their
// definitions; dry runs, existing outputs, validation, devices and a KV budget too small.
// (Resume, shards and merge: run_resume_test.cpp.)
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

TEST_F(RunE2e, ResultsReadBackWithValuesAttributesAndShapes) {
  ResultsFile f = ResultsFile::open(reference());
  const AttrMap root = f.root_attrs();
  EXPECT_EQ(std::get<int64_t>(root.at("schema_version")), kResultsSchemaVersion);
  EXPECT_EQ(std::get<std::string>(root.at("experiment")), spec_->yaml_text);
  EXPECT_EQ(std::get<std::string>(root.at("model_sha256")), sha256_of_path(fixture_model()));
  EXPECT_EQ(std::get<std::vector<int64_t>>(root.at("seeds")), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(std::get<int64_t>(root.at("cells_total")), 4 * 7);
  for (const char* key : {"kvlab_version", "git_commit", "start_time", "end_time", "host", "model_path",
                          "model_config", "tokenizer", "model_format"})
    EXPECT_TRUE(root.count(key)) << key;

  EXPECT_EQ(f.runs(), (std::vector<std::string>{"full", "sinks", "win@window=16", "win@window=48"}));
  const AttrMap win = f.run_attrs("win@window=16");
  EXPECT_EQ(std::get<std::string>(win.at("policy_type")), "sliding_window");
  EXPECT_EQ(std::get<std::string>(win.at("policy_name")), "win");
  EXPECT_EQ(std::get<int64_t>(win.at("param.window")), 16);

  const std::unique_ptr<Model> model = load_model(fixture_model());
  const Haystack hay = make_haystack(*model->tokenizer, [] {
    std::ifstream in(haystack_file());
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }());
  for (const std::string& run : f.runs()) {
    SCOPED_TRACE(run);
    EXPECT_EQ(f.complete_cells(run).size(), 7u);
    const auto niah = f.read_summary(run, "niah");
    EXPECT_EQ(niah.at("correct").dims(), (std::vector<uint64_t>{2, 3, 2}));
    EXPECT_EQ(niah.at("accuracy").dims(), (std::vector<uint64_t>{2, 3}));
    for (int8_t c : std::get<std::vector<int8_t>>(niah.at("correct").data)) EXPECT_TRUE(c == 0 || c == 1);
    // Needle positions and values are those of the seeded prompts, for every policy.
    const auto& pos = std::get<std::vector<int64_t>>(niah.at("needle_positions").data);
    const auto& values = std::get<std::vector<std::string>>(niah.at("values").data);
    int i = 0;
    for (int length : {120, 200})
      for (double depth : {0.0, 50.0, 100.0})
        for (uint64_t seed : {0, 7}) {
          const NiahPrompt p = build_niah_prompt(*model->tokenizer, hay, NiahOptions{}, length, depth,
                                                 trial_seed(seed, length, depth, 0));
          EXPECT_EQ(pos[i], p.needle_pos);
          EXPECT_EQ(values[i], p.value);
          ++i;
        }
    const CellRecord cell = f.read_cell(run, "niah_L200_D50");
    EXPECT_EQ(std::get<int64_t>(cell.attrs.at("context_length")), 200);
    EXPECT_EQ(cell.datasets.at("answers").size(), 2u);
    for (int64_t b : std::get<std::vector<int64_t>>(cell.datasets.at("kv_bytes_peak").data)) EXPECT_GT(b, 0);
    for (double r : std::get<std::vector<double>>(cell.datasets.at("recall_mean").data)) {
      EXPECT_GT(r, 0.0);
      EXPECT_LE(r, 1.0 + 1e-6);
      if (run == "full") {
        EXPECT_NEAR(r, 1.0, 1e-4);
      }
    }

    // Per-layer probes: one entry per probed layer, pooling back to the cell's attributes.
    for (const char* name : {"niah_L200_D50", "ppl_T0"}) {
      SCOPED_TRACE(name);
      const CellRecord c = f.read_cell(run, name);
      const auto& layers = std::get<std::vector<int64_t>>(c.datasets.at("probe_layers").data);
      const auto& samples = std::get<std::vector<int64_t>>(c.datasets.at("probe_samples_per_layer").data);
      const auto& recall = std::get<std::vector<double>>(c.datasets.at("attention_recall_per_layer").data);
      const auto& err = std::get<std::vector<double>>(c.datasets.at("output_rel_error_per_layer").data);
      const int n_layers = model->config.n_layers;
      std::vector<int64_t> want_layers = {0, n_layers / 2, n_layers - 1};  // the engine's default
      want_layers.erase(std::unique(want_layers.begin(), want_layers.end()), want_layers.end());
      EXPECT_EQ(layers, want_layers);
      ASSERT_EQ(samples.size(), layers.size());
      ASSERT_EQ(recall.size(), layers.size());
      ASSERT_EQ(err.size(), layers.size());
      int64_t n = 0;
      double recall_sum = 0, err_sum = 0;
      for (size_t l = 0; l < layers.size(); ++l) {
        EXPECT_GT(samples[l], 0);
        EXPECT_GT(recall[l], 0.0);
        EXPECT_LE(recall[l], 1.0 + 1e-6);
        EXPECT_GE(err[l], 0.0);
        if (run == "full") {
          EXPECT_NEAR(recall[l], 1.0, 1e-4);
        }
        n += samples[l];
        recall_sum += recall[l] * double(samples[l]);
        err_sum += err[l] * double(samples[l]);
      }
      EXPECT_EQ(n, std::get<int64_t>(c.attrs.at("probe_samples")));
      EXPECT_NEAR(recall_sum / double(n), std::get<double>(c.attrs.at("recall_mean")), 1e-9);
      EXPECT_NEAR(err_sum / double(n), std::get<double>(c.attrs.at("rel_error_mean")), 1e-9);
    }

    const CellRecord ppl = f.read_cell(run, "ppl_T0");
    const auto& nll = std::get<std::vector<float>>(ppl.datasets.at("nll").data);
    ASSERT_EQ(nll.size(), 159u);
    double mean = 0;
    for (float x : nll) mean += x / 159.0;
    EXPECT_NEAR(std::get<double>(ppl.attrs.at("ppl")), std::exp(mean), 1e-3 * std::exp(mean));
    EXPECT_EQ(std::get<std::vector<int64_t>>(ppl.datasets.at("checkpoints").data), (std::vector<int64_t>{10, 100}));
    EXPECT_EQ(ppl.datasets.at("running_ppl").size(), 2u);
    EXPECT_EQ(std::get<std::string>(ppl.attrs.at("protocol")), "streaming");
  }
  // A window of 16 keeps fewer KV bytes than full attention.
  const auto kv_of = [&](const std::string& run) {
    return std::get<int64_t>(f.read_cell(run, "ppl_T0").attrs.at("kv_bytes_peak"));
  };
  EXPECT_LT(kv_of("win@window=16"), kv_of("full"));
}

TEST_F(RunE2e, StreamingPerplexityEqualsADenseForwardPass) {
  // Full attention, token by token through decode, must give the NLLs of one dense prefill
  // with all logits: -log softmax(logits[i-1])[tokens[i]].
  ResultsFile f = ResultsFile::open(reference());
  const CellRecord cell = f.read_cell("full", "ppl_T0");
  const auto& nll = std::get<std::vector<float>>(cell.datasets.at("nll").data);
  const std::unique_ptr<Model> model = load_model(fixture_model());
  std::ifstream in(haystack_file());
  std::stringstream s;
  s << in.rdbuf();
  std::vector<int32_t> tokens = model->tokenizer->encode(s.str(), EncodeOptions{.add_bos = true});
  tokens.resize(160);
  EngineOptions eo;
  eo.threads = 1;
  Engine engine(*model, eo);
  const SeqId seq = engine.start_sequence();
  std::vector<float> logits;
  ASSERT_EQ(engine.prefill(seq, tokens, logits, true), StepStatus::kOk);
  const int vocab = model->config.vocab_size;
  ASSERT_EQ(nll.size(), tokens.size() - 1);
  for (size_t i = 1; i < tokens.size(); ++i) {
    const double direct = -log_prob(std::span(logits.data() + (i - 1) * vocab, size_t(vocab)), tokens[i]);
    EXPECT_NEAR(nll[i - 1], direct, 2e-3 * std::max(1.0, direct)) << i;
  }
}

// Chunked (llama.cpp) and sliding (Hugging Face) protocols through `kvlab run` against the
// definitions written out here with dense prefills of the tiny model.
TEST_F(RunE2e, ChunkedAndSlidingPerplexityMatchTheirDefinitions) {
  const std::unique_ptr<Model> model = load_model(fixture_model());
  std::ifstream in(haystack_file());
  std::stringstream text;
  text << in.rdbuf();
  EngineOptions eo;
  eo.threads = 1;
  Engine engine(*model, eo);
  // -log p(tokens[i] | window[0 .. i - begin)) from one dense prefill of `window`.
  auto window_nll = [&](const std::vector<int32_t>& window, int64_t j) {
    const SeqId seq = engine.start_sequence();
    std::vector<float> logits;
    EXPECT_EQ(engine.prefill(seq, std::span(window.data(), size_t(j)), logits, false), StepStatus::kOk);
    engine.end_sequence(seq);
    return -log_prob(logits, window[j]);
  };
  for (const char* protocol : {"chunked", "sliding"}) {
    SCOPED_TRACE(protocol);
    const std::string yaml = "model: {path: " + fixture_model().string() + ", threads: 1}\n" +
                             "policies: [{type: full}]\nevals:\n  perplexity:\n    text: " +
                             haystack_file().string() + "\n    protocol: " + protocol +
                             "\n    tokens: 140\n    n_ctx: 64\n    window: 48\n    stride: 20\n";
    const ExperimentSpec spec = parse_experiment(write_yaml(protocol, yaml));
    const fs::path out = work_dir() / (std::string(protocol) + ".h5");
    run_experiment(spec, quiet_options(out));
    const CellRecord cell = ResultsFile::open(out).read_cell("full", "ppl_T0");
    const auto& nll = std::get<std::vector<float>>(cell.datasets.at("nll").data);
    const auto& pos = std::get<std::vector<int64_t>>(cell.datasets.at("positions").data);
    std::vector<int32_t> tokens = model->tokenizer->encode(text.str(), EncodeOptions{.add_bos = true});
    tokens.resize(140);
    std::vector<std::pair<int64_t, double>> expected;  // (position, nll)
    if (std::string(protocol) == "chunked") {
      for (int c = 0; c < 2; ++c) {  // floor(140 / 64) windows, BOS first, second half scored
        std::vector<int32_t> w(tokens.begin() + c * 64, tokens.begin() + (c + 1) * 64);
        w[0] = model->tokenizer->bos_id();
        for (int j = 33; j < 64; ++j) expected.emplace_back(c * 64 + j, window_nll(w, j));
      }
    } else {
      // Windows [b, b + 48) for b = 0, 20, 40, ...; each token once, after the previous window.
      int64_t prev_end = 0;
      for (int64_t b = 0; b < 140; b += 20) {
        const int64_t e = std::min<int64_t>(b + 48, 140);
        std::vector<int32_t> w(tokens.begin() + b, tokens.begin() + e);
        for (int64_t i = std::max(prev_end, b + 1); i < e; ++i) expected.emplace_back(i, window_nll(w, i - b));
        prev_end = e;
        if (e == 140) break;
      }
      EXPECT_EQ(expected.size(), 139u);
    }
    ASSERT_EQ(nll.size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ(pos[k], expected[k].first) << k;
      EXPECT_NEAR(nll[k], expected[k].second, 2e-3 * std::max(1.0, expected[k].second)) << k;
    }
  }
}

TEST_F(RunE2e, DryRunListsCellsWithKvEstimates) {
  RunOptions o = quiet_options(work_dir() / "dry.h5");
  std::ostringstream listing;
  o.out = &listing;
  o.dry_run = true;
  o.shard = Shard{1, 2};
  run_experiment(*spec_, o);
  EXPECT_FALSE(fs::exists(o.output));
  EXPECT_NE(listing.str().find("win@window=16"), std::string::npos) << listing.str();
  EXPECT_NE(listing.str().find("14 of 28 cells"), std::string::npos) << listing.str();
}

TEST_F(RunE2e, ExistingOutputIsNotOverwrittenAndCudaIsChecked) {
  try {
    run_experiment(*spec_, quiet_options(reference()));
    ADD_FAILURE() << "an existing results file was overwritten";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists (--resume continues it, --overwrite replaces it)"),
              std::string::npos) << e.what();
  }
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is present (RunE2e.CudaRunAgreesWithTheCpuRun)";
  RunOptions o = quiet_options(work_dir() / "cuda.h5");
  o.device = Device::kCuda;
  try {
    run_experiment(*spec_, o);
    ADD_FAILURE() << "--device cuda ran on a machine without a usable GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--device cuda"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(o.output));
}

// Resume by cell identity: a YAML that differs only by a comment resumes a finished file and
// runs nothing; one that adds a policy runs only that policy's cells, and the file then equals a
// fresh run of the grown experiment.
TEST_F(RunE2e, ValidationCatchesAnImpossibleContextLength) {
  std::string yaml = experiment_yaml("e2e");
  yaml.replace(yaml.find("context_lengths: [120, 200]"), 27, "context_lengths: [120, 8192]");
  const ExperimentSpec spec = parse_experiment(write_yaml("e2e_long", yaml));
  LoadOptions load;
  load.load_tokenizer = false;
  const auto model = load_model(spec.model.path, load);
  PolicyRegistry registry = make_builtin_registry();
  try {
    check_experiment_against_model(spec, model->config, registry);
    ADD_FAILURE() << "8192 tokens accepted on a model of " << model->config.max_seq_len;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("evals.niah.context_lengths[1]: 8192"), std::string::npos) << msg;
    EXPECT_NE(msg.find("exceeds the model's context"), std::string::npos) << msg;
  }
  // The dry run checks it too, before listing anything.
  RunOptions o = quiet_options(work_dir() / "long.h5");
  o.dry_run = true;
  EXPECT_THROW(run_experiment(spec, o), Error);
  // A budget that keeps every token is named (the run equals full attention).
  std::string wide = experiment_yaml("e2e");
  wide.replace(wide.find("window: [16, 48]"), 16, "window: [16, 4096]");
  const auto warnings = check_experiment_against_model(parse_experiment(write_yaml("e2e_wide", wide)), model->config,
                                                       registry);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("win@window=4096"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("equals full attention"), std::string::npos) << warnings[0];
}

// The whole experiment through the device path gives the CPU run's numbers: every cell's NIAH
// accuracy and perplexity, for every policy. "emulated" (the device plans on CPU loops) always;
// "cuda" in fp32 on a GPU.
void expect_device_run_agrees(const ExperimentSpec& spec, const fs::path& reference, const std::string& device,
                              const std::string& dtype) {
  RunOptions o = quiet_options(work_dir() / (device + "_" + dtype + ".h5"));
  o.device = parse_device(device);
  o.device_dtype = parse_device_dtype(dtype);
  run_experiment(spec, o);
  ResultsFile cpu = ResultsFile::open(reference), dev = ResultsFile::open(o.output);
  ASSERT_EQ(cpu.runs(), dev.runs());
  int compared = 0;
  for (const std::string& run : cpu.runs()) {
    ASSERT_EQ(cpu.complete_cells(run), dev.complete_cells(run)) << run;
    for (const std::string& cell : cpu.complete_cells(run)) {
      const AttrMap a = cpu.read_cell(run, cell).attrs, b = dev.read_cell(run, cell).attrs;
      for (const char* key : {"accuracy", "ppl"}) {
        if (!a.count(key)) continue;
        const double x = std::get<double>(a.at(key)), y = std::get<double>(b.at(key));
        EXPECT_NEAR(x, y, 1e-3 * std::max(1.0, std::fabs(x))) << run << " " << cell << " " << key;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 20);
  EXPECT_EQ(std::get<std::string>(dev.root_attrs().at("device")).rfind(device, 0), 0u);
}

TEST_F(RunE2e, EmulatedDeviceRunAgreesWithTheCpuRun) {
  expect_device_run_agrees(*spec_, reference(), "emulated", "bf16");
}

TEST_F(RunE2e, CudaRunAgreesWithTheCpuRun) {
  if (!cuda_device_available()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda_device_summary();
  expect_device_run_agrees(*spec_, reference(), "cuda", "f32");
}

// A KV pool (kv.budget_bytes) too small for some cells, through the kvlab executable: one clear
// error naming the key, the cell and what it needed, a non-zero exit, and the cells finished
// before it (a sliding window fits) complete in the file. A pool that cannot hold one token is
// refused before any file is written.
// kv.format as a grid axis through a run: each run records its format and bytes per token,
// the f32 runs' cells equal a single-format f32 experiment's cells dataset for dataset (one engine
// per format, built afresh: nothing leaks from one format's store into the next), and the int8
// runs hold fewer bytes per token.
TEST_F(RunE2e, KvFormatGridRunsEachPolicyOncePerFormat) {
  auto yaml = [&](const std::string& name, const std::string& formats) {
    return "name: " + name + "\nmodel: {path: " + fixture_model().string() + ", threads: 1}\n" +
           "kv: {block_size: 4, format: " + formats + "}\n" + R"(engine: {probe: false}
policies:
  - {name: full, type: full}
  - {name: win, type: sliding_window, params: {window: 24}}
seeds: [0]
)" + evals_yaml("[120]", "[50]");
  };
  const fs::path grid = work_dir() / "format_grid.h5", single = work_dir() / "format_f32.h5";
  run_experiment(parse_experiment(write_yaml("format_grid", yaml("format_grid", "[int8, f32]"))), quiet_options(grid));
  run_experiment(parse_experiment(write_yaml("format_f32", yaml("format_f32", "f32"))), quiet_options(single));
  ResultsFile g = ResultsFile::open(grid), one = ResultsFile::open(single);
  EXPECT_EQ(g.runs(), (std::vector<std::string>{"full@kv.format=f32", "full@kv.format=int8", "win@kv.format=f32",
                                               "win@kv.format=int8"}));  // (the file lists them sorted)
  const int64_t f32_bytes = std::get<int64_t>(g.run_attrs("full@kv.format=f32").at("kv_bytes_per_token"));
  const int64_t int8_bytes = std::get<int64_t>(g.run_attrs("win@kv.format=int8").at("kv_bytes_per_token"));
  EXPECT_EQ(std::get<std::string>(g.run_attrs("win@kv.format=int8").at("kv_format")), "int8");
  EXPECT_EQ(f32_bytes, std::get<int64_t>(one.run_attrs("full").at("kv_bytes_per_token")));
  EXPECT_LT(int8_bytes, f32_bytes / 3);
  for (const char* policy : {"full", "win"}) {
    const std::string run = std::string(policy) + "@kv.format=f32";
    ASSERT_EQ(g.complete_cells(run), one.complete_cells(policy));
    for (const std::string& cell : one.complete_cells(policy)) {
      CellRecord a, b;
      a.datasets = g.read_cell(run, cell).datasets;
      b.datasets = one.read_cell(policy, cell).datasets;
      a.datasets.erase("tokens_per_s");
      b.datasets.erase("tokens_per_s");
      std::string diff;
      EXPECT_TRUE(same_cell_contents(a, b, &diff)) << run << "/" << cell << ": " << diff;
    }
    // The int8 store is another computation: its cells exist and record their format.
    const std::string q = std::string(policy) + "@kv.format=int8";
    EXPECT_EQ(g.complete_cells(q).size(), one.complete_cells(policy).size());
  }
}

TEST(RunKvBudget, TinyBudgetIsOneClearErrorAndKeepsFinishedCells) {
  const fs::path kvlab = fs::path(KVLAB_BINARY_DIR) / "bin/kvlab";
  if (!fs::exists(fixture_model())) GTEST_SKIP() << "needs the tiny_models CTest fixture: absent";
  if (!fs::exists(kvlab)) GTEST_SKIP() << "needs the kvlab executable (" << kvlab << "): absent";
  fs::create_directories(work_dir());  // (RunE2e's teardown removes it when run in one process)
  const ModelConfig c = load_model(fixture_model())->config;
  const uint64_t block_bytes = uint64_t(2) * 4 * c.n_kv_heads * c.head_dim * sizeof(float);  // block_size 4
  // Window 16 with 16-token prefill chunks holds at most 16 + 16 tokens (+ one partly filled
  // block) per layer: 9 blocks of 4. Full attention on a 120-token prompt needs 30 per layer.
  const uint64_t budget = 12 * block_bytes * uint64_t(c.n_layers);
  auto yaml_with = [&](uint64_t bytes) {
    return "name: kv_budget\nmodel: {path: " + fixture_model().string() + ", threads: 1}\n" +
           "kv: {block_size: 4, budget_bytes: " + std::to_string(bytes) + "}\n" + R"(engine: {prefill_chunk: 16}
policies:
  - {name: win, type: sliding_window, params: {window: 16}}
  - {name: full, type: full}
seeds: [0]
)" + evals_yaml("[120]", "[0, 100]");
  };
  auto run = [&](const std::string& name, uint64_t bytes, std::string* log_text) {
    const fs::path yaml = write_yaml(name, yaml_with(bytes));
    const fs::path out = work_dir() / (name + ".h5"), log = work_dir() / (name + ".log");
    const std::string cmd = kvlab.string() + " run " + yaml.string() + " -o " + out.string() + " > " +
                            log.string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    *log_text = text.str();
    return status;
  };

  std::string log;
  int status = run("kv_budget", budget, &log);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal: " << log;
  EXPECT_NE(WEXITSTATUS(status), 0) << log;
  const std::string want = "kv_budget.yaml: kv.budget_bytes = " + std::to_string(budget) +
                           " bytes is too small for run 'full', cell niah_L120_D0: the pool holds " +
                           std::to_string(12 * c.n_layers) + " KV blocks of " + std::to_string(block_bytes) + " bytes";
  EXPECT_NE(log.find(want), std::string::npos) << log;
  EXPECT_NE(log.find("Raise kv.budget_bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("the 3 cell(s) finished in this run are in"), std::string::npos) << log;
  {
    ResultsFile f = ResultsFile::open(work_dir() / "kv_budget.h5");
    EXPECT_EQ(f.complete_cells("win"), (std::vector<std::string>{"niah_L120_D0", "niah_L120_D100", "ppl_T0"}));
    EXPECT_TRUE(f.complete_cells("full").empty());
    for (const auto& cell : f.complete_cells("win")) {
      const CellRecord rec = f.read_cell("win", cell);
      EXPECT_EQ(std::get<std::string>(rec.attrs.at("kind")) == "niah"
                    ? std::get<std::vector<std::string>>(rec.datasets.at("status").data).at(0)
                    : std::get<std::string>(rec.attrs.at("status")),
                "ok") << cell;
    }
  }

  // Less than one block per layer: refused up front, no file.
  status = run("kv_none", block_bytes * uint64_t(c.n_layers) - 1, &log);
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_NE(WEXITSTATUS(status), 0) << log;
  EXPECT_NE(log.find("kv.budget_bytes = " + std::to_string(block_bytes * c.n_layers - 1) + " bytes holds"),
            std::string::npos) << log;
  EXPECT_FALSE(fs::exists(work_dir() / "kv_none.h5"));
  fs::remove_all(work_dir());
}

}  // namespace
}  // namespace kvlab
