// Helpers shared by model_test.cpp (loading the tiny fixtures) and model_bad_input_test.cpp (bad
// input and resource limits): where the fixtures live, loading one, scratch files.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "framework/core/error.h"
#include "framework/model/model.h"

namespace kvlab::model_testing {

namespace fs = std::filesystem;
using nlohmann::json;

inline fs::path fixtures_dir() {
  const char* env = std::getenv("KVLAB_BINARY_DIR");
  return fs::path(env ? env : KVLAB_BINARY_DIR) / "fixtures";
}

inline json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return json::parse(in);
}

inline std::unique_ptr<Model> load(const fs::path& p, const std::string& dtype = "keep") {
  LoadOptions opts;
  opts.weight_dtype = dtype;
  opts.load_tokenizer = false;
  return load_model(p, opts);
}

inline fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kvlab_model_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

inline std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const fs::path& p, const std::string& b) {
  std::ofstream(p, std::ios::binary).write(b.data(), b.size());
}

// Loads `p` expecting kvlab::Error whose message contains every `needles` entry.
inline void expect_error(const fs::path& p, const std::vector<std::string>& needles, LoadOptions opts = {}) {
  opts.load_tokenizer = opts.require_tokenizer;
  try {
    load_model(p, opts);
    ADD_FAILURE() << p << " loaded without error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

inline const fs::path kSmall = "llama_hd32_gqa1_tied";

}  // namespace kvlab::model_testing
