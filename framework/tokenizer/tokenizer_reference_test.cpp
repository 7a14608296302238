// kvlab's tokenizers against independent references, on every paragraph of Pride and Prejudice
// plus hand-written edge cases (tests/tokenizer/cases.py):
//   SentencePiece: python3-sentencepiece on ../shared/tokenizers/llama2/tokenizer.model, and the
//                  same vocabulary written into a GGUF file and a llama2.c tokenizer.bin;
//   byte-level BPE: tests/tokenizer/bpe_reference.py on GPT-2's vocab.json + merges.txt, against
//                  kvlab reading tokenizer.json and a GGUF file.
// Expected ids come from tests/tokenizer/make_fixtures.py, run by CTest first (FIXTURES_SETUP).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/tokenizer/tokenizer.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

fs::path shared_dir() {
  if (const char* env = std::getenv("KVLAB_SHARED_DIR")) return env;
  return fs::path(KVLAB_SOURCE_DIR) / ".." / "shared";
}
fs::path fixture_dir() { return fs::path(KVLAB_BINARY_DIR) / "tokenizer_fixtures"; }

// Returns the first of the shared files the tests need that is absent, or "".
std::string missing_shared_file() {
  for (const char* p : {"tokenizers/llama2/tokenizer.model", "tokenizers/gpt2/tokenizer.json",
                        "tokenizers/gpt2/vocab.json", "tokenizers/gpt2/merges.txt",
                        "text/pride_and_prejudice.txt"})
    if (!fs::exists(shared_dir() / p)) return p;
  return "";
}

Json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": absent (did the tokenizer_fixtures test run?)");
  return Json::parse(in);
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

struct Case {
  std::string name, text;
};

class TokenizerReference : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string missing = missing_shared_file(); !missing.empty())
      GTEST_SKIP() << "needs ../shared/" << missing << ": absent";
    if (cases_.empty()) {
      const Json file = read_json(fixture_dir() / "cases.json");
      for (const Json& c : file["cases"])
        cases_.push_back({c["name"].get<std::string>(), from_hex(c["hex"].get<std::string>())});
    }
  }

  // Encodes every case and compares with `expected_ids`; decode must give `expected_text[i]`.
  // Stops after a few mismatches so a broken build does not print megabytes.
  void check_encode_decode(const Tokenizer& tok, const Json& expected_ids,
                           const std::vector<std::string>& expected_text) {
    ASSERT_EQ(expected_ids.size(), cases_.size());
    int failures = 0;
    for (size_t i = 0; i < cases_.size() && failures < 5; ++i) {
      const Case& c = cases_[i];
      const std::vector<int32_t> ids = tok.encode(c.text);
      const auto want = expected_ids[i].get<std::vector<int32_t>>();
      if (ids != want) {
        ++failures;
        ADD_FAILURE() << "case " << c.name << ": ids differ from the reference (" << ids.size() << " vs "
                      << want.size() << " ids)";
        continue;
      }
      const std::string text = tok.decode(ids);
      if (text != expected_text[i]) {
        ++failures;
        ADD_FAILURE() << "case " << c.name << ": decode(encode(x)) differs";
      }
      // Streaming token by token yields the same bytes, never splitting a character mid-way.
      StreamDecoder stream(tok);
      std::string streamed;
      for (const int32_t id : ids) {
        const std::string part = stream.push(id);
        if (utf8::is_valid(text) && !utf8::is_valid(part)) {
          ++failures;
          ADD_FAILURE() << "case " << c.name << ": stream emitted a partial UTF-8 sequence";
        }
        streamed += part;
      }
      streamed += stream.flush();
      if (streamed != text) {
        ++failures;
        ADD_FAILURE() << "case " << c.name << ": streamed decode differs from decode";
      }
    }
  }

  std::vector<std::string> texts() const {
    std::vector<std::string> out;
    for (const Case& c : cases_) out.push_back(c.text);
    return out;
  }

  static std::vector<Case> cases_;
};
std::vector<Case> TokenizerReference::cases_;

// --- SentencePiece -----------------------------------------------------------------------------

class TokenizerSpmReference : public TokenizerReference {
 protected:
  void SetUp() override {
    TokenizerReference::SetUp();
    if (IsSkipped()) return;
    const Json expected = read_json(fixture_dir() / "spm_expected.json");
    ids_ = expected["ids"];
    for (const Json& h : expected["decoded_hex"]) decoded_.push_back(from_hex(h.get<std::string>()));
  }
  Json ids_;
  std::vector<std::string> decoded_;  // python3-sentencepiece's decode of its own ids
};

TEST_F(TokenizerSpmReference, TokenizerModelMatchesPythonSentencepiece) {
  const auto tok = load_tokenizer(shared_dir() / "tokenizers/llama2/tokenizer.model");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos_by_default());
  check_encode_decode(*tok, ids_, decoded_);
}

TEST_F(TokenizerSpmReference, RoundTripsValidUtf8AndReplacesInvalidBytes) {
  // decode(encode(x)) == x for valid UTF-8; sentencepiece turns each invalid byte into U+FFFD,
  // so for those cases the reference decode is x with the replacements.
  for (size_t i = 0; i < cases_.size(); ++i) {
    if (utf8::is_valid(cases_[i].text)) EXPECT_EQ(decoded_[i], cases_[i].text) << cases_[i].name;
    else EXPECT_NE(decoded_[i].find("\xEF\xBF\xBD"), std::string::npos) << cases_[i].name;
  }
}

TEST_F(TokenizerSpmReference, GgufVocabularyGivesTheSameIds) {
  const auto tok = load_tokenizer(fixture_dir() / "llama2_vocab.gguf");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  check_encode_decode(*tok, ids_, decoded_);
}

TEST_F(TokenizerSpmReference, Llama2cTokenizerBinGivesTheSameIds) {
  const auto tok = load_tokenizer(fixture_dir() / "llama2_tokenizer.bin");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  check_encode_decode(*tok, ids_, decoded_);
}

TEST_F(TokenizerSpmReference, SpecialTokensOnlyWhenAsked) {
  const auto tok = load_tokenizer(shared_dir() / "tokenizers/llama2/tokenizer.model");
  const std::vector<int32_t> plain = tok->encode("<s>hi</s>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EncodeOptions special;
  special.parse_special = true;
  const std::vector<int32_t> parsed = tok->encode("<s>hi</s>", special);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  // Text after a special token is not the start of the text: no dummy-prefix space.
  const std::vector<int32_t> inner(parsed.begin() + 1, parsed.end() - 1);
  EXPECT_EQ(tok->decode(inner), "hi");
  EncodeOptions bos;
  bos.add_bos = true;
  const std::vector<int32_t> with_bos = tok->encode("hi", bos);
  EXPECT_EQ(with_bos.front(), 1);
  EXPECT_EQ(tok->decode(with_bos), "hi");
}

// --- byte-level BPE ----------------------------------------------------------------------------

class TokenizerBpeReference : public TokenizerReference {
 protected:
  void SetUp() override {
    TokenizerReference::SetUp();
    if (IsSkipped()) return;
    const Json file = read_json(fixture_dir() / "bpe_expected.json");
    ids_ = file["ids"];
  }
  Json ids_;
};

TEST_F(TokenizerBpeReference, TokenizerJsonMatchesIndependentReference) {
  const auto tok = load_tokenizer(shared_dir() / "tokenizers/gpt2/tokenizer.json");
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_FALSE(tok->add_bos_by_default());
  check_encode_decode(*tok, ids_, texts());  // byte-exact round trip, invalid UTF-8 included
}

TEST_F(TokenizerBpeReference, GgufVocabularyGivesTheSameIds) {
  const auto tok = load_tokenizer(fixture_dir() / "gpt2_vocab.gguf");
  EXPECT_EQ(tok->kind(), "bpe");
  check_encode_decode(*tok, ids_, texts());
}

TEST_F(TokenizerBpeReference, EndOfTextOnlyWhenAsked) {
  const auto tok = load_tokenizer(shared_dir() / "tokenizers/gpt2/tokenizer.json");
  const std::string text = "a<|endoftext|>b";
  const std::vector<int32_t> plain = tok->encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(tok->decode(plain), text);
  EncodeOptions special;
  special.parse_special = true;
  const std::vector<int32_t> parsed = tok->encode(text, special);
  EXPECT_EQ(parsed, (std::vector<int32_t>{64, 50256, 65}));
}

}  // namespace
}  // namespace kvlab
