#include "framework/tokenizer/tokenizer.h"

#include <cstring>
#include <new>
#include <fstream>

#include "framework/core/error.h"
#include "framework/tokenizer/hf_tokenizer_json.h"
#include "framework/tokenizer/llama2c_vocab.h"
#include "framework/tokenizer/sentencepiece_tokenizer.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {

void check_token_id(const std::string& source, int32_t id, int32_t vocab_size) {
  if (id < 0 || id >= vocab_size)
    fail(source, ": token id ", id, " is outside the vocabulary [0, ", vocab_size, ")");
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

std::string StreamDecoder::push(int32_t id) {
  if (started_) {
    pending_ += tokenizer_->token_to_piece(id);
  } else {
    // Until some text appears, decode the ids seen so far as a whole: the first visible piece
    // may be trimmed (SentencePiece drops its dummy-prefix space), later ones never are.
    leading_ids_.push_back(id);
    std::string text = tokenizer_->decode(leading_ids_);
    if (text.empty()) return "";
    started_ = true;
    leading_ids_.clear();
    pending_ += text;
  }
  const size_t n = utf8::complete_prefix_length(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

namespace {

enum class TokenizerFileKind { kSentencePiece, kHfJson, kLlama2c, kGguf };

TokenizerFileKind sniff(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".json") return TokenizerFileKind::kHfJson;
  if (ext == ".gguf") return TokenizerFileKind::kGguf;
  if (ext == ".model") return TokenizerFileKind::kSentencePiece;
  std::ifstream in(path, std::ios::binary);
  char head[4] = {0, 0, 0, 0};
  in.read(head, 4);
  if (std::memcmp(head, "GGUF", 4) == 0) return TokenizerFileKind::kGguf;
  if (head[0] == '{') return TokenizerFileKind::kHfJson;
  if (ext == ".bin" || looks_like_llama2c_vocab(path)) return TokenizerFileKind::kLlama2c;
  return TokenizerFileKind::kSentencePiece;
}

}  // namespace

// Defined in gguf_tokenizer.cpp: opens the file with the GGUF reader.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::filesystem::path& path);

namespace {

std::unique_ptr<Tokenizer> load_tokenizer_unguarded(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path.string(), ": no such tokenizer file or directory");
  if (std::filesystem::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.bin"})
      if (std::filesystem::is_regular_file(path / name, ec)) return load_tokenizer(path / name);
    fail(path.string(), ": directory holds no tokenizer.json, tokenizer.model or tokenizer.bin");
  }
  switch (sniff(path)) {
    case TokenizerFileKind::kHfJson: return load_hf_tokenizer_json(path);
    case TokenizerFileKind::kGguf: return load_gguf_tokenizer(path);
    case TokenizerFileKind::kLlama2c:
      return sentencepiece_from_vocab(read_llama2c_vocab(path), path.string(), /*add_bos=*/true);
    case TokenizerFileKind::kSentencePiece: break;
  }
  return load_sentencepiece_model(path);
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path) {
  try {
    return load_tokenizer_unguarded(path);
  } catch (const std::bad_alloc&) {
    fail(path.string(), ": out of memory while loading the tokenizer");
  } catch (const std::filesystem::filesystem_error& e) {
    fail(path.string(), ": ", e.code().message(), " (", e.path1().string(), ")");
  }
}

}  // namespace kvlab
