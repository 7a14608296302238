#include "framework/tokenizer/unicode_nfc.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "framework/core/error.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {
namespace {

const icu::Normalizer2& nfc_instance() {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  KVLAB_CHECK(U_SUCCESS(status) && nfc != nullptr, "ICU has no NFC data: ", u_errorName(status));
  return *nfc;
}

void append_nfc(std::string_view valid, std::string& out) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString source = icu::UnicodeString::fromUTF8(icu::StringPiece(valid.data(), valid.size()));
  const icu::UnicodeString normalized = nfc_instance().normalize(source, status);
  if (U_FAILURE(status)) {
    out += valid;  // cannot happen for valid input; keep the text rather than lose it
    return;
  }
  normalized.toUTF8String(out);
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  bool ascii = true;
  for (const char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t begin = pos;
    const bool valid = utf8::char_length(text, pos) > 0;
    pos = utf8::validity_run_end(text, pos);
    if (valid) append_nfc(text.substr(begin, pos - begin), out);
    else out.append(text.substr(begin, pos - begin));
  }
  return out;
}

}  // namespace kvlab
