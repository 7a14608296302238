#include "framework/tokenizer/spm_model_proto.h"

#include <cstring>

#include "framework/core/error.h"

namespace kvlab {
namespace {

constexpr uint32_t kWireVarint = 0, kWireLength = 2, kWireFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

// int32 fields are varints of the sign-extended 64-bit value (so -1 takes 10 bytes).
void put_int(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kWireVarint);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kWireLength);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_float(std::string& out, uint32_t field, float v) {
  put_key(out, field, kWireFixed32);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  for (int k = 0; k < 4; ++k) out += static_cast<char>((bits >> (8 * k)) & 0xFF);
}

// ModelProto / SentencePiece / TrainerSpec / NormalizerSpec field numbers (see the header).
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kPiecePiece = 1, kPieceScore = 2, kPieceType = 3;
constexpr uint32_t kTrainerModelType = 3, kTrainerByteFallback = 35, kTrainerUnkId = 40,
                   kTrainerBosId = 41, kTrainerEosId = 42, kTrainerPadId = 43,
                   kTrainerUnkPiece = 45, kTrainerBosPiece = 46, kTrainerEosPiece = 47,
                   kTrainerPadPiece = 48;
constexpr uint32_t kTrainerTreatWhitespaceAsSuffix = 24;
constexpr uint32_t kNormalizerName = 1, kNormalizerCharsmap = 2, kNormalizerAddDummyPrefix = 3,
                   kNormalizerRemoveExtraWhitespaces = 4, kNormalizerEscapeWhitespaces = 5,
                   kNormalizerRuleTsv = 6;

}  // namespace

std::string serialize_spm_model_proto(const SpmVocab& vocab) {
  std::string out;
  for (size_t i = 0; i < vocab.pieces.size(); ++i) {
    std::string piece;
    put_bytes(piece, kPiecePiece, vocab.pieces[i]);
    put_float(piece, kPieceScore, i < vocab.scores.size() ? vocab.scores[i] : 0.0f);
    const SpmPieceType type = i < vocab.types.size() ? vocab.types[i] : SpmPieceType::kNormal;
    put_int(piece, kPieceType, static_cast<int32_t>(type));
    put_bytes(out, kModelPieces, piece);
  }

  const auto piece_or_default = [&](int32_t id, const char* fallback) {
    return id >= 0 && static_cast<size_t>(id) < vocab.pieces.size() ? vocab.pieces[id]
                                                                    : std::string(fallback);
  };
  std::string trainer;
  put_int(trainer, kTrainerModelType, static_cast<int32_t>(vocab.model_type));
  put_int(trainer, kTrainerByteFallback, vocab.byte_fallback ? 1 : 0);
  put_int(trainer, kTrainerUnkId, vocab.unk_id);
  put_int(trainer, kTrainerBosId, vocab.bos_id);
  put_int(trainer, kTrainerEosId, vocab.eos_id);
  put_int(trainer, kTrainerPadId, vocab.pad_id);
  put_bytes(trainer, kTrainerUnkPiece, piece_or_default(vocab.unk_id, "<unk>"));
  put_bytes(trainer, kTrainerBosPiece, piece_or_default(vocab.bos_id, "<s>"));
  put_bytes(trainer, kTrainerEosPiece, piece_or_default(vocab.eos_id, "</s>"));
  put_bytes(trainer, kTrainerPadPiece, piece_or_default(vocab.pad_id, "<pad>"));
  put_bytes(out, kModelTrainerSpec, trainer);

  // "identity": no precompiled character map, the text is used as given (Llama's setting).
  std::string normalizer;
  put_bytes(normalizer, kNormalizerName, "identity");
  put_int(normalizer, kNormalizerAddDummyPrefix, vocab.add_dummy_prefix ? 1 : 0);
  put_int(normalizer, kNormalizerRemoveExtraWhitespaces, vocab.remove_extra_whitespaces ? 1 : 0);
  put_int(normalizer, kNormalizerEscapeWhitespaces, 1);
  put_bytes(out, kModelNormalizerSpec, normalizer);
  return out;
}

std::string spm_add_dummy_prefix_override(bool value) {
  std::string normalizer;
  put_int(normalizer, kNormalizerAddDummyPrefix, value ? 1 : 0);
  std::string out;
  put_bytes(out, kModelNormalizerSpec, normalizer);
  return out;
}

}  // namespace kvlab

namespace kvlab {
namespace {

// A cursor over protobuf wire bytes; every read checks bounds and names `source` on failure.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& source, const char* what)
      : bytes_(bytes), source_(source), what_(what) {}
  bool done() const { return pos_ >= bytes_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= bytes_.size()) broken("truncated varint");
      const uint8_t b = static_cast<uint8_t>(bytes_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) return v;
    }
    broken("varint longer than 10 bytes");
  }

  // Reads one field; returns its number, wire type, and (for length-delimited) the payload.
  uint32_t field(uint32_t* wire_type, uint64_t* value, std::string_view* payload) {
    const uint64_t key = varint();
    *wire_type = static_cast<uint32_t>(key & 7);
    switch (*wire_type) {
      case 0: *value = varint(); break;
      case 1: skip(8); break;
      case 5: skip(4); break;
      case 2: {
        const uint64_t n = varint();
        if (n > bytes_.size() - pos_) broken("length-delimited field runs past the end (truncated?)");
        *payload = bytes_.substr(pos_, n);
        pos_ += n;
        break;
      }
      default: broken("unsupported wire type " + std::to_string(*wire_type));
    }
    return static_cast<uint32_t>(key >> 3);
  }

 private:
  void skip(size_t n) {
    if (n > bytes_.size() - pos_) broken("fixed-size field runs past the end (truncated?)");
    pos_ += n;
  }
  [[noreturn]] void broken(const std::string& problem) {
    fail(source_, ": not a valid SentencePiece model (", what_, " at byte ", pos_, ": ", problem, ")");
  }

  std::string_view bytes_;
  const std::string& source_;
  const char* what_;
  size_t pos_ = 0;
};

}  // namespace

SpmNormalizerFlags read_spm_normalizer_flags(std::string_view serialized, const std::string& source) {
  SpmNormalizerFlags flags;
  bool has_trainer_spec = false, has_normalizer_spec = false;
  bool has_rules = false;  // a precompiled charsmap or rule TSV
  std::string_view name;   // normalizer_spec.name (a repeated normalizer_spec merges: last set wins)
  WireReader top(serialized, source, "ModelProto");
  while (!top.done()) {
    uint32_t wire_type = 0;
    uint64_t value = 0;
    std::string_view payload;
    const uint32_t field = top.field(&wire_type, &value, &payload);
    if (field == kModelPieces && wire_type == kWireLength) ++flags.n_pieces;
    if (field == kModelTrainerSpec && wire_type == kWireLength) {
      has_trainer_spec = true;
      WireReader spec(payload, source, "trainer_spec");
      while (!spec.done()) {
        const uint32_t f = spec.field(&wire_type, &value, &payload);
        if (f == kTrainerTreatWhitespaceAsSuffix && wire_type == kWireVarint)
          flags.treat_whitespace_as_suffix = value != 0;
      }
      continue;
    }
    if (field != kModelNormalizerSpec || wire_type != kWireLength) continue;
    has_normalizer_spec = true;
    WireReader spec(payload, source, "normalizer_spec");
    while (!spec.done()) {
      const uint32_t f = spec.field(&wire_type, &value, &payload);
      if (wire_type == kWireLength) {
        if (f == kNormalizerName) name = payload;
        if ((f == kNormalizerCharsmap || f == kNormalizerRuleTsv) && !payload.empty()) has_rules = true;
        continue;
      }
      if (wire_type != kWireVarint) continue;
      if (f == kNormalizerAddDummyPrefix) flags.add_dummy_prefix = value != 0;
      if (f == kNormalizerRemoveExtraWhitespaces) flags.remove_extra_whitespaces = value != 0;
      if (f == kNormalizerEscapeWhitespaces) flags.escape_whitespaces = value != 0;
    }
  }
  flags.identity = name == "identity" && !has_rules;
  if (flags.n_pieces == 0) fail(source, ": not a valid SentencePiece model (no pieces)");
  // sentencepiece writes pieces, then trainer_spec, then normalizer_spec: a file cut at a field
  // boundary still parses, but lacks these.
  if (!has_trainer_spec || !has_normalizer_spec)
    fail(source, ": not a valid SentencePiece model (no ", has_trainer_spec ? "normalizer_spec" : "trainer_spec",
         "; truncated?)");
  return flags;
}

}  // namespace kvlab
