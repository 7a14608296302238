// Tokenizer encode/decode of arbitrary bytes, against the contract in tokenizer.h, on two fixed
// tokenizers: the bundled model's SentencePiece tokenizer.model (identity normalizer, byte
// fallback, a "▁" piece) and a small byte-level BPE built here (256 byte tokens, a few merges,
// one special and one plain added token).
// Input: byte 0 = mode (bit 0: BPE instead of SentencePiece, bit 1: add_bos, bit 2:
// parse_special, bit 3: the rest is token ids (little-endian u16, modulo the vocabulary) to
// decode instead of text to encode); the rest = the text or the ids.
// Checks: every id is in the vocabulary; decode(encode(x)) == x without parse_special (BPE: any
// bytes; SentencePiece: valid UTF-8 without U+2581, else U+FFFD for the invalid bytes: the
// bundled model meets the other conditions of tokenizer.h); StreamDecoder's pieces concatenate
// to decode().
#include <cstdlib>
#include <memory>

#include "framework/core/error.h"
#include "framework/tokenizer/bpe_tokenizer.h"
#include "framework/tokenizer/byte_level.h"
#include "framework/tokenizer/pretokenizer.h"
#include "framework/tokenizer/sentencepiece_tokenizer.h"
#include "framework/tokenizer/utf8.h"

namespace {

using namespace kvlab;

std::unique_ptr<Tokenizer> make_bpe() {
  BpeVocab v;
  for (uint32_t cp : byte_level::byte_to_codepoint()) {
    std::string s;
    utf8::append(s, cp);
    v.tokens.push_back(s);
  }
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "n"}, {"\xC4\xA0", "a"}, {"e", "r"},
      {"\xC4\xA0", "\xC4\xA0"}, {"1", "2"}, {"\xC3\xA4", "\xC2\xBD"}};
  for (const auto& [l, r] : merges) {
    v.merges.emplace_back(l, r);
    v.tokens.push_back(l + r);
  }
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  v.added = {{"<|endoftext|>", n, true}, {"<extra>", n + 1, false}};
  v.pre_patterns.emplace_back(kGpt2Pattern);
  v.bos_id = v.eos_id = n;
  return std::make_unique<BpeTokenizer>(std::move(v), "fuzz BPE");
}


}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> spm =
      load_tokenizer(KVLAB_SOURCE_DIR "/data/models/kvlab-tiny-hf/tokenizer.model");
  static const std::unique_ptr<Tokenizer> bpe = make_bpe();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const Tokenizer& tok = (mode & 1) ? *bpe : *spm;
  const EncodeOptions opts{(mode & 2) != 0, (mode & 4) != 0};
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<int32_t> ids;
  if (mode & 8) {
    for (size_t i = 0; i + 1 < rest.size(); i += 2) {
      const int id = static_cast<uint8_t>(rest[i]) | static_cast<uint8_t>(rest[i + 1]) << 8;
      ids.push_back(id % tok.vocab_size());
    }
  } else {
    ids = tok.encode(rest, opts);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    }
  }
  const std::string decoded = tok.decode(ids);
  if (!(mode & 8) && !opts.parse_special) {
    // SentencePiece: condition (d) of tokenizer.h, the text's own U+2581 reads as a space.
    const bool has_space_symbol = rest.find("\xE2\x96\x81") != std::string_view::npos;
    if (tok.kind() == "bpe" || (utf8::is_valid(rest) && !has_space_symbol)) {
      if (decoded != rest) std::abort();  // decode(encode(x)) == x
    } else if (!utf8::is_valid(rest) && decoded.find("\xEF\xBF\xBD") == std::string::npos) {
      std::abort();  // SentencePiece: invalid bytes come back as U+FFFD
    }
  }
  StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  if (streamed != decoded) std::abort();
  for (int32_t id : ids) (void)tok.token_to_piece(id);
  return 0;
}
