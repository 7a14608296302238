// RULER's task generators against their definitions (ruler_tasks.h), the scoring on hand-written
// predictions, the protocols' prompt-end signal, and the section's bad-input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>
#include <regex>

#include "evals/fake_lm_test_util.h"
#include "evals/ruler_eval.h"
#include "evals/ruler_tasks.h"
#include "framework/experiment/experiment.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using testing::ByteTokenizer;

// One token per byte, but sentences read as byte-level BPE would: encode_sentence gives each a
// leading space, so units stay separable in the decoded text.
class SpacedByteTokenizer : public ByteTokenizer {
 public:
  SpacedByteTokenizer() : ByteTokenizer("bpe") {}
};

fs::path shared_dir() {
  if (const char* d = std::getenv("KVLAB_SHARED_DIR")) return d;
  return fs::path(KVLAB_SOURCE_DIR) / ".." / "shared";
}

const char* kEssay =
    "Alpha beta gamma delta. Epsilon zeta eta theta iota! Kappa lambda mu nu xi omicron? Pi rho sigma tau. "
    "Upsilon phi chi psi omega. The quick brown fox jumps over the lazy dog. A journey of a thousand miles "
    "begins with one step. Still waters run deep. Time and tide wait for no one. Fortune favours the bold. ";

// The tokenizers the generators are checked with: the spaced byte tokenizer always, SentencePiece
// (llama2) and byte-level BPE (gpt2) from ../shared and the bundled model's when present.
std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> tokenizers() {
  std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> out;
  out.emplace_back("spaced-bytes", std::make_unique<SpacedByteTokenizer>());
  for (const char* p : {"tokenizers/llama2/tokenizer.model", "tokenizers/gpt2/tokenizer.json"})
    if (fs::exists(shared_dir() / p)) out.emplace_back(p, load_tokenizer(shared_dir() / p));
  const fs::path bundled = fs::path(KVLAB_SOURCE_DIR) / "data/models/kvlab-tiny.gguf";
  if (fs::exists(bundled)) out.emplace_back("kvlab-tiny", load_tokenizer(bundled));
  return out;
}

std::string essay_text() {
  std::string t;
  for (int i = 0; i < 40; ++i) t += kEssay;
  return t;
}

int expected_needles(const RulerTaskInfo& t) {
  switch (t.family) {
    case RulerFamily::kNiah: return std::max(t.num_keys, t.num_queries) * t.num_values;
    case RulerFamily::kVt: return 5;  // one chain of 4 hops: 5 statements
    case RulerFamily::kPasskey:
    case RulerFamily::kKvRetrieval: return 1;
    case RulerFamily::kCwe:
    case RulerFamily::kFwe: return 0;
  }
  return -1;
}

int expected_references(const RulerTaskInfo& t) {
  switch (t.family) {
    case RulerFamily::kNiah: return t.num_queries * t.num_values;
    case RulerFamily::kVt: return 5;
    case RulerFamily::kCwe: return 10;
    case RulerFamily::kFwe: return 3;
    case RulerFamily::kPasskey:
    case RulerFamily::kKvRetrieval: return 1;
  }
  return -1;
}

TEST(Ruler, EveryTaskHasItsDefinition) {
  // synthetic.yaml: needle counts and types; constants.py: tokens to generate.
  ASSERT_EQ(ruler_tasks().size(), 13u);
  EXPECT_EQ(find_ruler_task("niah_multikey_1")->num_keys, 4);
  EXPECT_EQ(find_ruler_task("niah_multivalue")->num_values, 4);
  EXPECT_EQ(find_ruler_task("niah_multiquery")->num_queries, 4);
  EXPECT_EQ(find_ruler_task("niah_single_3")->value, RulerItem::kUuid);
  EXPECT_EQ(find_ruler_task("niah_multikey_3")->key, RulerItem::kUuid);
  EXPECT_EQ(find_ruler_task("niah_multikey_2")->haystack, RulerHaystack::kNeedle);
  EXPECT_EQ(find_ruler_task("niah_single_1")->haystack, RulerHaystack::kNoise);
  EXPECT_EQ(find_ruler_task("niah_single_2")->answer_tokens, 128);
  EXPECT_EQ(find_ruler_task("vt")->answer_tokens, 30);
  EXPECT_EQ(find_ruler_task("cwe")->answer_tokens, 120);
  EXPECT_EQ(find_ruler_task("fwe")->answer_tokens, 50);
  EXPECT_EQ(find_ruler_task("qa_1"), nullptr);
}

// Every task, every tokenizer, both template sets, two lengths: the prompt has exactly the
// requested tokens; needles are where the sample says (in order, inside the context, whole), each
// holds its text; every reference is in a needle (retrieval) and the question names the query.
TEST(Ruler, PromptsHaveExactLengthsAndTheirNeedles) {
  for (const auto& [tname, tok] : tokenizers()) {
    const Haystack essay = make_haystack(*tok, essay_text());
    for (const char* set : {"instruct", "kvlab-tiny"}) {
      const RulerTemplates templates = *builtin_ruler_templates(set);
      const RulerSource src{*tok, templates, &essay};
      for (const RulerTaskInfo& task : ruler_tasks())
        // The instruct cwe prompt holds RULER's in-context example (about 650 one-byte tokens)
        // before its own list of at least 61 entries: 1500 bytes cannot hold both.
        for (int length : tname == "spaced-bytes" && task.family == RulerFamily::kCwe && std::string(set) == "instruct"
                              ? std::vector<int>{2047, 3000}
                              : std::vector<int>{1500, 2047}) {
          SCOPED_TRACE(std::string(tname) + " " + set + " " + task.name + " " + std::to_string(length));
          const int prompt = length - task.answer_tokens;
          const RulerSample s = build_ruler_sample(src, task, prompt, length, 7);
          ASSERT_EQ(int(s.tokens.size()), prompt);
          ASSERT_EQ(int(s.needle_pos.size()), expected_needles(task));
          ASSERT_EQ(int(s.references.size()), expected_references(task));
          const int64_t question_start = int64_t(s.tokens.size()) - s.question_tokens;
          int64_t prev_end = 1;  // after BOS at least
          for (size_t k = 0; k < s.needle_pos.size(); ++k) {
            EXPECT_GE(s.needle_pos[k], prev_end);
            prev_end = s.needle_pos[k] + s.needle_tokens[k];
            EXPECT_LE(prev_end, question_start);
          }
          // The needles' own text: each is the tokenization of a filled needle sentence.
          std::string needles_text;
          for (size_t k = 0; k < s.needle_pos.size(); ++k)
            needles_text += tok->decode(std::span<const int32_t>(s.tokens).subspan(size_t(s.needle_pos[k]), size_t(s.needle_tokens[k]))) + "\n";
          if (task.family != RulerFamily::kCwe && task.family != RulerFamily::kFwe) {
            for (const auto& r : s.references) EXPECT_NE(needles_text.find(r), std::string::npos) << r;
          }
          const std::string question = tok->decode(std::span<const int32_t>(s.tokens).subspan(size_t(question_start)));
          EXPECT_NE(question.find(s.query), std::string::npos) << question;
        }
    }
  }
}

// Essay haystacks put needles between sentences; noise/needle haystacks between units.
TEST(Ruler, EssayNeedlesSitAtSentenceBoundaries) {
  SpacedByteTokenizer tok;
  const Haystack essay = make_haystack(tok, essay_text());
  const RulerTemplates templates = *builtin_ruler_templates("kvlab-tiny");
  const RulerSource src{tok, templates, &essay};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const RulerSample s = build_ruler_sample(src, *find_ruler_task("niah_multikey_1"), 1000, 1128, seed);
    for (size_t k = 0; k < s.needle_pos.size(); ++k) {
      const char before = char(s.tokens[size_t(s.needle_pos[k] - 1)]);
      // after a sentence end, the intro (empty here: BOS), or the previous needle's '.'
      EXPECT_TRUE(before == '.' || before == '!' || before == '?' || s.needle_pos[k] == 1) << int(before);
    }
  }
}

TEST(Ruler, SeedsReproduceSamplesBitForBit) {
  SpacedByteTokenizer tok;
  const Haystack essay = make_haystack(tok, essay_text());
  const RulerTemplates templates = *builtin_ruler_templates("instruct");
  const RulerSource src{tok, templates, &essay};
  for (const RulerTaskInfo& task : ruler_tasks()) {
    const uint64_t seed = ruler_sample_seed(3, task.task, 2048, 5);
    EXPECT_EQ(seed, ruler_sample_seed(3, task.task, 2048, 5));
    EXPECT_NE(seed, ruler_sample_seed(3, task.task, 2048, 6));
    EXPECT_NE(seed, ruler_sample_seed(3, task.task, 1024, 5));
    const RulerSample a = build_ruler_sample(src, task, 1900, 2048, seed);
    const RulerSample b = build_ruler_sample(src, task, 1900, 2048, seed);
    const RulerSample c = build_ruler_sample(src, task, 1900, 2048, seed + 1);
    EXPECT_EQ(a.tokens, b.tokens) << task.name;
    EXPECT_EQ(a.needle_pos, b.needle_pos) << task.name;
    EXPECT_EQ(a.references, b.references) << task.name;
    EXPECT_NE(a.tokens, c.tokens) << task.name;
  }
}

// cwe: 10 words 6 times each below 4096 tokens (30 at 4096), every other word once (3), entries
// numbered 1..N; the references are the 10 common words.
TEST(Ruler, CommonWordsHaveRulersFrequencies) {
  SpacedByteTokenizer tok;
  const RulerTemplates templates = *builtin_ruler_templates("kvlab-tiny");
  const RulerSource src{tok, templates, nullptr};
  for (auto [length, freq_cw, freq_ucw] : {std::tuple{2048, 6, 1}, std::tuple{4096, 30, 3}}) {
    const RulerSample s = build_ruler_sample(src, *find_ruler_task("cwe"), length - 120, length, 11);
    const std::string text = tok.decode(s.tokens);
    std::map<std::string, int> counts;
    int entries = 0;
    const std::regex entry(R"( (\d+)\. ([a-z]+))");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), entry); it != std::sregex_iterator(); ++it) {
      ++entries;
      EXPECT_EQ(std::stoi((*it)[1]), entries);
      ++counts[(*it)[2]];
    }
    ASSERT_GT(entries, 10 * freq_cw);
    for (const auto& r : s.references) EXPECT_EQ(counts[r], freq_cw) << r;
    int uncommon = 0;
    for (const auto& [w, n] : counts)
      if (std::find(s.references.begin(), s.references.end(), w) == s.references.end()) {
        EXPECT_EQ(n, freq_ucw) << w;
        ++uncommon;
      }
    EXPECT_EQ(entries, 10 * freq_cw + uncommon * freq_ucw);
  }
}

// RULER's in-context example (ruler_tasks.h; variable_tracking.py, common_words_extraction.py):
// the instruct set prepends, right after BOS, a solved smaller instance of vt and cwe. Checked
// from the example's own text: its written answer is what its chain or its list gives.
std::string example_text(const Tokenizer& tok, const RulerSample& s) {
  const size_t bos = tok.bos_id() >= 0 ? 1 : 0;
  return tok.decode(std::span<const int32_t>(s.tokens).subspan(bos, size_t(s.example_tokens)));
}

TEST(Ruler, InContextExampleIsASolvedSmallerInstance) {
  SpacedByteTokenizer tok;
  const RulerTemplates templates = *builtin_ruler_templates("instruct");
  const RulerSource src{tok, templates, nullptr};
  // (one byte per token: from 4096 the cwe example and the sample's list of 30-fold words need
  // more than 4096 tokens, so the long case is 6144)
  for (int length : {2048, 3072, 6144})
    for (uint64_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(std::to_string(length) + " seed " + std::to_string(seed));
      {
        // vt: 3-letter names (the sample's own have 5); the example and its answer take 470
        // tokens; the written answer is every name the example's chain assigns its value to.
        const RulerTaskInfo& vt = *find_ruler_task("vt");
        const RulerSample s = build_ruler_sample(src, vt, length - 30, length, seed);
        ASSERT_EQ(int(s.tokens.size()), length - 30);
        ASSERT_EQ(s.example_tokens, 470);
        const std::string text = example_text(tok, s);
        ASSERT_EQ(text.substr(text.size() - 2), "\n\n");
        const std::regex assign(R"(VAR ([A-Z]+) = (VAR ([A-Z]+)|(\d+)))");
        std::map<std::string, std::string> from;  // name -> the name or value it copies
        std::string value;
        for (auto it = std::sregex_iterator(text.begin(), text.end(), assign); it != std::sregex_iterator(); ++it) {
          const std::string name = (*it)[1];
          EXPECT_EQ(name.size(), 3u) << name;
          from[name] = (*it)[3].matched ? std::string((*it)[3]) : std::string((*it)[4]);
          if ((*it)[4].matched) value = (*it)[4];
        }
        ASSERT_EQ(from.size(), 5u);
        std::vector<std::string> chain;  // the names holding `value`, in assignment order
        for (std::string at = value; chain.size() < from.size();) {
          const auto next = std::find_if(from.begin(), from.end(), [&](const auto& e) { return e.second == at; });
          if (next == from.end()) break;
          chain.push_back(next->first);
          at = next->first;
        }
        EXPECT_EQ(chain, s.example_references);
        std::string answer;
        for (const auto& n : chain) answer += (answer.empty() ? "" : " ") + n;
        // The template filled for the example (its value, 5 variables), then the answer.
        const std::string prefix = " Answer: the 5 variables holding the value " + value + " are:  ";
        EXPECT_NE(text.find("which variables end up holding the value " + value + "?"), std::string::npos) << text;
        EXPECT_NE(text.find(prefix + answer + " \n\n"), std::string::npos) << text;
        // The sample's own needles come after the example, with 5-letter names.
        ASSERT_EQ(s.needle_pos.size(), 5u);
        EXPECT_GT(s.needle_pos[0], s.example_tokens);
        for (const auto& r : s.references) EXPECT_EQ(r.size(), 5u) << r;
      }
      {
        // cwe: 20 words, 10 of them 3 times (40 words, 10 and 3 times, from 4096), entries
        // numbered 1..N; the written answer "1. w 2. w ... 10. w" is the 10 most common.
        const RulerTaskInfo& cwe = *find_ruler_task("cwe");
        const RulerSample s = build_ruler_sample(src, cwe, length - 120, length, seed);
        ASSERT_EQ(int(s.tokens.size()), length - 120);
        ASSERT_GT(s.example_tokens, 0);
        const std::string text = example_text(tok, s);
        const size_t question = text.find("\nQuestion: which 10 words");
        ASSERT_NE(question, std::string::npos) << text;
        const std::string list = text.substr(0, question), after = text.substr(question);
        const auto [words, freq_cw, freq_ucw] = length >= 4096 ? std::tuple{40, 10, 3} : std::tuple{20, 3, 1};
        std::map<std::string, int> counts;
        int entries = 0;
        const std::regex entry(R"( (\d+)\. ([a-z]+))");
        for (auto it = std::sregex_iterator(list.begin(), list.end(), entry); it != std::sregex_iterator(); ++it) {
          EXPECT_EQ(std::stoi((*it)[1]), ++entries);
          ++counts[(*it)[2]];
        }
        ASSERT_EQ(int(counts.size()), words);
        EXPECT_EQ(entries, 10 * freq_cw + (words - 10) * freq_ucw);
        std::vector<std::string> common;
        for (const auto& [w, n] : counts) {
          EXPECT_TRUE(n == freq_cw || n == freq_ucw) << w << " " << n;
          if (n == freq_cw) common.push_back(w);
        }
        std::vector<std::string> answered;  // what the example's answer lists, in order
        for (auto it = std::sregex_iterator(after.begin(), after.end(), entry); it != std::sregex_iterator(); ++it) {
          EXPECT_EQ(std::stoi((*it)[1]), int(answered.size()) + 1);
          answered.push_back((*it)[2]);
        }
        EXPECT_EQ(answered, s.example_references);
        std::sort(answered.begin(), answered.end());
        EXPECT_EQ(answered, common);
        EXPECT_EQ(after.back(), '\n');
      }
    }
}

// The example counts inside the exact prompt length for every tokenizer; it comes from the
// sample's seed (the same seed gives the same tokens, another seed another example) and from its
// own stream, so vt's chain is the one drawn without an example; kvlab-tiny has none.
TEST(Ruler, InContextExampleIsExactAndReproducible) {
  for (const auto& [tname, tok] : tokenizers()) {
    RulerTemplates with = *builtin_ruler_templates("instruct"), without = with;
    without.vt.example = without.cwe.example = false;
    const RulerTemplates tiny = *builtin_ruler_templates("kvlab-tiny");
    for (const char* name : {"vt", "cwe"}) {
      SCOPED_TRACE(std::string(tname) + " " + name);
      const RulerTaskInfo& task = *find_ruler_task(name);
      // (one byte per token, cwe's example and list need more: see above)
      const bool bytes_cwe = tname == "spaced-bytes" && task.family == RulerFamily::kCwe;
      for (int length : bytes_cwe ? std::vector<int>{2048, 6144} : std::vector<int>{1024, 2048, 4096}) {
        const int prompt = length - task.answer_tokens;
        const RulerSample a = build_ruler_sample({*tok, with, nullptr}, task, prompt, length, 9);
        const RulerSample b = build_ruler_sample({*tok, with, nullptr}, task, prompt, length, 9);
        const RulerSample c = build_ruler_sample({*tok, with, nullptr}, task, prompt, length, 10);
        const RulerSample plain = build_ruler_sample({*tok, without, nullptr}, task, prompt, length, 9);
        ASSERT_EQ(int(a.tokens.size()), prompt);
        ASSERT_EQ(int(c.tokens.size()), prompt);
        if (task.family == RulerFamily::kVt) {
          EXPECT_EQ(a.example_tokens, 470);
        }
        EXPECT_GT(a.example_tokens, 0);
        EXPECT_EQ(a.tokens, b.tokens);
        EXPECT_EQ(a.example_references, b.example_references);
        EXPECT_NE(a.example_references, c.example_references);
        const size_t bos = tok->bos_id() >= 0 ? 1 : 0;
        const auto ex = [&](const RulerSample& s) {
          return std::vector<int32_t>(s.tokens.begin() + long(bos), s.tokens.begin() + long(bos) + s.example_tokens);
        };
        EXPECT_NE(ex(a), ex(c));
        EXPECT_EQ(plain.example_tokens, 0);
        if (task.family == RulerFamily::kVt) {  // (cwe's list is drawn for its size, which the example shrinks)
          EXPECT_EQ(a.references, plain.references);
          EXPECT_EQ(a.query, plain.query);
        }
        EXPECT_EQ(build_ruler_sample({*tok, tiny, nullptr}, task, prompt, length, 9).example_tokens, 0);
      }
    }
  }
}

// fwe: rank k appears floor(n k^-2 / zeta(2)) times; rank 1 is "..."; references = ranks 2..4.
TEST(Ruler, FrequentWordsFollowZipf) {
  SpacedByteTokenizer tok;
  const RulerTemplates templates = *builtin_ruler_templates("kvlab-tiny");
  const RulerSource src{tok, templates, nullptr};
  const RulerSample s = build_ruler_sample(src, *find_ruler_task("fwe"), 2000, 2048, 5);
  std::map<std::string, int> counts;
  // The list alone: the padding (" ..." repeated) and the question come after it.
  const size_t list_end = s.tokens.size() - size_t(s.question_tokens) - size_t(s.pad_tokens);
  const std::string text = tok.decode(std::span<const int32_t>(s.tokens).first(list_end));
  const std::regex word(R"( ([a-z]{6}|\.\.\.)(?= |$))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator(); ++it) ++counts[(*it)[1]];
  ASSERT_EQ(s.references.size(), 3u);
  // count(k) = floor(c / k^2) with c = n / zeta(2) and count(1) = floor(c): flooring both moves
  // count(k) from count(1) / k^2 by less than 1 + 1 / k^2 <= 1.25 (k >= 2).
  const double top = counts["..."];
  ASSERT_GT(top, 50);
  for (int k = 0; k < 3; ++k)
    EXPECT_NEAR(counts[s.references[size_t(k)]], top / double((k + 2) * (k + 2)), 1.25) << s.references[size_t(k)];
  EXPECT_GT(counts[s.references[0]], counts[s.references[1]]);
  EXPECT_GT(counts[s.references[1]], counts[s.references[2]]);
}

TEST(Ruler, ScoringOnHandWrittenPredictions) {
  const std::vector<std::string> refs = {"1234567", "Apple-Pie", "9999999"};
  EXPECT_DOUBLE_EQ(string_match_all("the numbers are 1234567 and apple-pie.", refs), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(string_match_all("1234567 APPLE-PIE 9999999", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("nothing here", refs), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("only 9999999", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_part("123456", refs), 0.0);
  EXPECT_DOUBLE_EQ(ruler_score(RulerScoring::kFirstNumber, " 4213. Remember it.", {"4213"}), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(RulerScoring::kFirstNumber, " 42130", {"4213"}), 0.0);
  EXPECT_DOUBLE_EQ(ruler_score(RulerScoring::kFirstNumber, " 17 then 4213", {"4213"}), 0.0);
}

// The protocols on a RULER prompt: the prompt-end signal comes with the token before the
// question (query_agnostic; the question then follows without it) or with the last token of the
// prompt (query_aware).
struct Call {
  size_t tokens;
  bool prompt_end;
  int32_t first;
};
class RecordingLm : public LanguageModel {
 public:
  std::vector<Call> calls;
  int32_t vocab_size() const override { return 258; }
  std::unique_ptr<LmSequence> start(uint64_t) override { return std::make_unique<Seq>(*this); }

 private:
  struct Seq : LmSequence {
    explicit Seq(RecordingLm& lm) : lm(lm), out(258, 0.f) {}
    const std::vector<float>& prefill(std::span<const int32_t> t, bool, bool end) override {
      lm.calls.push_back({t.size(), end, t.empty() ? -1 : t[0]});
      return out;
    }
    const std::vector<float>& decode(int32_t) override { return out; }
    RecordingLm& lm;
    std::vector<float> out;
  };
};

TEST(Ruler, ProtocolsSignalThePromptEndAtTheRightToken) {
  SpacedByteTokenizer tok;
  const RulerTemplates templates = *builtin_ruler_templates("instruct");
  const RulerSource src{tok, templates, nullptr};
  for (const RulerTaskInfo& task : ruler_tasks()) {
    const RulerSample s = build_ruler_sample(src, task, 1800, 2048, 1);
    const size_t head = s.tokens.size() - size_t(s.question_tokens);
    // The question starts right after the context: its first token begins the question text.
    const std::string q = tok.decode(std::span<const int32_t>(s.tokens).subspan(head));
    const std::string expect_start = templates.of(task.family).question.substr(0, 4);
    EXPECT_EQ(q.substr(0, 5), " " + expect_start) << task.name;
    RecordingLm agnostic, aware;
    auto a = agnostic.start(0);
    feed_prompt(*a, s.tokens, s.question_tokens, NiahProtocol::kQueryAgnostic);
    ASSERT_EQ(agnostic.calls.size(), 2u);
    EXPECT_EQ(agnostic.calls[0].tokens, head);
    EXPECT_TRUE(agnostic.calls[0].prompt_end);
    EXPECT_EQ(agnostic.calls[1].tokens, size_t(s.question_tokens));
    EXPECT_FALSE(agnostic.calls[1].prompt_end);
    EXPECT_EQ(agnostic.calls[1].first, s.tokens[head]);
    auto b = aware.start(0);
    feed_prompt(*b, s.tokens, s.question_tokens, NiahProtocol::kQueryAware);
    ASSERT_EQ(aware.calls.size(), 1u);
    EXPECT_EQ(aware.calls[0].tokens, s.tokens.size());
    EXPECT_TRUE(aware.calls[0].prompt_end);
  }
}

std::string error_of(const std::string& yaml) {
  try {
    parse_experiment_text(yaml, "r.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kHead = "model: {path: m.gguf}\npolicies: [{type: full}]\nevals:\n  ruler:\n";

TEST(Ruler, SectionParsesAndExpands) {
  const ExperimentSpec s = parse_experiment_text(std::string(kHead) +
                                                     "    tasks: [niah_single_1, vt]\n    context_lengths: [1024, 2048]\n"
                                                     "    protocol: [query_agnostic, query_aware]\n    samples: 3\n",
                                                 "r.yaml");
  const RulerEvaluation* r = find_evaluation<RulerEvaluation>(s);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->cell_count(), 8u);
  EXPECT_EQ(r->cell_id(0), "ruler_query_agnostic_niah_single_1_L1024");
  EXPECT_EQ(r->cell_id(3), "ruler_query_agnostic_vt_L2048");
  EXPECT_EQ(r->cell_id(7), "ruler_query_aware_vt_L2048");
  EXPECT_EQ(count_grid(s).cells, 8u);
}

TEST(Ruler, UnknownTaskNamesTheValidOnes) {
  const std::string e = error_of(std::string(kHead) + "    tasks: [niah_singel_1]\n    context_lengths: [1024]\n");
  EXPECT_NE(e.find("r.yaml:5:13: evals.ruler.tasks[0]: unknown task 'niah_singel_1' (did you mean 'niah_single_1'?)"),
            std::string::npos) << e;
  EXPECT_NE(e.find(ruler_task_names()), std::string::npos) << e;
}

TEST(Ruler, TemplateMissingAFieldNamesTemplateAndField) {
  const std::string e = error_of(std::string(kHead) +
                                 "    tasks: [niah_single_1]\n    context_lengths: [1024]\n"
                                 "    templates: {base: instruct, niah: {needle: 'The number is {value}.'}}\n");
  EXPECT_NE(e.find("evals.ruler.templates.niah.needle: template 'niah'"), std::string::npos) << e;
  EXPECT_NE(e.find("field 'needle': missing {key}"), std::string::npos) << e;
  const std::string e2 = error_of(std::string(kHead) +
                                  "    tasks: [kv_retrieval]\n    context_lengths: [1024]\n"
                                  "    templates: {kv_retrieval: {needle: 'key {key}'}}\n");
  EXPECT_NE(e2.find("evals.ruler.templates.kv_retrieval.needle: template 'kv_retrieval'"), std::string::npos) << e2;
  EXPECT_NE(e2.find("missing {value}"), std::string::npos) << e2;
}

// `example` is a vt/cwe template field: it turns the example on or off and is part of the cell's
// identity; elsewhere it is an unknown key.
TEST(Ruler, TemplateExampleFieldParsesAndEntersTheIdentity) {
  auto identity = [](const std::string& templates) {
    const ExperimentSpec s = parse_experiment_text(
        std::string(kHead) + "    tasks: [cwe]\n    context_lengths: [1024]\n    templates: " + templates + "\n", "r.yaml");
    const RulerEvaluation* r = find_evaluation<RulerEvaluation>(s);
    return std::pair{r->has_example(*find_ruler_task("cwe")), r->identity(0, [](const fs::path&) { return std::string(); })};
  };
  const auto [tiny_on, tiny_id] = identity("kvlab-tiny");
  const auto [on, on_id] = identity("{base: kvlab-tiny, cwe: {example: true}}");
  const auto [off, off_id] = identity("{base: instruct, cwe: {example: false}}");
  const auto [inst_on, inst_id] = identity("instruct");
  EXPECT_FALSE(tiny_on);
  EXPECT_TRUE(on);
  EXPECT_FALSE(off);
  EXPECT_TRUE(inst_on);
  EXPECT_EQ(tiny_id.find("ruler.example"), std::string::npos);
  EXPECT_NE(on_id.find("ruler.example"), std::string::npos);
  EXPECT_EQ(off_id.find("ruler.example"), std::string::npos);
  EXPECT_NE(inst_id.find("ruler.example"), std::string::npos);
  const std::string e = error_of(std::string(kHead) + "    tasks: [niah_single_1]\n    context_lengths: [1024]\n"
                                 "    templates: {niah: {example: true}}\n");
  EXPECT_NE(e.find("evals.ruler.templates.niah"), std::string::npos) << e;
  EXPECT_NE(e.find("example"), std::string::npos) << e;
  const std::string e2 = error_of(std::string(kHead) + "    tasks: [vt]\n    context_lengths: [1024]\n"
                                  "    templates: {vt: {example: maybe}}\n");
  EXPECT_NE(e2.find("evals.ruler.templates.vt.example"), std::string::npos) << e2;
}

TEST(Ruler, ContextLengthsBeyondTheModelAreCaught) {
  const ExperimentSpec s = parse_experiment_text(std::string(kHead) +
                                                     "    tasks: [vt]\n    context_lengths: [1024, 8192]\n", "r.yaml");
  try {
    find_evaluation<RulerEvaluation>(s)->check_limit(TokenLimit{4096, "the model's context (4096 tokens)"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("evals.ruler.context_lengths[1]: 8192 tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvlab
