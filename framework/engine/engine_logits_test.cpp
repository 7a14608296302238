// Golden logits on the tiny fixture models (CTest fixture tiny_models, written by
// scripts/fixtures/make_fixtures.py): for every config,
//   - the engine on the Hugging Face F32 files agrees with the independent numpy float64
//     reference (tests/reference/llama_ref.py) within logit_bound() (the rounding of one fp32
//     forward pass, from the model's shapes and weights), and so does the HF BF16 copy with the
//     reference run on the same BF16 files;
//   - the same weights in other files give the same logits: sharded HF = HF and llama2.c = GGUF
//     bit for bit; GGUF/llama2.c (Q/K permuted for interleaved RoPE) vs HF (rotate-half) within
//     2 logit_bound() (the permuted head features only reorder float sums: two fp32 passes);
//   - GGUF F16 / Q8_0 files give the same logits as the HF F32 model converted to F16 / Q8_0 on
//     load (the same stored values, Q/K permuted: 2 logit_bound());
//   - token-by-token decode (matvec kernels) gives the prefill logits (sgemm) within 2
//     logit_bound().
// The Gemma fixtures (local windows shorter and longer than the sequences, soft-capping) go
// through the same checks; their GGUF equals their HF files bit for bit.
// Skips (naming the directory) when the fixtures are absent, e.g. the binary run by hand
// before `ctest -R make_tiny_models`.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/fixture_logits_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/model/model.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using namespace fixture_logits;

fs::path fixtures_root() { return fixture_logits::fixtures_root("fixtures"); }

std::vector<Fixture> load_fixtures() {
  std::vector<Fixture> out;
  const fs::path root = fixtures_root();
  if (!fs::exists(root)) return out;
  for (const auto& entry : fs::directory_iterator(root))
    if (fs::exists(entry.path() / "fixture.json")) out.push_back(fixture_logits::read_fixture(entry.path()));
  std::sort(out.begin(), out.end(), [](const Fixture& a, const Fixture& b) { return a.dir < b.dir; });
  return out;
}

// Logits [n, vocab] from the numpy reference on a HF directory.
std::vector<float> reference_logits(const fs::path& hf_dir, const std::vector<int32_t>& tokens, int vocab) {
  return fixture_logits::reference_logits("tests/reference/llama_ref.py", hf_dir, tokens, vocab);
}

class FixtureLogits : public ::testing::Test {
 protected:
  void SetUp() override {
    fixtures_ = load_fixtures();
    if (fixtures_.empty())
      GTEST_SKIP() << "needs the tiny_models fixtures in " << fixtures_root() << ": absent (run ctest)";
  }
  std::vector<Fixture> fixtures_;
};

TEST_F(FixtureLogits, HfMatchesTheNumpyReference) {
  for (const Fixture& f : fixtures_) {
    const auto& files = f.meta["files"];
    const auto hf = load(f.dir / files["hf"].get<std::string>());
    const int V = hf->config.vocab_size;
    // the two longest sequences (the short ones add a python start-up each and little else)
    for (size_t k = f.sequences.size() >= 2 ? f.sequences.size() - 2 : 0; k < f.sequences.size(); ++k) {
      const auto& seq = f.sequences[k];
      const std::string what = f.dir.filename().string() + ", " + std::to_string(seq.size()) + " tokens";
      expect_within(prefill_logits(*hf, seq), reference_logits(f.dir / files["hf"].get<std::string>(), seq, V),
                    logit_bound(*hf, seq.size()), what);
    }
    if (files.contains("hf_bf16")) {
      const fs::path dir = f.dir / files["hf_bf16"].get<std::string>();
      const auto bf = load(dir);
      const auto& seq = f.sequences.back();
      expect_within(prefill_logits(*bf, seq), reference_logits(dir, seq, V), logit_bound(*bf, seq.size()),
                    f.dir.filename().string() + " bf16");
    }
  }
}

TEST_F(FixtureLogits, EveryFormatGivesTheSameLogits) {
  for (const Fixture& f : fixtures_) {
    const auto& files = f.meta["files"];
    const auto hf = load(f.dir / files["hf"].get<std::string>());
    const auto& seq = f.sequences.back();
    const auto want = prefill_logits(*hf, seq);
    const double two_passes = 2 * logit_bound(*hf, seq.size());  // two differently rounded passes
    // HF (rotate-half) vs sharded HF: the same computation, bit for bit.
    if (files.contains("hf_sharded")) {
      SCOPED_TRACE(f.dir.filename().string() + " hf_sharded");
      EXPECT_EQ(max_abs_diff(prefill_logits(*load(f.dir / files["hf_sharded"].get<std::string>()), seq), want), 0.f);
    }
    // GGUF vs llama2.c: both store Q/K for interleaved RoPE, so also bit for bit; against HF the
    // head features are permuted, which only reorders float sums.
    std::vector<float> gguf;
    if (files.contains("gguf")) {
      gguf = prefill_logits(*load(f.dir / files["gguf"].get<std::string>()), seq);
      expect_within(gguf, want, two_passes, f.dir.filename().string() + " gguf");
      // Gemma: no Q/K permutation (NeoX RoPE) and the GGUF's norms are float32(1 + w), what the HF
      // loader computes from w: the same values, the same computation, bit for bit.
      const std::string arch = f.meta["arch"].get<std::string>();
      if (arch == "gemma2" || arch == "gemma3") {
        SCOPED_TRACE(f.dir.filename().string() + " gguf == hf");
        EXPECT_EQ(max_abs_diff(gguf, want), 0.f);
      }
    }
    if (files.contains("llama2c")) {
      SCOPED_TRACE(f.dir.filename().string() + " llama2c");
      const auto l2c = prefill_logits(*load(f.dir / files["llama2c"].get<std::string>()), seq);
      expect_within(l2c, want, two_passes, f.dir.filename().string() + " llama2c");
      if (!gguf.empty()) {
        EXPECT_EQ(max_abs_diff(l2c, gguf), 0.f);
      }
    }
    for (auto [key, dtype] : {std::pair{"gguf_f16", "f16"}, std::pair{"gguf_q8_0", "q8_0"}}) {
      if (!files.contains(key)) continue;
      const auto stored = load(f.dir / files[key].get<std::string>());
      const auto converted = load(f.dir / files["hf"].get<std::string>(), dtype);
      expect_within(prefill_logits(*stored, seq), prefill_logits(*converted, seq),
                    2 * logit_bound(*converted, seq.size()), f.dir.filename().string() + " " + key);
    }
  }
}

TEST_F(FixtureLogits, DecodeMatchesPrefill) {
  for (const Fixture& f : fixtures_) {
    const auto m = load(f.dir / f.meta["files"]["gguf"].get<std::string>());
    const auto& seq = f.sequences.back();
    const auto want = prefill_logits(*m, seq);
    const auto all = decode_logits(*m, seq);
    // decode (matvec kernels, attention over 1 query) and prefill (sgemm, all queries) round
    // differently: two passes.
    expect_within(all, want, 2 * logit_bound(*m, seq.size()), f.dir.filename().string() + " decode");
  }
}

}  // namespace
}  // namespace kvlab
