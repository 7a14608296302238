// Reads a JSON file (Hugging Face config.json, tokenizer.json, a safetensors index) into a
// nlohmann::json, or throws kvlab::Error naming the file.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"

namespace kvlab {

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(path.string(), ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": malformed JSON: ", e.what());
  }
}

}  // namespace kvlab
