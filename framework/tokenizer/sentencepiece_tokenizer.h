// SentencePiece tokenizer: Debian's libsentencepiece does the encoding; this class adds the
// parts of kvlab's Tokenizer contract the library lacks (special tokens in text, byte-exact
// decode, per-token pieces for streaming).
//
// One ModelProto, three sources: a tokenizer.model file is already one; a GGUF "llama" vocabulary
// and a llama2.c tokenizer.bin are converted to one (spm_model_proto.h, llama2c_vocab.h).
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "framework/tokenizer/spm_model_proto.h"
#include "framework/tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace kvlab {

// What the container says about BOS/EOS (GGUF keys); -1 / nullopt-like defaults keep the model's.
struct SpmSpecialOverrides {
  int32_t bos_id = -2;  // -2: take the ModelProto's; -1: none; else this id
  int32_t eos_id = -2;
  bool add_bos = true;  // Llama models are trained with BOS first
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // `serialized` is a ModelProto; `source` names its file in error messages.
  SentencePieceTokenizer(const std::string& serialized, const std::string& source,
                         const SpmSpecialOverrides& overrides = {});
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(surface_.size()); }

 private:
  std::string piece_of(int32_t id) const override { return surface_[id]; }
  std::string spelling_of(int32_t id) const override;
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_with(const sentencepiece::SentencePieceProcessor& sp, std::string_view text,
                   std::vector<int32_t>& out) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // the model as given
  // The same model with add_dummy_prefix off: encodes text that follows a special token, which
  // is not the start of the text (the dummy prefix marks only the start).
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_continue_;
  std::vector<std::string> surface_;  // [vocab] bytes each id contributes mid-text
  std::vector<std::pair<std::string, int32_t>> specials_;  // control/unknown piece text -> id,
                                                           // longest first (parse_special)
  bool strip_leading_space_ = true;  // decode drops the dummy-prefix space of the first piece

  // Word memo (a speed-up that changes no id). When the normalizer is the identity with spaces
  // escaped and kept, and no piece holds a "▁" after another character, no piece can span the
  // point before a space that follows a non-space: BPE merges never cross it. The text is then
  // encoded word by word (" world" with the dummy prefix off), and repeated words come from the
  // memo instead of the library. Bounded (cleared when full); a mutex keeps encode() thread-safe.
  bool word_memo_ = false;
  static constexpr size_t kMaxMemoWords = 1 << 16;
  mutable std::mutex memo_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> memo_;
};

// Loads a SentencePiece tokenizer.model file. Throws kvlab::Error naming the file.
std::unique_ptr<SentencePieceTokenizer> load_sentencepiece_model(const std::filesystem::path& path);

// Builds the tokenizer from a vocabulary (GGUF or tokenizer.bin); `source` names the file.
std::unique_ptr<SentencePieceTokenizer> sentencepiece_from_vocab(const SpmVocab& vocab,
                                                                 const std::string& source,
                                                                 bool add_bos);

}  // namespace kvlab
