// Unicode NFC (canonical composition: "e" + U+0301 -> "é"), for tokenizers whose tokenizer.json
// names an NFC normalizer (Qwen2). Uses ICU's Normalizer2.
#pragma once

#include <string>
#include <string_view>

namespace kvlab {

// NFC of the valid UTF-8 runs of `text`; invalid bytes are kept as they are, in place.
// ASCII text is returned unchanged without calling ICU.
std::string nfc_normalize(std::string_view text);

}  // namespace kvlab
