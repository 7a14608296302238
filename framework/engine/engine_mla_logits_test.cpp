// Golden logits of the MLA (deepseek2) GGUF fixtures (CTest fixture mla_models, written by
// scripts/fixtures/make_mla_fixtures.py): for every config,
//   - kvlab's absorbed engine on the GGUF equals the independent numpy float64 reference
//     (tests/reference/mla_ref.py on the HF copy of the weights; one fixture with YaRN) within
//     logit_bound(), against
//     both of the reference's modes (decompressed, as HF computes, and absorbed);
//   - token-by-token decode gives the prefill logits within 2 logit_bound();
//   - the loaded config is the file's (ranks, head dims, one latent KV head, YaRN's scale), from
//     the GGUF and from the HF directory of the same weights, whose logits equal the GGUF's bit
//     for bit (same F32 weights, same kernels);
//   - every other format of the family: the F16 and BF16 GGUFs and HF directories (the weights
//     rounded once, the reference reading those rounded values from hf-f16/ and hf-bf16/) equal
//     the reference within logit_bound(), and each GGUF equals its HF directory within two bounds;
//     the Q8_0 GGUF equals the F32 HF directory quantised to q8_0 at load within two bounds (the
//     other families' check: the quantisation itself is not a rounding logit_bound models);
//   - the bad GGUFs (MoE layers, expert_count, a missing key, a wrong kv_b shape) are refused
//     naming the key or tensor.
// Skips (naming the directory) when the fixtures are absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/fixture_logits_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/model/model.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using namespace fixture_logits;

fs::path fixtures_root() { return fixture_logits::fixtures_root("fixtures_mla"); }

// mode: decompressed (as HF computes) or absorbed.
std::vector<float> reference_logits(const fs::path& hf_dir, const std::vector<int32_t>& tokens, int vocab,
                                    const std::string& mode) {
  return fixture_logits::reference_logits("tests/reference/mla_ref.py", hf_dir, tokens, vocab, "--mode " + mode);
}

class MlaFixtures : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path list = fixtures_root() / "fixtures.json";
    if (!fs::exists(list)) GTEST_SKIP() << "needs the mla_models fixtures in " << fixtures_root() << ": absent (run ctest)";
    const nlohmann::json names = nlohmann::json::parse(std::ifstream(list))["fixtures"];
    for (const auto& name : names)
      fixtures_.push_back(fixture_logits::read_fixture(fixtures_root() / name.get<std::string>()));
    ASSERT_FALSE(fixtures_.empty());
  }
  std::vector<Fixture> fixtures_;
};

TEST_F(MlaFixtures, ConfigIsTheFiles) {
  for (const Fixture& f : fixtures_) for (const char* file : {"model.gguf", "hf"}) {
    SCOPED_TRACE(f.dir.filename().string() + "/" + file);
    const auto m = load(f.dir / file);
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, "deepseek2");
    EXPECT_TRUE(c.mla());
    EXPECT_EQ(c.q_lora_rank, f.meta["q_lora_rank"].get<int>());
    EXPECT_EQ(c.kv_lora_rank, f.meta["kv_lora_rank"].get<int>());
    EXPECT_EQ(c.qk_nope_head_dim, f.meta["qk_nope"].get<int>());
    EXPECT_EQ(c.qk_rope_head_dim, f.meta["qk_rope"].get<int>());
    EXPECT_EQ(c.v_head_dim, f.meta["v_head"].get<int>());
    EXPECT_EQ(c.n_kv_heads, 1);
    EXPECT_EQ(c.head_dim, c.kv_lora_rank + c.qk_rope_head_dim);
    EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
    // YaRN: the score scale times (1 + yarn_log_multiplier ln factor)^2, 0.1 x mscale_all_dim the multiplier
    double ms = 1;
    if (!f.meta["yarn"].is_null()) {
      EXPECT_EQ(c.rope_scaling.type, "yarn");
      EXPECT_EQ(c.rope_scaling.factor, f.meta["yarn"]["factor"].get<float>());
      EXPECT_EQ(c.rope_scaling.original_max_position, f.meta["yarn"]["original_max_position_embeddings"].get<int>());
      ms = 1 + 0.1 * f.meta["yarn"]["mscale_all_dim"].get<double>() * std::log(f.meta["yarn"]["factor"].get<double>());
    } else {
      EXPECT_EQ(c.rope_scaling.type, "none");
    }
    EXPECT_FLOAT_EQ(attention_scale(c), float(ms * ms / std::sqrt(double(c.qk_nope_head_dim + c.qk_rope_head_dim))));
  }
}

TEST_F(MlaFixtures, GgufMatchesTheNumpyReference) {
  for (const Fixture& f : fixtures_) {
    const auto m = load(f.dir / "model.gguf");
    const int V = m->config.vocab_size;
    for (size_t k = f.sequences.size() - 2; k < f.sequences.size(); ++k) {
      const auto& seq = f.sequences[k];
      const auto got = prefill_logits(*m, seq);
      for (const char* mode : {"decompressed", "absorbed"})
        expect_within(got, reference_logits(f.dir / "hf", seq, V, mode), logit_bound(*m, seq.size()),
                      f.dir.filename().string() + ", " + std::to_string(seq.size()) + " tokens, reference " + mode);
    }
  }
}

// F16 and BF16: one fp32 pass over the rounded weights against the float64 reference over the
// same rounded weights, so logit_bound() (fp32 rounding only) is the tolerance, as for the F32
// files and the other families' hf-bf16 directories; GGUF vs HF of the same rounded weights: two
// passes (the HF loader and the GGUF loader may lay the matrices out differently), two bounds.
TEST_F(MlaFixtures, EveryFormatMatchesTheNumpyReference) {
  int q8_files = 0;
  for (const Fixture& f : fixtures_) {
    const auto& files = f.meta["files"];
    const auto& seq = f.sequences.back();
    const std::string name = f.dir.filename().string();
    for (const char* low : {"f16", "bf16"}) {
      ASSERT_TRUE(files.contains(std::string("gguf_") + low) && files.contains(std::string("hf_") + low)) << name;
      const fs::path hf_dir = f.dir / files[std::string("hf_") + low].get<std::string>();
      const auto gguf = load(f.dir / files[std::string("gguf_") + low].get<std::string>());
      const auto hf = load(hf_dir);
      EXPECT_EQ(gguf->stored_dtype, low) << name;
      EXPECT_EQ(hf->stored_dtype, low) << name;
      const int V = gguf->config.vocab_size;
      const auto ref = reference_logits(hf_dir, seq, V, "decompressed");
      const auto got = prefill_logits(*gguf, seq);
      expect_within(got, ref, logit_bound(*gguf, seq.size()), name + " gguf " + low + " vs reference");
      const auto got_hf = prefill_logits(*hf, seq);
      expect_within(got_hf, ref, logit_bound(*hf, seq.size()), name + " hf " + low + " vs reference");
      expect_within(got_hf, got, 2 * logit_bound(*hf, seq.size()), name + " hf " + low + " vs gguf " + low);
    }
    if (!files.contains("gguf_q8_0")) continue;  // a matrix row not a multiple of 32 values
    ++q8_files;
    const auto stored = load(f.dir / files["gguf_q8_0"].get<std::string>());
    const auto converted = load(f.dir / files["hf"].get<std::string>(), "q8_0");
    expect_within(prefill_logits(*stored, seq), prefill_logits(*converted, seq),
                  2 * logit_bound(*converted, seq.size()), name + " gguf q8_0 vs hf quantised at load");
  }
  EXPECT_GE(q8_files, 1) << "no MLA fixture has a Q8_0 file";
}

TEST_F(MlaFixtures, HfDirectoryEqualsTheGguf) {
  for (const Fixture& f : fixtures_) {
    const auto gguf = load(f.dir / "model.gguf");
    const auto hf = load(f.dir / "hf");
    EXPECT_EQ(hf->format, "hf");
    const auto& seq = f.sequences.back();
    EXPECT_EQ(prefill_logits(*hf, seq), prefill_logits(*gguf, seq)) << f.dir.filename().string();
  }
}

TEST_F(MlaFixtures, DecodeMatchesPrefill) {
  for (const Fixture& f : fixtures_) {
    const auto m = load(f.dir / "model.gguf");
    const auto& seq = f.sequences.back();
    expect_within(decode_logits(*m, seq), prefill_logits(*m, seq), 2 * logit_bound(*m, seq.size()), f.dir.filename().string() + " decode");
  }
}

TEST_F(MlaFixtures, BadFilesAreRefusedNamingTheProblem) {
  const fs::path bad = fixtures_root() / "bad";
  for (auto [file, needle] : {std::pair{"moe_layers.gguf", "leading_dense_block_count"},
                              std::pair{"expert_count.gguf", "expert_count"},
                              std::pair{"no_kv_lora_rank.gguf", "deepseek2.attention.kv_lora_rank"},
                              std::pair{"kv_b_shape.gguf", "blk.1.attn_kv_b.weight"}}) {
    SCOPED_TRACE(file);
    try {
      load(bad / file);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace kvlab
