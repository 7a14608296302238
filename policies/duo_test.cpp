// The `duo` policy beyond the registry-wide conformance suites: its head file (format and every
// validation error), the retrieval-head choice, what each kind of head keeps, its budget
// convention, memory resident per KV head through the real engine, the device path (emulator)
// against the CPU, and the TopKeyProbe instrument of the calibration against a brute-force
// argmax computed from the simulator's generator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "framework/core/error.h"
#include "framework/engine/device.h"
#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/random_model.h"
#include "policies/budget.h"
#include "policies/builtin.h"
#include "policies/duo_heads.h"
#include "policies/policy_testing.h"
#include "policies/top_key_probe.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using P = std::map<std::string, ParamValue>;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("kvlab_duo_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string write_text(const std::string& name, const std::string& text) {
  const std::string p = temp_path(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// The error `fn` throws (fails the test when it throws none).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

const std::string kGood =
    "# kvlab duo heads v1\n# model=x\nlayer\tkv_head\tscore\n"
    "0\t0\t0.25\n0\t1\t1\n1\t1\t0\n1\t0\t0.5\n";

TEST(DuoHeadFile, RoundTripAndRowOrder) {
  const std::string p = write_text("good.tsv", kGood);
  const HeadScores h = read_head_file(p, 2, 2);
  EXPECT_EQ(h.score, (std::vector<double>{0.25, 1, 0.5, 0}));
  const std::string q = temp_path("written.tsv");
  write_head_file(q, HeadScores{2, 2, {0.125, 0.375, 1.0 / 3, 0.0}}, {"a comment"});
  const HeadScores back = read_head_file(q, 2, 2);
  EXPECT_EQ(back.score[0], 0.125);
  EXPECT_NEAR(back.score[2], 1.0 / 3, 1e-9);  // written with 9 significant digits
  std::ifstream in(q);
  std::string l1, l2, l3;
  std::getline(in, l1), std::getline(in, l2), std::getline(in, l3);
  EXPECT_EQ(l1, "# kvlab duo heads v1");
  EXPECT_EQ(l2, "# a comment");
  EXPECT_EQ(l3, "layer\tkv_head\tscore");
}

TEST(DuoHeadFile, EveryBadInputIsOneErrorNamingFileAndLine) {
  struct Case {
    std::string text, want;  // `want`: a substring of the error (after the file name)
  };
  const std::string head = "# kvlab duo heads v1\nlayer\tkv_head\tscore\n";
  const Case cases[] = {
      {"", "empty head file"},
      {"layer\tkv_head\tscore\n", ":1: not a kvlab head file"},
      {"# kvlab duo heads v1\nlayer kv_head score\n", ":2: expected the header"},
      {"# kvlab duo heads v1\n# only comments\n", "no header line"},
      {head + "0\t0\t0.5\n0\t1\t0.5\n1\t0\t0.5\n2\t0\t0.5\n", ":6: layer '2' is not an integer in [0, 2) (the model has 2 layers)"},
      {head + "0\t2\t0.5\n", ":3: kv_head '2' is not an integer in [0, 2) (the model has 2 KV heads)"},
      {head + "-1\t0\t0.5\n", ":3: layer '-1'"},
      {head + "0x1\t0\t0.5\n", ":3: layer '0x1'"},
      {head + "0\t0\tnan\n", ":3: score 'nan' is not a finite number in [0, 1]"},
      {head + "0\t0\tinf\n", ":3: score 'inf'"},
      {head + "0\t0\t1.5\n", ":3: score '1.5'"},
      {head + "0\t0\t0.5x\n", ":3: score '0.5x'"},
      {head + "0\t0\t\n", ":3: score ''"},
      {head + "0\t0\n", ":3: expected 3 TAB-separated fields (layer, kv_head, score), got 2"},
      {head + "0\t0\t0.5\n\n", ":4: expected 3 TAB-separated fields"},
      {head + "0\t0\t0.5\n1\t1\t0.5\n0\t0\t0.25\n", ":5: duplicate row for layer 0 kv_head 0 (first on line 3)"},
      {head + "0\t0\t0.5\n0\t1\t0.5\n1\t1\t0.5\n", ": no row for layer 1 kv_head 0"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string p = write_text("bad" + std::to_string(i++) + ".tsv", c.text);
    const std::string e = error_of([&] { read_head_file(p, 2, 2); });
    EXPECT_NE(e.find(p), std::string::npos) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << "got: " << e << "\nwant: " << c.want;
  }
  EXPECT_NE(error_of([] { read_head_file("/nonexistent/heads.tsv", 2, 2); }).find("/nonexistent/heads.tsv: cannot open"),
            std::string::npos);
  // A file for a model with fewer KV heads than this one: the first missing pair is named.
  const std::string p = write_text("small.tsv", "# kvlab duo heads v1\nlayer\tkv_head\tscore\n0\t0\t1\n1\t0\t0\n");
  EXPECT_NE(error_of([&] { read_head_file(p, 2, 2); }).find("no row for layer 0 kv_head 1"), std::string::npos);
}

TEST(DuoHeadFile, TopFractionRoundsUpWithTiesToLowerPairs) {
  const HeadScores h{2, 3, {0.5, 0.9, 0.5, 0.1, 0.5, 0.0}};
  auto pairs = [&](double f) {
    std::vector<int> out;
    const std::vector<uint8_t> m = top_fraction_heads(h, f);
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i]) out.push_back(int(i));
    return out;
  };
  EXPECT_EQ(pairs(0), std::vector<int>{});
  EXPECT_EQ(pairs(0.1), std::vector<int>{1});            // ceil(0.6) = 1
  EXPECT_EQ(pairs(0.25), (std::vector<int>{0, 1}));      // ceil(1.5) = 2: the tie 0.5 -> lowest pair
  EXPECT_EQ(pairs(0.5), (std::vector<int>{0, 1, 2}));    // 3
  EXPECT_EQ(pairs(0.6), (std::vector<int>{0, 1, 2, 4})); // ceil(3.6) = 4
  EXPECT_EQ(pairs(1), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  const HeadScores ten{1, 30, std::vector<double>(30, 0.5)};
  int n = 0;
  for (uint8_t r : top_fraction_heads(ten, 0.1)) n += r;
  EXPECT_EQ(n, 3);  // 0.1 * 30 is 3.0000000000000004 in double: still 3 heads
}

PolicyModelShape shape_2x2() { return PolicyModelShape{2, 6, 2, 8, 512}; }

TEST(DuoFactory, ParameterErrorsNameTheParameter) {
  PolicyRegistry r = make_builtin_registry();
  const std::string heads = testing::duo_test_head_file();
  // Defaults without a head file: every head streaming (auto fraction 0), recorded as such.
  const ParamValues defaults = validate_params("duo", r.at("duo").params(), P{}, "t");
  EXPECT_NO_THROW(r.create("duo", P{}, shape_2x2()));
  EXPECT_EQ(std::get<double>(r.at("duo").effective_params(defaults, shape_2x2()).at("retrieval_fraction")), 0.0);
  const ParamValues with_file = validate_params("duo", r.at("duo").params(), P{{"heads", heads}}, "t");
  EXPECT_EQ(std::get<double>(r.at("duo").effective_params(with_file, shape_2x2()).at("retrieval_fraction")), 0.5);
  EXPECT_NE(error_of([&] { r.create("duo", P{{"retrieval_fraction", 0.3}}, shape_2x2()); }).find("parameter 'heads'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.create("duo", P{{"retrieval_fraction", -0.5}}, shape_2x2()); })
                .find("retrieval_fraction -0.5: expected a fraction in [0, 1], or -1"),
            std::string::npos);
  EXPECT_NO_THROW(r.create("duo", P{{"retrieval_fraction", 0.0}}, shape_2x2()));
  EXPECT_NO_THROW(r.create("duo", P{{"retrieval_fraction", 1.0}}, shape_2x2()));
  EXPECT_NO_THROW(r.create("duo", P{{"heads", heads}}, shape_2x2()));
  // The file is for 2 layers x 2 KV heads: another model is an error naming the file.
  EXPECT_NE(error_of([&] { r.create("duo", P{{"heads", heads}}, PolicyModelShape{3, 6, 2, 8, 512}); }).find(heads),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.create("duo", P{{"heads", heads}, {"retrieval_fraction", 1.5}}, shape_2x2()); })
                .find("retrieval_fraction"),
            std::string::npos);
  // Half the pairs (auto with a file: 0.5) are retrieval heads: removing 75% is impossible.
  EXPECT_NE(error_of([&] { r.create("duo", P{{"heads", heads}, {"compression_ratio", 0.75}}, shape_2x2()); })
                .find("compression_ratio 0.75"),
            std::string::npos);
  EXPECT_NO_THROW(r.create("duo", P{{"heads", heads}, {"compression_ratio", 0.5}}, shape_2x2()));
  EXPECT_NE(error_of([&] {
              r.create("duo", P{{"heads", heads}, {"compression_ratio", 0.5}, {"budget_tokens", int64_t(9)}},
                       shape_2x2());
            }).find("budget_tokens"),
            std::string::npos);
}

testing::SimOptions sim_options() {
  testing::SimOptions o;
  o.n_layers = 2, o.n_heads = 6, o.n_kv_heads = 2, o.head_dim = 8;
  return o;
}

// Resident positions of (layer, KV head) in the simulator's cache.
std::vector<int64_t> resident_positions(const testing::FakeLayerCache& c, int h) {
  std::vector<int64_t> out;
  for (int s = 0; s < c.n_slots(); ++s)
    if (c.slot_valid(s, h)) out.push_back(c.slot_position(s, h));
  return out;
}

TEST(DuoPolicy, RetrievalHeadsKeepAllStreamingHeadsSinksAndRecent) {
  // retrieval_fraction 0.25 of the test file: (layer 1, KV head 1) alone is a retrieval head.
  PolicyRegistry r = make_builtin_registry();
  const testing::SimOptions o = sim_options();
  testing::PolicySimulator sim(o, 3);
  auto p = r.create("duo", P{{"heads", testing::duo_test_head_file()}, {"retrieval_fraction", 0.25},
                             {"sinks", int64_t(3)}, {"recent", int64_t(5)}},
                    sim.shape());
  for (int n : {17, 1, 1, 1, 9, 1, 1}) {
    const auto st = sim.step(*p, n);
    ASSERT_TRUE(st.violations.empty()) << st.violations[0];
    const int64_t seen = sim.n_seen();
    std::vector<int64_t> streaming = {0, 1, 2};
    for (int64_t j = seen - 5; j < seen; ++j) streaming.push_back(j);
    std::vector<int64_t> all(seen);
    for (int64_t j = 0; j < seen; ++j) all[j] = j;
    EXPECT_EQ(resident_positions(sim.cache(0), 0), streaming) << seen;
    EXPECT_EQ(resident_positions(sim.cache(0), 1), streaming) << seen;
    EXPECT_EQ(resident_positions(sim.cache(1), 0), streaming) << seen;
    EXPECT_EQ(resident_positions(sim.cache(1), 1), all) << seen;
    EXPECT_EQ(p->budget_tokens(0, seen), 8);
    EXPECT_EQ(p->budget_tokens(1, seen), -1);
  }
}

TEST(DuoPolicy, DefaultsWithoutAHeadFileAreAllStreaming) {
  PolicyRegistry r = make_builtin_registry();
  testing::PolicySimulator sim(sim_options(), 5);
  auto p = r.create("duo", P{{"sinks", int64_t(2)}, {"recent", int64_t(4)}}, sim.shape());
  for (int n : {11, 1, 1}) sim.step(*p, n);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h)
      EXPECT_EQ(resident_positions(sim.cache(l), h), (std::vector<int64_t>{0, 1, 9, 10, 11, 12}));
}

TEST(DuoPolicy, ABudgetIsTheMeanOverPairs) {
  // 1 retrieval pair of 4, compression_ratio 0.5: the 3 streaming pairs keep
  // floor((4 * kept(n) - n) / 3), kept(n) = n - floor(n / 2), so the mean over the 4 pairs is
  // at most kept(n), and the sinks stay.
  PolicyRegistry r = make_builtin_registry();
  testing::PolicySimulator sim(sim_options(), 4);
  auto p = r.create("duo", P{{"heads", testing::duo_test_head_file()}, {"retrieval_fraction", 0.25},
                             {"sinks", int64_t(2)}, {"compression_ratio", 0.5}},
                    sim.shape());
  TokenBudget b;
  b.compression_ratio = 0.5;
  for (int n : {13, 1, 1, 1, 1, 20, 1, 1, 1}) {
    const auto st = sim.step(*p, n);
    ASSERT_TRUE(st.violations.empty()) << st.violations[0];
    const int64_t seen = sim.n_seen();
    const int64_t share = (4 * b.kept(seen) - seen) / 3;
    int64_t total = 0;
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h) {
        const int64_t want = (l == 1 && h == 1) ? seen : share;
        EXPECT_EQ(st.resident[l][h], want) << "layer " << l << " head " << h << " n " << seen;
        total += st.resident[l][h];
        EXPECT_EQ(resident_positions(sim.cache(l), h)[1], 1);  // sinks 0, 1 kept
      }
    EXPECT_LE(total, 4 * b.kept(seen));
  }
}

// The probe's argmax against the generator's q, k in double: the chosen key's score must be the
// maximum up to the fp32 rounding of a d-term dot product (|error| <= d * 2^-24 * sum |q_f k_f|,
// doubled for safety), and causal.
TEST(TopKeyProbe, ArgmaxEqualsBruteForceOverTheGenerator) {
  const testing::SimOptions o = sim_options();
  const uint64_t seed = 7;
  testing::PolicySimulator sim(o, seed);
  auto rec = std::make_shared<TopKeyRecord>();
  TopKeyProbe probe(rec, sim.shape());
  EXPECT_TRUE(probe.needs().queries);
  const int d = o.head_dim, G = o.n_heads / o.n_kv_heads;
  int checked = 0;
  for (int n : {1, 12, 1, 1, 30, 1, 1, 1}) {
    sim.step(probe, n);
    const int64_t i = sim.n_seen() - 1;  // the step's last row
    for (int l = 0; l < o.n_layers; ++l) {
      EXPECT_EQ(rec->row_position[l], i);
      std::vector<float> q(size_t(o.n_heads) * d), k(size_t(o.n_kv_heads) * d);
      testing::generate(o, seed, l, i, 0, q.data());
      for (int hq = 0; hq < o.n_heads; ++hq) {
        const int kv = hq / G;
        double best = -INFINITY, chosen = NAN, abs_at_chosen = 0;
        const int64_t top = rec->top[size_t(l) * o.n_heads + hq];
        ASSERT_GE(top, 0);
        ASSERT_LE(top, i);
        for (int64_t j = 0; j <= i; ++j) {
          testing::generate(o, seed, l, j, 1, k.data());
          double dot = 0, abs_sum = 0;
          for (int f = 0; f < d; ++f) {
            dot += double(q[size_t(hq) * d + f]) * k[size_t(kv) * d + f];
            abs_sum += std::fabs(double(q[size_t(hq) * d + f]) * k[size_t(kv) * d + f]);
          }
          best = std::max(best, dot);
          if (j == top) chosen = dot, abs_at_chosen = abs_sum;
        }
        EXPECT_GE(chosen, best - 2.0 * d * std::ldexp(abs_at_chosen + std::fabs(best), -24)) << "layer " << l;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 8 * 2 * 6);
}

// ---- through the engine ---------------------------------------------------------------------

ModelConfig tiny_config() {
  // 2 layers, 2 KV heads, G = 2; head_dim 64, a size the device kernels (and emulator) take
  ModelConfig c = tiny_llama_config(97, 256, 4, 2, 64);
  c.rope_theta = 10000.f;
  return c;
}

struct EngineRun {
  std::vector<float> logits;                 // prefill's last row, then every decode step
  std::vector<std::vector<int64_t>> resident;  // [layer][kv_head] at the end
  std::vector<std::vector<int64_t>> blocks;    // [layer][kv_head] KvStore::head_blocks at the end
  size_t kv_bytes = 0;
};

EngineRun run(const Model& m, const std::string& device, const P& params, bool per_head_tables = false) {
  EngineOptions o;
  o.kv_per_head_tables = per_head_tables;
  o.threads = 1;
  o.block_size_tokens = 16;
  o.prefill_chunk_tokens = 13;
  o.device = parse_device(device);
  o.device_dtype = parse_device_dtype("f32");
  o.device_launch_rows = 5;
  Engine e(m, o);
  PolicyRegistry r = make_builtin_registry();
  const SeqId s = e.start_sequence(r.create("duo", params, policy_shape(m.config)));
  EngineRun out;
  std::vector<float> lg;
  EXPECT_EQ(e.prefill(s, random_tokens(70, 97, 1), lg), StepStatus::kOk);
  out.logits = lg;
  for (int32_t t : random_tokens(60, 97, 2)) {
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kOk);
    out.logits.insert(out.logits.end(), lg.begin(), lg.end());
  }
  out.resident.assign(2, std::vector<int64_t>(2));
  out.blocks = out.resident;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) {
      out.resident[l][h] = e.kv().resident_tokens(s, l, h);
      out.blocks[l][h] = e.kv().head_blocks(s, l, h);
    }
  out.kv_bytes = e.sequence_stats(s).kv_bytes_current;
  e.end_sequence(s);
  return out;
}

TEST(DuoEngine, ResidentPerKvHeadAndBlocksFreedForStreamingLayers) {
  auto model = make_random_model(tiny_config(), DType::kF32, 5);
  const P duo{{"heads", testing::duo_test_head_file()}, {"retrieval_fraction", 0.25},
              {"sinks", int64_t(4)}, {"recent", int64_t(12)}};
  const EngineRun d = run(*model, "cpu", duo);
  const EngineRun full = run(*model, "cpu", P{{"retrieval_fraction", 1.0}});
  // 130 tokens: streaming heads hold 4 + 12, the retrieval head (layer 1, KV head 1) all.
  EXPECT_EQ(d.resident, (std::vector<std::vector<int64_t>>{{16, 16}, {16, 130}}));
  EXPECT_EQ(full.resident, (std::vector<std::vector<int64_t>>{{130, 130}, {130, 130}}));
  // A block holds every KV head of its layer: layer 1 keeps blocks for its retrieval head's 130
  // tokens (9 blocks of 16), layer 0 for 16 tokens (at most 2 blocks after compaction, plus the
  // one being filled); full keeps 9 + 9.
  const size_t block_bytes = full.kv_bytes / 18;
  EXPECT_EQ(full.kv_bytes % 18, 0u);
  EXPECT_LE(d.kv_bytes, (9 + 3) * block_bytes);
  EXPECT_GE(d.kv_bytes, (9 + 1) * block_bytes);
}

// With per-head block tables the streaming heads give their blocks back although the retrieval
// head of their layer keeps everything: bytes follow each head's own budget.
TEST(DuoEngine, PerHeadTablesFreeTheStreamingHeadsBlocks) {
  auto model = make_random_model(tiny_config(), DType::kF32, 5);
  const P duo{{"heads", testing::duo_test_head_file()}, {"retrieval_fraction", 0.25},
              {"sinks", int64_t(4)}, {"recent", int64_t(12)}};
  const EngineRun layer_tables = run(*model, "cpu", duo);
  const EngineRun head_tables = run(*model, "cpu", duo, /*per_head_tables=*/true);
  EXPECT_EQ(head_tables.logits, layer_tables.logits);  // bit for bit (same slots, same order)
  EXPECT_EQ(head_tables.resident, layer_tables.resident);
  // Per-layer tables: every head of layer 1 holds the retrieval head's 9 blocks of 16 slots.
  EXPECT_EQ(layer_tables.blocks[1][0], 9);
  EXPECT_EQ(layer_tables.blocks[1][1], 9);
  // Per-head tables: the retrieval head (layer 1, KV head 1) holds ceil(130 / 16) = 9 one-head
  // blocks; each streaming head's 16 tokens (4 sinks, 12 recent) lie in at most 3 pages (the
  // sinks' page and the recent run's one or two).
  EXPECT_EQ(head_tables.blocks[1][1], 9);
  for (auto [l, h] : {std::pair{0, 0}, {0, 1}, {1, 0}}) {
    EXPECT_GE(head_tables.blocks[l][h], 1) << l << " " << h;
    EXPECT_LE(head_tables.blocks[l][h], 3) << l << " " << h;
  }
  // A one-head block is half a two-head block: bytes = head blocks x (layer-table block / 2).
  const size_t one_head_block = layer_tables.kv_bytes / (layer_tables.blocks[0][0] + layer_tables.blocks[1][0]) / 2;
  int64_t head_block_sum = 0;
  for (const auto& layer : head_tables.blocks)
    for (int64_t b : layer) head_block_sum += b;
  EXPECT_EQ(head_tables.kv_bytes, size_t(head_block_sum) * one_head_block);
  // Layer 1 holds at most 9 + 3 one-head blocks where per-layer tables hold 9 two-head ones (18);
  // layer 0 (both heads streaming) the same bytes either way.
  EXPECT_LE(head_tables.blocks[1][0] + head_tables.blocks[1][1], 12);
  EXPECT_LT(head_tables.kv_bytes, layer_tables.kv_bytes);
}

TEST(DuoEngine, PerHeadTablesAreRefusedOnADevicePathByName) {
  auto model = make_random_model(tiny_config(), DType::kF32, 5);
  const std::string e = error_of([&] { run(*model, "emulated", P{}, /*per_head_tables=*/true); });
  EXPECT_NE(e.find("per-head block tables (kv.block_tables: per_head) are not available with the emulated backend"),
            std::string::npos) << e;
}

void device_equals_the_cpu(const std::string& device) {
  auto model = make_random_model(tiny_config(), DType::kF32, 6);
  for (double f : {0.25, 0.5}) {
    const P duo{{"heads", testing::duo_test_head_file()}, {"retrieval_fraction", f},
                {"sinks", int64_t(3)}, {"recent", int64_t(9)}};
    const EngineRun cpu = run(*model, "cpu", duo), emu = run(*model, device, duo);
    ASSERT_EQ(cpu.logits.size(), emu.logits.size());
    // The same tolerance as framework/engine/engine_device_test.cpp for f32: the two paths sum
    // the same fp32 terms in different orders (tiles vs rows).
    double diff = 0, scale = 1;
    for (size_t i = 0; i < cpu.logits.size(); ++i) {
      diff = std::max(diff, std::fabs(double(cpu.logits[i]) - emu.logits[i]));
      scale = std::max(scale, std::fabs(double(cpu.logits[i])));
    }
    EXPECT_LT(diff / scale, 2e-4) << "retrieval_fraction " << f;
    EXPECT_EQ(cpu.resident, emu.resident);
  }
}

TEST(DuoEngine, EmulatedDeviceEqualsTheCpu) { device_equals_the_cpu("emulated"); }

TEST(DuoEngine, CudaF32EqualsTheCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda_device_summary();
  device_equals_the_cpu("cuda");
}

}  // namespace
}  // namespace kvlab
