// Shared by the golden-logit tests on generated fixture models (engine_logits_test.cpp: the tiny
// Llama/Gemma/Qwen fixtures; engine_mla_logits_test.cpp: the MLA ones): where the fixtures and the
// numpy references live, one fixture directory read, a model loaded without its tokenizer, the
// reference's logits, and the max-|diff| comparison that prints its margin (header-only).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/model/model.h"

namespace kvlab::fixture_logits {

namespace fs = std::filesystem;

// BINARY_DIR/<subdir>: the environment's KVLAB_BINARY_DIR, else the build's.
inline fs::path fixtures_root(const std::string& subdir) {
  if (const char* b = std::getenv("KVLAB_BINARY_DIR")) return fs::path(b) / subdir;
  return fs::path(KVLAB_BINARY_DIR) / subdir;
}

inline fs::path source_root() {
  if (const char* s = std::getenv("KVLAB_SOURCE_DIR")) return s;
  return KVLAB_SOURCE_DIR;
}

// One fixture directory: fixture.json (its metadata) and tokens.json's sequences.
struct Fixture {
  fs::path dir;
  nlohmann::json meta;
  std::vector<std::vector<int32_t>> sequences;
};

inline Fixture read_fixture(const fs::path& dir) {
  Fixture f;
  f.dir = dir;
  f.meta = nlohmann::json::parse(std::ifstream(dir / "fixture.json"));
  const nlohmann::json tokens = nlohmann::json::parse(std::ifstream(dir / "tokens.json"));
  for (const auto& seq : tokens["sequences"]) f.sequences.push_back(seq.get<std::vector<int32_t>>());
  return f;
}

inline std::unique_ptr<Model> load(const fs::path& path, const std::string& dtype = "keep") {
  LoadOptions o;
  o.load_tokenizer = false;
  o.weight_dtype = dtype;
  return load_model(path, o);
}

// Logits [n, vocab] from a numpy reference script (relative to the source tree) run on a HF
// directory: `script --model DIR --tokens a,b,... EXTRA --out FILE`.
inline std::vector<float> reference_logits(const std::string& script, const fs::path& hf_dir,
                                           const std::vector<int32_t>& tokens, int vocab,
                                           const std::string& extra_args = "") {
  std::string ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids += (i ? "," : "") + std::to_string(tokens[i]);
  const fs::path out = fs::temp_directory_path() / ("kvlab_ref_" + std::to_string(::getpid()) + ".f32");
  const std::string cmd = "/usr/bin/python3 '" + (source_root() / script).string() + "' --model '" +
                          hf_dir.string() + "' --tokens " + ids + (extra_args.empty() ? "" : " " + extra_args) +
                          " --out '" + out.string() + "'";
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

// max |a - b| in double (exact for two floats); infinity for a size mismatch or a NaN on either side.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  }
  return m;
}

// max |a - b| <= bound, printing both (the margin on this machine, for the record).
inline void expect_within(const std::vector<float>& a, const std::vector<float>& b, double bound,
                          const std::string& what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  const double d = max_abs_diff(a, b);
  std::printf("  %s: max |diff| %.3g, bound %.3g (%.3f of it)\n", what.c_str(), d, bound, d / bound);
  EXPECT_LE(d, bound) << what;
}

}  // namespace kvlab::fixture_logits
