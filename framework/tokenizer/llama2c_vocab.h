// Reader for llama2.c's tokenizer.bin (written by llama2.c's tokenizer.py export).
//
// Layout, little endian, no header magic:
//   int32 max_token_length
//   vocab_size times:  float32 score, int32 len, `len` bytes of the token's text
// The vocabulary size is not stored: tokens are read until the end of the file.
// The exporter stores each SentencePiece piece with "▁" replaced by " ", and BOS/EOS as
// "\n<s>\n" / "\n</s>\n"; both are undone here so the pieces are SentencePiece's again.
//
// Piece types are NOT stored, so they are inferred (documented guess, exact for Llama 2 and the
// TinyStories tokenizers): "<unk>" -> UNKNOWN; "<s>", "</s>" -> CONTROL; "<0xXX>" -> BYTE
// (and byte_fallback on when any exists); everything else NORMAL. The model type is BPE (the
// llama2.c tokenizers are SentencePiece BPE models), the normalizer Llama's: dummy prefix on,
// extra whitespace kept.
#pragma once

#include <filesystem>

#include "framework/tokenizer/spm_model_proto.h"

namespace kvlab {

// Throws kvlab::Error naming the file for a missing, truncated or malformed file.
SpmVocab read_llama2c_vocab(const std::filesystem::path& path);

// True when the first bytes look like a llama2.c tokenizer.bin (a small positive
// max_token_length followed by a finite score and a small length).
bool looks_like_llama2c_vocab(const std::filesystem::path& path);

}  // namespace kvlab
