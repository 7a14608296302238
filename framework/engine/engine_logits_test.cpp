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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/engine/engine_testing.h"
#include "framework/engine/logit_bound.h"
#include "framework/model/model.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

fs::path fixtures_root() {
  if (const char* b = std::getenv("KVLAB_BINARY_DIR")) return fs::path(b) / "fixtures";
  return fs::path(KVLAB_BINARY_DIR) / "fixtures";
}
fs::path source_root() {
  if (const char* s = std::getenv("KVLAB_SOURCE_DIR")) return s;
  return KVLAB_SOURCE_DIR;
}

struct Fixture {
  fs::path dir;
  nlohmann::json meta;
  std::vector<std::vector<int32_t>> sequences;
};

std::vector<Fixture> load_fixtures() {
  std::vector<Fixture> out;
  const fs::path root = fixtures_root();
  if (!fs::exists(root)) return out;
  for (const auto& entry : fs::directory_iterator(root)) {
    const fs::path meta = entry.path() / "fixture.json";
    if (!fs::exists(meta)) continue;
    Fixture f;
    f.dir = entry.path();
    f.meta = nlohmann::json::parse(std::ifstream(meta));
    const auto tokens = nlohmann::json::parse(std::ifstream(entry.path() / "tokens.json"));
    for (const auto& seq : tokens["sequences"]) f.sequences.push_back(seq.get<std::vector<int32_t>>());
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const Fixture& a, const Fixture& b) { return a.dir < b.dir; });
  return out;
}

std::unique_ptr<Model> load(const fs::path& path, const std::string& dtype = "keep") {
  LoadOptions o;
  o.load_tokenizer = false;
  o.weight_dtype = dtype;
  return load_model(path, o);
}

// Logits [n, vocab] from the numpy reference on a HF directory.
std::vector<float> reference_logits(const fs::path& hf_dir, const std::vector<int32_t>& tokens, int vocab) {
  std::string ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids += (i ? "," : "") + std::to_string(tokens[i]);
  const fs::path out = fs::temp_directory_path() / ("kvlab_ref_" + std::to_string(::getpid()) + ".f32");
  const std::string cmd = "/usr/bin/python3 '" + (source_root() / "tests/reference/llama_ref.py").string() +
                          "' --model '" + hf_dir.string() + "' --tokens " + ids + " --out '" + out.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "reference failed: " << cmd;
    return {};
  }
  std::vector<float> lg(tokens.size() * static_cast<size_t>(vocab));
  std::ifstream in(out, std::ios::binary);
  in.read(reinterpret_cast<char*>(lg.data()), static_cast<std::streamsize>(lg.size() * sizeof(float)));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(lg.size() * sizeof(float))) << out;
  fs::remove(out);
  return lg;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

// max |a - b| <= bound, printing both (the margin on this machine, for the record).
void expect_within(const std::vector<float>& a, const std::vector<float>& b, double bound,
                   const std::string& what) {
  const float d = max_abs_diff(a, b);
  std::printf("  %s: max |diff| %.3g, bound %.3g (%.3f of it)\n", what.c_str(), d, bound, d / bound);
  EXPECT_LE(d, bound) << what;
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
    EngineOptions o;
    o.threads = 1;
    o.block_size_tokens = 7;
    Engine e(*m, o);
    SeqId s = e.start_sequence();
    std::vector<float> all, lg;
    for (int32_t t : seq) {
      ASSERT_EQ(e.decode(std::span(&s, 1), std::span(&t, 1), lg), StepStatus::kOk);
      all.insert(all.end(), lg.begin(), lg.end());
    }
    // decode (matvec kernels, attention over 1 query) and prefill (sgemm, all queries) round
    // differently: two passes.
    expect_within(all, want, 2 * logit_bound(*m, seq.size()), f.dir.filename().string() + " decode");
  }
}

}  // namespace
}  // namespace kvlab
