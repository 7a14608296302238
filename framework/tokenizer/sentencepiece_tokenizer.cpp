#include "framework/tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "framework/core/error.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's space
constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";  // " ⁇ ", sentencepiece's unk_surface

std::unique_ptr<sentencepiece::SentencePieceProcessor> load_processor(const std::string& serialized,
                                                                      const std::string& source) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  // libsentencepiece reports most problems as a status but throws for some (its darts_clone
  // trie throws Darts::Details::Exception, a std::exception, for a piece "\0": "zero-length
  // key"; issue 11's fuzz_spm_model finding): both become one error naming the file.
  sentencepiece::util::Status status;
  try {
    status = sp->LoadFromSerializedProto(serialized);
  } catch (const std::exception& e) {
    fail(source, ": sentencepiece rejected the model: ", e.what());
  }
  if (!status.ok()) fail(source, ": sentencepiece rejected the model: ", status.ToString());
  // A model whose normalizer is corrupt loads but cannot encode (fuzz_spm_model: "all
  // normalized characters are not consumed"): refused here, on printable ASCII, whitespace,
  // multi-byte and invalid UTF-8, rather than at the first encode.
  static const std::string kProbe = [] {
    std::string t = "\t\n\r \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80 caf\xC3\xA9 \xFF\xC3(x ";
    for (char c = 0x21; c < 0x7f; ++c) t += c;
    return t;
  }();
  std::vector<int> ids;
  if (const auto probe = sp->Encode(kProbe, &ids); !probe.ok())
    fail(source, ": sentencepiece cannot encode text with this model (corrupt normalizer?): ", probe.ToString());
  return sp;
}

// "▁the" -> " the".
std::string unescape_spaces(const std::string& piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.compare(pos, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
      out += ' ';
      pos += kSpaceSymbol.size();
    } else {
      out += piece[pos++];
    }
  }
  return out;
}

// "<0x0A>" -> '\n'. Byte pieces are spelled exactly so (sentencepiece's ByteToPiece).
char byte_piece_value(const std::string& piece, const std::string& source) {
  const auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>' || hex(piece[3]) < 0 ||
      hex(piece[4]) < 0)
    fail(source, ": byte piece '", piece, "' is not of the form <0xXX>");
  return static_cast<char>(hex(piece[3]) * 16 + hex(piece[4]));
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& serialized, const std::string& source,
                                               const SpmSpecialOverrides& overrides)
    : Tokenizer("sentencepiece", source) {
  const SpmNormalizerFlags flags = read_spm_normalizer_flags(serialized, source);
  sp_ = load_processor(serialized, source);
  sp_continue_ = load_processor(serialized + spm_add_dummy_prefix_override(false), source);
  // sentencepiece's Decode drops the leading "▁" of the first piece under either switch.
  strip_leading_space_ = flags.add_dummy_prefix || flags.remove_extra_whitespaces;

  const int n = sp_->GetPieceSize();
  surface_.resize(n);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp_->IdToPiece(id);
    // libsentencepiece matches pieces in a NUL-terminated trie and assumes they are whole UTF-8
    // characters; a piece like "\xE2\x96\0a" (fuzz_spm_model, issue 11) is stored as the half
    // character "\xE2\x96", the lattice then ends inside a character, and Encode of some later
    // text fails ("all normalized characters are not consumed") though the load probe passed.
    // Trained models only hold valid UTF-8, so anything else is a corrupt file.
    if (!utf8::is_valid(piece) || piece.find('\0') != std::string::npos)
      fail(source, ": piece ", id, " is not valid UTF-8 without NUL bytes (corrupt model?)");
    if (sp_->IsControl(id)) {
      surface_[id] = "";
      if (!piece.empty()) specials_.emplace_back(piece, id);
    } else if (sp_->IsUnknown(id)) {
      surface_[id] = std::string(kUnknownSurface);
      if (!piece.empty()) specials_.emplace_back(piece, id);
    } else if (sp_->IsByte(id)) {
      surface_[id] = std::string(1, byte_piece_value(piece, source));
    } else {
      surface_[id] = unescape_spaces(piece);
    }
  }
  word_memo_ = flags.identity && flags.escape_whitespaces && !flags.remove_extra_whitespaces &&
               !flags.treat_whitespace_as_suffix;
  for (int id = 0; id < n && word_memo_; ++id) {
    std::string_view piece = sp_->IdToPiece(id);
    while (piece.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) piece.remove_prefix(kSpaceSymbol.size());
    if (piece.find(kSpaceSymbol) != std::string_view::npos) word_memo_ = false;  // "a▁b": merges cross spaces
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  const auto valid_or_none = [&](int32_t id) { return id >= 0 && id < n ? id : -1; };
  bos_id_ = valid_or_none(overrides.bos_id == -2 ? sp_->bos_id() : overrides.bos_id);
  eos_id_ = valid_or_none(overrides.eos_id == -2 ? sp_->eos_id() : overrides.eos_id);
  add_bos_ = overrides.add_bos && bos_id_ >= 0;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_with(const sentencepiece::SentencePieceProcessor& sp,
                                         std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto status = sp.Encode(text, &ids);
  // A loaded model encodes the constructor's probe; a corrupt one may still refuse some text.
  if (!status.ok()) fail(source_, ": sentencepiece cannot encode the text: ", status.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

void SentencePieceTokenizer::encode_text(std::string_view text, bool at_start,
                                         std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (!word_memo_) {
    encode_with(at_start ? *sp_ : *sp_continue_, text, out);
    return;
  }
  // Words: cut before each space that follows a non-space ("a  b c" -> "a", "  b", " c").
  size_t begin = 0;
  for (size_t end = 1; end <= text.size(); ++end) {
    if (end < text.size() && !(text[end] == ' ' && text[end - 1] != ' ')) continue;
    const std::string_view word = text.substr(begin, end - begin);
    if (begin == 0 && at_start) {
      encode_with(*sp_, word, out);  // the only word that gets the dummy prefix
    } else {
      const std::string key(word);
      std::unique_lock<std::mutex> lock(memo_mutex_);
      if (const auto it = memo_.find(key); it != memo_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
      } else {
        lock.unlock();
        const size_t first = out.size();
        encode_with(*sp_continue_, word, out);
        lock.lock();
        if (memo_.size() >= kMaxMemoWords) memo_.clear();
        memo_.emplace(key, std::vector<int32_t>(out.begin() + first, out.end()));
      }
    }
    begin = end;
  }
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text,
                                                    const EncodeOptions& opts) const {
  std::vector<int32_t> out;
  if (opts.add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  if (!opts.parse_special || specials_.empty()) {
    encode_text(text, true, out);
    return out;
  }
  // Split at special-token text (leftmost, then longest); the dummy prefix marks only the start.
  size_t segment_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto match = std::find_if(specials_.begin(), specials_.end(), [&](const auto& s) {
      return text.compare(pos, s.first.size(), s.first) == 0;
    });
    if (match == specials_.end()) {
      ++pos;
      continue;
    }
    encode_text(text.substr(segment_begin, pos - segment_begin), segment_begin == 0, out);
    out.push_back(match->second);
    pos += match->first.size();
    segment_begin = pos;
  }
  encode_text(text.substr(segment_begin), segment_begin == 0, out);
  return out;
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  bool first_piece = true;  // the first non-control piece loses its dummy-prefix space
  for (const int32_t id : ids) {
    const std::string piece = token_to_piece(id);
    if (sp_->IsControl(id)) continue;
    if (first_piece && strip_leading_space_ && !piece.empty() && piece[0] == ' ' && !sp_->IsByte(id) &&
        !sp_->IsUnknown(id)) {
      out.append(piece, 1);
    } else {
      out += piece;
    }
    first_piece = false;
  }
  return out;
}

std::string SentencePieceTokenizer::spelling_of(int32_t id) const { return sp_->IdToPiece(id); }

std::unique_ptr<SentencePieceTokenizer> load_sentencepiece_model(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), ": cannot open SentencePiece model");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) fail(path.string(), ": empty file, expected a SentencePiece model");
  return std::make_unique<SentencePieceTokenizer>(bytes, path.string());
}

std::unique_ptr<SentencePieceTokenizer> sentencepiece_from_vocab(const SpmVocab& vocab,
                                                                 const std::string& source,
                                                                 bool add_bos) {
  SpmSpecialOverrides overrides;
  overrides.bos_id = vocab.bos_id;
  overrides.eos_id = vocab.eos_id;
  overrides.add_bos = add_bos;
  return std::make_unique<SentencePieceTokenizer>(serialize_spm_model_proto(vocab), source, overrides);
}

}  // namespace kvlab
