#include "framework/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "framework/core/error.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {

// One compiled pattern. Matching state (match data) is per call, so a const PreTokenizer can be
// shared between threads.
class RegexSplitter {
 public:
  RegexSplitter(const std::string& pattern, const std::string& source) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof message);
      fail(source, ": cannot compile pre-tokenizer regex /", pattern, "/ at offset ", error_offset, ": ",
           reinterpret_cast<const char*>(message));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~RegexSplitter() { pcre2_code_free(code_); }
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Splits valid UTF-8 `text` into matches and the gaps between them (Isolated behaviour).
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t gap_begin = 0, pos = 0;
    while (pos < text.size()) {
      // The text was validated by the caller: skip PCRE2's own UTF check.
      int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match, nullptr)
                    : -1;
      if (!jit_ || rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc < 0) break;  // no further match (or a resource limit): the rest is one gap
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (end == begin) {  // empty match: not a piece; move on by one character
        const size_t len = utf8::char_length(text, begin);
        pos = begin + (len == 0 ? 1 : len);
        continue;
      }
      if (begin > gap_begin) out.push_back(text.substr(gap_begin, begin - gap_begin));
      out.push_back(text.substr(begin, end - begin));
      gap_begin = pos = end;
    }
    if (gap_begin < text.size()) out.push_back(text.substr(gap_begin));
    pcre2_match_data_free(match);
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& patterns, const std::string& source) {
  for (const std::string& p : patterns) steps_.push_back(std::make_unique<RegexSplitter>(p, source));
}
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  // Cut into valid-UTF-8 runs (split further by the regex steps) and invalid-byte runs (kept whole).
  std::vector<std::string_view> current, next;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t run_begin = pos;
    const bool valid = utf8::char_length(text, pos) > 0;
    pos = utf8::validity_run_end(text, pos);
    const std::string_view run = text.substr(run_begin, pos - run_begin);
    if (!valid) {
      pieces.push_back(run);
      continue;
    }
    current.assign(1, run);
    for (const auto& step : steps_) {
      next.clear();
      for (const std::string_view piece : current) step->split(piece, next);
      current.swap(next);
    }
    pieces.insert(pieces.end(), current.begin(), current.end());
  }
}

}  // namespace kvlab
