// GPT-2's byte-level alphabet: every byte is shown as one printable Unicode character so that a
// BPE vocabulary over bytes can be stored as text ("Ġthe" is " the": space 0x20 -> U+0120 'Ġ').
//
// Mapping (GPT-2's bytes_to_unicode): the printable bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map
// to the code point of the same value; the other 68 bytes, in increasing order, map to
// U+0100, U+0101, ... U+0143.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvlab::byte_level {

// [256] code point shown for each byte.
const std::array<uint32_t, 256>& byte_to_codepoint();

// "hello world" -> "helloĠworld".
std::string encode(std::string_view bytes);

// "helloĠworld" -> "hello world". Returns false (leaving *out partial) when `text` holds a
// character outside the byte-level alphabet or invalid UTF-8.
bool decode(std::string_view text, std::string* out);

}  // namespace kvlab::byte_level
