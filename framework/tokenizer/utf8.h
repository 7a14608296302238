// UTF-8 helpers shared by the tokenizers and the stream decoder.
//
// Validity follows RFC 3629: no overlongs, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvlab::utf8 {

// Length of the valid UTF-8 character starting at s[pos] (1..4), or 0 when the bytes there do not
// form one (invalid lead, bad continuation, overlong, surrogate, too large, or cut by the end).
size_t char_length(std::string_view s, size_t pos);

// The end of the run that starts at s[pos] (pos < s.size()) and holds only valid characters, or
// only bytes that are not part of one (which: char_length(s, pos) > 0); the run is never empty.
size_t validity_run_end(std::string_view s, size_t pos);

// Number of leading bytes of s that can be emitted without splitting a character: all of s,
// except a trailing sequence that is a valid *prefix* of a character and might still complete.
size_t complete_prefix_length(std::string_view s);

// True when every byte of s belongs to a valid character.
bool is_valid(std::string_view s);

// Appends the UTF-8 encoding of code point cp (assumed valid) to out.
void append(std::string& out, uint32_t cp);

// Decodes the valid character of `len` bytes starting at s[pos] (len from char_length).
uint32_t decode_at(std::string_view s, size_t pos, size_t len);

}  // namespace kvlab::utf8
