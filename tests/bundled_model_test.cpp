// The bundled model (data/models/kvlab-tiny): kvlab's logits on the exported GGUF and Hugging Face
// files match the PyTorch model it was trained as (max |difference| <= 1e-3), on held-out text.
// The PyTorch logits are written by data/torch_logits.py at export time (no torch needed here);
// the tokens are checked against kvlab's own tokenizer, so the text path is covered too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "framework/engine/engine.h"
#include "framework/engine/logit_bound.h"
#include "framework/model/model.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;

const fs::path kModels = fs::path(KVLAB_SOURCE_DIR) / "data" / "models";

// Raw little-endian float32 file -> floats.
std::vector<float> read_f32(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const auto bytes = static_cast<size_t>(in.tellg());
  std::vector<float> out(bytes / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(bytes));
  return out;
}

std::vector<int32_t> read_tokens(const fs::path& path) {
  std::ifstream in(path);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

class BundledModel : public ::testing::TestWithParam<std::string> {};

TEST_P(BundledModel, LogitsMatchThePyTorchModel) {
  const fs::path model_path = kModels / GetParam();
  const fs::path ref_logits = kModels / "kvlab-tiny.torch-logits.f32";
  ASSERT_TRUE(fs::exists(model_path)) << model_path;
  ASSERT_TRUE(fs::exists(ref_logits)) << ref_logits << ": run data/torch_logits.py";
  const std::vector<int32_t> tokens = read_tokens(kModels / "kvlab-tiny.torch-logits.tokens");
  const std::vector<float> expected = read_f32(ref_logits);

  auto model = load_model(model_path);
  const int vocab = model->config.vocab_size;
  ASSERT_EQ(expected.size(), tokens.size() * static_cast<size_t>(vocab));

  // The same ids from kvlab's tokenizer (BOS + the start of the held-out text).
  ASSERT_NE(model->tokenizer, nullptr);
  std::ifstream text_in(fs::path(KVLAB_SOURCE_DIR) / "data" / "eval" / "heldout.txt");
  std::string text((std::istreambuf_iterator<char>(text_in)), {});
  text.resize(std::min<size_t>(text.size(), 20000));
  EncodeOptions bos;
  bos.add_bos = true;
  std::vector<int32_t> ours = model->tokenizer->encode(text, bos);
  ours.resize(tokens.size());
  EXPECT_EQ(ours, tokens);

  EngineOptions opts;
  opts.threads = 1;
  Engine engine(*model, opts);
  const SeqId seq = engine.start_sequence();
  std::vector<float> logits;
  ASSERT_EQ(engine.prefill(seq, tokens, logits, /*all_logits=*/true), StepStatus::kOk);
  ASSERT_EQ(logits.size(), expected.size());
  float max_diff = 0.f;
  for (size_t i = 0; i < logits.size(); ++i)
    max_diff = std::max(max_diff, std::abs(logits[i] - expected[i]));
  // The PyTorch logits are an fp32 pass too (data/torch_logits.py): two differently rounded
  // passes, each within logit_bound() of the exact logits (framework/engine/logit_bound.h).
  const double bound = 2 * logit_bound(*model, tokens.size());
  std::printf("%s: bound %.3g\n", GetParam().c_str(), bound);
  EXPECT_LE(max_diff, bound) << GetParam();
  RecordProperty("max_abs_logit_diff", std::to_string(max_diff));
  std::printf("%s: max |kvlab - PyTorch| = %.3g over %zu tokens\n", GetParam().c_str(), max_diff,
              tokens.size());
}

INSTANTIATE_TEST_SUITE_P(Files, BundledModel,
                         ::testing::Values("kvlab-tiny.gguf", "kvlab-tiny-hf"),
                         [](const auto& info) {
                           return info.param == "kvlab-tiny.gguf" ? std::string("gguf")
                                                                  : std::string("hf");
                         });

}  // namespace
}  // namespace kvlab
