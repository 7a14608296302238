// Hugging Face tokenizer.json -> BpeTokenizer (byte-level BPE only).
//
// Read: model {type "BPE", vocab {token: id}, merges ["a b" | ["a","b"]], ignore_merges},
// added_tokens [{id, content, special}], normalizer (null only), pre_tokenizer (ByteLevel,
// Split{Regex|String, behavior "Isolated"}, Digits, Sequence of these), post_processor
// (TemplateProcessing: a leading special token is the BOS added by default).
// BOS/EOS: a tokenizer_config.json next to the file (bos_token, eos_token, add_bos_token) when
// present, else the post-processor's leading special token.
// Anything else that changes ids (a normalizer, a Metaspace pre-tokenizer, a non-BPE model) is
// rejected with an error naming the file and the JSON key, rather than silently mis-encoded.
#pragma once

#include <filesystem>
#include <memory>

#include "framework/tokenizer/bpe_tokenizer.h"

namespace kvlab {

std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::filesystem::path& path);

}  // namespace kvlab
