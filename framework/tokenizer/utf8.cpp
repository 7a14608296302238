#include "framework/tokenizer/utf8.h"

namespace kvlab::utf8 {
namespace {

// Bytes expected after a lead byte, and the allowed range of the first continuation byte (which
// is what excludes overlongs, surrogates and code points above U+10FFFF; RFC 3629 table 3).
struct LeadInfo {
  int n_continuation;  // -1: not a lead byte
  uint8_t first_lo, first_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b < 0xC2) return {-1, 0, 0};  // continuation byte, or overlong 2-byte lead C0/C1
  if (b < 0xE0) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};  // no surrogates
  if (b < 0xF0) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b < 0xF4) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};  // <= U+10FFFF
  return {-1, 0, 0};
}

// How many bytes starting at pos are a valid prefix of one character (0 when s[pos] cannot
// start one); sets *complete when the character is whole.
size_t valid_prefix(std::string_view s, size_t pos, bool* complete) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[pos]));
  *complete = false;
  if (info.n_continuation < 0) return 0;
  size_t len = 1;
  for (int k = 0; k < info.n_continuation; ++k) {
    if (pos + len >= s.size()) return len;  // cut by the end: still a valid prefix
    const uint8_t c = static_cast<uint8_t>(s[pos + len]);
    const uint8_t lo = k == 0 ? info.first_lo : 0x80, hi = k == 0 ? info.first_hi : 0xBF;
    if (c < lo || c > hi) return 0;
    ++len;
  }
  *complete = true;
  return len;
}

}  // namespace

size_t char_length(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  bool complete = false;
  const size_t len = valid_prefix(s, pos, &complete);
  return complete ? len : 0;
}

size_t validity_run_end(std::string_view s, size_t pos) {
  const bool valid = char_length(s, pos) > 0;
  while (pos < s.size()) {
    const size_t len = char_length(s, pos);
    if ((len > 0) != valid) break;
    pos += len > 0 ? len : 1;
  }
  return pos;
}

size_t complete_prefix_length(std::string_view s) {
  // Only the last (at most 3) bytes can be an unfinished character: find the last lead byte.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const size_t pos = n - back;
    const uint8_t b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    bool complete = false;
    const size_t len = valid_prefix(s, pos, &complete);
    if (len == back && !complete) return pos;  // valid so far, needs more bytes
    return n;
  }
  return n;
}

bool is_valid(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = char_length(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decode_at(std::string_view s, size_t pos, size_t len) {
  const auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[pos + k])); };
  switch (len) {
    case 1: return byte(0);
    case 2: return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3: return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) |
             (byte(3) & 0x3F);
  }
}

}  // namespace kvlab::utf8
