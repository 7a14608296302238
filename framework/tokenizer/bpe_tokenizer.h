// Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM), implemented here.
//
// encode(text):
//   1. cut the text at added tokens (special ones only with parse_special; others always);
//   2. NFC-normalize each remaining stretch when the vocabulary asks for it (then decode gives
//      the normalized text back), and pre-tokenize it into words (pretokenizer.h);
//   3. per word: start from one symbol per byte (the byte-level token of that byte), then merge
//      adjacent symbols, always the pair of lowest merge rank first (leftmost among equals),
//      until no adjacent pair has a merge. With ignore_merges (Llama 3), a word that is itself
//      in the vocabulary is emitted whole.
// The merge loop is a linked list + min-heap of candidate pairs: O(n log n) in the word length
// n, so a pathological megabyte-long word cannot stall the encoder.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "framework/tokenizer/pretokenizer.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

struct BpeAddedToken {
  std::string content;  // matched literally in the text
  int32_t id = -1;
  bool special = true;  // special: recognised only with parse_special, invisible in decode
};

struct BpeVocab {
  std::vector<std::string> tokens;  // [vocab] byte-level spelling ("Ġthe"); "" for unused ids
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order: merges[0] first
  std::vector<BpeAddedToken> added;
  std::vector<std::string> pre_patterns;  // PreTokenizer steps
  bool add_prefix_space = false;  // ByteLevel(add_prefix_space): " " before a text not starting with one
  bool ignore_merges = false;
  bool nfc = false;  // NFC-normalize text (outside added tokens) before pre-tokenizing (Qwen2)
  int32_t bos_id = -1, eos_id = -1;
  bool add_bos = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Validates the vocabulary (every byte has its token, merges name known tokens); throws
  // kvlab::Error naming `source` otherwise.
  BpeTokenizer(BpeVocab vocab, const std::string& source);

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }

 private:
  std::string piece_of(int32_t id) const override { return bytes_[id]; }
  std::string spelling_of(int32_t id) const override { return tokens_[id]; }
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // Index into added_ of the longest added token starting at text[pos] (special ones only when
  // allowed), or -1.
  int match_added(std::string_view text, size_t pos, bool allow_special) const;

  std::vector<std::string> tokens_;      // [vocab] byte-level spelling
  std::vector<std::string> bytes_;       // [vocab] bytes each id contributes to decoded text
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  static constexpr int32_t kNoToken = -1;      // a byte the vocabulary has no token for
  std::array<int32_t, 256> byte_token_{};       // [256] id of the single-byte token, or kNoToken
  std::vector<BpeAddedToken> added_;            // longest content first
  std::array<bool, 256> added_first_byte_{};    // some added token starts with this byte
  PreTokenizer pre_;
  bool add_prefix_space_ = false, ignore_merges_ = false, nfc_ = false;

  // Word -> ids memo: English text repeats few distinct words, so most words skip the merge loop.
  // Bounded (cleared when full); guarded by a mutex so a const tokenizer stays thread-safe.
  static constexpr size_t kMaxCachedWords = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kvlab
