#include "framework/tokenizer/byte_level.h"

#include "framework/tokenizer/utf8.h"

namespace kvlab::byte_level {
namespace {

bool is_printable_byte(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  uint32_t next_shifted = 0x100;
  for (uint32_t b = 0; b < 256; ++b) table[b] = is_printable_byte(b) ? b : next_shifted++;
  return table;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const std::array<uint32_t, 256> table = make_table();
  return table;
}

std::string encode(std::string_view bytes) {
  const auto& table = byte_to_codepoint();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) utf8::append(out, table[static_cast<uint8_t>(c)]);
  return out;
}

bool decode(std::string_view text, std::string* out) {
  // Inverse table over code points 0..0x143.
  static const std::array<int, 0x144> inverse = [] {
    std::array<int, 0x144> inv;
    inv.fill(-1);
    const auto& table = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) inv[table[b]] = b;
    return inv;
  }();
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8::char_length(text, pos);
    if (len == 0) return false;
    const uint32_t cp = utf8::decode_at(text, pos, len);
    if (cp >= inverse.size() || inverse[cp] < 0) return false;
    *out += static_cast<char>(inverse[cp]);
    pos += len;
  }
  return true;
}

}  // namespace kvlab::byte_level
