// Tokenizers: text <-> the token ids a Llama-family model was trained on.
//
// Two kinds behind one interface:
//   "sentencepiece" (Llama 1/2, Mistral, TinyLlama, TinyStories): run by Debian's libsentencepiece.
//       Sources: tokenizer.model, a GGUF file with tokenizer.ggml.model = "llama", a llama2.c
//       tokenizer.bin. The last two are turned into a SentencePiece ModelProto (spm_model_proto.h)
//       so the same library encodes all three.
//   "bpe" (GPT-2, Llama 3, Qwen2, SmolLM): byte-level BPE implemented here (bpe_tokenizer.h).
//       Sources: a Hugging Face tokenizer.json, a GGUF file with tokenizer.ggml.model = "gpt2".
//
// Contract:
//   - encode() never throws on any byte string (invalid UTF-8 included). Special tokens
//     (BOS/EOS/control/added special tokens) written in the text are recognised only with
//     EncodeOptions::parse_special; otherwise they are ordinary text.
//   - Round trip, byte-level BPE: decode(encode(x)) == x for every byte string x (invalid UTF-8
//     included), without parse_special, unless x holds one of the few non-printable bytes a
//     vocabulary may lack (SmolLM2's lacks 21), which are dropped as llama.cpp drops them.
//   - Round trip, SentencePiece: decode(encode(x)) == x for valid UTF-8 x without parse_special
//     when the model can spell x unchanged, which is the case for Llama 1/2, Mistral, TinyLlama
//     and the bundled model, i.e. when all of these hold:
//       (a) the normalizer is the identity and remove_extra_whitespaces is off (an NFKC model
//           gives back the normalized text; one that collapses spaces gives back single spaces);
//       (b) the vocabulary has the piece "▁" (U+2581, SentencePiece's space). Without it a space
//           that no longer piece covers falls back to the bytes of U+2581 (byte_fallback on) and
//           decodes as "▁" instead of " ", or becomes <unk> (off): libsentencepiece does the same;
//       (c) every character of x is a piece or byte_fallback is on (else <unk>, decoded " ⁇ ");
//       (d) x does not contain U+2581 itself: SentencePiece reads it as a space, decode gives " ".
//     Invalid UTF-8: the library replaces each invalid byte by U+FFFD before encoding, so decode
//     gives that U+FFFD text back. (tokenizer_test.cpp: TokenizerContract tests each condition.)
//   - decode() returns bytes: a byte-fallback piece (<0xE4>) contributes its raw byte, so a
//     sequence cut in the middle of a character yields a partial UTF-8 sequence; StreamDecoder
//     holds such partial sequences back until they complete.
//   - Loaders throw kvlab::Error naming the file and the problem (missing, truncated, malformed).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvlab {

class GgufFile;  // framework/model/gguf.h

struct EncodeOptions {
  bool add_bos = false;        // prepend bos_id() (when the tokenizer has one)
  bool parse_special = false;  // recognise special-token text ("<s>", "<|endoftext|>") as one id
};

// Throws kvlab::Error "SOURCE: token id ID is outside the vocabulary [0, VOCAB_SIZE)" unless
// 0 <= id < vocab_size (what decode, token_to_piece and id_to_token do with a bad id).
void check_token_id(const std::string& source, int32_t id, int32_t vocab_size);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;  // inverse of encode (see above)
  virtual int32_t vocab_size() const = 0;
  const std::string& kind() const { return kind_; }  // "sentencepiece" | "bpe"

  // The bytes this token contributes in the middle of a text ("▁the" -> " the", <0x0A> -> "\n",
  // control tokens -> ""). Throws kvlab::Error for an id outside [0, vocab_size()).
  std::string token_to_piece(int32_t id) const {
    check_token_id(source_, id, vocab_size());
    return piece_of(id);
  }
  // The vocabulary's own spelling of a token ("▁the", "Ġthe", "<0x0A>"), for `kvlab tokenize
  // --pieces`. Throws like token_to_piece.
  std::string id_to_token(int32_t id) const {
    check_token_id(source_, id, vocab_size());
    return spelling_of(id);
  }
  int32_t bos_id() const { return bos_id_; }  // -1 when none
  int32_t eos_id() const { return eos_id_; }  // -1 when none
  bool add_bos_by_default() const { return add_bos_; }

 protected:
  Tokenizer(std::string kind, std::string source) : kind_(std::move(kind)), source_(std::move(source)) {}

  std::string kind_;
  std::string source_;  // the file (or name) error messages cite
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool add_bos_ = false;

 private:
  // token_to_piece and id_to_token for an id already checked to be in the vocabulary.
  virtual std::string piece_of(int32_t id) const = 0;
  virtual std::string spelling_of(int32_t id) const = 0;
};

// Streaming decode: push ids one by one, get back only complete UTF-8 text. A trailing partial
// UTF-8 sequence (e.g. the first 2 bytes of a 4-byte emoji from byte-fallback pieces) is held
// back until it completes; bytes that can never start a valid character are passed through.
// Invariant: push(i0) + push(i1) + ... + flush() == tokenizer.decode({i0, i1, ...}).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer);
  std::string push(int32_t id);
  std::string flush();  // whatever is still held back (an incomplete sequence at the very end)

 private:
  const Tokenizer* tokenizer_;
  std::vector<int32_t> leading_ids_;  // ids pushed while decode() of them is still empty
  bool started_ = false;              // some token has produced text
  std::string pending_;               // bytes held back: an incomplete trailing UTF-8 sequence
};

// PATH: tokenizer.model | tokenizer.json | llama2.c tokenizer.bin | *.gguf | a directory holding
// one of tokenizer.json, tokenizer.model (tried in that order). Throws kvlab::Error naming PATH.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

// Builds the tokenizer described by the tokenizer.ggml.* metadata of an open GGUF file.
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& gguf);

}  // namespace kvlab
