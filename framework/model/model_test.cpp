// Loading the tiny fixtures (scripts/fixtures/make_fixtures.py, CTest fixture `tiny_models`):
// every format of one model must give the same config and the same weights, after accounting for
// the Q/K row order (GGUF llama and llama2.c: interleaved RoPE order; HF: rotate-half order).
// Also: dtype conversions on load, RoPE frequencies, and bad inputs failing with clear messages.
#include "framework/model/model.h"
#include "framework/model/safetensors.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "framework/core/error.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path fixtures_dir() {
  const char* env = std::getenv("KVLAB_BINARY_DIR");
  return fs::path(env ? env : KVLAB_BINARY_DIR) / "fixtures";
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return json::parse(in);
}

// The configs make_fixtures.py writes (checked against its fixtures.json below).
const std::vector<std::string> kFixtures = {
    "llama_hd32_gqa1_tied",        "llama_hd64_gqa2_untied",   "llama_hd80_gqa4_untied",
    "llama_hd128_gqa8_tied",       "qwen2_hd64_gqa2_bias_tied", "qwen2_hd32_gqa4_bias_untied",
    "llama3_rope_hd32_gqa4",       "qwen3_hd64_gqa2_qknorm_untied",
    "gemma3_hd64_gqa2_w5",
    "gemma3_hd32_gqa1_w128_linear",
    "gemma2_hd32_gqa4_w4_softcap"};

std::unique_ptr<Model> load(const fs::path& p, const std::string& dtype = "keep") {
  LoadOptions opts;
  opts.weight_dtype = dtype;
  opts.load_tokenizer = false;
  return load_model(p, opts);
}

// Rotate-half row order -> interleaved row order, per head of head_dim rows:
// interleaved row 2i + j == rotate-half row j * head_dim/2 + i.
std::vector<float> to_interleaved(const std::vector<float>& w, int64_t rows, int64_t cols, int head_dim) {
  std::vector<float> out(w.size());
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = r / head_dim, k = r % head_dim, i = k / 2, j = k % 2;
    const int64_t src = head * head_dim + j * half + i;
    std::copy_n(w.begin() + src * cols, cols, out.begin() + r * cols);
  }
  return out;
}

// All matrices and vectors of a model as float32, with Q/K in interleaved order.
struct FlatModel {
  std::vector<std::vector<float>> tensors;
  std::vector<std::string> names;
  std::vector<bool> is_matrix;
};

FlatModel flatten(const Model& m, bool from_neox_llama) {
  FlatModel f;
  const int hd = m.config.head_dim;
  auto add = [&](const std::string& name, std::vector<float> v, bool is_matrix = true) {
    f.names.push_back(name);
    f.tensors.push_back(std::move(v));
    f.is_matrix.push_back(is_matrix);
  };
  add("tok_embeddings", weight_to_float(m.tok_embeddings));
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& l = m.layers[i];
    const std::string p = "layer" + std::to_string(i) + ".";
    auto wq = weight_to_float(l.wq), wk = weight_to_float(l.wk);
    if (from_neox_llama) {
      wq = to_interleaved(wq, l.wq.rows, l.wq.cols, hd);
      wk = to_interleaved(wk, l.wk.rows, l.wk.cols, hd);
    }
    add(p + "attn_norm", l.attn_norm, false);
    add(p + "wq", wq);
    add(p + "wk", wk);
    add(p + "wv", weight_to_float(l.wv));
    add(p + "wo", weight_to_float(l.wo));
    add(p + "bq", l.bq, false);
    add(p + "bk", l.bk, false);
    add(p + "bv", l.bv, false);
    add(p + "ffn_norm", l.ffn_norm, false);
    add(p + "q_norm", l.q_norm, false);
    add(p + "k_norm", l.k_norm, false);
    add(p + "post_attn_norm", l.post_attn_norm, false);  // Gemma (HF: 1 + w added on load)
    add(p + "post_ffn_norm", l.post_ffn_norm, false);
    add(p + "w_gate", weight_to_float(l.w_gate));
    add(p + "w_up", weight_to_float(l.w_up));
    add(p + "w_down", weight_to_float(l.w_down));
  }
  add("final_norm", m.final_norm, false);
  add("lm_head", weight_to_float(m.lm_head));
  return f;
}

// Applies a float -> float rounding (e.g. through fp16) to the matrices (and to the vectors too
// when `vectors`: a BF16 safetensors file stores norms as BF16, a GGUF keeps them F32).
FlatModel rounded(FlatModel f, float (*round)(float), bool vectors = false) {
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    if (!f.is_matrix[i] && !vectors) continue;
    for (float& x : f.tensors[i]) x = round(x);
  }
  return f;
}

// Gemma: a norm the engine reads is 1 + w (added on load from HF), so a BF16/F16 copy of the HF
// file gives 1 + round(w), w as the F32 file stores it (not round(1 + w)).
FlatModel gemma_rounded(FlatModel f, const fs::path& hf_f32_file, float (*round)(float)) {
  const SafetensorsFile st = SafetensorsFile::open(hf_f32_file);
  auto raw = [&](const std::string& name) {
    for (const SafetensorsTensor& t : st.tensors())
      if (t.name == name) return static_cast<const float*>(t.data);
    ADD_FAILURE() << "no tensor " << name;
    return static_cast<const float*>(nullptr);
  };
  static const std::map<std::string, std::string> kHf = {
      {"attn_norm", "input_layernorm.weight"},         {"ffn_norm", "pre_feedforward_layernorm.weight"},
      {"post_attn_norm", "post_attention_layernorm.weight"}, {"post_ffn_norm", "post_feedforward_layernorm.weight"},
      {"q_norm", "self_attn.q_norm.weight"},           {"k_norm", "self_attn.k_norm.weight"}};
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    std::vector<float>& t = f.tensors[i];
    if (f.is_matrix[i]) {
      for (float& x : t) x = round(x);
    } else if (!t.empty()) {  // "layerN.part" or "final_norm"
      const std::string& n = f.names[i];
      std::string hf = "model.norm.weight";
      if (n != "final_norm") {
        const size_t dot = n.find('.');
        hf = "model.layers." + n.substr(5, dot - 5) + "." + kHf.at(n.substr(dot + 1));
      }
      const float* w = raw(hf);
      for (size_t k = 0; w && k < t.size(); ++k) t[k] = 1.f + round(w[k]);
    }
  }
  return f;
}

void expect_same(const FlatModel& a, const FlatModel& b, const std::string& what) {
  ASSERT_EQ(a.names, b.names) << what;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    ASSERT_EQ(a.tensors[i].size(), b.tensors[i].size()) << what << ": " << a.names[i];
    for (size_t k = 0; k < a.tensors[i].size(); ++k) {
      ASSERT_EQ(a.tensors[i][k], b.tensors[i][k]) << what << ": " << a.names[i] << "[" << k << "]";
    }
  }
}

float via_f16(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }
float via_bf16(float x) { return bf16_to_fp32(fp32_to_bf16(x)); }

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fixtures_dir() / GetParam();
    if (!fs::exists(dir_ / "fixture.json")) {
      GTEST_FAIL() << "missing " << dir_ << ": run the make_tiny_models CTest fixture first";
    }
    meta_ = read_json(dir_ / "fixture.json");
  }
  bool has(const std::string& key) const { return meta_["files"].contains(key); }
  fs::path file(const std::string& key) const { return dir_ / meta_["files"][key].get<std::string>(); }
  bool llama() const { return meta_["arch"] == "llama"; }

  fs::path dir_;
  json meta_;
};

TEST(Fixtures, ListMatchesTheGenerator) {
  const json list = read_json(fixtures_dir() / "fixtures.json");
  EXPECT_EQ(list["fixtures"].get<std::vector<std::string>>(), kFixtures);
}

TEST_P(FixtureTest, ConfigMatchesInEveryFormat) {
  for (const std::string key :
       {"gguf", "gguf_f16", "gguf_q8_0", "hf", "hf_sharded", "hf_bf16", "hf_f16", "llama2c", "llama2c_v1"}) {
    if (!has(key)) continue;
    SCOPED_TRACE(key);
    const auto m = load(file(key));
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, meta_["arch"]);
    EXPECT_EQ(c.dim, meta_["dim"]);
    EXPECT_EQ(c.n_layers, meta_["n_layers"]);
    EXPECT_EQ(c.n_heads, meta_["n_heads"]);
    EXPECT_EQ(c.n_kv_heads, meta_["n_kv_heads"]);
    EXPECT_EQ(c.head_dim, meta_["head_dim"]);
    EXPECT_EQ(c.hidden_dim, meta_["hidden"]);
    EXPECT_EQ(c.vocab_size, meta_["vocab"]);
    EXPECT_EQ(c.max_seq_len, meta_["max_seq_len"]);
    EXPECT_EQ(c.qkv_bias, meta_["qkv_bias"]);
    EXPECT_EQ(c.qk_norm, meta_["qk_norm"]);
    EXPECT_EQ(c.tied_embeddings, meta_["tied"]);
    EXPECT_FLOAT_EQ(c.rope_theta, meta_["rope_theta"].get<float>());
    EXPECT_FLOAT_EQ(c.rms_eps, meta_["rms_eps"].get<float>());
    EXPECT_EQ(c.rope_scaling.type,
              meta_["rope_scaling"].is_null() ? "none" : meta_["rope_scaling"]["rope_type"].get<std::string>());
    const bool interleaved = key.rfind("gguf", 0) == 0 ? llama() : key.rfind("llama2c", 0) == 0;
    EXPECT_EQ(c.rope_style, interleaved ? RopeStyle::kInterleaved : RopeStyle::kNeox);
    EXPECT_EQ(m->layers.size(), static_cast<size_t>(c.n_layers));
    const bool mistral_hf = key.rfind("hf", 0) == 0 && meta_["hf_arch"] == "MistralForCausalLM";
    const std::string arch = meta_["arch"];
    const bool gemma = arch == "gemma2" || arch == "gemma3";
    EXPECT_EQ(c.sliding_window, mistral_hf ? 4096 : meta_["sliding_window"].get<int>());
    if (gemma) {  // the layer pattern (HF's layer_types default, llama.cpp's hard-coded one)
      std::vector<uint8_t> want(c.n_layers);
      for (int i = 0; i < c.n_layers; ++i) want[i] = arch == "gemma2" ? i % 2 == 0 : (i + 1) % 6 != 0;
      EXPECT_EQ(c.local_layers, want);
      EXPECT_FLOAT_EQ(c.attn_softcap, meta_["attn_softcap"].get<float>());
      EXPECT_FLOAT_EQ(c.final_softcap, meta_["final_softcap"].get<float>());
      EXPECT_FLOAT_EQ(attention_scale(c), 1.f / std::sqrt(static_cast<float>(c.head_dim)));
      EXPECT_FLOAT_EQ(c.rope_local_theta, arch == "gemma3" ? 10000.f : 0.f);
      EXPECT_TRUE(c.embed_scale && c.sandwich_norms && c.ffn_activation == FfnActivation::kGeluTanh);
    } else {
      EXPECT_TRUE(c.local_layers.empty());
      EXPECT_FALSE(c.embed_scale || c.sandwich_norms || c.attn_softcap > 0 || c.final_softcap > 0);
    }
    if (c.tied_embeddings) {
      EXPECT_EQ(m->lm_head.data, m->tok_embeddings.data);
    }
    EXPECT_EQ(m->format, key.substr(0, key.find('_')) == "llama2c" ? "llama2c" : key.substr(0, key.find('_')));
  }
}

TEST_P(FixtureTest, WeightsAreIdenticalAcrossFormats) {
  const auto hf = load(file("hf"));
  EXPECT_EQ(hf->stored_dtype, "f32");
  const FlatModel ref = flatten(*hf, llama());  // interleaved order for llama, as stored for qwen2
  expect_same(flatten(*load(file("gguf")), false), ref, "gguf f32");
  expect_same(flatten(*load(file("gguf_f16")), false), rounded(ref, via_f16), "gguf f16");
  if (has("llama2c")) expect_same(flatten(*load(file("llama2c")), false), ref, "llama2.c");
  if (has("llama2c_v1")) expect_same(flatten(*load(file("llama2c_v1")), false), ref, "llama2.c v1");
  if (has("hf_sharded")) expect_same(flatten(*load(file("hf_sharded")), llama()), ref, "hf sharded");
  const bool gemma = meta_["arch"] == "gemma2" || meta_["arch"] == "gemma3";
  const fs::path hf_f32 = file("hf") / "model.safetensors";
  if (has("hf_bf16"))
    expect_same(flatten(*load(file("hf_bf16")), llama()),
                gemma ? gemma_rounded(ref, hf_f32, via_bf16) : rounded(ref, via_bf16, true), "hf bf16");
  if (has("hf_f16"))
    expect_same(flatten(*load(file("hf_f16")), llama()),
                gemma ? gemma_rounded(ref, hf_f32, via_f16) : rounded(ref, via_f16, true), "hf f16");
}

TEST_P(FixtureTest, ConversionOnLoadMatchesStoredFiles) {
  // f16 on load == the F16 file (1-D tensors are float vectors in both).
  expect_same(flatten(*load(file("hf"), "f16"), llama()), flatten(*load(file("gguf_f16")), false),
              "hf -> f16 vs gguf f16");
  const auto bf = load(file("gguf"), "bf16");
  EXPECT_EQ(bf->layers[0].wq.dtype, DType::kBF16);
  expect_same(flatten(*bf, false), rounded(flatten(*load(file("hf")), llama()), via_bf16), "gguf -> bf16");
  if (has("gguf_q8_0")) {
    // Python's quantizer (gguf_writer.py) and kvlab's (dtype.cpp) must agree bit for bit.
    const auto q_file = load(file("gguf_q8_0"));
    const auto q_load = load(file("gguf"), "q8_0");
    EXPECT_EQ(q_file->stored_dtype, "q8_0");
    EXPECT_EQ(q_load->layers[1].w_down.dtype, DType::kQ8_0);
    expect_same(flatten(*q_load, false), flatten(*q_file, false), "gguf -> q8_0 vs gguf q8_0");
    const WeightView& a = q_file->layers[0].wq;
    const WeightView& b = q_load->layers[0].wq;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.rows * a.row_bytes()), 0);
  }
}

TEST_P(FixtureTest, RopeFrequenciesAgreeBetweenGgufAndHf) {
  const auto g = load(file("gguf"));
  const auto h = load(file("hf"));
  const std::vector<float> fg = rope_inv_freq(g->config), fh = rope_inv_freq(h->config);
  ASSERT_EQ(fg.size(), static_cast<size_t>(g->config.head_dim / 2));
  ASSERT_EQ(fg.size(), fh.size());
  for (size_t i = 0; i < fg.size(); ++i) EXPECT_NEAR(fg[i], fh[i], 2e-7 * fh[i]) << i;
  const double theta = meta_["rope_theta"].get<double>();
  const bool linear = !meta_["rope_scaling"].is_null() && meta_["rope_scaling"]["rope_type"] == "linear";
  EXPECT_FLOAT_EQ(fh[0], linear ? 1.f / meta_["rope_scaling"]["factor"].get<float>() : 1.f);
  if (meta_["rope_scaling"].is_null()) {
    EXPECT_FLOAT_EQ(fh.back(), static_cast<float>(std::pow(theta, -2.0 * (static_cast<double>(fh.size()) - 1) / g->config.head_dim)));
    EXPECT_TRUE(g->config.rope_freq_factors.empty());
  } else if (meta_["rope_scaling"]["rope_type"] == "linear") {  // Gemma 3: the global layers'
    EXPECT_TRUE(g->config.rope_freq_factors.empty());
    const double base = std::pow(theta, -2.0 * (static_cast<double>(fh.size()) - 1) / g->config.head_dim);
    EXPECT_NEAR(fh.back(), base / meta_["rope_scaling"]["factor"].get<double>(), 1e-6 * base);
  } else {
    EXPECT_EQ(g->config.rope_freq_factors.size(), fg.size());
    // The lowest frequency is divided by the full factor.
    const double base = std::pow(theta, -2.0 * (static_cast<double>(fh.size()) - 1) / g->config.head_dim);
    EXPECT_NEAR(fh.back(), base / meta_["rope_scaling"]["factor"].get<double>(), 1e-6 * base);
  }
}

TEST_P(FixtureTest, TokenizersAttachWhenPresent) {
  LoadOptions opts;
  const auto g = load_model(file("gguf"), opts);
  ASSERT_NE(g->tokenizer, nullptr) << g->tokenizer_search;
  EXPECT_EQ(g->tokenizer->vocab_size(), meta_["vocab"].get<int>());
  EXPECT_EQ(g->tokenizer->bos_id(), 1);
  if (has("llama2c")) {
    const auto l = load_model(file("llama2c"), opts);
    ASSERT_NE(l->tokenizer, nullptr) << l->tokenizer_search;
    EXPECT_EQ(l->tokenizer->vocab_size(), meta_["vocab"].get<int>());
    EXPECT_EQ(l->tokenizer->encode("hello the"), g->tokenizer->encode("hello the"));
  }
  const auto h = load_model(file("hf"), opts);  // fixtures carry no HF tokenizer files
  EXPECT_EQ(h->tokenizer, nullptr);
  EXPECT_THROW(h->require_tokenizer(), Error);
}

TEST_P(FixtureTest, ParameterCountAndKvBytes) {
  const auto m = load(file("hf"));
  const ModelConfig& c = m->config;
  const int64_t d = c.dim, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim, ff = c.hidden_dim;
  int64_t expected = c.vocab_size * d * (c.tied_embeddings ? 1 : 2) + d;
  expected += c.n_layers * (2 * d + d * q * 2 + d * kv * 2 + 3 * d * ff + (c.qkv_bias ? q + 2 * kv : 0) +
                            (c.qk_norm ? 2 * c.head_dim : 0) + (c.sandwich_norms ? 2 * d : 0));
  EXPECT_EQ(parameter_count(*m), expected);
  EXPECT_EQ(c.kv_bytes_per_token(DType::kF16), static_cast<size_t>(2 * c.n_layers * kv * 2));
  EXPECT_EQ(c.kv_bytes_per_token(DType::kF32), static_cast<size_t>(2 * c.n_layers * kv * 4));
  EXPECT_EQ(c.kv_bytes_per_token(DType::kQ8_0), static_cast<size_t>((2 * c.n_layers * kv * 34 + 31) / 32));
}

INSTANTIATE_TEST_SUITE_P(TinyModels, FixtureTest, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return info.param; });

// ----- bad input -----------------------------------------------------------------------------

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kvlab_model_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& b) {
  std::ofstream(p, std::ios::binary).write(b.data(), b.size());
}

// Loads `p` expecting kvlab::Error whose message contains every `needles` entry.
void expect_error(const fs::path& p, const std::vector<std::string>& needles, LoadOptions opts = {}) {
  opts.load_tokenizer = opts.require_tokenizer;
  try {
    load_model(p, opts);
    ADD_FAILURE() << p << " loaded without error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

const fs::path kSmall = "llama_hd32_gqa1_tied";

TEST(BadInput, MissingFile) {
  expect_error(fixtures_dir() / "nope.gguf", {"nope.gguf", "no such file"});
  expect_error(fixtures_dir() / "bad", {"no config.json"});
}

TEST(BadInput, TruncatedFilesInEveryFormat) {
  const fs::path src = fixtures_dir() / kSmall;
  struct Case { fs::path from; std::string name; };
  for (const Case& c : {Case{src / "model.gguf", "t.gguf"}, Case{src / "model.bin", "t.bin"}}) {
    const std::string bytes = read_bytes(c.from);
    for (size_t n : {size_t{0}, size_t{3}, size_t{20}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
      const fs::path p = scratch(c.name);
      write_bytes(p, bytes.substr(0, n));
      expect_error(p, {p.string(), "truncated"});
    }
  }
  const fs::path hf = scratch("hf_trunc");
  fs::create_directories(hf);
  fs::copy_file(src / "hf/config.json", hf / "config.json", fs::copy_options::overwrite_existing);
  const std::string st = read_bytes(src / "hf/model.safetensors");
  for (size_t n : {size_t{4}, size_t{100}, st.size() - 1}) {
    write_bytes(hf / "model.safetensors", st.substr(0, n));
    expect_error(hf, {"model.safetensors", "truncated"});
  }
}

TEST(BadInput, WrongMagic) {
  std::string bytes = read_bytes(fixtures_dir() / kSmall / "model.gguf");
  bytes.replace(0, 4, "GGUX");
  const fs::path p = scratch("magic.gguf");
  write_bytes(p, bytes);
  expect_error(p, {p.string(), "wrong magic"});
  // Not a GGUF by name or magic: read as llama2.c, whose header then does not fit.
  const fs::path txt = scratch("notes.bin");
  write_bytes(txt, std::string(4096, 'x'));
  expect_error(txt, {txt.string(), "not a llama2.c checkpoint"});
}

TEST(BadInput, UnsupportedTensorTypeArchitectureAndShape) {
  const fs::path bad = fixtures_dir() / "bad";
  expect_error(bad / "iq4_nl_tensor.gguf",
               {"iq4_nl_tensor.gguf", "token_embd.weight", "unsupported tensor type IQ4_NL (20)",
                "supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"});
  expect_error(bad / "unknown_arch.gguf", {"unknown_arch.gguf", "unsupported architecture 'gpt2'"});
  expect_error(bad / "shape_mismatch.gguf",
               {"shape_mismatch.gguf", "blk.1.attn_k.weight", "shape [96, 64]", "expected [64, 64]"});
}

// An HF directory whose config.json is edited by `edit` (weights linked from the fixture).
fs::path hf_with_config(const std::string& name, void (*edit)(json&), const std::string& fixture = kSmall) {
  const fs::path src = fixtures_dir() / fixture / "hf";
  const fs::path dir = scratch(name);
  fs::create_directories(dir);
  json config = read_json(src / "config.json");
  edit(config);
  std::ofstream(dir / "config.json") << config.dump();
  fs::remove(dir / "model.safetensors");
  fs::create_symlink(src / "model.safetensors", dir / "model.safetensors");
  return dir;
}

TEST(BadInput, GemmaConfigProblems) {
  const std::string g3 = "gemma3_hd64_gqa2_w5";
  expect_error(hf_with_config("g3_vision", [](json& c) { c["architectures"] = {"Gemma3ForConditionalGeneration"}; }, g3),
               {"config.json", "Gemma3ForConditionalGeneration", "vision tower"});
  expect_error(hf_with_config("g3_types", [](json& c) { c["layer_types"] = {"sliding_attention"}; }, g3),
               {"config.json", "layer_types", "array of 6 strings"});
  expect_error(hf_with_config("g3_kind", [](json& c) {
                 c["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention",
                                     "sliding_attention", "sliding_attention", "chunked_attention"};
               }, g3),
               {"config.json", "layer_types[5]", "chunked_attention"});
  expect_error(hf_with_config("g3_act", [](json& c) { c["hidden_activation"] = "relu"; }, g3),
               {"config.json", "hidden_activation", "relu"});
  expect_error(hf_with_config("g3_rope", [](json& c) {
                 c["rope_parameters"] = {{"sliding_attention", {{"rope_type", "yarn"}, {"rope_theta", 1e4}}}};
               }, g3),
               {"config.json", "sliding_attention.rope_type", "yarn"});
  expect_error(hf_with_config("g3_window", [](json& c) { c["sliding_window"] = 0; }, g3),
               {"config.json", "'sliding_window'", "out of range"});
  expect_error(hf_with_config("g3_cap", [](json& c) { c["attn_logit_softcapping"] = -1.0; }, g3),
               {"attn_logit_softcapping", "must be finite and >= 0"});
  expect_error(hf_with_config("g3_bidir", [](json& c) { c["use_bidirectional_attention"] = true; }, g3),
               {"config.json", "use_bidirectional_attention"});
}

TEST(BadInput, HfConfigProblems) {
  expect_error(hf_with_config("hf_arch", [](json& c) { c["architectures"] = {"GPT2LMHeadModel"}; }),
               {"config.json", "unsupported architecture 'GPT2LMHeadModel'"});
  expect_error(hf_with_config("hf_shape", [](json& c) { c["intermediate_size"] = 128; }),
               {"model.safetensors", "model.layers.0.mlp.gate_proj.weight", "shape [160, 64]",
                "expected [128, 64]"});
  expect_error(hf_with_config("hf_untied", [](json& c) { c["tie_word_embeddings"] = false; }),
               {"missing tensor 'lm_head.weight'"});
  expect_error(hf_with_config("hf_missing", [](json& c) { c.erase("hidden_size"); }),
               {"config.json", "missing key 'hidden_size'"});
  expect_error(hf_with_config("hf_type", [](json& c) { c["num_hidden_layers"] = "two"; }),
               {"config.json", "'num_hidden_layers'", "expected an integer"});
  expect_error(hf_with_config("hf_layers", [](json& c) { c["num_hidden_layers"] = 3; }),
               {"missing tensor 'model.layers.2.input_layernorm.weight'"});
  expect_error(hf_with_config("hf_rope", [](json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}}; }),
               {"unsupported rope_scaling type 'yarn'"});
}

TEST(BadInput, MissingTokenizer) {
  const fs::path dir = scratch("l2c_no_tok");
  fs::create_directories(dir);
  fs::remove(dir / "model.bin");
  fs::create_symlink(fixtures_dir() / kSmall / "model.bin", dir / "model.bin");
  LoadOptions opts;
  opts.require_tokenizer = true;
  expect_error(dir / "model.bin", {"model.bin", "no tokenizer found", "tokenizer.bin"}, opts);
  LoadOptions lenient;
  const auto m = load_model(dir / "model.bin", lenient);
  EXPECT_EQ(m->tokenizer, nullptr);
  try {
    m->require_tokenizer();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.bin"), std::string::npos) << e.what();
  }
}

TEST(BadInput, Llama2cSizeMismatchAndBadHeader) {
  std::string bytes = read_bytes(fixtures_dir() / kSmall / "model.bin");
  const fs::path p = scratch("extra.bin");
  write_bytes(p, bytes + std::string(4, '\0'));
  expect_error(p, {"size mismatch", "dim=64"});
  int32_t heads = 3;  // dim 64 is not a multiple of 3
  std::memcpy(&bytes[12], &heads, 4);
  write_bytes(p, bytes);
  expect_error(p, {"not a llama2.c checkpoint", "dim is not a multiple of n_heads"});

  std::string v1 = read_bytes(fixtures_dir() / kSmall / "model-v1.bin");
  write_bytes(p, v1.substr(0, 100));
  expect_error(p, {"truncated", "256"});
  int32_t version = 2;
  std::memcpy(&v1[4], &version, 4);
  write_bytes(p, v1);
  expect_error(p, {"llama2.c export version 2 is not supported"});
}

// Random byte corruption of headers and metadata: either a clean load or a kvlab::Error, never a
// crash or another exception type (std::bad_alloc, std::length_error, ...).
TEST(BadInput, RandomCorruptionGivesErrorsNotCrashes) {
  std::mt19937 rng(1234);
  const fs::path small = fixtures_dir() / kSmall;
  struct Target { fs::path src; std::string name; size_t region; };
  const fs::path hf_dir = scratch("hf_corrupt");
  fs::create_directories(hf_dir);
  fs::copy_file(small / "hf/config.json", hf_dir / "config.json", fs::copy_options::overwrite_existing);
  for (const Target& t : {Target{small / "model.gguf", "c.gguf", 12000}, Target{small / "model.bin", "c.bin", 28},
                          Target{small / "model-v1.bin", "c1.bin", 256},
                          Target{small / "hf/model.safetensors", "hf_corrupt/model.safetensors", 2500}}) {
    const std::string clean = read_bytes(t.src);
    int errors = 0;
    for (int iter = 0; iter < 80; ++iter) {
      std::string bytes = clean;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) {
        bytes[rng() % std::min(t.region, bytes.size())] = static_cast<char>(rng());
      }
      const fs::path p = scratch(t.name);
      write_bytes(p, bytes);
      LoadOptions opts;
      opts.load_tokenizer = false;
      try {
        load_model(t.name.rfind("hf_", 0) == 0 ? hf_dir : p, opts);
      } catch (const Error&) {
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << t.name << " iteration " << iter << ": non-kvlab exception: " << e.what();
      }
    }
    EXPECT_GT(errors, 0) << t.name;
  }
}

TEST(BadInput, QuantizingOddColumnsIsRefused) {
  // dim 64: no multiple of q4_k's 256-value blocks; an unknown dtype fails clearly too.
  LoadOptions opts;
  opts.load_tokenizer = false;
  for (auto [dtype, want] : {std::pair{"q4_k", "columns, not a multiple of 256: cannot convert to q4_k"},
                             std::pair{"iq4_nl", "unknown dtype 'iq4_nl'"}}) {
    opts.weight_dtype = dtype;
    try {
      load_model(fixtures_dir() / kSmall / "model.gguf", opts);
      ADD_FAILURE() << dtype;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// --weight-dtype to kvlab's own quantisers: every block type with a quantiser loads and runs
// (the weights equal from_float of the f32 weights); q2_k / q3_k (no quantiser) are refused.
TEST(Model, ConvertsToBlockQuantTypes) {
  LoadOptions opts;
  opts.load_tokenizer = false;
  for (const char* dtype : {"q4_0", "q4_1", "q5_0", "q5_1"}) {
    opts.weight_dtype = dtype;
    const auto m = load_model(fixtures_dir() / kSmall / "model.gguf", opts);
    EXPECT_EQ(m->layers[0].wq.dtype, parse_dtype(dtype));
    EXPECT_EQ(m->tok_embeddings.dtype, parse_dtype(dtype));
  }
  opts.weight_dtype = "q2_k";
  try {
    load_model(fixtures_dir() / "llama_hd64_gqa2_untied" / "model.gguf", opts);
    ADD_FAILURE() << "q2_k";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'token_embd.weight': kvlab cannot convert to q2_k"),
              std::string::npos) << e.what();
  }
}

// ----- resource limits (issue 11): sizes read from a file are checked before anything is
// allocated. Each case replays a fuzzer finding.

// Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

TEST(ResourceLimits, Llama2cHeaderProductsThatOverflowInt64AreTruncated) {
  // 36-byte files whose header values are each within 2^24 but whose block sizes multiply past
  // int64 (hidden * dim * n_layers = 2^72): they passed the size check through wrapped sums and
  // then segfaulted, hung building tensor tables, or reported a wrapped byte count.
  struct Header { int32_t dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len; };
  const int32_t big = 1 << 24;
  for (const Header& h : {Header{big, big, big, 1 << 20, 1 << 20, big, big},
                          Header{big, big, big, 1 << 22, 1 << 22, -big, big},
                          Header{1 << 16, big, big, 1 << 10, 1 << 10, 1 << 10, 1},
                          Header{2, big, big, 1, 1, 1, 1}}) {
    std::string bytes(sizeof h, '\0');
    std::memcpy(bytes.data(), &h, sizeof h);
    bytes += std::string(8, '\0');
    const fs::path p = scratch("overflow.bin");
    write_bytes(p, bytes);
    expect_error(p, {p.string(), "truncated", "needs more than 36"});
  }
  // The same in a version 1 header.
  std::string v1(256, '\0');
  const uint32_t magic = 0x616b3432;
  const int32_t version = 1;
  const int32_t header[7] = {big, big, big, 1 << 20, 1 << 20, big, big};
  std::memcpy(v1.data(), &magic, 4);
  std::memcpy(v1.data() + 4, &version, 4);
  std::memcpy(v1.data() + 8, header, sizeof header);
  const fs::path p = scratch("overflow_v1.bin");
  write_bytes(p, v1);
  expect_error(p, {p.string(), "truncated", "needs more than 256"});
}

TEST(ResourceLimits, GgufBlockCountBitFlipFailsAtTheFirstMissingTensor) {
  // One flipped bit: llama.block_count 2 -> 67,108,866 (0x04000002). Before, build_weights sized
  // 67M layer tables (~21.5 GiB) before looking at a tensor.
  std::string bytes = read_bytes(fixtures_dir() / kSmall / "model.gguf");
  const std::string key = "llama.block_count";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + key.size() + 4;  // after the key: u32 type (UINT32), then the value
  uint32_t layers = 0;
  std::memcpy(&layers, &bytes[value], 4);
  ASSERT_EQ(layers, 2u);
  layers |= 1u << 26;
  std::memcpy(&bytes[value], &layers, 4);
  const fs::path p = scratch("block_count.gguf");
  write_bytes(p, bytes);
  const double rss_before = peak_rss_mib();
  expect_error(p, {p.string(), "missing tensor 'blk.2.attn_norm.weight'", "67108866 layers"});
  // The fixture is 0.4 MiB; 64 MiB of headroom covers the allocator, not a per-layer table.
  EXPECT_LT(peak_rss_mib() - rss_before, 64.0);
}

TEST(ResourceLimits, HfConfigNumbersOutOfRangeNameTheKey) {
  // original_max_position_embeddings: 1e12 was an undefined float -> int conversion (exit 0).
  expect_error(hf_with_config("hf_rope_pos", [](json& c) {
                 c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 1e12}};
               }),
               {"config.json", "'original_max_position_embeddings' = 1000000000000.0",
                "expected a positive integer below 2^31"});
  // An integral float is an integer (some exporters write 8192.0).
  {
    const fs::path dir = hf_with_config("hf_rope_pos_ok", [](json& c) {
      c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192.0}};
    });
    EXPECT_EQ(load(dir)->config.rope_scaling.original_max_position, 8192);
  }
  expect_error(hf_with_config("hf_theta", [](json& c) { c["rope_theta"] = 1e39; }),
               {"config.json", "'rope_theta'", "expected a finite float32 number"});
  expect_error(hf_with_config("hf_layers_u64", [](json& c) { c["num_hidden_layers"] = uint64_t{1} << 63; }),
               {"config.json", "'num_hidden_layers'", "out of range"});
}

TEST(ResourceLimits, SafetensorsHeaderNumberOutOfRangeIsAnError) {
  // 1e400 made nlohmann throw out_of_range, which escaped (only parse_error was caught).
  const fs::path dir = scratch("hf_1e400");
  fs::create_directories(dir);
  fs::copy_file(fixtures_dir() / kSmall / "hf/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const std::string header = R"({"model.norm.weight": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  write_bytes(dir / "model.safetensors", file + header + std::string(4, '\0'));
  expect_error(dir, {"model.safetensors", "header is not valid JSON"});
  // A shape whose dimensions multiply past int64 before the 2^50 check.
  const std::string wide = R"({"t": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 1099511627776], "data_offsets": [0, 4]}})";
  const uint64_t m = wide.size();
  std::memcpy(file.data(), &m, 8);
  write_bytes(dir / "model.safetensors", file + wide + std::string(4, '\0'));
  expect_error(dir, {"model.safetensors", "tensor 't': bad shape"});
}

TEST(ResourceLimits, OverlongPathComponentIsAnErrorNamingThePath) {
  const fs::path p = fixtures_dir() / (std::string(300, 'x') + ".bin");
  expect_error(p, {std::string(300, 'x')});
  const fs::path dir = fixtures_dir() / std::string(300, 'y') / "model.gguf";
  expect_error(dir, {std::string(300, 'y')});
}

TEST(ResourceLimits, MisalignedTensorDataIsCopiedNotReadInPlace) {
  // fuzz_hf: a header of odd length put every tensor at an odd address, and the F32/BF16 reads
  // were misaligned (UBSan). Such a file is valid; the loader copies those tensors.
  const fs::path src = fixtures_dir() / kSmall / "hf";
  const fs::path dir = scratch("hf_misaligned");
  fs::create_directories(dir);
  fs::copy_file(src / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  std::string st = read_bytes(src / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  st.insert(8 + n, " ");  // JSON allows the trailing space; the data start moves by one byte
  ++n;
  std::memcpy(st.data(), &n, 8);
  write_bytes(dir / "model.safetensors", st);
  const auto shifted = load(dir);
  const auto original = load(src);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(shifted->layers[0].wq.data) % alignof(float), 0u);
  EXPECT_EQ(weight_to_float(shifted->layers[0].wq), weight_to_float(original->layers[0].wq));
  EXPECT_EQ(weight_to_float(shifted->lm_head), weight_to_float(original->lm_head));
  EXPECT_EQ(shifted->final_norm, original->final_norm);
}
}  // namespace
}  // namespace kvlab
