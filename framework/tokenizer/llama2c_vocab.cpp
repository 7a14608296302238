#include "framework/tokenizer/llama2c_vocab.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "framework/core/error.h"

namespace kvlab {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // "▁"
constexpr int32_t kMaxSaneTokenLength = 1 << 16;

bool is_byte_piece(const std::string& p) {
  const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  return p.size() == 6 && p.compare(0, 3, "<0x") == 0 && hex(p[3]) && hex(p[4]) && p[5] == '>';
}

std::string spaces_to_meta(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == ' ') out += kSpaceSymbol;
    else out += c;
  }
  return out;
}

}  // namespace

SpmVocab read_llama2c_vocab(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(name, ": cannot open llama2.c tokenizer file");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  size_t pos = 0;
  const auto read_i32 = [&](const char* what, size_t token) {
    if (bytes.size() - pos < 4)
      fail(name, ": truncated llama2.c tokenizer (", what, " of token ", token, " at byte ", pos, ")");
    int32_t v;
    std::memcpy(&v, bytes.data() + pos, 4);
    pos += 4;
    return v;
  };
  if (bytes.size() < 4) fail(name, ": truncated llama2.c tokenizer (", bytes.size(), " bytes, no header)");
  int32_t max_token_length;
  std::memcpy(&max_token_length, bytes.data(), 4);
  pos = 4;
  if (max_token_length <= 0 || max_token_length > kMaxSaneTokenLength)
    fail(name, ": not a llama2.c tokenizer (max_token_length ", max_token_length, " is not in [1, ",
         kMaxSaneTokenLength, "])");

  SpmVocab vocab;
  vocab.unk_id = vocab.bos_id = vocab.eos_id = -1;
  vocab.byte_fallback = false;
  while (pos < bytes.size()) {
    const size_t token = vocab.pieces.size();
    const int32_t score_bits = read_i32("score", token);
    float score;
    std::memcpy(&score, &score_bits, 4);
    const int32_t len = read_i32("length", token);
    if (!std::isfinite(score)) fail(name, ": token ", token, " has a non-finite score (at byte ", pos - 8, ")");
    if (len < 0 || len > max_token_length)
      fail(name, ": token ", token, " has length ", len, ", outside [0, max_token_length=",
           max_token_length, "] (at byte ", pos - 4, ")");
    if (bytes.size() - pos < static_cast<size_t>(len))
      fail(name, ": truncated llama2.c tokenizer (token ", token, " needs ", len, " bytes at byte ", pos,
           ", file has ", bytes.size(), ")");
    std::string text = bytes.substr(pos, len);
    pos += len;

    SpmPieceType type = SpmPieceType::kNormal;
    if (text == "\n<s>\n" || text == "<s>") {
      text = "<s>";
      type = SpmPieceType::kControl;
      vocab.bos_id = static_cast<int32_t>(token);
    } else if (text == "\n</s>\n" || text == "</s>") {
      text = "</s>";
      type = SpmPieceType::kControl;
      vocab.eos_id = static_cast<int32_t>(token);
    } else if (text == "<unk>") {
      type = SpmPieceType::kUnknown;
      vocab.unk_id = static_cast<int32_t>(token);
    } else if (is_byte_piece(text)) {
      type = SpmPieceType::kByte;
      vocab.byte_fallback = true;
    } else {
      text = spaces_to_meta(text);
    }
    vocab.pieces.push_back(std::move(text));
    vocab.scores.push_back(score);
    vocab.types.push_back(type);
  }
  if (vocab.pieces.empty()) fail(name, ": llama2.c tokenizer holds no tokens");
  if (vocab.unk_id < 0) fail(name, ": llama2.c tokenizer has no <unk> token (SentencePiece needs one)");
  return vocab;
}

bool looks_like_llama2c_vocab(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[12];
  if (!in.read(head, sizeof head)) return false;
  int32_t max_len, len;
  float score;
  std::memcpy(&max_len, head, 4);
  std::memcpy(&score, head + 4, 4);
  std::memcpy(&len, head + 8, 4);
  return max_len > 0 && max_len <= kMaxSaneTokenLength && std::isfinite(score) && len >= 0 &&
         len <= max_len;
}

}  // namespace kvlab
