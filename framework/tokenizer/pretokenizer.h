// Regex pre-tokenization for byte-level BPE: the text is cut into pieces ("words") and BPE merges
// never cross a piece boundary.
//
// A pre-tokenizer is a list of regex split steps applied in turn, each to every piece produced so
// far, in Hugging Face's "Isolated" behaviour: every match becomes a piece and so does every
// unmatched gap between matches. GPT-2's ByteLevel(use_regex=true) is one such step with
// kGpt2Pattern; HF Digits(individual_digits) is the step \p{N} (or \p{N}+).
// Regexes are PCRE2 with Unicode properties (PCRE2_UTF | PCRE2_UCP), JIT-compiled.
//
// Invalid UTF-8: before the first step the text is cut into maximal runs of valid UTF-8 and
// maximal runs of invalid bytes; each invalid run is one piece that no regex sees. (No real
// tokenizer defines this case; the reference in tests/tokenizer/bpe_reference.py does the same.)
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// GPT-2 (also SmolLM after its digit split).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3: case-insensitive contractions, digits in groups of up to three, newlines kept apart.
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama 3 but every digit alone.
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class RegexSplitter;  // one compiled pattern (pretokenizer.cpp)

class PreTokenizer {
 public:
  // Compiles the patterns; throws kvlab::Error naming `source`, the pattern and PCRE2's message.
  PreTokenizer(const std::vector<std::string>& patterns, const std::string& source);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Appends the pieces of `text`, in order, as views into `text` (they concatenate to `text`).
  // Never throws on any input.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  std::vector<std::unique_ptr<RegexSplitter>> steps_;
};

}  // namespace kvlab
