// A SentencePiece vocabulary as plain data, and its serialization as a sentencepiece ModelProto,
// so that a vocabulary found in a GGUF file or a llama2.c tokenizer.bin runs through the real
// library (SentencePieceProcessor::LoadFromSerializedProto). Debian's libsentencepiece-dev ships
// no sentencepiece_model.pb.h, so the few fields needed are written by hand in protobuf wire
// format (proto2; field numbers below).
//
// Field numbers: sentencepiece_model.proto, as embedded in the descriptor of Debian's
// /usr/lib/python3/dist-packages/sentencepiece/sentencepiece_model_pb2.py (python3-sentencepiece
// 0.1.97), decoded by hand and cross-checked against tokenizers/llama2/tokenizer.model:
//   ModelProto        1 pieces (repeated SentencePiece)  2 trainer_spec  3 normalizer_spec
//   SentencePiece     1 piece (string)  2 score (float)  3 type (enum Type, default NORMAL)
//   TrainerSpec       3 model_type (UNIGRAM=1 BPE=2 WORD=3 CHAR=4)  35 byte_fallback (bool)
//                     40 unk_id  41 bos_id  42 eos_id  43 pad_id (int32)
//                     45 unk_piece  46 bos_piece  47 eos_piece  48 pad_piece (string)
//                     24 treat_whitespace_as_suffix (bool, read only)
//   NormalizerSpec    1 name  2 precompiled_charsmap (bytes)  3 add_dummy_prefix (default true)
//                     4 remove_extra_whitespaces (default true!)  5 escape_whitespaces (default true)
//                     6 normalization_rule_tsv (string, read only)
// Wire format: key = (field << 3) | wire_type; wire types 0 varint, 2 length-delimited,
// 5 fixed 32-bit little endian. A message field that occurs twice is merged (later scalars win).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// SentencePiece piece types (ModelProto.SentencePiece.Type). GGUF's tokenizer.ggml.token_type
// uses the same numbers.
enum class SpmPieceType : int32_t {
  kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6
};

enum class SpmModelType : int32_t { kUnigram = 1, kBpe = 2 };

struct SpmVocab {
  std::vector<std::string> pieces;  // [vocab] as SentencePiece spells them ("▁the", "<0x0A>")
  std::vector<float> scores;        // [vocab]
  std::vector<SpmPieceType> types;  // [vocab]
  SpmModelType model_type = SpmModelType::kBpe;  // Llama's tokenizer.model is BPE
  bool add_dummy_prefix = true;                  // "hello" is encoded as "▁hello"
  bool remove_extra_whitespaces = false;         // Llama keeps runs of spaces
  bool byte_fallback = true;                     // unknown characters become <0xXX> pieces
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;  // -1: none
};

// Serializes `vocab` as a ModelProto. Checks nothing: SentencePieceProcessor validates on load.
std::string serialize_spm_model_proto(const SpmVocab& vocab);

// Bytes to append to a serialized ModelProto so that its normalizer_spec.add_dummy_prefix
// becomes `value` (protobuf merges a repeated message field into the first one).
std::string spm_add_dummy_prefix_override(bool value);

// The normalizer switches kvlab needs to know: decoding (sentencepiece strips the first piece's
// leading space when add_dummy_prefix or remove_extra_whitespaces is on) and whether text may be
// encoded word by word (sentencepiece_tokenizer.cpp: identity normalizer, spaces escaped, kept).
struct SpmNormalizerFlags {
  bool add_dummy_prefix = true;           // proto2 defaults
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  bool identity = false;                  // no precompiled_charsmap and no rule TSV: text used as is
  bool treat_whitespace_as_suffix = false;  // TrainerSpec 24: "▁" ends pieces instead of starting them
  int n_pieces = 0;
};

// Walks a serialized ModelProto's top-level fields and its normalizer_spec. Throws kvlab::Error
// naming `source` when the bytes are not well-formed protobuf (truncated, bad wire type), hold
// no pieces, or lack trainer_spec / normalizer_spec (a file cut at a field boundary): the library
// itself would only say "model file is broken", or load the partial vocabulary.
SpmNormalizerFlags read_spm_normalizer_flags(std::string_view serialized, const std::string& source);

}  // namespace kvlab
