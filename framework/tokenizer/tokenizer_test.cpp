// Self-contained tokenizer tests (no ../shared): UTF-8 helpers, a hand-made SentencePiece
// vocabulary run through the ModelProto bridge, a hand-made byte-level BPE tokenizer.json,
// streaming decode, and clear errors for missing, truncated and malformed files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/tokenizer/byte_level.h"
#include "framework/tokenizer/llama2c_vocab.h"
#include "framework/tokenizer/pretokenizer.h"
#include "framework/tokenizer/sentencepiece_tokenizer.h"
#include "framework/tokenizer/spm_model_proto.h"
#include "framework/tokenizer/tokenizer.h"
#include "framework/tokenizer/tokenizer_testing.h"
#include "framework/tokenizer/utf8.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using namespace tokenizer_testing;

// --- UTF-8 -------------------------------------------------------------------------------------

TEST(TokenizerUtf8, CharLengthAcceptsOnlyWellFormedSequences) {
  EXPECT_EQ(utf8::char_length("a", 0), 1u);
  EXPECT_EQ(utf8::char_length("\xC3\xA9", 0), 2u);          // é
  EXPECT_EQ(utf8::char_length("\xE4\xB8\xAD", 0), 3u);      // 中
  EXPECT_EQ(utf8::char_length("\xF0\x9F\x98\x80", 0), 4u);  // 😀
  EXPECT_EQ(utf8::char_length("\x80", 0), 0u);              // lone continuation
  EXPECT_EQ(utf8::char_length("\xC0\xAF", 0), 0u);          // overlong
  EXPECT_EQ(utf8::char_length("\xED\xA0\x80", 0), 0u);      // surrogate
  EXPECT_EQ(utf8::char_length("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::char_length("\xE4\xB8", 0), 0u);          // cut
  EXPECT_EQ(utf8::char_length("\xFF", 0), 0u);
}

TEST(TokenizerUtf8, CompletePrefixHoldsBackOnlyAnUnfinishedLastCharacter) {
  EXPECT_EQ(utf8::complete_prefix_length(""), 0u);
  EXPECT_EQ(utf8::complete_prefix_length("ab"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xFF"), 3u);      // never valid: passed through
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0" "a"), 4u);  // broken already: passed through
  EXPECT_EQ(utf8::complete_prefix_length("\x80\x80"), 2u);
}

TEST(TokenizerByteLevel, MapsEveryByteToOneCharacterAndBack) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string spelled = byte_level::encode(all);
  std::string back;
  ASSERT_TRUE(byte_level::decode(spelled, &back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(byte_level::encode(" "), "\xC4\xA0");  // Ġ
  EXPECT_EQ(byte_level::encode("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_level::encode("A"), "A");
  std::string ignored;
  EXPECT_FALSE(byte_level::decode("\xE4\xB8\xAD", &ignored));  // 中 is not in the alphabet
}

// --- pre-tokenizer regexes (PCRE2) against python3-regex ------------------------------------------

std::vector<std::string> split_with(const std::vector<std::string>& patterns, const std::string& text) {
  const PreTokenizer pre(patterns, "test");
  std::vector<std::string_view> pieces;
  pre.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

// Expected pieces: regex.findall(pattern, text) with python3-regex 2022.10 (Debian 12).
const std::string kSplitText = "Hello 12345 world!!\n\n  I'M here's \xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87  \tx";

TEST(TokenizerPreTokenizer, Gpt2PatternMatchesPythonRegex) {
  EXPECT_EQ(split_with({std::string(kGpt2Pattern)}, kSplitText),
            (std::vector<std::string>{"Hello", " 12345", " world", "!!", "\n\n ", " I", "'", "M", " here", "'s",
                                      " \xC3\xA9t\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87", "  ", "\t", "x"}));
}

TEST(TokenizerPreTokenizer, Llama3PatternMatchesPythonRegex) {
  EXPECT_EQ(split_with({std::string(kLlama3Pattern)}, kSplitText),
            (std::vector<std::string>{"Hello", " ", "123", "45", " world", "!!\n\n", " ", " I", "'M", " here", "'s",
                                      " \xC3\xA9t\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87", "  ", "\tx"}));
}

TEST(TokenizerPreTokenizer, Qwen2PatternMatchesPythonRegex) {
  EXPECT_EQ(split_with({std::string(kQwen2Pattern)}, kSplitText),
            (std::vector<std::string>{"Hello", " ", "1", "2", "3", "4", "5", " world", "!!\n\n", " ", " I", "'M",
                                      " here", "'s", " \xC3\xA9t\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87", "  ",
                                      "\tx"}));
}

TEST(TokenizerPreTokenizer, StepsApplyInTurnAndInvalidBytesStayWhole) {
  // SmolLM: digits one by one, then GPT-2's regex on each piece.
  EXPECT_EQ(split_with({R"(\p{N})", std::string(kGpt2Pattern)}, "ab 123"),
            (std::vector<std::string>{"ab", " ", "1", "2", "3"}));
  EXPECT_EQ(split_with({std::string(kGpt2Pattern)}, "a \xFF\xFE b"),
            (std::vector<std::string>{"a", " ", "\xFF\xFE", " b"}));
  EXPECT_THROW(PreTokenizer({"(unclosed"}, "test"), Error);
}

// --- SentencePiece through a hand-made ModelProto -------------------------------------------------

TEST(TokenizerSpmProto, HandMadeVocabularyEncodesAndDecodes) {
  const auto tok = sentencepiece_from_vocab(tiny_spm_vocab(), "tiny", /*add_bos=*/true);
  EXPECT_EQ(tok->vocab_size(), 265);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos_by_default());
  // "ab" -> "▁ab": ▁+a (score -4) merges before a+b (-5), then ▁a+b -> ▁ab.
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{264}));
  EXPECT_EQ(tok->encode("ab ab"), (std::vector<int32_t>{264, 264}));
  // 'c' is not a piece: byte fallback to <0x63> (id 3 + 0x63).
  EXPECT_EQ(tok->encode("c"), (std::vector<int32_t>{259, 3 + 0x63}));
  // é (C3 A9) -> two byte pieces.
  EXPECT_EQ(tok->encode("\xC3\xA9"), (std::vector<int32_t>{259, 3 + 0xC3, 3 + 0xA9}));
  for (const std::string text : {"ab", " ab", "a  b ", "cab\n\xC3\xA9", "", "   "})
    EXPECT_EQ(tok->decode(tok->encode(text)), text) << "'" << text << "'";
  EXPECT_EQ(tok->token_to_piece(264), " ab");
  EXPECT_EQ(tok->token_to_piece(1), "");
  EXPECT_EQ(tok->token_to_piece(3 + 0x0A), "\n");
  EXPECT_EQ(tok->id_to_token(3 + 0x0A), "<0x0A>");
  EXPECT_THROW(tok->token_to_piece(265), Error);
}

TEST(TokenizerSpmProto, DummyPrefixCanBeSwitchedOff) {
  SpmVocab v = tiny_spm_vocab();
  v.add_dummy_prefix = false;
  const auto tok = sentencepiece_from_vocab(v, "tiny", true);
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{263}));
  EXPECT_EQ(tok->decode(tok->encode(" ab")), " ab");
}

TEST(TokenizerSpmProto, PieceSpanningASpaceStillWins) {
  // "b▁a" lets a merge cross a space, so the word-by-word memo must stay off for this vocabulary:
  // the ids must be those of encoding the whole text at once.
  SpmVocab v = tiny_spm_vocab();
  v.pieces.push_back("b\xE2\x96\x81" "a");  // 265 b▁a, the best-scoring merge
  v.scores.push_back(0.5f);
  v.types.push_back(SpmPieceType::kNormal);
  v.pieces.push_back("b\xE2\x96\x81");      // 266 b▁
  v.scores.push_back(0.6f);
  v.types.push_back(SpmPieceType::kNormal);
  const auto tok = sentencepiece_from_vocab(v, "tiny", true);
  const std::vector<int32_t> ids = tok->encode("ab ab");
  EXPECT_NE(std::find(ids.begin(), ids.end(), 265), ids.end());
  EXPECT_EQ(tok->decode(ids), "ab ab");
}

TEST(TokenizerSpmProto, StreamingHoldsBackPartialCharacters) {
  const auto tok = sentencepiece_from_vocab(tiny_spm_vocab(), "tiny", true);
  const std::string text = "ab \xF0\x9F\x98\x80 ab";  // 😀 is four byte pieces
  const std::vector<int32_t> ids = tok->encode(text, {.add_bos = true});
  std::vector<std::string> parts;
  EXPECT_EQ(stream_all(*tok, ids, &parts), text);
  for (const std::string& p : parts) EXPECT_TRUE(utf8::is_valid(p)) << p;
  // The emoji comes out whole, in the part of its last byte.
  EXPECT_NE(std::find(parts.begin(), parts.end(), "\xF0\x9F\x98\x80"), parts.end());
}

TEST(TokenizerSpmProto, ReaderRejectsTruncatedProto) {
  const std::string proto = serialize_spm_model_proto(tiny_spm_vocab());
  EXPECT_NO_THROW(read_spm_normalizer_flags(proto, "x.model"));
  const auto flags = read_spm_normalizer_flags(proto, "x.model");
  EXPECT_TRUE(flags.add_dummy_prefix);
  EXPECT_FALSE(flags.remove_extra_whitespaces);
  EXPECT_EQ(flags.n_pieces, 265);
  // Every strict prefix is rejected, also those cut exactly between two fields.
  for (size_t cut = 0; cut < proto.size(); ++cut)
    EXPECT_THROW(read_spm_normalizer_flags(proto.substr(0, cut), "x.model"), Error) << cut;
}

// --- llama2.c tokenizer.bin -------------------------------------------------------------------

TEST(TokenizerLlama2cBin, ReadsPiecesAndInfersTypes) {
  const fs::path path = temp_dir() / "tokenizer.bin";
  write_file(path, tiny_llama2c_bin());
  const SpmVocab v = read_llama2c_vocab(path);
  const SpmVocab want = tiny_spm_vocab();
  EXPECT_EQ(v.pieces, want.pieces);
  EXPECT_EQ(v.scores, want.scores);
  EXPECT_EQ(v.types, want.types);
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_TRUE(v.byte_fallback);
  const auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->encode("ab c"), (std::vector<int32_t>{264, 259, 3 + 0x63}));
}

TEST(TokenizerLlama2cBin, TruncatedOrMalformedFilesGiveClearErrors) {
  const fs::path dir = temp_dir();
  const std::string good = tiny_llama2c_bin();
  const fs::path cut = dir / "cut.bin";
  write_file(cut, good.substr(0, good.size() - 3));
  expect_error([&] { load_tokenizer(cut); }, cut, "truncated");
  const fs::path tiny = dir / "tiny.bin";
  write_file(tiny, "ab");
  expect_error([&] { load_tokenizer(tiny); }, tiny, "truncated");
  const fs::path bad_header = dir / "header.bin";
  write_file(bad_header, std::string("\xff\xff\xff\xff", 4) + good.substr(4));
  expect_error([&] { load_tokenizer(bad_header); }, bad_header, "max_token_length");
}

// --- byte-level BPE from a hand-written tokenizer.json ------------------------------------------

TEST(TokenizerBpeJson, MergesByRankAndRoundTripsBytes) {
  const fs::path path = temp_dir() / "tokenizer.json";
  write_file(path, tiny_tokenizer_json());
  const auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 262);
  EXPECT_EQ(tok->encode("hello hello"), (std::vector<int32_t>{259, 260}));
  EXPECT_EQ(tok->encode("hellllo"), (std::vector<int32_t>{258, 257, 'o'}));  // leftmost "l l" first
  EXPECT_EQ(tok->encode("x\xFF"), (std::vector<int32_t>{'x', 0xFF}));
  for (const std::string text : {"hello  world\n\n", "", " \t", "caf\xC3\xA9 \xF0\x9F\x98\x80", "a\xFF\xFE" "b"})
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

TEST(TokenizerBpeJson, SpecialTokensOnlyWhenAskedNonSpecialAlways) {
  const fs::path path = temp_dir() / "tokenizer.json";
  write_file(path, tiny_tokenizer_json(R"(, {"id": 262, "content": "[x]", "special": false})"));
  const auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->vocab_size(), 263);
  const std::vector<int32_t> plain = tok->encode("hello<|end|>[x]");
  EXPECT_EQ(plain.back(), 262);  // a non-special added token is always one id
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 261), 0);
  EXPECT_EQ(tok->decode(plain), "hello<|end|>[x]");
  const std::vector<int32_t> special = tok->encode("hello<|end|>[x]", {.parse_special = true});
  EXPECT_EQ(special, (std::vector<int32_t>{259, 261, 262}));
  EXPECT_EQ(tok->decode(special), "hello[x]");  // special tokens are invisible in text
}

TEST(TokenizerBpeJson, Llama3StyleSettings) {
  // Llama 3's tokenizer.json: ignore_merges, a Split regex + ByteLevel without regex, and a
  // TemplateProcessing post-processor that puts <|begin|> first.
  const fs::path dir = temp_dir();
  std::string json = tiny_tokenizer_json(R"(, {"id": 262, "content": "<|begin|>", "special": true})");
  const auto swap = [&](const std::string& from, const std::string& to) { json.replace(json.find(from), from.size(), to); };
  swap(R"("Ġhello": 260)", R"("Ġhello": 260, "xyz": 263)");
  swap(R"("merges": [)", R"("ignore_merges": true, "merges": [)");
  swap(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})",
       R"({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
          "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]})");
  write_file(dir / "tokenizer.json", json);
  const auto tok = load_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->bos_id(), 262);
  EXPECT_TRUE(tok->add_bos_by_default());
  EXPECT_EQ(tok->encode("xyz"), (std::vector<int32_t>{263}));  // whole word in the vocabulary
  EXPECT_EQ(tok->encode("hello 12345"), (std::vector<int32_t>{259, ' ', '1', '2', '3', '4', '5'}));
  EXPECT_EQ(tok->encode("xyz", {.add_bos = true}).front(), 262);

  // A tokenizer_config.json beside it overrides BOS/EOS and add_bos.
  write_file(dir / "tokenizer_config.json",
             R"({"bos_token": {"content": "<|end|>"}, "eos_token": "<|begin|>", "add_bos_token": false})");
  const auto configured = load_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(configured->bos_id(), 261);
  EXPECT_EQ(configured->eos_id(), 262);
  EXPECT_FALSE(configured->add_bos_by_default());
}

TEST(TokenizerBpeJson, NfcNormalizerComposesCharacters) {
  const fs::path dir = temp_dir();
  std::string json = tiny_tokenizer_json();
  const std::string null_normalizer = R"("normalizer": null)";
  json.replace(json.find(null_normalizer), null_normalizer.size(), R"("normalizer": {"type": "NFC"})");
  write_file(dir / "tokenizer.json", json);
  const auto tok = load_tokenizer(dir / "tokenizer.json");
  // "e" + U+0301 (CC 81) composes to U+00E9 (C3 A9); invalid bytes pass through untouched.
  EXPECT_EQ(tok->encode("e\xCC\x81"), (std::vector<int32_t>{0xC3, 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("x\xFF" "e\xCC\x81")), "x\xFF\xC3\xA9");
  EXPECT_EQ(tok->decode(tok->encode("hello world")), "hello world");
  json.replace(json.find(R"({"type": "NFC"})"), 15, R"({"type": "Lowercase"})");
  write_file(dir / "lower.json", json);
  expect_error([&] { load_tokenizer(dir / "lower.json"); }, dir / "lower.json", "normalizer.type");
}

TEST(TokenizerBpeJson, StreamingHoldsBackPartialCharacters) {
  const fs::path path = temp_dir() / "tokenizer.json";
  write_file(path, tiny_tokenizer_json());
  const auto tok = load_tokenizer(path);
  const std::string text = "hello \xE4\xB8\xAD\xF0\x9F\x98\x80!";
  std::vector<std::string> parts;
  EXPECT_EQ(stream_all(*tok, tok->encode(text), &parts), text);
  for (const std::string& p : parts) EXPECT_TRUE(utf8::is_valid(p));
}

TEST(TokenizerBpeJson, MalformedFilesGiveClearErrors) {
  const fs::path dir = temp_dir();
  const fs::path broken = dir / "broken.json";
  write_file(broken, tiny_tokenizer_json().substr(0, 500));
  expect_error([&] { load_tokenizer(broken); }, broken, "malformed JSON");
  const fs::path no_merges = dir / "no_merges.json";
  write_file(no_merges, R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel"}})");
  expect_error([&] { load_tokenizer(no_merges); }, no_merges, "model.merges");
  const fs::path wordpiece = dir / "wordpiece.json";
  write_file(wordpiece, R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  expect_error([&] { load_tokenizer(wordpiece); }, wordpiece, "model.type");
  const fs::path not_byte_level = dir / "metaspace.json";
  write_file(not_byte_level, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Metaspace"}})");
  expect_error([&] { load_tokenizer(not_byte_level); }, not_byte_level, "pre_tokenizer");
  const fs::path wrong_type = dir / "wrong_type.json";
  write_file(wrong_type, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "yes"}})");
  expect_error([&] { load_tokenizer(wrong_type); }, wrong_type, "JSON");
  const fs::path missing_bytes = dir / "missing_bytes.json";
  write_file(missing_bytes, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "ByteLevel"}})");
  expect_error([&] { load_tokenizer(missing_bytes); }, missing_bytes, "no token for byte");
}

// A byte-level vocabulary that lacks a few non-printable bytes (SmolLM2's lacks 21, e.g. 0x04)
// loads; such a byte merges with nothing and is dropped from the ids, as llama.cpp does.
TEST(TokenizerBpeJson, BytesWithoutATokenAreDropped) {
  const fs::path path = temp_dir() / "gappy.json";
  std::string vocab;
  int id = 0;
  int id_of_a = -1, id_of_b = -1, id_of_ab = -1;
  for (int b = 0; b < 256; ++b) {
    if (b == 0x04 || b == 0xF5) continue;
    std::string spelled;
    utf8::append(spelled, byte_level::byte_to_codepoint()[b]);
    if (b == '"' || b == '\\') spelled = "\\" + spelled;
    if (b == 'a') id_of_a = id;
    if (b == 'b') id_of_b = id;
    vocab += (vocab.empty() ? "" : ", ") + ("\"" + spelled + "\": " + std::to_string(id++));
  }
  id_of_ab = id;
  vocab += ", \"ab\": " + std::to_string(id);
  write_file(path, R"({"model": {"type": "BPE", "vocab": {)" + vocab +
                       R"(}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}})");
  const auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{id_of_ab}));
  EXPECT_EQ(tok->encode("a\x04" "b"), (std::vector<int32_t>{id_of_a, id_of_b}));  // 0x04 blocks the merge
  EXPECT_EQ(tok->encode("\x04"), std::vector<int32_t>{});
  EXPECT_EQ(tok->encode("a\xF5"), (std::vector<int32_t>{id_of_a}));
}

}  // namespace
}  // namespace kvlab
