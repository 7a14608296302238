// Loading the tiny fixtures (scripts/fixtures/make_fixtures.py, CTest fixture `tiny_models`):
// every format of one model must give the same config and the same weights, after accounting for
// the Q/K row order (GGUF llama and llama2.c: interleaved RoPE order; HF: rotate-half order).
// Also: dtype conversions on load and RoPE frequencies. Bad inputs: model_bad_input_test.cpp.
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
#include "framework/model/model_test_util.h"

namespace kvlab {
namespace {

using namespace model_testing;

// The configs make_fixtures.py writes (checked against its fixtures.json below).
const std::vector<std::string> kFixtures = {
    "llama_hd32_gqa1_tied",        "llama_hd64_gqa2_untied",   "llama_hd80_gqa4_untied",
    "llama_hd128_gqa8_tied",       "qwen2_hd64_gqa2_bias_tied", "qwen2_hd32_gqa4_bias_untied",
    "llama3_rope_hd32_gqa4",       "qwen3_hd64_gqa2_qknorm_untied",
    "gemma3_hd64_gqa2_w5",
    "gemma3_hd32_gqa1_w128_linear",
    "gemma2_hd32_gqa4_w4_softcap",
    "qwen3_hd32_gqa4_qknorm_tied"};

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

}  // namespace
}  // namespace kvlab
