// Test doubles for the evals: a byte-level tokenizer and language models whose logits are a
// known function of the whole context, so every protocol can be recomputed directly.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "evals/lm.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab::testing {

// A short haystack text for the NIAH tests (sentences ending in '.', '!' and '?').
inline const char* const kHay =
    "Alice was beginning to get very tired. She sat by her sister on the bank! Had she nothing "
    "to do? Once or twice she had peeped into the book. It had no pictures or conversations in "
    "it. So she was considering in her own mind what to do. The day was hot.";

// One token per byte; BOS = 256, EOS = 257.
class ByteTokenizer : public Tokenizer {
 public:
  // `kind`: what kind() reports (a test may have the bytes read as another kind's text would).
  explicit ByteTokenizer(std::string kind = "byte") : Tokenizer(std::move(kind), "byte tokenizer") {
    bos_id_ = 256;
    eos_id_ = 257;
    add_bos_ = true;
  }
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& o = {}) const override {
    std::vector<int32_t> ids;
    if (o.add_bos) ids.push_back(256);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) s += token_to_piece(id);
    return s;
  }
  int32_t vocab_size() const override { return 258; }

 private:
  std::string piece_of(int32_t id) const override { return id < 256 ? std::string(1, char(id)) : ""; }
  std::string spelling_of(int32_t id) const override { return piece_of(id); }
};

// logits(context) = fn(context) for the context [0, t]; prefill and decode agree exactly, so the
// model is "full attention". Counts the tokens fed through each path.
class FunctionLm : public LanguageModel {
 public:
  using Fn = std::function<std::vector<float>(std::span<const int32_t> context)>;
  FunctionLm(int32_t vocab, Fn fn) : vocab_(vocab), fn_(std::move(fn)) {}
  int32_t vocab_size() const override { return vocab_; }
  int64_t prefilled = 0, decoded = 0, sequences = 0;

  std::unique_ptr<LmSequence> start(uint64_t) override {
    ++sequences;
    return std::make_unique<Seq>(*this);
  }

 private:
  struct Seq : LmSequence {
    explicit Seq(FunctionLm& lm) : lm(lm) {}
    const std::vector<float>& prefill(std::span<const int32_t> tokens, bool all_logits, bool) override {
      out.clear();
      for (size_t i = 0; i < tokens.size(); ++i) {
        context.push_back(tokens[i]);
        if (all_logits || i + 1 == tokens.size()) {
          std::vector<float> l = lm.fn_(context);
          out.insert(out.end(), l.begin(), l.end());
        }
      }
      lm.prefilled += int64_t(tokens.size());
      return out;
    }
    const std::vector<float>& decode(int32_t token) override {
      context.push_back(token);
      out = lm.fn_(context);
      ++lm.decoded;
      return out;
    }
    FunctionLm& lm;
    std::vector<int32_t> context;
    std::vector<float> out;
  };
  int32_t vocab_;
  Fn fn_;
};

// Logits that depend on every token of the context and on its length (a hash), smooth enough
// that no probability underflows.
inline std::vector<float> hash_logits(std::span<const int32_t> context, int32_t vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ uint64_t(t + 1)) * 1099511628211ull;
  std::vector<float> l(vocab);
  for (int32_t v = 0; v < vocab; ++v)
    l[v] = float(2.0 * std::sin(double((h >> 11) % 1000) * 0.013 * (v + 1) + v * 0.7));
  return l;
}

}  // namespace kvlab::testing
