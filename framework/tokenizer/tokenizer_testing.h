// Helpers shared by the self-contained tokenizer tests (tokenizer_test.cpp,
// tokenizer_robustness_test.cpp): temporary files, error expectations, streaming, and the
// hand-made SentencePiece, llama2.c and byte-level BPE vocabularies.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/tokenizer/byte_level.h"
#include "framework/tokenizer/spm_model_proto.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab::tokenizer_testing {

namespace fs = std::filesystem;

inline fs::path temp_dir() {
  const fs::path dir = fs::path(KVLAB_BINARY_DIR) / "tokenizer_test_tmp" /
                       ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::remove_all(dir);  // fresh for each run
  fs::create_directories(dir);
  return dir;
}

inline void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Expects `body` to throw kvlab::Error whose message names `file` and contains `problem`.
template <class F>
inline void expect_error(F body, const fs::path& file, const std::string& problem) {
  try {
    body();
    ADD_FAILURE() << "no error for " << file;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(file.string()), std::string::npos) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << message;
  }
}

inline std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, std::vector<std::string>* parts) {
  StreamDecoder stream(tok);
  std::string out;
  for (const int32_t id : ids) {
    parts->push_back(stream.push(id));
    out += parts->back();
  }
  parts->push_back(stream.flush());
  return out + parts->back();
}

// <unk> <s> </s>, the 256 byte pieces, then a few pieces whose scores set the BPE merge order.
inline SpmVocab tiny_spm_vocab() {
  SpmVocab v;
  const auto add = [&](std::string piece, float score, SpmPieceType type) {
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, SpmPieceType::kUnknown);
  add("<s>", 0, SpmPieceType::kControl);
  add("</s>", 0, SpmPieceType::kControl);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, 0, SpmPieceType::kByte);
  }
  // ids 259.. : higher score merges first.
  add("\xE2\x96\x81", -1, SpmPieceType::kNormal);                 // 259 ▁
  add("a", -2, SpmPieceType::kNormal);                            // 260
  add("b", -3, SpmPieceType::kNormal);                            // 261
  add("\xE2\x96\x81" "a", -4, SpmPieceType::kNormal);             // 262 ▁a
  add("ab", -5, SpmPieceType::kNormal);                           // 263
  add("\xE2\x96\x81" "ab", -6, SpmPieceType::kNormal);            // 264 ▁ab
  return v;
}

// llama2.c's layout for tiny_spm_vocab(): "▁" stored as " ", BOS/EOS as "\n<s>\n" / "\n</s>\n".
inline std::string tiny_llama2c_bin() {
  const SpmVocab v = tiny_spm_vocab();
  std::string body;
  int32_t max_len = 0;
  for (size_t i = 0; i < v.pieces.size(); ++i) {
    std::string text = v.pieces[i];
    if (i == 1) text = "\n<s>\n";
    if (i == 2) text = "\n</s>\n";
    for (size_t p; (p = text.find("\xE2\x96\x81")) != std::string::npos;) text.replace(p, 3, " ");
    const int32_t len = static_cast<int32_t>(text.size());
    max_len = std::max(max_len, len);
    body.append(reinterpret_cast<const char*>(&v.scores[i]), 4);
    body.append(reinterpret_cast<const char*>(&len), 4);
    body += text;
  }
  return std::string(reinterpret_cast<const char*>(&max_len), 4) + body;
}

// Vocabulary: the 256 byte-level characters (id = byte value), then merges building "hello".
inline std::string tiny_tokenizer_json(const std::string& extra_added = "") {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string ch = byte_level::encode(std::string(1, static_cast<char>(b)));
    std::string escaped;
    for (const char c : ch) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    vocab += "\"" + escaped + "\": " + std::to_string(b) + ", ";
  }
  vocab += R"("he": 256, "ll": 257, "hell": 258, "hello": 259, "Ġhello": 260, "<|end|>": 261)";
  return R"({"version": "1.0", "added_tokens": [{"id": 261, "content": "<|end|>", "special": true})" +
         extra_added + R"(], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "model": {"type": "BPE", "vocab": {)" + vocab + R"(},
              "merges": ["h e", "l l", "he ll", "hell o", "Ġ hello"]}})";
}

}  // namespace kvlab::tokenizer_testing
