// The device forward pass against the CPU engine (the oracle) on tiny random models: the same
// tokens, policies and chunking give the same logits — to float tolerance with device dtype
// f32, to bf16 tolerance with bf16 on a GPU — and the policies make the same eviction decisions
// (resident tokens per layer and head agree). Shapes: head_dim 64 and 128, GQA 1, 4 and 8,
// QKV bias, both RoPE layouts, page sizes 7 and 16, prefill chunks not a multiple of the page;
// every built-in policy (rope-at-read sinks, key-mass H2O, landmark selection in prefill).
// Devices: "emulated" always (the host-side plans, page mirror and launches executed by CPU
// loops over device-shaped arrays; with dtype bf16 it plans tensor-core prefill launches, with
// f32 rows as decode requests, as CUDA does), "cuda" when a GPU is present. The refusal without
// a GPU is checked everywhere else.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "framework/core/error.h"
#include "framework/engine/device.h"
#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/random_model.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

struct Shape {
  int head_dim, n_heads, n_kv_heads;
  bool bias, neox;
  int page;
};

ModelConfig config_of(const Shape& s) {
  ModelConfig c;
  c.arch = s.bias ? "qwen2" : "llama";
  c.n_layers = 2;
  c.n_heads = s.n_heads;
  c.n_kv_heads = s.n_kv_heads;
  c.head_dim = s.head_dim;
  c.dim = 96;
  c.hidden_dim = 160;
  c.vocab_size = 97;
  c.max_seq_len = 256;
  c.qkv_bias = s.bias;
  c.rope_style = s.neox ? RopeStyle::kNeox : RopeStyle::kInterleaved;
  return c;
}

std::vector<int32_t> tokens(int n, uint32_t seed, int vocab) { return random_tokens(n, vocab, seed); }

// Policies with parameters that act within the test's 75 tokens.
std::vector<std::pair<std::string, std::map<std::string, ParamValue>>> acting_policies() {
  return {{"", {}},
          {"full", {}},
          {"sliding_window", {{"window", int64_t{9}}}},
          {"strided", {{"stride", int64_t{5}}}},
          {"sinks", {{"sinks", int64_t{2}}, {"recent", int64_t{10}}}},
          {"h2o", {{"units", std::string("tokens")}, {"recent", 6.0}, {"heavy", 5.0}}},
          {"landmark", {{"chunk_size", int64_t{8}}, {"top_k", int64_t{2}}, {"window", int64_t{12}},
                        {"prefill", std::string("select")}}},
          {"sliding_window", {{"window", int64_t{9}}, {"plus_one", true}, {"mode", std::string("mask")}}},
          {"sinks", {{"sinks", int64_t{3}}, {"recent", int64_t{7}}, {"rope_positions", std::string("original")}}},
          // compress at the prefill's end (prompt_end) or after every step
          {"snapkv", {{"compression_ratio", 0.5}, {"window", int64_t{6}}}},
          {"pyramidkv", {{"compression_ratio", 0.6}, {"window", int64_t{4}}, {"beta", 2.0}}},
          {"adakv", {{"budget_tokens", int64_t{20}}, {"window", int64_t{4}}}},
          {"tova", {{"budget_tokens", int64_t{16}}}},
          {"knorm", {{"compression_ratio", 0.5}, {"compress", std::string("every_step")}}},
          {"random", {{"compression_ratio", 0.7}}},
          // The budget convention (POLICIES.md 9): a ratio window (per-row lists, no prefill
          // mask), a token budget with sinks (a prefill mask), landmark per_head under a ratio.
          {"sliding_window", {{"compression_ratio", 0.5}}},
          {"sinks", {{"sinks", int64_t{2}}, {"budget_tokens", int64_t{12}}}},
          {"landmark", {{"chunk_size", int64_t{8}}, {"window", int64_t{12}}, {"compression_ratio", 0.5},
                        {"gqa", std::string("per_head")}, {"prefill", std::string("select")}}}};
}

struct Trace {
  std::vector<float> logits;      // prefill's last row, then every decode step
  std::vector<int64_t> resident;  // per layer and KV head at the end
};

Trace run(Engine& e, const std::string& policy, const std::map<std::string, ParamValue>& params) {
  const ModelConfig& c = e.config();
  PolicyRegistry registry = make_builtin_registry();
  SeqId s = e.start_sequence(policy.empty() ? nullptr : registry.create(policy, params, policy_shape(c)));
  Trace t;
  std::vector<float> lg;
  EXPECT_EQ(e.prefill(s, tokens(45, 1, c.vocab_size), lg, false, /*prompt_end=*/true), StepStatus::kOk);
  t.logits = lg;
  for (int32_t tok : tokens(30, 2, c.vocab_size)) {
    EXPECT_EQ(e.decode(std::span(&s, 1), std::span(&tok, 1), lg), StepStatus::kOk);
    t.logits.insert(t.logits.end(), lg.begin(), lg.end());
  }
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) t.resident.push_back(e.kv().resident_tokens(s, l, h));
  e.end_sequence(s);
  return t;
}

EngineOptions options(int page, const std::string& device, const std::string& dtype = "f32") {
  EngineOptions o;
  o.device_launch_rows = 5;  // prefill chunks of 13 rows as decode requests take 3 launches
  o.threads = 1;
  o.block_size_tokens = page;
  o.prefill_chunk_tokens = 13;
  o.device = parse_device(device);
  o.device_dtype = parse_device_dtype(dtype);
  return o;
}

// max |a - b| / max(1, max |a|)
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return diff / scale;
}

struct Device {
  std::string device, dtype;
};
void PrintTo(const Device& d, std::ostream* os) { *os << d.device << " " << d.dtype; }

// (device, dtype) pairs whose results must equal the CPU's to float tolerance.
class EngineDevice : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().device == "cuda" && !cuda_device_available())
      GTEST_SKIP() << "needs a CUDA GPU: " << cuda_device_summary();
  }
};

TEST_P(EngineDevice, MatchesTheCpuForEveryPolicyAndShape) {
  const Shape shapes[] = {{64, 4, 4, false, false, 7}, {128, 4, 1, true, true, 16},
                          {64, 8, 2, false, true, 16}, {64, 8, 1, true, false, 7}};
  for (const Shape& sh : shapes) {
    const ModelConfig c = config_of(sh);
    auto model = make_random_model(c, DType::kF32, 11);
    Engine cpu(*model, options(sh.page, "cpu"));
    Engine gpu(*model, options(sh.page, GetParam().device, GetParam().dtype));
    for (const auto& [name, params] : acting_policies()) {
      SCOPED_TRACE("head_dim " + std::to_string(sh.head_dim) + " heads " + std::to_string(sh.n_heads) + "/" +
                   std::to_string(sh.n_kv_heads) + " page " + std::to_string(sh.page) + " policy '" + name + "'");
      const Trace a = run(cpu, name, params), b = run(gpu, name, params);
      ASSERT_EQ(a.logits.size(), b.logits.size());
      EXPECT_LT(max_rel_diff(a.logits, b.logits), 2e-4);
      EXPECT_EQ(a.resident, b.resident);
    }
  }
}

TEST(EngineDeviceCuda, Bf16IsCloseToTheCpuOnBf16Weights) {
  if (!cuda_device_available()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda_device_summary();
  const Shape sh{128, 8, 2, false, false, 16};
  const ModelConfig c = config_of(sh);
  auto model = make_random_model(c, DType::kBF16, 12);
  Engine cpu(*model, options(sh.page, "cpu"));
  Engine gpu(*model, options(sh.page, "cuda", "bf16"));
  for (const char* name : {"", "sliding_window", "sinks"}) {
    SCOPED_TRACE(std::string("policy '") + name + "'");
    std::map<std::string, ParamValue> params;
    for (const auto& [n, p] : acting_policies())
      if (n == name) params = p;
    const Trace a = run(cpu, name, params), b = run(gpu, name, params);
    EXPECT_LT(max_rel_diff(a.logits, b.logits), 3e-2);
  }
}

TEST_P(EngineDevice, BatchedDecodeOfMixedPoliciesEqualsEachAlone) {
  const Shape sh{64, 4, 2, false, false, 16};
  const ModelConfig c = config_of(sh);
  auto model = make_random_model(c, DType::kF32, 13);
  PolicyRegistry registry = make_builtin_registry();
  const auto policies = acting_policies();
  const std::vector<int> pick = {0, 4, 5, 2};  // none, sinks (rope at read), h2o, sliding window
  std::vector<std::vector<float>> alone;
  {
    Engine cpu(*model, options(16, "cpu"));
    for (int p : pick) alone.push_back(run(cpu, policies[p].first, policies[p].second).logits);
  }
  Engine gpu(*model, options(16, GetParam().device, GetParam().dtype));
  std::vector<SeqId> seqs;
  std::vector<std::vector<float>> got(pick.size());
  std::vector<float> lg;
  for (size_t i = 0; i < pick.size(); ++i) {
    const auto& [name, params] = policies[pick[i]];
    seqs.push_back(gpu.start_sequence(name.empty() ? nullptr : registry.create(name, params, policy_shape(c))));
    ASSERT_EQ(gpu.prefill(seqs[i], tokens(45, 1, c.vocab_size), lg, false, true), StepStatus::kOk);
    got[i] = lg;
  }
  for (int32_t tok : tokens(30, 2, c.vocab_size)) {
    const std::vector<int32_t> batch(pick.size(), tok);
    ASSERT_EQ(gpu.decode(seqs, batch, lg), StepStatus::kOk);
    for (size_t i = 0; i < pick.size(); ++i)
      got[i].insert(got[i].end(), lg.begin() + i * c.vocab_size, lg.begin() + (i + 1) * c.vocab_size);
  }
  for (size_t i = 0; i < pick.size(); ++i) EXPECT_LT(max_rel_diff(alone[i], got[i]), 2e-4) << "sequence " << i;
  EXPECT_THROW(gpu.fork(seqs[0]), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, EngineDevice,
                         ::testing::Values(Device{"emulated", "f32"}, Device{"emulated", "bf16"},
                                           Device{"cuda", "f32"}),
                         [](const auto& info) { return info.param.device + "_" + info.param.dtype; });

TEST(EngineDeviceRefusal, WithoutAGpuTheEngineSaysSo) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is present";
  const ModelConfig c = config_of({64, 4, 4, false, false, 16});
  auto model = make_random_model(c, DType::kF32, 1);
  try {
    Engine e(*model, options(16, "cuda"));
    FAIL() << "an engine on device cuda was created without a GPU";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("device cuda"), std::string::npos) << err.what();
  }
  EXPECT_THROW(Engine(*model, options(16, "tpu")), Error);
}

}  // namespace
}  // namespace kvlab
