// tokenizer_from_gguf: the tokenizer.ggml.* metadata (llama.cpp's convention) -> Tokenizer.
//
// Keys read:
//   tokenizer.ggml.model        "llama" (SentencePiece) | "gpt2" (byte-level BPE)
//   tokenizer.ggml.tokens       [vocab] strings (SentencePiece / byte-level spelling)
//   tokenizer.ggml.scores       [vocab] floats (llama; default 0)
//   tokenizer.ggml.token_type   [vocab] ints, SentencePiece's numbering: 1 normal, 2 unknown,
//                               3 control, 4 user-defined, 5 unused, 6 byte (default: inferred
//                               from the spelling as for llama2.c, see llama2c_vocab.h)
//   tokenizer.ggml.merges       [n_merges] "left right" strings in rank order (gpt2)
//   tokenizer.ggml.pre          pre-tokenizer name (gpt2): "default"/"gpt2", "llama3"/"llama-bpe"/
//                               "llama-v3" (+ ignore_merges), "qwen2" (+ NFC), "smollm"
//   tokenizer.ggml.bos_token_id, eos_token_id, unknown_token_id, padding_token_id (optional)
//   tokenizer.ggml.add_bos_token (default: true for llama, false for gpt2)
//   tokenizer.ggml.add_space_prefix (llama; default true)
#include <algorithm>

#include <cstdint>

#include "framework/core/error.h"
#include "framework/model/gguf.h"
#include "framework/tokenizer/bpe_tokenizer.h"
#include "framework/tokenizer/sentencepiece_tokenizer.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {
namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTokenType = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyBos = "tokenizer.ggml.bos_token_id";
constexpr std::string_view kKeyEos = "tokenizer.ggml.eos_token_id";
constexpr std::string_view kKeyUnk = "tokenizer.ggml.unknown_token_id";
constexpr std::string_view kKeyPad = "tokenizer.ggml.padding_token_id";
constexpr std::string_view kKeyAddBos = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kKeyAddSpacePrefix = "tokenizer.ggml.add_space_prefix";

// A token id key; values outside int32 are refused here (the callers check the vocabulary
// range) rather than wrapped into some valid-looking id.
int32_t optional_id(const GgufFile& gguf, std::string_view key, int32_t fallback) {
  const GgufValue* v = gguf.find(key);
  if (!v) return fallback;
  const int64_t id = v->as_int();
  if (id < -1 || id > INT32_MAX)
    fail(gguf.path().string(), ": key '", key, "' = ", id, " is not a token id");
  return static_cast<int32_t>(id);
}
bool optional_bool(const GgufFile& gguf, std::string_view key, bool fallback) {
  const GgufValue* v = gguf.find(key);
  return v ? v->as_int() != 0 : fallback;
}

// Arrays that must have one entry per token.
template <class T>
void check_per_token(const GgufFile& gguf, std::string_view key, const std::vector<T>& values, size_t n) {
  if (values.size() != n)
    fail(gguf.path().string(), ": key '", key, "' has ", values.size(), " entries, expected one per token (",
         n, ")");
}

SpmPieceType infer_piece_type(const std::string& piece) {
  if (piece == "<unk>") return SpmPieceType::kUnknown;
  if (piece == "<s>" || piece == "</s>") return SpmPieceType::kControl;
  if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>') return SpmPieceType::kByte;
  return SpmPieceType::kNormal;
}

std::unique_ptr<Tokenizer> sentencepiece_from_gguf(const GgufFile& gguf) {
  const std::string name = gguf.path().string();
  SpmVocab vocab;
  vocab.pieces = gguf.at(kKeyTokens).as_strings();
  const size_t n = vocab.pieces.size();
  if (n == 0) fail(name, ": key '", kKeyTokens, "' is empty");
  if (const GgufValue* scores = gguf.find(kKeyScores)) {
    vocab.scores = scores->as_floats();
    check_per_token(gguf, kKeyScores, vocab.scores, n);
  } else {
    vocab.scores.assign(n, 0.0f);
  }
  vocab.types.resize(n);
  if (const GgufValue* types = gguf.find(kKeyTokenType)) {
    const std::vector<int64_t> raw = types->as_ints();
    check_per_token(gguf, kKeyTokenType, raw, n);
    for (size_t i = 0; i < n; ++i) {
      if (raw[i] < 1 || raw[i] > 6)
        fail(name, ": key '", kKeyTokenType, "'[", i, "] = ", raw[i], ", expected a type in [1, 6]");
      vocab.types[i] = static_cast<SpmPieceType>(raw[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) vocab.types[i] = infer_piece_type(vocab.pieces[i]);
  }
  vocab.byte_fallback = std::count(vocab.types.begin(), vocab.types.end(), SpmPieceType::kByte) > 0;
  const auto first_of_type = [&](SpmPieceType t) {
    const auto it = std::find(vocab.types.begin(), vocab.types.end(), t);
    return it == vocab.types.end() ? -1 : static_cast<int32_t>(it - vocab.types.begin());
  };
  vocab.unk_id = optional_id(gguf, kKeyUnk, first_of_type(SpmPieceType::kUnknown));
  vocab.bos_id = optional_id(gguf, kKeyBos, 1);
  vocab.eos_id = optional_id(gguf, kKeyEos, 2);
  vocab.pad_id = optional_id(gguf, kKeyPad, -1);
  for (const auto& [key, id] : {std::pair{kKeyUnk, vocab.unk_id}, {kKeyBos, vocab.bos_id},
                                {kKeyEos, vocab.eos_id}, {kKeyPad, vocab.pad_id}})
    if (id < -1 || id >= static_cast<int64_t>(n))
      fail(name, ": key '", key, "' = ", id, " is outside the vocabulary [0, ", n, ")");
  if (vocab.unk_id < 0) fail(name, ": the vocabulary has no unknown token (SentencePiece needs one)");
  // The piece unknown_token_id names is the unknown token, whatever its type says: Gemma 3's GGUF
  // marks <unk> CONTROL (3), and SentencePiece needs exactly one UNKNOWN piece.
  if (std::count(vocab.types.begin(), vocab.types.end(), SpmPieceType::kUnknown) == 0)
    vocab.types[vocab.unk_id] = SpmPieceType::kUnknown;
  vocab.add_dummy_prefix = optional_bool(gguf, kKeyAddSpacePrefix, true);
  return sentencepiece_from_vocab(vocab, name, optional_bool(gguf, kKeyAddBos, true));
}

// The pre-tokenizer (and the tokenizer.json settings that go with it) of each named family, as
// in the family's Hugging Face tokenizer.json: Llama 3 sets ignore_merges, Qwen2 an NFC normalizer.
void apply_pre(const GgufFile& gguf, BpeVocab& vocab) {
  const GgufValue* v = gguf.find(kKeyPre);
  const std::string pre = v ? v->as_string() : "default";
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2") {
    vocab.pre_patterns = {std::string(kGpt2Pattern)};
  } else if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3") {
    vocab.pre_patterns = {std::string(kLlama3Pattern)};
    vocab.ignore_merges = true;
  } else if (pre == "qwen2") {
    vocab.pre_patterns = {std::string(kQwen2Pattern)};
    vocab.nfc = true;
  } else if (pre == "smollm") {
    vocab.pre_patterns = {R"(\p{N})", std::string(kGpt2Pattern)};
  } else {
    fail(gguf.path().string(), ": key '", kKeyPre, "' = \"", pre,
         "\" is not a supported pre-tokenizer (default, gpt2, llama3, llama-bpe, llama-v3, qwen2, smollm)");
  }
}

std::unique_ptr<Tokenizer> bpe_from_gguf(const GgufFile& gguf) {
  const std::string name = gguf.path().string();
  BpeVocab vocab;
  vocab.tokens = gguf.at(kKeyTokens).as_strings();
  const size_t n = vocab.tokens.size();
  if (n == 0) fail(name, ": key '", kKeyTokens, "' is empty");
  const std::vector<std::string> merges = gguf.at(kKeyMerges).as_strings();
  vocab.merges.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const size_t space = merges[k].find(' ', 1);
    if (space == std::string::npos)
      fail(name, ": key '", kKeyMerges, "'[", k, "] = \"", merges[k], "\", expected \"left right\"");
    vocab.merges.emplace_back(merges[k].substr(0, space), merges[k].substr(space + 1));
  }
  if (const GgufValue* types = gguf.find(kKeyTokenType)) {
    const std::vector<int64_t> raw = types->as_ints();
    check_per_token(gguf, kKeyTokenType, raw, n);
    // Control tokens are special added tokens; user-defined ones are added tokens matched always.
    for (size_t i = 0; i < n; ++i) {
      const auto type = static_cast<SpmPieceType>(raw[i]);
      if (type == SpmPieceType::kControl || type == SpmPieceType::kUserDefined)
        vocab.added.push_back({vocab.tokens[i], static_cast<int32_t>(i), type == SpmPieceType::kControl});
    }
  }
  apply_pre(gguf, vocab);
  vocab.bos_id = optional_id(gguf, kKeyBos, -1);
  vocab.eos_id = optional_id(gguf, kKeyEos, -1);
  vocab.add_bos = optional_bool(gguf, kKeyAddBos, false);
  return std::make_unique<BpeTokenizer>(std::move(vocab), name);
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& gguf) {
  const GgufValue* model = gguf.find(kKeyModel);
  if (model == nullptr) fail(gguf.path().string(), ": missing key '", kKeyModel, "' (the file carries no tokenizer)");
  const std::string& kind = model->as_string();
  if (kind == "llama") return sentencepiece_from_gguf(gguf);
  if (kind == "gpt2") return bpe_from_gguf(gguf);
  fail(gguf.path().string(), ": key '", kKeyModel, "' = \"", kind, "\", expected \"llama\" or \"gpt2\"");
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::filesystem::path& path) {
  return tokenizer_from_gguf(GgufFile::open(path));
}

}  // namespace kvlab
